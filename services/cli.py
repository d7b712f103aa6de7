"""``engram``: the operator's and developer's command line. Every subcommand except ``serve``
talks to a running ``engram serve`` over the bus through ``EngramClient``."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import secrets
import signal
import sys
from collections.abc import Awaitable, Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import msgspec
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoPermissionError, RedisClusterException
from redis.exceptions import TimeoutError as RedisTimeoutError

from engram_ledger.contracts.commands import NoteDraft
from engram_ledger.contracts.errors import EngramError, ErrorCode
from engram_ledger.contracts.limits import LIST_NOTES_MAX, LIST_NOTES_PAGE, parse_time
from engram_ledger.contracts.model import NoteKind, NoteSource, NoteStatus
from engram_ledger.services import cli_render as render
from engram_ledger.services.adapters.minilm import ENCODER_KINDS
from engram_ledger.services.adapters.redis_conn import close_redis
from engram_ledger.services.config import ROLES, SettingError, Settings, parse_roles
from engram_ledger.services.ops.operator import connect, operator_redis, resolve_url

if TYPE_CHECKING:
    from engram_ledger.services.adapters.crypto import MasterKey
    from engram_ledger.services.bus.client import EngramClient

log = logging.getLogger("engram")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    as_json = _asks_for_json(argv)
    try:
        try:
            parser = _parser()
            args = parser.parse_args(argv)
            _check_text(parser, args)
            code = int(args.run(args) or 0)
        except _UsageError as e:
            if not as_json:
                e.parser.print_usage(sys.stderr)
                print(f"{e.parser.prog}: error: {e.message}", file=sys.stderr)
                return 2
            return _fail(as_json, ErrorCode.INVALID_PARAMETER.value, f"{e.parser.prog}: {e.message}")
        except EngramError as e:
            return _fail(as_json, e.code.value, e.message, e.command_id)
        except SettingError as e:
            return _fail(as_json, ErrorCode.INVALID_PARAMETER.value, f"bad configuration: {e}")
        except NoPermissionError as e:
            # An admin command (health, export, rebuild...) run as a role that may not do it.
            return _fail(
                as_json,
                ErrorCode.PERMISSION_DENIED.value,
                f"Redis refused this command to its user: {e}; `engram acl` says what each role may do",
            )
        except (RedisConnectionError, RedisTimeoutError, RedisClusterException) as e:
            # The operator commands (tail, export, rebuild...) talk to Redis itself.
            return _fail(as_json, ErrorCode.UNAVAILABLE.value, f"cannot reach the Engram bus: {e}")
        except OSError as e:
            if e.filename is None:
                raise
            return _fail(as_json, ErrorCode.INVALID_PARAMETER.value, f"cannot open {e.filename}: {e.strerror}")
        sys.stdout.flush()  # here, not at exit, so that a reader gone early is handled below
        return code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader left (`engram docs | head`): stop quietly, as a process killed by SIGPIPE
        # would (Python docs, "Note on SIGPIPE"); stdout goes to devnull so the flush at exit
        # cannot fail again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 128 + signal.SIGPIPE


def _asks_for_json(argv: list[str]) -> bool:
    """Whether ``--json`` (or an abbreviation argparse would take for it) comes before ``--``:
    known before parsing, so that an argument error can be answered in JSON too."""
    options = argv[: argv.index("--")] if "--" in argv else argv
    return any(len(a) > 2 and "--json".startswith(a) for a in options)


class _UsageError(Exception):
    def __init__(self, parser: argparse.ArgumentParser, message: str) -> None:
        super().__init__(message)
        self.parser = parser
        self.message = message


class _Parser(argparse.ArgumentParser):
    """argparse, with its errors raised to ``main``: under ``--json`` they are an error object and
    exit status 1 like every other error; without, argparse's usage line and status 2."""

    def error(self, message: str) -> NoReturn:
        raise _UsageError(self, message)


