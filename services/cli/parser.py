"""The arguments of every subcommand, and the function each runs. Options of a command take the
contract's names, defaults and limits (``NoteDraft``, ``contracts/limits.py``)."""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable, Sequence
from importlib import import_module
from typing import Any, NoReturn

import msgspec

from engram_ledger.contracts.commands import NoteDraft
from engram_ledger.contracts.errors import EngramError
from engram_ledger.contracts.limits import LIST_NOTES_MAX, LIST_NOTES_PAGE, parse_time
from engram_ledger.contracts.model import NoteKind, NoteSource
from engram_ledger.services.adapters.minilm import ENCODER_KINDS
from engram_ledger.services.agents.profiles import DESCRIPTIONS, canonical
from engram_ledger.services.config import ROLES

Run = Callable[[argparse.Namespace], int]


class UsageError(Exception):
    def __init__(self, parser: argparse.ArgumentParser, message: str) -> None:
        super().__init__(message)
        self.parser = parser
        self.message = message


class Parser(argparse.ArgumentParser):
    """argparse, with its errors raised to ``main``: under ``--json`` they are an error object and
    exit status 1 like every other error; without, argparse's usage line and status 2."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(self, message)


class Commands:
    """The subcommands being declared: each has ``--json``; a user's commands also ``--user`` and
    ``--timeout``; a write ``--command-id``."""

    def __init__(self, sub: Any) -> None:
        self._sub = sub

    @staticmethod
    def _common(p: argparse.ArgumentParser, run: Run, user: bool) -> None:
        p.set_defaults(run=run)
        p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
        if user:
            p.add_argument("--user", required=True, help="the user whose memory this is")
            p.add_argument("--timeout", type=float, default=None, help="seconds to wait for a reply")

    @staticmethod
    def writes(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
        p.add_argument(
            "--command-id",
            help="the command's idempotency key (default: a new one); a command that timed out, sent again "
            "with the id its error gave, is applied once",
        )
        return p

    def add(
        self, name: str, run: Run, help: str, user: bool = False, epilog: str | None = None
    ) -> argparse.ArgumentParser:
        """``epilog``: lines shown after the options, as written."""
        formatter = argparse.RawDescriptionHelpFormatter if epilog else argparse.HelpFormatter
        p = self._sub.add_parser(name, help=help, description=help, epilog=epilog, formatter_class=formatter)
        self._common(p, run, user)
        return p

    def add_actions(
        self, name: str, run: Run, help: str, actions: dict[str, str], user: bool = False
    ) -> dict[str, argparse.ArgumentParser]:
        """A command of several actions (`engram NAME ACTION`), each with ``--json``; their parsers, to add to."""
        group = self._sub.add_parser(name, help=help).add_subparsers(dest="action", required=True)
        parsers: dict[str, argparse.ArgumentParser] = {}
        for action, action_help in actions.items():
            parsers[action] = group.add_parser(action, help=action_help, description=action_help)
            self._common(parsers[action], run, user)
        return parsers


def _of_user(name: str) -> Run:
    """The command ``name`` of ``notes.py``, over one user's memory, run with a client of the bus.
    Each command's module is imported when it runs, never to parse: ``engram --help`` and a
    command that does not talk to the bus import neither Redis nor the client."""

    def run(args: argparse.Namespace) -> int:
        notes = import_module("engram_ledger.services.cli.notes")
        return int(notes.with_client(getattr(notes, name))(args))

    return run


def _operator(name: str) -> Run:
    """The command ``name`` of ``operator.py``, imported when it runs."""
    return lambda args: int(getattr(import_module("engram_ledger.services.cli.operator"), name)(args) or 0)


def _agent(name: str) -> Run:
    """The command ``name`` of ``agents.py``, imported when it runs."""
    return lambda args: int(getattr(import_module("engram_ledger.services.cli.agents"), name)(args) or 0)


class _Version(argparse.Action):
    """``--version``: the installed package's version, looked up only when asked for."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS, **kwargs: Any) -> None:
        super().__init__(option_strings, dest=dest, default=argparse.SUPPRESS, nargs=0, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
        from importlib.metadata import PackageNotFoundError, version

        try:
            found = version("engram-ledger")
        except PackageNotFoundError:
            found = "(not installed)"
        sys.stdout.write(f"engram {found}\n")
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="engram", description="Engram: long-term memory for LLM agents.")
    parser.add_argument("--version", action=_Version, help="print the version and exit")
    cli = Commands(parser.add_subparsers(dest="command", required=True))
    _serve(cli)
    _memory(cli)
    _log_readers(cli)
    _agents(cli)
    _operations(cli)
    return parser


