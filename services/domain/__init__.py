"""The pure domain: no Redis, no clock, no randomness. A decider is a function of
(states, command, now) to events or an ``EngramError``; a note's state is a fold over its events."""
