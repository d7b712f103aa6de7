"""``engram``: the operator's and developer's command line. Every subcommand except ``serve``
talks to a running ``engram serve`` over the bus through ``EngramClient``."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import msgspec
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisClusterException
from redis.exceptions import TimeoutError as RedisTimeoutError

from contracts.commands import NoteDraft
from contracts.errors import EngramError, ErrorCode
from contracts.limits import LIST_NOTES_MAX, LIST_NOTES_PAGE, parse_time
from contracts.model import NoteKind, NoteSource, NoteStatus
from services import cli_render as render
from services.adapters.redis_conn import close_redis
from services.config import ROLES, SettingError, Settings, parse_roles
from services.ops.operator import connect, follow_log, operator_redis, resolve_url

if TYPE_CHECKING:
    from services.bus.client import EngramClient

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
            return _fail(as_json, e.code.value, e.message)
        except SettingError as e:
            return _fail(as_json, ErrorCode.INVALID_PARAMETER.value, f"bad configuration: {e}")
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


def _fail(as_json: bool, code: str, message: str) -> int:
    if as_json:
        print(json.dumps({"error": {"code": code, "message": message}}))
    else:
        print(f"engram: {code}: {message}", file=sys.stderr)
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
    from services.ops.serve import serve

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
    from services.bus.client import EngramClient  # the client pulls in FastStream: not at import

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
    _print(args, reply, render.saved)


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
            reply = await client.forget_user(args.user, confirmed=args.yes)
        else:
            reply = await client.forget_session(args.user, args.session, confirmed=args.yes)
        _print(args, reply, render.forget)
        return
    if (args.query is None) == (not args.note_ids):
        raise EngramError(ErrorCode.INVALID_PARAMETER, "give either --query or note ids")
    reply = await client.forget(args.user, query=args.query, note_ids=args.note_ids, confirmed=args.yes)
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


def cmd_tail(args: argparse.Namespace) -> int:
    async def go() -> None:
        settings = Settings.from_env()
        async with operator_redis(settings) as (redis, partitions):
            events = follow_log(redis, partitions, cluster=settings.redis_cluster, from_start=args.from_start)
            shown = 0
            async for entry in events:
                print(json.dumps(entry), flush=True)
                shown += 1
                if args.count is not None and shown >= args.count:
                    return

    asyncio.run(go())
    return 0


def cmd_rebuild(args: argparse.Namespace) -> int:
    from services.ops.rebuild import rebuild_history, rebuild_index

    rebuild = rebuild_index if args.projection == "index" else rebuild_history

    def progress(what: str, total: int) -> Any:
        from tqdm import tqdm

        return tqdm(total=total, desc=what, unit="event", file=sys.stderr, disable=args.json)

    async def go() -> dict[str, Any]:
        settings = Settings.from_env()
        async with operator_redis(settings) as (redis, partitions):
            return await rebuild(redis, settings, partitions, progress)

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
    from contracts.schema import json_schema

    return _write_document(args, json_schema())


def _write_document(args: argparse.Namespace, document: dict[str, Any]) -> int:
    text = json.dumps(document, indent=2, sort_keys=True)
    if args.out:
        Path(args.out).write_text(text + "\n")
        _print(args, {"written": args.out}, lambda o: f"wrote {o['written']}")
    else:
        print(text)
    return 0


def cmd_health(args: argparse.Namespace) -> int:
    from services.ops.health import health

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


def cmd_export(args: argparse.Namespace) -> int:
    from services.adapters.private_files import open_private
    from services.ops.portable import export_log

    async def go() -> dict[str, int]:
        async with operator_redis(Settings.from_env()) as (redis, partitions):
            with open_private(args.out) as out:  # it holds every wrapped data key
                return await export_log(redis, partitions, out)

    counts = asyncio.run(go())
    _print(args, {"written": args.out, **counts}, lambda o: f"exported {o['events']} events to {o['written']}")
    return 0


def cmd_import(args: argparse.Namespace) -> int:
    from services.adapters.crypto import load_master_key
    from services.adapters.event_store import RedisEventStore
    from services.ops.portable import import_log, read_partitions

    settings = Settings.from_env()

    async def go() -> dict[str, int]:
        redis = connect(settings)
        try:
            with open(args.source) as source:
                partitions = read_partitions(source)
                store = RedisEventStore(redis, partitions, 0, load_master_key(settings.data_dir))
                return await import_log(redis, store, source)
        except ValueError as e:
            raise EngramError(ErrorCode.INVALID_PARAMETER, str(e)) from None
        finally:
            await close_redis(redis)

    counts = asyncio.run(go())
    _print(args, counts, lambda o: f"imported {o['events']} events; projections rebuild when engram serve starts")
    return 0


def cmd_docs(args: argparse.Namespace) -> int:
    from contracts.asyncapi import asyncapi

    return _write_document(args, asyncapi())


# the agent's surface ------------------------------------------------------------------------------


def cmd_tools(args: argparse.Namespace) -> int:
    from services.agents.tools import PROFILES, profile

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
    from services.agents.mcp_server import serve_http, serve_stdio
    from services.application.decoding import check_user_id

    if args.http is None:
        if not args.user:
            raise EngramError(
                ErrorCode.INVALID_PARAMETER, "--user is required for stdio (or serve --http for many users)"
            )
        check_user_id(args.user, "--user")  # refused at start, before looking for the bus
    client = _client(Settings.from_env(), operator=False)
    if args.http is not None:
        asyncio.run(serve_http(client, args.profile, args.host, args.http))
        return 0
    asyncio.run(serve_stdio(client, args.profile, args.user, args.session))
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
        sys.stdout.write(render.memory_list(reply.notes, reply.total))
        return
    note = await client.get_note(args.user, args.note_id)
    reply = await client.forget(args.user, note_ids=[args.note_id], confirmed=True)
    _print(args, reply, lambda r: f"Deleted: '{note.content}'")


# argument parsing -------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="engram", description="Engram: long-term memory for LLM agents.")
    sub = parser.add_subparsers(dest="command", required=True)

    def add(
        name: str, run: Callable[[argparse.Namespace], int], help: str, user: bool = False
    ) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help, description=help)
        p.set_defaults(run=run)
        p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
        if user:
            p.add_argument("--user", required=True, help="the user whose memory this is")
            p.add_argument("--timeout", type=float, default=None, help="seconds to wait for a reply")
        return p

    p = add("serve", cmd_serve, "run the workers (command handler, projections, query responders, forget saga)")
    p.add_argument(
        "--role",
        action="append",
        metavar="ROLE",
        help=f"run only these workers: all (default) or any of {', '.join(ROLES)}; repeat or comma-separate "
        "(also ENGRAM_ROLES). Processes with the same roles share the work and take over from a dead one.",
    )

    p = add("save", _with_client(cmd_save), "save a new note", user=True)
    p.add_argument("text")
    # Unset options take the contract's defaults (NoteDraft), which the help shows.
    p.add_argument("--category", help=f"default {_draft_default('category')}")
    p.add_argument("--subject")
    p.add_argument("--confidence", type=float, help=f"default {_draft_default('confidence')}")
    p.add_argument("--importance", type=float, help=f"default {_draft_default('importance')}")
    p.add_argument("--source", choices=[s.value for s in NoteSource], help=f"default {_draft_default('source')}")
    p.add_argument("--command-id", help="idempotency key (default: a new one)")

    p = add("update", _with_client(cmd_update), "change a note (new version, same id)", user=True)
    p.add_argument("note_id")
    p.add_argument("text", nargs="?")
    p.add_argument("--category")
    p.add_argument("--subject")
    p.add_argument("--expected-version", type=int)
    p.add_argument("--command-id")

    p = add("supersede", _with_client(cmd_supersede), "mark OLD_ID as replaced by NEW_ID", user=True)
    p.add_argument("old_id")
    p.add_argument("new_id")
    p.add_argument("--command-id")

    p = add(
        "forget",
        _with_client(cmd_forget),
        "forget notes in two calls: --query finds candidates; ids ask for confirmation, then delete",
        user=True,
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

    p = add("tail", cmd_tail, "follow the public event stream (JSON lines)")
    p.add_argument("--from-start", action="store_true", help="start at the beginning of the log")
    p.add_argument("--count", type=int, help="stop after this many events")

    p = add("rebuild", cmd_rebuild, "rebuild a projection from the event log, then switch to it")
    p.add_argument("projection", choices=["history", "index"])

    from services.agents.tools import PROFILE_NAMES

    p = add("tools", cmd_tools, "the tool definitions of a profile, for an LLM API")
    p.add_argument("--profile", choices=PROFILE_NAMES)
    p.add_argument("--format", choices=["openai", "anthropic", "engram"], default="engram")

    p = add("mcp", cmd_mcp, "serve a tool profile over MCP (stdio for one user, or streamable HTTP)")
    p.add_argument("--profile", choices=PROFILE_NAMES, default="engram")
    p.add_argument("--user", help="the user (stdio)")
    p.add_argument("--session", help="the conversation, for include_conversation")
    p.add_argument("--http", type=int, metavar="PORT", help="streamable HTTP on this port (user per request)")
    p.add_argument("--host", default="127.0.0.1")

    p = add("context", _with_client(cmd_context), "the user's memory as a prompt block", user=True)
    p.add_argument("--format", choices=["markdown", "xml"], default="markdown")
    p.add_argument("--query", help="focus: the most relevant notes and episodes")
    p.add_argument("--max-tokens", type=int, help="token budget (MiniLM word pieces)")
    p.add_argument("--after", help="consistency token to wait for")

    memory = sub.add_parser("memory", help="requirements §3's /memory: list, or delete ID at once")
    actions = memory.add_subparsers(dest="action", required=True)
    for action, help in (("list", "the user's memories, by category"), ("delete", "delete one memory at once")):
        p = actions.add_parser(action, help=help, description=help)
        p.set_defaults(run=_with_client(cmd_memory))
        p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
        p.add_argument("--user", required=True, help="the user whose memory this is")
        p.add_argument("--timeout", type=float, default=None, help="seconds to wait for a reply")
        if action == "delete":
            p.add_argument("note_id")

    add("health", cmd_health, "bus reachable? projection and request-group lag, pending deletions")

    p = add("export", cmd_export, "write the raw event log (sealed) and data keys as JSON lines")
    p.add_argument("--out", required=True)
    p = add("import", cmd_import, "replay an export into an empty store (same master key)")
    p.add_argument("source")

    p = add("docs", cmd_docs, "write the AsyncAPI 3.0 document of every channel and message")
    p.add_argument("--out", help="file to write (default: stdout)")

    p = add("schema", cmd_schema, "write the JSON Schema of every contract")
    p.add_argument("--out", help="file to write (default: stdout)")
    return parser


if __name__ == "__main__":
    sys.exit(main())