def _validity(p: argparse.ArgumentParser) -> None:
    p.add_argument("--valid-from", type=_time_argument, help="when what it says began to hold in the world")
    p.add_argument("--valid-until", type=_time_argument, help="when it stopped holding (ISO 8601; UTC if no zone)")


def _serve(cli: Commands) -> None:
    p = cli.add(
        "serve", _operator("cmd_serve"), "run the workers (command handler, projections, query responders, forget saga)"
    )
    p.add_argument(
        "--role",
        action="append",
        metavar="ROLE",
        help=f"run only these workers: all (default) or any of {', '.join(ROLES)}; repeat or comma-separate "
        "(also ENGRAM_ROLES). Processes with the same roles share the work and take over from a dead one.",
    )


def _memory(cli: Commands) -> None:
    """The commands over one user's memory."""
    _writing(cli)
    _looking_back(cli)
    _forgetting(cli)
    _reading(cli)


def _writing(cli: Commands) -> None:
    p = cli.writes(cli.add("save", _of_user("cmd_save"), "save a new note", user=True))
    p.add_argument("text")
    # Unset options take the contract's defaults (NoteDraft), which the help shows.
    p.add_argument("--category", help=f"default {_draft_default('category')}")
    p.add_argument("--subject")
    p.add_argument("--confidence", type=float, help=f"default {_draft_default('confidence')}")
    p.add_argument("--importance", type=float, help=f"default {_draft_default('importance')}")
    p.add_argument("--source", choices=[s.value for s in NoteSource], help=f"default {_draft_default('source')}")
    p.add_argument(
        "--occurred-at",
        type=_time_argument,
        help="when it happened (ISO 8601; UTC if no zone), if not when saved: searches naming a time use it",
    )
    _validity(p)

    p = cli.writes(cli.add("update", _of_user("cmd_update"), "change a note (new version, same id)", user=True))
    p.add_argument("note_id")
    p.add_argument("text", nargs="?")
    p.add_argument("--category")
    p.add_argument("--subject")
    p.add_argument("--expected-version", type=int)
    _validity(p)

    p = cli.writes(cli.add("supersede", _of_user("cmd_supersede"), "mark OLD_ID as replaced by NEW_ID", user=True))
    p.add_argument("old_id")
    p.add_argument("new_id")
    p.add_argument(
        "--keep-validity",
        action="store_true",
        help="leave OLD_ID's valid-until as it is (by default it ends where NEW_ID begins)",
    )

    p = cli.writes(
        cli.add("revert", _of_user("cmd_revert"), "give a note back what an earlier version held", user=True)
    )
    p.add_argument("note_id")
    p.add_argument("--to-version", type=int, required=True, help="the version whose content and fields come back")
    p.add_argument("--expected-version", type=int, help="refuse unless the note is at this version now")


def _looking_back(cli: Commands) -> None:
    """What changed between two moments, and what the user's agents were shown."""
    p = cli.add("diff", _of_user("cmd_diff"), "what changed in a user's notes between two moments", user=True)
    p.add_argument("--since", required=True, help="from this moment (ISO 8601, UTC if no zone; or a token)")
    p.add_argument("--until", help="up to this moment (default: now)")
    p.add_argument("--limit", type=int, default=200, help=f"changes at most (1-{LIST_NOTES_MAX})")
    p.add_argument("--after", help="a token a write printed: this read waits until that write is applied")

    p = cli.add(
        "recalls", _of_user("cmd_recalls"), "what searches and memory blocks showed the user's agents", user=True
    )
    p.add_argument("--since", type=_time_argument, help="after this time (ISO 8601; UTC if no zone)")
    p.add_argument("--until", type=_time_argument, help="up to this time")
    p.add_argument("--session", help="only this conversation's")
    p.add_argument("--limit", type=int, default=50, help=f"recalls at most (1-{LIST_NOTES_MAX})")
    p.add_argument("--after", help="a token a write printed: this read waits until that write is applied")


