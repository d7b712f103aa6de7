"""One command line: parse it, run its subcommand, and turn every failure into an exit status and
an error a person (or, under ``--json``, a program) can act on."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from collections.abc import Iterator

from engram_ledger.contracts.errors import EngramError, ErrorCode
from engram_ledger.services.cli.parser import UsageError, build_parser
from engram_ledger.services.config import SettingError


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    as_json = _asks_for_json(argv)
    try:
        try:
            parser = build_parser()
            args = parser.parse_args(argv)
            _check_text(parser, args)
            code = int(args.run(args) or 0)
        except UsageError as e:
            if not as_json:
                e.parser.print_usage(sys.stderr)
                print(f"{e.parser.prog}: error: {e.message}", file=sys.stderr)
                return 2
            return _fail(as_json, ErrorCode.INVALID_PARAMETER.value, f"{e.parser.prog}: {e.message}")
        except EngramError as e:
            return _fail(as_json, e.code.value, e.message, e.command_id)
        except SettingError as e:
            return _fail(as_json, ErrorCode.INVALID_PARAMETER.value, f"bad configuration: {e}")
        except OSError as e:
            if e.filename is None:
                raise
            return _fail(as_json, ErrorCode.INVALID_PARAMETER.value, f"cannot open {e.filename}: {e.strerror}")
        except Exception as e:
            failure = _redis_failure(e)
            if failure is None:
                raise
            return _fail(as_json, *failure)
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


def _redis_failure(e: Exception) -> tuple[str, str] | None:
    """The error code and message of a Redis failure the operator commands (tail, export,
    rebuild...) meet talking to Redis themselves; None for any other exception. Redis is imported
    by the commands that use it, never here: an error of redis-py can only come from a command
    that imported it."""
    exceptions = sys.modules.get("redis.exceptions")
    if exceptions is None:
        return None
    if isinstance(e, exceptions.NoPermissionError):
        # An admin command (health, export, rebuild...) run as a role that may not do it.
        refused = f"Redis refused this command to its user: {e}; `engram acl` says what each role may do"
        return ErrorCode.PERMISSION_DENIED.value, refused
    if isinstance(e, exceptions.ConnectionError | exceptions.TimeoutError | exceptions.RedisClusterException):
        return ErrorCode.UNAVAILABLE.value, f"cannot reach the Engram bus: {e}"
    return None


def _asks_for_json(argv: list[str]) -> bool:
    """Whether ``--json`` (or an abbreviation argparse would take for it) comes before ``--``:
    known before parsing, so that an argument error can be answered in JSON too."""
    options = argv[: argv.index("--")] if "--" in argv else argv
    return any(len(a) > 2 and "--json".startswith(a) for a in options)


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
