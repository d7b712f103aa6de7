"""Redis ACL users for Engram's roles, each with the least it needs: the recipe as data, shared by
`engram acl`, the compose secrets it writes and the tests that hold each role to it.

Where the tenant boundary lies: in the service and the authenticated front doors (an MCP server
checking bearer tokens, the host application of an agent), not in the bus. A request names its
user in its body and the service believes it, so whoever may add requests to the command and
query streams may act as any user; the ACLs below keep each client to its own part of the bus
(an agent cannot read the log, the notes' streams, the data keys, the read model or another
client's replies, nor delete at once through the operators' stream) but cannot keep an agent to
one user. An agent that must only ever see one user's memory goes through a front door that
authenticates it and picks the user itself.

Key and channel patterns rely on names the contracts guarantee: a partition's hash tag is the
only ``{...}`` in a key (ids cannot hold braces), so ``engram:{*}:log`` takes in every
partition's log and nothing else; a client's name never holds ``:`` or a glob character, so
``engram:replies:<name>:*`` never takes in another client's replies. ACL patterns apply to every
database of a server alike: one Redis server (or cluster) per Engram store.
"""

from __future__ import annotations

import hashlib
import secrets
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engram_ledger.contracts import channels
from engram_ledger.contracts.errors import EngramError, ErrorCode
from engram_ledger.services.adapters.private_files import private_dir, write_private


@dataclass(frozen=True)
class Role:
    name: str
    who: str
    can: str
    cannot: str


ROLES: dict[str, Role] = {
    role.name: role
    for role in (
        Role(
            "service",
            "`engram serve` (every worker), and the admin commands `engram health`, `export`, `import`, "
            "`rebuild`, `tokens`",
            "every `engram:*` key and channel with the data commands (strings, hashes, sets, sorted "
            "sets, lists, streams), pub/sub, transactions, its Lua scripts (EVALSHA, SCRIPT LOAD), "
            "and for the scrub after a forget CONFIG GET and BGREWRITEAOF",
            "any key or channel outside `engram:*`; admin and dangerous commands (CONFIG SET, ACL, "
            "FLUSHALL, FLUSHDB, KEYS, SHUTDOWN, DEBUG, MODULE, REPLICAOF, MIGRATE, FUNCTION, ...)",
        ),
        Role(
            "operator",
            "the `engram` CLI's bus commands (save, search, get, list, forget --yes, memory delete, ...); "
            "the framework adapters given a URL (they open an operator's client)",
            "what an agent can, and append requests to the operators' inbox `engram:{p}:operator:inbox` "
            "(a `confirmed` forget deletes at once)",
            "read the log, the notes' streams, data keys, read model or request streams; another "
            "client's replies; write any key; `engram health`, `export`, `import`, `rebuild` (the "
            "service role's) or `tail` (the subscriber role's)",
        ),
        Role(
            "agent",
            "an agent's client (`EngramClient`, `engram mcp` over stdio, the tool dispatcher): one ACL "
            "user per agent or per host",
            "read `engram:partitions`; append requests (RPUSH, nothing else) to the inboxes of the command "
            "and query streams (`engram:{p}:commands:inbox`, `engram:{p}:queries:inbox`), from which the "
            "service admits them; subscribe to its own reply channels `engram:replies:<its user>:*`",
            "write a request stream itself (XADD, XTRIM, XDEL: no trimming or dropping another's request); "
            "touch a user's places in flight; add requests to the operators' inbox (delete at once); "
            "read or pop an inbox, the log, the notes' streams, data keys, read model, request streams or "
            "any other key; create any other key; subscribe to another client's replies, pattern-subscribe or "
            "publish",
        ),
        Role(
            "front-door",
            "an authenticated front door that picks the user itself: `engram http` and `engram mcp --http` "
            "checking bearer tokens",
            "what an agent can, look a presented token up in `engram:tokens` (HGET of its hash), and read the "
            "logs `engram:{p}:log` directly (XREAD, XRANGE, XREVRANGE: a caller's event stream, its content "
            "sealed)",
            "list, add or revoke tokens (`engram tokens` is the service role's); write the log or keep a "
            "consumer group on it; what an agent cannot",
        ),
        Role(
            "subscriber",
            "another service following the public event stream with its consumer group "
            "(`EngramClient.events`), `engram relay`, `engram tail`",
            "read the logs `engram:{p}:log` with consumer groups (XGROUP CREATE, XREADGROUP, XACK, "
            "XPENDING, XCLAIM, XAUTOCLAIM, XINFO) or directly (XREAD, XRANGE); read "
            "`engram:partitions`; subscribe to its own reply channels; add to a relay's dead letters "
            "(`engram:relay:<group>:dead`)",
            "write anything else but its groups' state (no XADD, XDEL or XTRIM on the log); destroy or "
            "reset a group; read the notes' streams, data keys, read model, requests or replies; "
            "send requests",
        ),
    )
}