def _forgetting(cli: Commands) -> None:
    p = cli.writes(
        cli.add(
            "forget",
            _of_user("cmd_forget"),
            "forget notes in two calls: --query finds candidates; ids ask for confirmation, then delete",
            user=True,
        )
    )
    p.add_argument("note_ids", nargs="*", metavar="NOTE_ID")
    p.add_argument("--query", help="find candidates (deletes nothing)")
    p.add_argument("--all", action="store_true", help="erase every note and message of the user")
    p.add_argument("--session", help="erase every message of this conversation")
    p.add_argument("--yes", action="store_true", help="operator: delete at once, without the second call")


def _reading(cli: Commands) -> None:
    for name, fn, help in (
        ("get", "cmd_get", "show one note"),
        ("history", "cmd_history", "show every version of a note"),
    ):
        p = cli.add(name, _of_user(fn), help, user=True)
        p.add_argument("note_id")
        p.add_argument("--after", help="a token a write printed: this read waits until that write is applied")
        if name == "get":
            p.add_argument("--as-of", help="the note as it was then (ISO 8601, UTC if no zone; or a token)")

    p = cli.add("list", _of_user("cmd_list"), "list notes by category, then creation time", user=True)
    p.add_argument("--category", help="only this category")
    p.add_argument("--include-superseded", action="store_true", help="also the notes a newer one superseded")
    p.add_argument("--limit", type=int, default=LIST_NOTES_PAGE, help=f"notes a page (1-{LIST_NOTES_MAX})")
    p.add_argument("--offset", type=int, default=0, help="where the page starts (the listing's order)")
    p.add_argument("--after", help="a token a write printed: this read waits until that write is applied")
    p.add_argument("--as-of", help="the notes as they were then (ISO 8601, UTC if no zone; or a token)")
    p.add_argument("--valid-at", type=_time_argument, help="only notes whose content held in the world then")

    p = cli.add("recent", _of_user("cmd_recent"), "most recently created notes", user=True)
    p.add_argument("--limit", type=int, default=10, help="how many")
    p.add_argument("--after", help="a token a write printed: this read waits until that write is applied")

    p = cli.add("search", _of_user("cmd_search"), "hybrid search of a user's notes", user=True)
    p.add_argument("query")
    p.add_argument("--session", help="also search this conversation's recorded messages")
    p.add_argument("--conversations", action="store_true", help="also search every past conversation")
    p.add_argument("--since", type=_time_argument, help="only what happened from this time (ISO 8601; UTC if no zone)")
    p.add_argument("--until", type=_time_argument, help="only what happened up to this time (ISO 8601; UTC if no zone)")
    p.add_argument("--top-k", type=int, default=5, help="how many hits (1-20)")
    p.add_argument("--category", help="only this category")
    p.add_argument("--kind", choices=[k.value for k in NoteKind], help="only notes of this kind")
    p.add_argument(
        "--ranking",
        choices=["relevance", "blended"],
        default="relevance",
        help="blended: relevance with how recent and how important a note is",
    )
    p.add_argument(
        "--min-relevance",
        type=float,
        help="leave out hits below this relevance, 0-1 (default: the service's floor; 0: every hit)",
    )
    p.add_argument("--subject", help="only notes about this subject (case and spacing aside)")
    p.add_argument("--include-superseded", action="store_true", help="also the notes a newer one superseded")
    p.add_argument("--after", help="a token a write printed: this read waits until that write is applied")
    p.add_argument("--as-of", help="search the memory as it was then (ISO 8601, UTC if no zone; or a token)")
    p.add_argument("--valid-at", type=_time_argument, help="only notes whose content held in the world then")

    p = cli.add("context", _of_user("cmd_context"), "the user's memory as a prompt block", user=True)
    p.add_argument("--format", choices=["markdown", "xml"], default="markdown")
    p.add_argument(
        "--query",
        help="with --max-tokens, the notes most relevant to it are kept first; in xml, its relevant episodes are shown",
    )
    p.add_argument("--max-tokens", type=int, help="token budget (MiniLM word pieces)")
    p.add_argument("--min-relevance", type=float, help="with --query: what counts as relevant, 0-1")
    p.add_argument(
        "--update-tool",
        help="the tool the model reading the block changes a memory with, named in the block (default: none)",
    )
    p.add_argument("--after", help="a token a write printed: this read waits until that write is applied")
    p.add_argument("--as-of", help="the block as the memory was then (ISO 8601, UTC if no zone; or a token)")

    memory = cli.add_actions(
        "memory",
        _of_user("cmd_memory"),
        "the user's memories as a list by category, or delete one at once (no second call)",
        {"list": "the user's memories, by category", "delete": "delete one memory at once"},
        user=True,
    )
    cli.writes(memory["delete"]).add_argument("note_id")


