"""Admission: how many requests of one user the request streams may hold at once.

Each request of a user takes a place (a member of the user's sorted set ``channels.in_flight``,
scored by when it lapses) as the gate writes it to its stream, and gives it back when its reply
is sent (``release``, in the same round trip as the reply: ``services/bus/handled.py``). A place
also lapses on its own at the end of its hold (how long its caller said it would wait, within
``MAX_HOLD_MS``), so a request whose worker died keeps it no longer than that, and the key
expires with its last place. Places are taken and lapsed places cleared by one Lua script run by
the service (``ADMIT``): no client's Redis role can write them.
"""

from __future__ import annotations

from collections.abc import Mapping

# A user's requests in the streams at once, by default. Each one in flight is one more that
# another user's request shares the worker's processor with: with two, a flooding agent left the
# others' p99 at about twice what it is alone (bench/bench_flood.py); more only wait in front of
# theirs.
DEFAULT_USER_IN_FLIGHT = 2
# A place's hold when the request does not say how long its caller waits, and the longest hold.
DEFAULT_HOLD_MS = 10_000
MAX_HOLD_MS = 120_000
# A place is kept this long past its caller's wait, so it does not lapse while the reply is on
# its way (it is given back with the reply, long before).
PLACE_GRACE_MS = 1_000
# How a client says how long it waits for the reply (a header of the request's envelope).
WAIT_HEADER = "engram-wait-ms"
# Set on a refusal's envelope by the gate: the request was not admitted (nothing of it ran).
ADMISSION_HEADER = "engram-admission"
# The stream entry's fields naming its place (written by the gate, read when the reply is sent).
PLACE_KEY_FIELD = b"engram-place-key"
PLACE_FIELD = b"engram-place"

# KEYS[1]: the inbox; KEYS[2]: its stream; KEYS[3..]: the in-flight sets of the users in the batch.
# ARGV[1]: how many requests at the inbox's head the batch is; ARGV[2]: the stream's count cap;
# ARGV[3]: its byte budget; then five per request: its SHA-1, the index of its user's set in KEYS
# (0: it takes no place), how many places that set has, its place, its hold in ms.
# The requests leave the inbox here and nowhere else, in the same step as they enter the stream:
# a gate that dies at any point loses none. When the inbox's head is no longer the batch the
# caller read (another worker's gate took it), nothing is done and -1 is answered; else the
# (1-based) positions of the requests refused: their users' places were all taken. Lapsed places
# are cleared first (their callers stopped waiting).
ADMIT = """
local count, maxlen, budget = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local head = redis.call('LRANGE', KEYS[1], 0, count - 1)
if #head < count then return -1 end
for n = 1, count do
  if redis.sha1hex(head[n]) ~= ARGV[4 + (n - 1) * 5] then return -1 end
end
redis.call('LTRIM', KEYS[1], count, -1)
local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local cleared, refused = {}, {}
for n = 1, count do
  local i = 4 + (n - 1) * 5
  local which, cap, place, hold = tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2]), ARGV[i + 3], tonumber(ARGV[i + 4])
  local entry = head[n]
  local admitted = true
  if which > 0 then
    local key = KEYS[which]
    if not cleared[key] then
      redis.call('ZREMRANGEBYSCORE', key, '-inf', now_ms)
      cleared[key] = true
    end
    if redis.call('ZCARD', key) >= cap then
      admitted = false
      refused[#refused + 1] = n
    else
      redis.call('ZADD', key, now_ms + hold, place)
      if redis.call('PTTL', key) < hold then redis.call('PEXPIRE', key, hold) end
    end
  end
  if admitted then
    -- Capped by bytes as well as by count: the larger the request, the fewer the stream keeps.
    local keep = math.max(1, math.min(maxlen, math.floor(budget / #entry)))
    if which > 0 then
      redis.call('XADD', KEYS[2], 'MAXLEN', '~', keep, '*', '__data__', entry,
        'engram-place-key', KEYS[which], 'engram-place', place)
    else
      redis.call('XADD', KEYS[2], 'MAXLEN', '~', keep, '*', '__data__', entry)
    end
  end
end
return refused
"""


def hold_ms(headers: Mapping[str, object]) -> int:
    """How long a request's place is held: its caller's wait (``WAIT_HEADER``), within bounds."""
    try:
        wait = int(str(headers.get(WAIT_HEADER, DEFAULT_HOLD_MS)))
    except ValueError:
        wait = DEFAULT_HOLD_MS
    return min(max(wait, 0), MAX_HOLD_MS) + PLACE_GRACE_MS


def place_of(fields: Mapping[bytes, bytes]) -> tuple[bytes, bytes] | None:
    """The in-flight set and place a stream entry holds (None: it holds none)."""
    key, place = fields.get(PLACE_KEY_FIELD), fields.get(PLACE_FIELD)
    return (key, place) if key and place else None