# The user names `engram acl --write` creates.
DEFAULT_USERS = {role: f"engram-{role}" for role in ROLES}

_BASE = ["resetkeys", "resetchannels", "-@all", "+ping", "+select"]
# What redis-py's cluster client asks of any node to find the slots and route commands.
_CLUSTER = ["+cluster|slots", "+cluster|shards", "+cluster|nodes", "+command", "+asking", "+readonly"]
_PARTITIONS = f"%R~{channels.PARTITIONS_KEY}"


_REQUEST_STREAMS: dict[str, Callable[[int], str]] = {
    "commands": channels.command_stream,
    "queries": channels.query_stream,
    "operator": channels.operator_stream,
}


def _inboxes(partitions: int, *streams: str) -> list[str]:
    # Write-only (%W) and with RPUSH alone: a client appends its request and can neither read
    # the requests waiting there (other users' text) nor remove, trim or reorder any. Each
    # partition's inbox by its name: a pattern over the hash tag would let a caller create
    # inboxes that no worker reads. (The service's gate admits what is appended:
    # services/bus/gate.py. A Redis function could not stand in for it: Redis checks what a
    # function runs against its caller's ACL.)
    return [f"%W~{channels.inbox(_REQUEST_STREAMS[stream](p))}" for stream in streams for p in range(partitions)]


def _logs(partitions: int) -> list[str]:
    return [f"~{channels.event_log(p)}" for p in range(partitions)]


def rules(role: str, user: str, *, cluster: bool = False, partitions: int = 1) -> list[str]:
    """The ACL rules of ``role`` for the user ``user``, in the order ``ACL SETUSER`` takes them
    (after the name and any password). ``cluster``: also what a Redis Cluster client needs.
    ``partitions``: the deployment's number (ENGRAM_PARTITIONS): its streams are named one by
    one, and a partition beyond them is refused."""
    if role not in ROLES:
        raise EngramError(ErrorCode.INVALID_PARAMETER, f"unknown role {role!r}; one of {', '.join(ROLES)}")
    if partitions < 1:
        raise EngramError(ErrorCode.INVALID_PARAMETER, f"partitions must be at least 1; got {partitions}")
    check_user(user)
    replies = f"&{channels.client_reply_channels(user)}"
    if role == "service":
        found = [
            "resetkeys",
            "resetchannels",
            "-@all",
            f"~{channels.PREFIX}:*",
            f"&{channels.PREFIX}:*",
            "+@read",
            "+@write",
            "+@pubsub",
            "+@transaction",
            "+@connection",
            # @read and @write bring these in; none is Engram's, and FUNCTION FLUSH and the like
            # reach past its keys.
            "-@dangerous",
            "-function",
            "-fcall",
            "-fcall_ro",
            "+evalsha",
            "+script|load",
            "+script|exists",
            "+time",
            # The scrub after a forget rewrites the AOF (services/adapters/scrub.py).
            "+config|get",
            "+bgrewriteaof",
        ]
    elif role in ("agent", "operator", "front-door"):
        streams = ("commands", "queries", "operator") if role == "operator" else ("commands", "queries")
        found = [*_BASE, _PARTITIONS, *_inboxes(partitions, *streams), replies, "+get", "+rpush"]
        found += ["+subscribe", "+unsubscribe"]
        if role == "front-door":
            # One token's record by the token's hash: never the list of them, never a write.
            found += [f"%R~{channels.TOKENS_KEY}", "+hget"]
            # A caller's event stream (`GET /v1/events`), read without a group: the events'
            # content is sealed, and no group's place nor the log itself can be changed.
            found += [f"%R~{channels.event_log(p)}" for p in range(partitions)]
            found += ["+xread", "+xrange", "+xrevrange"]
    else:
        found = [
            *_BASE,
            _PARTITIONS,
            # Read and write key rights, but only commands that read the log or keep a group's
            # place in it: XADD, XDEL, XTRIM, XSETID, XGROUP DESTROY and SETID are not granted.
            *_logs(partitions),
            # EngramClient subscribes to its reply channel when it connects.
            replies,
            "+get",
            "+subscribe",
            "+unsubscribe",
            "+xread",
            "+xrange",
            "+xrevrange",
            "+xlen",
            "+xinfo|stream",
            "+xinfo|groups",
            "+xinfo|consumers",
            "+xgroup|create",
            "+xgroup|createconsumer",
            "+xreadgroup",
            "+xack",
            "+xpending",
            # Not XCLAIM: its LASTID moves a group's position, another subscriber's too (a group
            # is not a key, and ACLs grant keys); XAUTOCLAIM, which Subscription uses, cannot.
            "+xautoclaim",
            # `engram relay` moves an event it could not post to its group's dead letters. A
            # selector: XADD there alone, so the log stays closed to XADD.
            f"(%W~{channels.PREFIX}:relay:*:dead +xadd)",
        ]
    return found + (_CLUSTER if cluster else [])