def _log_readers(cli: Commands) -> None:
    """The commands that follow the event log, and the one that rebuilds from it."""
    p = cli.add(
        "tail", _operator("cmd_tail"), "follow the event log: typed events, one line each (content only with the key)"
    )
    p.add_argument("--from-start", action="store_true", help="start at the beginning of the log (a new --group too)")
    p.add_argument("--count", type=int, help="stop after this many events")
    p.add_argument(
        "--group", help="read through this consumer group: created on first use, each line acked once written"
    )
    _event_filters(p, "erasures are always shown")
    p.add_argument("--content", action="store_true", help="open content with the master key as `engram serve` finds it")
    p.add_argument("--key-file", help="open content with the master key in this file")

    p = cli.add(
        "relay",
        _operator("cmd_relay"),
        "post every event of the log to a webhook URL, signed (HMAC-SHA256), at least once",
    )
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
    p.add_argument(
        "--post-seconds",
        type=float,
        default=30.0,
        help="seconds one post may take in all, connecting to reading the answer, before it has failed (default 30)",
    )
    p.add_argument("--metrics-port", type=int, help="Prometheus metrics on 127.0.0.1:PORT (lag, failures)")

    p = cli.add("rebuild", _operator("cmd_rebuild"), "rebuild a projection from the event log, then switch to it")
    p.add_argument("projection", choices=["history", "index"])


