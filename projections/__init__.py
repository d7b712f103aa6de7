"""What is read: projections fed from the event log. Each one has the same shape
(``projections/tracking.py``): ``apply(batch)`` stores state and position in one transaction,
``checkpoint()`` says how far it got, and ``rebuild()`` runs the same code from position zero:
history and index into a fresh generation, then switch; the forget saga in place."""