def _check_text(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Every text argument must be UTF-8. Python decodes the command line with surrogateescape,
    so bytes that are not UTF-8 (``$(printf 'caf\\xe9')``) arrive as lone surrogates; they would
    fail when the request is encoded. Refused here, naming the argument."""
    for action in _actions(parser, args):
        values = getattr(args, action.dest, None)
        for value in values if isinstance(values, list) else [values]:
            if not isinstance(value, str):
                continue
            try:
                value.encode()
            except UnicodeEncodeError as e:
                name = action.option_strings[-1] if action.option_strings else action.dest
                byte = os.fsencode(value[e.start])[0]
                raise EngramError(
                    ErrorCode.INVALID_PARAMETER,
                    f"{name} is not valid UTF-8 (byte 0x{byte:02x} at position {e.start}); give text in UTF-8",
                ) from None


def _actions(parser: argparse.ArgumentParser, args: argparse.Namespace) -> Iterator[argparse.Action]:
    """The arguments of the (sub)command that was parsed."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            chosen = action.choices.get(getattr(args, action.dest, None) or "")
            if chosen is not None:
                yield from _actions(chosen, args)
        else:
            yield action


def _fail(as_json: bool, code: str, message: str, command_id: str | None = None) -> int:
    """``command_id``: a command that may still be applied; the same call with ``--command-id``
    is applied once, whatever happened to the first."""
    if as_json:
        error = {"code": code, "message": message}
        if command_id is not None:
            error["command_id"] = command_id
        print(json.dumps({"error": error}))
    else:
        print(f"engram: {code}: {message}", file=sys.stderr)
        if command_id is not None:
            print(f"engram: to retry safely, run the same command with --command-id {command_id}", file=sys.stderr)
    return 1


def _draft_default(field: str) -> str:
    default = next(f.default for f in msgspec.structs.fields(NoteDraft) if f.name == field)
    return str(getattr(default, "value", default))


def _print(args: argparse.Namespace, obj: Any, human: Callable[[Any], render.Text | str] | None = None) -> None:
    """``obj`` as one JSON object under ``--json``; else ``human(obj)``, for a person (see cli_render)."""
    if args.json or human is None:
        sys.stdout.write(msgspec.json.encode(obj).decode() + "\n")
    else:
        render.show(human(obj))


def _progress(args: argparse.Namespace) -> Callable[[str, int | None], Any]:
    """A progress bar per step of a long command (tqdm, on stderr), shown on a terminal only and
    never under ``--json``."""

    def bar(what: str, total: int | None) -> Any:
        from tqdm import tqdm

        return tqdm(total=total, desc=what, unit="event", file=sys.stderr, disable=args.json or not sys.stderr.isatty())

    return bar


def _log_to_terminal() -> None:
    """For the commands that keep running (relay, mcp --http, console): what they do and what
    fails goes to stderr, one line each."""
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("engram").setLevel(logging.INFO)


# serve ------------------------------------------------------------------------------------------


def cmd_serve(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        settings = Settings.from_env()
        if args.role:
            settings = Settings(**{**settings.__dict__, "roles": parse_roles(",".join(args.role))})
    except ValueError as e:
        log.error("bad configuration: %s", e)
        return 2
    from engram_ledger.services.ops.serve import serve

    return serve(settings)


# client subcommands -----------------------------------------------------------------------------


def _time_argument(text: str) -> Any:
    try:
        return parse_time(text)
    except EngramError as e:
        raise argparse.ArgumentTypeError(e.message) from None


def _client(settings: Settings, timeout: float | None = None, operator: bool = True) -> EngramClient:
    """The command line is an operator's (``forget --yes`` deletes at once); the MCP server it
    starts serves an agent, whose client is not."""
    from engram_ledger.services.bus.client import EngramClient  # the client pulls in FastStream: not at import

    return EngramClient(
        resolve_url(settings),
        timeout=timeout or settings.request_timeout_seconds,
        cluster=settings.redis_cluster,
        operator=operator,
    )


def _with_client(fn: Callable[..., Awaitable[int | None]]) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        async def go() -> int:
            client = _client(Settings.from_env(), args.timeout)
            await client.connect()
            try:
                return int(await fn(client, args) or 0)
            finally:
                await client.close()

        return asyncio.run(go())

    return run


async def cmd_save(client: Any, args: argparse.Namespace) -> None:
    reply = await client.save(
        args.user,
        args.text,
        category=args.category,
        subject=args.subject,
        confidence=args.confidence,
        source=NoteSource(args.source) if args.source else None,
        importance=args.importance,
        command_id=args.command_id,
    )
    _print(args, reply, lambda r: render.saved(r, args.user))


async def cmd_update(client: Any, args: argparse.Namespace) -> None:
    reply = await client.update(
        args.user,
        args.note_id,
        content=args.text,
        category=args.category,
        subject=args.subject,
        expected_version=args.expected_version,
        command_id=args.command_id,
    )
    _print(args, reply, render.updated)


async def cmd_supersede(client: Any, args: argparse.Namespace) -> None:
    reply = await client.supersede(args.user, args.old_id, args.new_id, command_id=args.command_id)
    _print(args, reply, render.superseded)


async def cmd_forget(client: Any, args: argparse.Namespace) -> None:
    if args.all or args.session is not None:
        if args.query is not None or args.note_ids or (args.all and args.session is not None):
            raise EngramError(ErrorCode.INVALID_PARAMETER, "--all and --session take no query and no note ids")
        if args.all:
            reply = await client.forget_user(args.user, confirmed=args.yes, command_id=args.command_id)
        else:
            reply = await client.forget_session(args.user, args.session, confirmed=args.yes, command_id=args.command_id)
        _print(args, reply, render.forget)
        return
    if (args.query is None) == (not args.note_ids):
        raise EngramError(ErrorCode.INVALID_PARAMETER, "give either --query or note ids")
    reply = await client.forget(
        args.user, query=args.query, note_ids=args.note_ids, confirmed=args.yes, command_id=args.command_id
    )
    _print(args, reply, render.forget)


async def cmd_get(client: Any, args: argparse.Namespace) -> None:
    note = await client.get_note(args.user, args.note_id, after=args.after)
    _print(args, note, render.note)


async def cmd_history(client: Any, args: argparse.Namespace) -> None:
    reply = await client.history(args.user, args.note_id, after=args.after)
    if not args.json:
        # A forgotten note's versions are gone; its tombstone says when it was forgotten.
        tombstone = None
        if reply.status == NoteStatus.FORGOTTEN.value:
            tombstone = await client.get_note(args.user, args.note_id)
        render.show(render.history(reply, tombstone))
        return
    _print(args, {"note_id": reply.note_id, "status": reply.status, "versions": reply.versions})


async def cmd_list(client: Any, args: argparse.Namespace) -> None:
    reply = await client.list_notes(
        args.user,
        category=args.category,
        include_superseded=args.include_superseded,
        offset=args.offset,
        limit=args.limit,
        after=args.after,
    )
    more = max(reply.total - args.offset - len(reply.notes), 0)
    listed = {"notes": reply.notes, "total": reply.total, "more": more}
    _print(args, listed, lambda o: render.notes(o["notes"], o["total"], args.offset))


async def cmd_recent(client: Any, args: argparse.Namespace) -> None:
    reply = await client.list_recent(args.user, limit=args.limit, after=args.after)
    _print(args, {"notes": reply.notes, "total": reply.total}, lambda o: render.notes(o["notes"], o["total"]))


async def cmd_search(client: Any, args: argparse.Namespace) -> None:
    reply = await client.search(
        args.user,
        args.query,
        top_k=args.top_k,
        category=args.category,
        kind=NoteKind(args.kind) if args.kind else None,
        subject=args.subject,
        include_superseded=args.include_superseded,
        include_conversation=args.session is not None or args.conversations,
        session_id=args.session,
        since=args.since,
        until=args.until,
        after=args.after,
        ranking=args.ranking,
    )
    results = [
        {
            **msgspec.to_builtins(hit.note or hit.message),
            "note_id": hit.note_id,
            "content": hit.content,
            "score": hit.score,
            "similarity": hit.similarity,
            "found_in": hit.found_in,
        }
        for hit in reply.results
    ]
    _print(args, {"results": results}, lambda _: render.search(reply))


# operator subcommands ---------------------------------------------------------------------------


def _comma_list(given: list[str] | None) -> list[str] | None:
    """``--kinds a,b --kinds c`` (and the like) as one list; None when none was given."""
    return [v.strip() for each in given or [] for v in each.split(",") if v.strip()] or None


def _event_filters(p: argparse.ArgumentParser, what: str) -> None:
    """``--kinds`` and ``--user``, the same for every command that reads the log."""
    p.add_argument(
        "--kinds",
        action="append",
        metavar="KIND[,KIND...]",
        help=f"only these event types, comma-separated or repeated ({what})",
    )
    p.add_argument("--user", action="append", metavar="USER", help="only this user's events (repeat for several)")


def cmd_tail(args: argparse.Namespace) -> int:
    """The log as typed events, one line each (a JSON object each with --json); with --group
    through that consumer group, each entry acked once its line is written."""
    from engram_ledger.services.bus.subscription import Subscription

    settings = Settings.from_env()
    if args.count is not None and args.count < 1:
        raise EngramError(ErrorCode.INVALID_PARAMETER, f"--count must be at least 1; got {args.count}")
    kinds = _comma_list(args.kinds)
    subscription = Subscription.connect(
        resolve_url(settings),
        args.group,
        cluster=settings.redis_cluster,
        from_start=args.from_start,
        users=args.user,
        kinds=kinds,
        key=_subscriber_key(args, settings),
        # Its own name in the group: a tail never takes over an application consumer's pending entries.
        consumer="tail",
    )

    async def go() -> None:
        shown = 0
        async with subscription:
            async for delivery in subscription:
                if args.json:
                    line = {
                        "token": delivery.token,
                        "partition": delivery.partition,
                        "position": delivery.position,
                        "type": delivery.event.__struct_config__.tag,
                        "content": delivery.content,
                        "erase": delivery.erasure,
                        "redelivered": delivery.redelivered,
                        "event": delivery.event,
                    }
                    sys.stdout.write(msgspec.json.encode(line).decode() + "\n")
                else:
                    render.show(render.event_line(delivery))
                # Written before it is acked: a tail killed in between shows it again, never loses it.
                sys.stdout.flush()
                await delivery.ack()
                shown += 1
                if args.count is not None and shown >= args.count:
                    return

    asyncio.run(go())
    return 0


def _subscriber_key(args: argparse.Namespace, settings: Settings) -> MasterKey | None:
    """The master key for --key-file or --content (as `engram serve` finds it, never generating
    one); None: metadata only."""
    from engram_ledger.services.adapters.crypto import MasterKeyError, load_master_key

    try:
        if args.key_file:
            return load_master_key(settings.data_dir, {"ENGRAM_MASTER_KEY_FILE": args.key_file})
        if not args.content:
            return None
        configured = any(v for k, v in os.environ.items() if k.startswith("ENGRAM_MASTER_KEY"))
        if not configured and not (settings.data_dir / "master.key").exists():
            raise EngramError(
                ErrorCode.INVALID_PARAMETER,
                f"--content: no master key here (ENGRAM_MASTER_KEY, ENGRAM_MASTER_KEY_FILE or "
                f"{settings.data_dir / 'master.key'}); give the service's with --key-file",
            )
        return load_master_key(settings.data_dir)
    except MasterKeyError as e:
        raise EngramError(ErrorCode.INVALID_PARAMETER, f"the master key: {e}") from None


def cmd_relay(args: argparse.Namespace) -> int:
    """`engram relay`: every event of the log posted to a URL, signed, until SIGINT/SIGTERM."""
    from engram_ledger.services.adapters.private_files import write_private
    from engram_ledger.services.ops.relay import RelayOptions, RetryPolicy, run_relay, signing_key

    _log_to_terminal()
    settings = Settings.from_env()
    if not args.url.startswith(("http://", "https://")):
        raise EngramError(ErrorCode.INVALID_PARAMETER, f"--url must be an http:// or https:// URL; got {args.url!r}")
    if args.give_up_after <= 0:
        raise EngramError(ErrorCode.INVALID_PARAMETER, "--give-up-after must be a positive number of seconds")
    secret_file = Path(args.secret_file) if args.secret_file else settings.data_dir / "relay.secret"
    if not args.secret_file:
        # Generated once, beside the master key, for the receiver to be given as it is (no
        # newline: a receiver that signs with the file's bytes agrees too).
        settings.data_dir.mkdir(parents=True, exist_ok=True)
        write_private(secret_file, secrets.token_urlsafe(32), replace=False)
    try:
        secret = signing_key(secret_file.read_bytes())
    except OSError as e:
        raise EngramError(ErrorCode.INVALID_PARAMETER, f"--secret-file {secret_file}: {e.strerror}") from None
    if len(secret) < 16:
        raise EngramError(ErrorCode.INVALID_PARAMETER, f"the secret in {secret_file} is shorter than 16 characters")
    log.info("signing posts with the secret in %s (give the receiver this file)", secret_file)
    options = RelayOptions(
        url=args.url,
        group=args.group,
        secret=secret,
        kinds=_comma_list(args.kinds),
        users=args.user,
        from_start=args.from_start,
        key=_subscriber_key(args, settings),
        metrics_port=args.metrics_port,
        retry=RetryPolicy(give_up_after=args.give_up_after),
    )

    async def go() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await run_relay(resolve_url(settings), settings.redis_cluster, options, stop)

    asyncio.run(go())
    return 0


def cmd_rebuild(args: argparse.Namespace) -> int:
    from engram_ledger.services.ops.rebuild import rebuild_history, rebuild_index

    rebuild = rebuild_index if args.projection == "index" else rebuild_history

    async def go() -> dict[str, Any]:
        settings = Settings.from_env()
        async with operator_redis(settings) as (redis, partitions):
            return await rebuild(redis, settings, partitions, _progress(args))

    result = asyncio.run(go())
    if args.projection == "index":
        _print(
            args, result, lambda r: f"rebuilt the index from {r['events']} events; generation {r['generation']} is live"
        )
    else:
        _print(
            args, result, lambda r: f"rebuilt history from {r['events']} events; live generations {r['generations']}"
        )
    return 0


def cmd_schema(args: argparse.Namespace) -> int:
    from engram_ledger.contracts.schema import json_schema

    return _write_document(args, json_schema())


def _write_document(args: argparse.Namespace, document: dict[str, Any]) -> int:
    text = json.dumps(document, indent=2, sort_keys=True)
    if args.out:
        Path(args.out).write_text(text + "\n")
        _print(args, {"written": args.out}, lambda o: f"wrote {o['written']}")
    else:
        print(text)
    return 0


def cmd_model(args: argparse.Namespace) -> int:
    """Export (once) and load the configured encoder: at install time, so that no start waits."""
    import time

    from engram_ledger.services.adapters.minilm import indexed_model_name, load_encoder

    settings = Settings.from_env()
    encoder = args.encoder or settings.encoder
    started = time.perf_counter()
    load_encoder(encoder, settings.model_cache_dir).encode(["ready"])
    report = {
        "encoder": encoder,
        "model": indexed_model_name(encoder),
        "model_cache": str(settings.model_cache_dir),
        "seconds": round(time.perf_counter() - started, 1),
    }
    _print(args, report, lambda r: f"{r['model']} ({r['encoder']}) ready in {r['model_cache']} in {r['seconds']} s")
    return 0


def cmd_health(args: argparse.Namespace) -> int:
    from engram_ledger.services.observability.health import health

    async def go() -> dict[str, Any]:
        settings = Settings.from_env()
        redis = connect(settings, socket_connect_timeout=2)
        try:
            return await health(redis)
        finally:
            await close_redis(redis)

    report = asyncio.run(go())
    if args.json:
        sys.stdout.write(json.dumps(report) + "\n")
    else:
        render.show(render.health(report))
    return 0 if report["status"] == "ok" else 1


def cmd_keys(args: argparse.Namespace) -> int:
    from engram_ledger.services.ops.keys import human, run_keys

    progress = _progress(args)
    options = {k: getattr(args, k) for k in ("wait_seconds", "batch", "pause") if hasattr(args, k)}
    result = asyncio.run(run_keys(Settings.from_env(), args.action, progress, **options))
    _print(args, result, lambda r: human(args.action, r))
    return 0


def _bounded(kind: Callable[[str], Any], low: float, high: float) -> Callable[[str], Any]:
    """An argument of type ``kind`` from ``low`` to ``high``, refused with its range otherwise."""

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a {kind.__name__}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{text} is not from {low:g} to {high:g}")
        return value

    return parse


def cmd_export(args: argparse.Namespace) -> int:
    from engram_ledger.services.adapters.private_files import open_private
    from engram_ledger.services.ops.portable import export_log

    async def go() -> dict[str, int]:
        async with operator_redis(Settings.from_env()) as (redis, partitions):
            with open_private(args.out) as out:  # it holds every wrapped data key
                return await export_log(redis, partitions, out, _progress(args))

    counts = asyncio.run(go())
    _print(args, {"written": args.out, **counts}, lambda o: f"exported {o['events']} events to {o['written']}")
    return 0


def cmd_import(args: argparse.Namespace) -> int:
    from engram_ledger.services.adapters.crypto import load_master_key
    from engram_ledger.services.adapters.event_store import RedisEventStore
    from engram_ledger.services.ops.portable import import_log, read_partitions

    settings = Settings.from_env()

    async def go() -> dict[str, int]:
        redis = connect(settings)
        try:
            with open(args.source) as source:
                partitions = read_partitions(source)
                store = RedisEventStore(redis, partitions, 0, load_master_key(settings.data_dir))
                return await import_log(redis, store, source, _progress(args))
        except ValueError as e:
            raise EngramError(ErrorCode.INVALID_PARAMETER, str(e)) from None
        finally:
            await close_redis(redis)

    counts = asyncio.run(go())
    _print(args, counts, lambda o: f"imported {o['events']} events; projections rebuild when engram serve starts")
    return 0


def cmd_acl(args: argparse.Namespace) -> int:
    """`engram acl`: each role's Redis ACL rules, or (--write) an ACL file and URL files."""
    from engram_ledger.services.ops import acl

    if args.write:
        if args.role or args.name:
            raise EngramError(ErrorCode.INVALID_PARAMETER, "--write makes every role's user: give no ROLE or --name")
        paths = acl.write_deployment(Path(args.write), args.host, database=args.database, cluster=args.cluster)
        written = {name: str(path) for name, path in paths.items()}
        _print(args, {"written": written}, lambda o: "wrote (0600) " + ", ".join(o["written"].values()))
        return 0
    if args.name and not args.role:
        raise EngramError(ErrorCode.INVALID_PARAMETER, "--name names the user of one ROLE: give the ROLE too")
    roles = [args.role] if args.role else list(acl.ROLES)
    out = []
    for role in roles:
        user = args.name or acl.DEFAULT_USERS[role]
        described = acl.ROLES[role]
        command = acl.setuser(role, user, cluster=args.cluster)
        out.append(
            {
                "role": role,
                "user": user,
                "for": described.who,
                "can": described.can,
                "cannot": described.cannot,
                "setuser": command,
            }
        )

    def human(roles: list[dict[str, Any]]) -> str:
        import shlex

        return "\n\n".join(
            f"# {r['role']}: {r['for']}\n# can: {r['can']}\n# cannot: {r['cannot']}\n"
            f"redis-cli {shlex.join(r['setuser'])}\nredis-cli ACL SETUSER {r['user']} '>PASSWORD'"
            for r in roles
        )

    _print(args, {"roles": out}, lambda o: human(o["roles"]))
    return 0


def cmd_docs(args: argparse.Namespace) -> int:
    from engram_ledger.contracts.asyncapi import asyncapi

    return _write_document(args, asyncapi())


# the agent's surface ------------------------------------------------------------------------------


def cmd_tools(args: argparse.Namespace) -> int:
    from engram_ledger.services.agents.tools import PROFILES, profile

    specs = profile(args.profile) if args.profile else [t for p in PROFILES for t in profile(p)]
    if args.format == "openai":
        out: Any = [t.openai() for t in specs]
    elif args.format == "anthropic":
        out = [t.anthropic() for t in specs]
    else:
        out = [
            {**t.anthropic(), "read_only": t.read_only, "side_effecting": not t.read_only, "timeout_s": t.timeout}
            for t in specs
        ]
    sys.stdout.write(json.dumps({"profile": args.profile, "tools": out}, indent=None if args.json else 2) + "\n")
    return 0


def cmd_mcp(args: argparse.Namespace) -> int:
    from engram_ledger.services.agents.mcp_server import serve_http, serve_stdio
    from engram_ledger.services.application.decoding import check_user_id

    if args.http is None:
        if not args.user:
            raise EngramError(
                ErrorCode.INVALID_PARAMETER, "--user is required for stdio (or serve --http for many users)"
            )
        check_user_id(args.user, "--user")  # refused at start, before looking for the bus
    elif args.user:
        raise EngramError(
            ErrorCode.INVALID_PARAMETER,
            "--user is for stdio; over HTTP the user comes from each request's token (engram tokens create)",
        )
    if bool(args.tls_cert) != bool(args.tls_key):
        raise EngramError(ErrorCode.INVALID_PARAMETER, "--tls-cert and --tls-key go together")
    settings = Settings.from_env()
    client = _client(settings, operator=False)
    if args.http is not None:
        _log_to_terminal()
        verifier = _token_verifier(settings, args.gateway_secret_file)
        tls = (args.tls_cert, args.tls_key) if args.tls_cert else None
        asyncio.run(serve_http(client, args.profile, args.host, args.http, verifier, tls))
        return 0
    asyncio.run(serve_stdio(client, args.profile, args.user, args.session))
    return 0


def _token_verifier(settings: Settings, gateway_secret_file: str | None) -> Any:
    """The MCP server's check of bearer tokens: the registry in Redis, and the gateway's shared
    secret when one is given (read from a file: a secret on the command line shows in ps)."""
    from engram_ledger.services.agents.tokens import EngramTokenVerifier, GatewayVerifier, TokenRegistry

    gateway = None
    if gateway_secret_file:
        try:
            gateway = GatewayVerifier(Path(gateway_secret_file).read_text())
        except OSError as e:
            raise EngramError(ErrorCode.INVALID_PARAMETER, f"--gateway-secret-file: {e.strerror}") from None
    return EngramTokenVerifier(TokenRegistry(connect(settings)), gateway)


def cmd_tokens(args: argparse.Namespace) -> int:
    """`engram tokens create|list|revoke`: the MCP front door's bearer tokens."""
    from engram_ledger.services.agents.tokens import TokenRegistry

    if args.action == "create" and bool(args.user) == bool(args.operator):
        raise EngramError(ErrorCode.INVALID_PARAMETER, "give --user USER, or --operator for the operator role")
    if args.action == "create" and args.expires_in_days is not None and args.expires_in_days <= 0:
        raise EngramError(ErrorCode.INVALID_PARAMETER, "--expires-in-days must be positive")

    async def go() -> dict[str, Any]:
        redis = connect(Settings.from_env())
        registry = TokenRegistry(redis)
        try:
            if args.action == "create":
                lifetime = timedelta(days=args.expires_in_days) if args.expires_in_days is not None else None
                token, record = await registry.create(user_id=args.user, label=args.label, expires_in=lifetime)
                return {"token": token, **msgspec.to_builtins(record)}
            if args.action == "revoke":
                revoked = await registry.revoke(args.token_id)
                if revoked is None:
                    raise EngramError(ErrorCode.MEMORY_NOT_FOUND, f"no token has the id {args.token_id!r}")
                return {"revoked": msgspec.to_builtins(revoked)}
            return {"tokens": [msgspec.to_builtins(r) for r in await registry.records()]}
        finally:
            await close_redis(redis)

    outcome = asyncio.run(go())
    if args.json:
        sys.stdout.write(json.dumps(outcome) + "\n")
    elif "token" in outcome:
        whom = f"user {outcome['user_id']}" if outcome["user_id"] else "the operator role"
        sys.stdout.write(f"{outcome['token']}\n")
        sys.stderr.write(f"token {outcome['id']} for {whom}: shown once, keep it secret (Redis keeps only its hash)\n")
    elif "revoked" in outcome:
        sys.stdout.write(f"revoked {outcome['revoked']['id']}\n")
    else:
        for r in outcome["tokens"]:
            whom = f"user {r['user_id']}" if r["user_id"] else "operator"
            expires = f" expires {r['expires_at']}" if r["expires_at"] else ""
            label = f" {r['label']!r}" if r["label"] else ""
            sys.stdout.write(f"{r['id']}  {whom}  created {r['created_at']}{expires}{label}\n")
    return 0


async def cmd_context(client: Any, args: argparse.Namespace) -> None:
    reply = await client.context(
        args.user, format=args.format, query=args.query, max_tokens=args.max_tokens, after=args.after
    )
    if args.json:
        _print(args, reply)
    else:
        sys.stdout.write(reply.text)


async def cmd_memory(client: Any, args: argparse.Namespace) -> None:
    """Requirements §3's /memory for humans: the list, and deletion at once (a person typed it)."""
    if args.action == "list":
        reply = await client.list_notes(args.user)
        if args.json:
            _print(args, {"notes": reply.notes, "total": reply.total})
            return
        sys.stdout.write(render.memory_list(reply.notes, reply.total, args.user))
        return
    note = await client.get_note(args.user, args.note_id)
    reply = await client.forget(args.user, note_ids=[args.note_id], confirmed=True, command_id=args.command_id)
    _print(args, reply, lambda r: f"Deleted: '{note.content}'")


def cmd_console(args: argparse.Namespace) -> int:
    """`engram console`: the memory console in a browser (services/console), until SIGINT/SIGTERM."""
    from engram_ledger.services.console.app import serve_console
    from engram_ledger.services.console.auth import check_token, new_token

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = Settings.from_env()
    chosen = os.environ.get("ENGRAM_CONSOLE_TOKEN")
    token = check_token(chosen) if chosen else new_token()

    def announce(url: str) -> None:
        # The generated token is shown here once; a chosen one is never printed.
        shown = {"url": url, "token": None if chosen else token}
        if args.json:
            print(json.dumps(shown), flush=True)
            return
        print(f"engram console on {url}", flush=True)
        if not chosen:
            print(f"console token (log in with it; set ENGRAM_CONSOLE_TOKEN to choose one): {token}", flush=True)

    url = resolve_url(settings)
    asyncio.run(
        serve_console(
            url,
            token,
            args.host,
            args.port,
            cluster=settings.redis_cluster,
            timeout=settings.request_timeout_seconds,
            announce=announce,
        )
    )
    return 0


# argument parsing -------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="engram", description="Engram: long-term memory for LLM agents.")
    sub = parser.add_subparsers(dest="command", required=True)

    def common(p: argparse.ArgumentParser, run: Callable[[argparse.Namespace], int], user: bool) -> None:
        p.set_defaults(run=run)
        p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
        if user:
            p.add_argument("--user", required=True, help="the user whose memory this is")
            p.add_argument("--timeout", type=float, default=None, help="seconds to wait for a reply")

    def writes(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
        p.add_argument(
            "--command-id",
            help="the command's idempotency key (default: a new one); a command that timed out, sent again "
            "with the id its error gave, is applied once",
        )
        return p

    def add(
        name: str, run: Callable[[argparse.Namespace], int], help: str, user: bool = False
    ) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help, description=help)
        common(p, run, user)
        return p

    def add_actions(
        name: str, run: Callable[[argparse.Namespace], int], help: str, actions: dict[str, str], user: bool = False
    ) -> dict[str, argparse.ArgumentParser]:
        """A command of several actions (`engram NAME ACTION`), each with ``--json``; their parsers, to add to."""
        group = sub.add_parser(name, help=help).add_subparsers(dest="action", required=True)
        parsers: dict[str, argparse.ArgumentParser] = {}
        for action, action_help in actions.items():
            parsers[action] = group.add_parser(action, help=action_help, description=action_help)
            common(parsers[action], run, user)
        return parsers

    p = add("serve", cmd_serve, "run the workers (command handler, projections, query responders, forget saga)")
    p.add_argument(
        "--role",
        action="append",
        metavar="ROLE",
        help=f"run only these workers: all (default) or any of {', '.join(ROLES)}; repeat or comma-separate "
        "(also ENGRAM_ROLES). Processes with the same roles share the work and take over from a dead one.",
    )

    p = writes(add("save", _with_client(cmd_save), "save a new note", user=True))
    p.add_argument("text")
    # Unset options take the contract's defaults (NoteDraft), which the help shows.
    p.add_argument("--category", help=f"default {_draft_default('category')}")
    p.add_argument("--subject")
    p.add_argument("--confidence", type=float, help=f"default {_draft_default('confidence')}")
    p.add_argument("--importance", type=float, help=f"default {_draft_default('importance')}")
    p.add_argument("--source", choices=[s.value for s in NoteSource], help=f"default {_draft_default('source')}")

    p = writes(add("update", _with_client(cmd_update), "change a note (new version, same id)", user=True))
    p.add_argument("note_id")
    p.add_argument("text", nargs="?")
    p.add_argument("--category")
    p.add_argument("--subject")
    p.add_argument("--expected-version", type=int)

    p = writes(add("supersede", _with_client(cmd_supersede), "mark OLD_ID as replaced by NEW_ID", user=True))
    p.add_argument("old_id")
    p.add_argument("new_id")

    p = writes(
        add(
            "forget",
            _with_client(cmd_forget),
            "forget notes in two calls: --query finds candidates; ids ask for confirmation, then delete",
            user=True,
        )
    )
    p.add_argument("note_ids", nargs="*", metavar="NOTE_ID")
    p.add_argument("--query", help="find candidates (deletes nothing)")
    p.add_argument("--all", action="store_true", help="erase every note and message of the user")
    p.add_argument("--session", help="erase every message of this conversation")
    p.add_argument("--yes", action="store_true", help="operator: delete at once, without the second call")

    for name, fn, help in (
        ("get", cmd_get, "show one note"),
        ("history", cmd_history, "show every version of a note"),
    ):
        p = add(name, _with_client(fn), help, user=True)
        p.add_argument("note_id")
        p.add_argument("--after", help="consistency token to wait for")

    p = add("list", _with_client(cmd_list), "list notes by category, then creation time", user=True)
    p.add_argument("--category")
    p.add_argument("--include-superseded", action="store_true")
    p.add_argument("--limit", type=int, default=LIST_NOTES_PAGE, help=f"notes a page (1-{LIST_NOTES_MAX})")
    p.add_argument("--offset", type=int, default=0, help="where the page starts (the listing's order)")
    p.add_argument("--after")

    p = add("recent", _with_client(cmd_recent), "most recently created notes", user=True)
    p.add_argument("--limit", type=int, default=10)
    p.add_argument("--after")

    p = add("search", _with_client(cmd_search), "hybrid search of a user's notes", user=True)
    p.add_argument("query")
    p.add_argument("--session", help="also search this conversation's recorded messages")
    p.add_argument("--conversations", action="store_true", help="also search every past conversation")
    p.add_argument("--since", type=_time_argument, help="only what happened from this time (ISO 8601; UTC if no zone)")
    p.add_argument("--until", type=_time_argument, help="only what happened up to this time (ISO 8601; UTC if no zone)")
    p.add_argument("--top-k", type=int, default=5)
    p.add_argument("--category")
    p.add_argument("--kind", choices=[k.value for k in NoteKind])
    p.add_argument("--ranking", choices=["relevance", "blended"], default="relevance")
    p.add_argument("--subject")
    p.add_argument("--include-superseded", action="store_true")
    p.add_argument("--after")

    p = add("tail", cmd_tail, "follow the event log: typed events, one line each (content only with the key)")
    p.add_argument("--from-start", action="store_true", help="start at the beginning of the log (a new --group too)")
    p.add_argument("--count", type=int, help="stop after this many events")
    p.add_argument(
        "--group", help="read through this consumer group: created on first use, each line acked once written"
    )
    _event_filters(p, "erasures are always shown")
    p.add_argument("--content", action="store_true", help="open content with the master key as `engram serve` finds it")
    p.add_argument("--key-file", help="open content with the master key in this file")

    p = add("relay", cmd_relay, "post every event of the log to a webhook URL, signed (HMAC-SHA256), at least once")
    p.add_argument("--url", required=True, help="where to POST each event as JSON")
    p.add_argument("--group", required=True, help="the relay's consumer group: its position is kept in Redis")
    p.add_argument("--secret-file", help="the signing secret (default: generated once as DATA_DIR/relay.secret)")
    _event_filters(p, "erasures always come")
    p.add_argument("--from-start", action="store_true", help="a new group starts at the log's beginning")
    p.add_argument("--content", action="store_true", help="post the content of notes not forgotten (the master key)")
    p.add_argument("--key-file", help="the master key file to open content with (implies --content)")
    p.add_argument(
        "--give-up-after",
        type=float,
        default=3600.0,
        help="seconds an event is retried before it is dead-lettered (erasures never are; default 3600)",
    )
    p.add_argument("--metrics-port", type=int, help="Prometheus metrics on 127.0.0.1:PORT (lag, failures)")

    p = add("rebuild", cmd_rebuild, "rebuild a projection from the event log, then switch to it")
    p.add_argument("projection", choices=["history", "index"])

    from engram_ledger.services.agents.tools import PROFILE_NAMES

    p = add("tools", cmd_tools, "the tool definitions of a profile, for an LLM API")
    p.add_argument("--profile", choices=PROFILE_NAMES)
    p.add_argument("--format", choices=["openai", "anthropic", "engram"], default="engram")

    p = add("mcp", cmd_mcp, "serve a tool profile over MCP (stdio for one user, or streamable HTTP)")
    p.add_argument("--profile", choices=PROFILE_NAMES, default="engram")
    p.add_argument("--user", help="the user (stdio)")
    p.add_argument("--session", help="the conversation, for include_conversation")
    p.add_argument("--http", type=int, metavar="PORT", help="streamable HTTP on this port (bearer tokens)")
    p.add_argument("--host", default="127.0.0.1", help="interface to listen on (loopback by default)")
    p.add_argument("--tls-cert", help="HTTPS: the certificate chain file (PEM)")
    p.add_argument("--tls-key", help="HTTPS: the private key file (PEM)")
    p.add_argument(
        "--gateway-secret-file",
        help="also accept this shared secret as the bearer token of a gateway that authenticates users "
        "itself and names the user in X-Engram-User",
    )

    tokens = add_actions(
        "tokens",
        cmd_tokens,
        "bearer tokens of the MCP server over HTTP: create, list, revoke",
        {
            "create": "a new token for one user (or the operator role), printed once",
            "list": "every token: id, user or role, when made, when it expires",
            "revoke": "refuse a token from its next request on",
        },
    )
    p = tokens["create"]
    p.add_argument("--user", help="the user the token acts as")
    p.add_argument("--operator", action="store_true", help="a token that may name any user per request")
    p.add_argument("--label", default="", help="what the token is for (shown by list)")
    p.add_argument("--expires-in-days", type=float, help="refused after this many days (default: never)")
    tokens["revoke"].add_argument("token_id", help="the id `engram tokens list` shows")

    p = add("context", _with_client(cmd_context), "the user's memory as a prompt block", user=True)
    p.add_argument("--format", choices=["markdown", "xml"], default="markdown")
    p.add_argument("--query", help="focus: the most relevant notes and episodes")
    p.add_argument("--max-tokens", type=int, help="token budget (MiniLM word pieces)")
    p.add_argument("--after", help="consistency token to wait for")

    p = add("console", cmd_console, "the memory console in a browser: users, search, timelines, forgetting, live")
    p.add_argument("--port", type=_bounded(int, 1, 65_535), default=8780, help="port to listen on (default 8780)")
    p.add_argument("--host", default="127.0.0.1", help="interface to listen on (loopback by default)")

    memory = add_actions(
        "memory",
        _with_client(cmd_memory),
        "requirements §3's /memory: list, or delete ID at once",
        {"list": "the user's memories, by category", "delete": "delete one memory at once"},
        user=True,
    )
    writes(memory["delete"]).add_argument("note_id")

    add("health", cmd_health, "bus reachable? projection and request-group lag, pending deletions")

    p = add("model", cmd_model, "prepare the embedding model: export it to ONNX under the model cache (once)")
    p.add_argument("--encoder", choices=ENCODER_KINDS, help="default: ENGRAM_ENCODER (onnx)")

    keys = add_actions(
        "keys",
        cmd_keys,
        "the master key's generations: rotate, status, retire",
        {
            "rotate": "re-wrap every note's data key under a new master-key generation; resumes one in progress",
            "status": "the master-key generation in use, a rotation in progress, each worker's generations",
            "retire": "after a rotation: take the older generations out of the keyring file",
        },
    )
    for p in (keys["rotate"], keys["retire"]):
        p.add_argument(
            "--wait",
            dest="wait_seconds",
            type=_bounded(float, 0, 86_400),
            default=60.0,
            help="seconds to wait for every worker to hold and use the new generation (default 60)",
        )
        p.add_argument("--batch", type=_bounded(int, 1, 10_000), default=500, help="log entries a round (default 500)")
    keys["rotate"].add_argument(
        "--pause",
        type=_bounded(float, 0, 60),
        default=0.0,
        help="seconds between rounds, to spare a busy Redis",
    )

    p = add("export", cmd_export, "write the raw event log (sealed) and data keys as JSON lines")
    p.add_argument("--out", required=True)
    p = add("import", cmd_import, "replay an export into an empty store (same master key)")
    p.add_argument("source")

    p = add("docs", cmd_docs, "write the AsyncAPI 3.0 document of every channel and message")
    p.add_argument("--out", help="file to write (default: stdout)")

    p = add("schema", cmd_schema, "write the JSON Schema of every contract")
    p.add_argument("--out", help="file to write (default: stdout)")

    from engram_ledger.services.ops.acl import ROLES as ACL_ROLES

    p = add("acl", cmd_acl, "Redis ACL users with least privilege, one per role: print them, or --write files")
    p.add_argument("role", nargs="?", choices=list(ACL_ROLES), help="one role (default: all)")
    p.add_argument("--name", help="the ACL user's name (default engram-ROLE); an agent's replies are bound to it")
    p.add_argument("--cluster", action="store_true", help="also what a Redis Cluster client needs")
    p.add_argument("--write", metavar="DIR", help="write an ACL file and each role's URL (fresh passwords, 0600)")
    p.add_argument("--host", default="redis:6379", help="HOST:PORT in the URLs --write makes (default redis:6379)")
    p.add_argument("--database", type=int, default=0, help="the database in the URLs --write makes")
    return parser


if __name__ == "__main__":
    sys.exit(main())