def _agents(cli: Commands) -> None:
    help = "the tool definitions of a profile, for an LLM API"
    p = cli.add("tools", _agent("cmd_tools"), help, epilog=_PROFILES_HELP)
    _profile_option(p, "the profile (default: every profile's tools)", None)
    p.add_argument("--format", choices=["openai", "anthropic", "engram"], default="engram")

    help = "serve a tool profile over MCP (stdio for one user, or streamable HTTP)"
    p = cli.add("mcp", _agent("cmd_mcp"), help, epilog=_PROFILES_HELP)
    _profile_option(p, "the profile to serve (default engram)", "engram")
    p.add_argument("--user", help="the user (stdio)")
    p.add_argument("--session", help="the conversation the agent is in: the tools can search its messages too")
    p.add_argument("--http", type=int, metavar="PORT", help="streamable HTTP on this port (bearer tokens)")
    p.add_argument("--host", default="127.0.0.1", help="interface to listen on (loopback by default)")
    p.add_argument("--tls-cert", help="HTTPS: the certificate chain file (PEM)")
    p.add_argument("--tls-key", help="HTTPS: the private key file (PEM)")
    p.add_argument(
        "--gateway-secret-file",
        help="also accept this shared secret as the bearer token of a gateway that authenticates users "
        "itself and names the user in X-Engram-User",
    )

    help = "the HTTP API under /v1 (OpenAPI at /v1/openapi.json) and MCP at /mcp, on one port (bearer tokens)"
    p = cli.add("http", _agent("cmd_http"), help)
    p.add_argument("--port", type=_bounded(int, 1, 65_535), default=8788, help="port to listen on (default 8788)")
    p.add_argument("--host", default="127.0.0.1", help="interface to listen on (loopback by default)")
    p.add_argument("--tls-cert", help="HTTPS: the certificate chain file (PEM)")
    p.add_argument("--tls-key", help="HTTPS: the private key file (PEM)")
    p.add_argument("--gateway-secret-file", help="also accept this shared secret (see engram mcp)")
    _profile_option(p, "the tool profile served at /mcp (default engram)", "engram")
    p.add_argument(
        "--requests-per-token",
        type=_bounded(int, 1, 10_000),
        default=32,
        help="requests one token may have in flight; more are answered 429 (default 32)",
    )
    p = cli.add("openapi", _agent("cmd_openapi"), "write the OpenAPI 3.1 document of the HTTP API")
    p.add_argument("--out", help="file to write (default: stdout)")

    tokens = cli.add_actions(
        "tokens",
        _agent("cmd_tokens"),
        "bearer tokens of the HTTP API and MCP over HTTP: create, list, revoke",
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


_PROFILES_HELP = "tool profiles:\n" + "\n".join(f"  {name:<10} {line}" for name, line in DESCRIPTIONS.items())


def _profile_option(p: argparse.ArgumentParser, help: str, default: str | None) -> None:
    """``--profile``: one of the profiles the epilog describes; a profile's old name is still
    taken (as the profile it now names), and never offered."""
    p.add_argument("--profile", type=canonical, choices=list(DESCRIPTIONS), default=default, help=help)


def _operations(cli: Commands) -> None:
    p = cli.add(
        "console",
        _operator("cmd_console"),
        "the memory console in a browser: users, search, timelines, forgetting, live",
    )
    p.add_argument("--port", type=_bounded(int, 1, 65_535), default=8780, help="port to listen on (default 8780)")
    p.add_argument("--host", default="127.0.0.1", help="interface to listen on (loopback by default)")

    cli.add("health", _operator("cmd_health"), "bus reachable? projection and request-group lag, pending deletions")

    p = cli.add(
        "model", _operator("cmd_model"), "prepare the embedding model: export it to ONNX under the model cache (once)"
    )
    p.add_argument("--encoder", choices=ENCODER_KINDS, help="default: ENGRAM_ENCODER (onnx)")

    keys = cli.add_actions(
        "keys",
        _operator("cmd_keys"),
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

    p = cli.add("export", _operator("cmd_export"), "write the raw event log (sealed) and data keys as JSON lines")
    p.add_argument("--out", required=True)
    p = cli.add("import", _operator("cmd_import"), "replay an export into an empty store (same master key)")
    p.add_argument("source")

    p = cli.add("docs", _operator("cmd_docs"), "write the AsyncAPI 3.0 document of every channel and message")
    p.add_argument("--out", help="file to write (default: stdout)")

    p = cli.add("schema", _operator("cmd_schema"), "write the JSON Schema of every contract")
    p.add_argument("--out", help="file to write (default: stdout)")

    from engram_ledger.services.ops.acl import ROLES as ACL_ROLES

    p = cli.add(
        "acl", _operator("cmd_acl"), "Redis ACL users with least privilege, one per role: print them, or --write files"
    )
    p.add_argument("role", nargs="?", choices=list(ACL_ROLES), help="one role (default: all)")
    p.add_argument("--name", help="the ACL user's name (default engram-ROLE); an agent's replies are bound to it")
    p.add_argument("--cluster", action="store_true", help="also what a Redis Cluster client needs")
    p.add_argument("--write", metavar="DIR", help="write an ACL file and each role's URL (fresh passwords, 0600)")
    p.add_argument("--host", default="redis:6379", help="HOST:PORT in the URLs --write makes (default redis:6379)")
    p.add_argument("--database", type=int, default=0, help="the database in the URLs --write makes")
    p.add_argument(
        "--partitions",
        type=_bounded(int, 1, 1024),
        help="the deployment's partitions, each named in the rules (default: ENGRAM_PARTITIONS, else 1)",
    )


def _draft_default(field: str) -> str:
    default = next(f.default for f in msgspec.structs.fields(NoteDraft) if f.name == field)
    return str(getattr(default, "value", default))


def _time_argument(text: str) -> Any:
    """An ISO 8601 time; a year or a year and month alone is its start ("2023", "2023-05")."""
    if re.fullmatch(r"[0-9]{4}(-[0-9]{2})?", text.strip()):
        text = text.strip() + ("-01-01" if len(text.strip()) == 4 else "-01")
    try:
        return parse_time(text)
    except EngramError as e:
        raise argparse.ArgumentTypeError(e.message) from None


def _event_filters(p: argparse.ArgumentParser, what: str) -> None:
    """``--kinds`` and ``--user``, the same for every command that reads the log."""
    p.add_argument(
        "--kinds",
        action="append",
        metavar="KIND[,KIND...]",
        help=f"only these event types, comma-separated or repeated ({what})",
    )
    p.add_argument("--user", action="append", metavar="USER", help="only this user's events (repeat for several)")


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