def check_user(user: str) -> None:
    """An ACL user name Engram can bind reply channels to (the client takes its name from it)."""
    if not channels.valid_client_name(user):
        raise EngramError(
            ErrorCode.INVALID_PARAMETER,
            f"user name {user!r} must be 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit",
        )


def setuser(role: str, user: str, *, cluster: bool = False, partitions: int = 1) -> list[str]:
    """``ACL SETUSER`` of ``user`` as ``role``, with no password yet (``reset`` leaves none):
    send ``ACL SETUSER <user> ><password>`` after it."""
    return ["ACL", "SETUSER", user, "reset", "on", *rules(role, user, cluster=cluster, partitions=partitions)]


def acl_file_line(role: str, user: str, password: str, *, cluster: bool = False, partitions: int = 1) -> str:
    """One line of a Redis ACL file (``aclfile``): the password as its SHA-256, never in clear."""
    digest = hashlib.sha256(password.encode()).hexdigest()
    found = rules(role, user, cluster=cluster, partitions=partitions)
    return " ".join(["user", user, "reset", "on", f"#{digest}", *found])


# The users every ACL file starts with: the password-less default user off, and one that may only
# PING, for a container's health check (it needs no secret: it can learn nothing).
PREAMBLE = [
    "user default off",
    "user healthcheck reset on nopass resetkeys resetchannels -@all +ping",
]
ACL_FILE = "redis_users.acl"


def url_file(role: str) -> str:
    return f"redis_url_{role}"


def write_deployment(
    directory: Path, host: str, *, database: int = 0, cluster: bool = False, partitions: int = 1
) -> dict[str, Path]:
    """A Redis ACL file with a user per role (``DEFAULT_USERS``) under fresh random passwords,
    and each role's URL in a file of its own, every file 0600 (compose.yaml mounts them as
    secrets). Refuses to replace any of them: new passwords need the old files removed first,
    and Redis restarted on the new ACL file."""
    private_dir(directory)
    paths = {"acl": directory / ACL_FILE, **{role: directory / url_file(role) for role in ROLES}}
    present = [str(path) for path in paths.values() if path.exists()]
    if present:
        raise EngramError(
            ErrorCode.INVALID_PARAMETER,
            f"{', '.join(present)} already exist: remove them to make new users and passwords",
        )
    passwords = {role: secrets.token_urlsafe(32) for role in ROLES}
    lines = [
        *PREAMBLE,
        *(
            acl_file_line(role, DEFAULT_USERS[role], passwords[role], cluster=cluster, partitions=partitions)
            for role in ROLES
        ),
    ]
    write_private(paths["acl"], "\n".join(lines) + "\n")
    for role in ROLES:
        # token_urlsafe needs no quoting in a URL.
        write_private(paths[role], f"redis://{DEFAULT_USERS[role]}:{passwords[role]}@{host}/{database}\n")
    return paths


def describe(role: str | None, name: str | None, *, cluster: bool = False, partitions: int = 1) -> list[dict[str, Any]]:
    """Each role's user (or ``role``'s alone, named ``name``): who it is for, what it can and
    cannot do, and the ``ACL SETUSER`` that makes it."""
    if name and not role:
        raise EngramError(ErrorCode.INVALID_PARAMETER, "--name names the user of one ROLE: give the ROLE too")
    described = []
    for each in [role] if role else list(ROLES):
        user = name or DEFAULT_USERS[each]
        about = ROLES[each]
        described.append(
            {
                "role": each,
                "user": user,
                "for": about.who,
                "can": about.can,
                "cannot": about.cannot,
                "setuser": setuser(each, user, cluster=cluster, partitions=partitions),
            }
        )
    return described


def as_redis_cli(roles: list[dict[str, Any]]) -> str:
    """``describe``'s roles as commented redis-cli lines, with the password still to set."""
    return "\n\n".join(
        f"# {r['role']}: {r['for']}\n# can: {r['can']}\n# cannot: {r['cannot']}\n"
        f"redis-cli {shlex.join(r['setuser'])}\nredis-cli ACL SETUSER {r['user']} '>PASSWORD'"
        for r in roles
    )
