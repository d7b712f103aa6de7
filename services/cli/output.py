"""How a subcommand answers: one JSON object under ``--json``, words for a person otherwise
(``render``), progress bars on a terminal, and log lines for the commands that keep running."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from engram_ledger.services.cli import render


def print_result(args: argparse.Namespace, obj: Any, human: Callable[[Any], render.Text | str] | None = None) -> None:
    """``obj`` as one JSON object under ``--json``; else ``human(obj)``, for a person (see render)."""
    if args.json or human is None:
        sys.stdout.write(msgspec.json.encode(obj).decode() + "\n")
    else:
        render.show(human(obj))


def progress(args: argparse.Namespace) -> Callable[[str, int | None], Any]:
    """A progress bar per step of a long command (tqdm, on stderr), shown on a terminal only and
    never under ``--json``."""

    def bar(what: str, total: int | None) -> Any:
        from tqdm import tqdm

        return tqdm(total=total, desc=what, unit="event", file=sys.stderr, disable=args.json or not sys.stderr.isatty())

    return bar


def log_to_terminal() -> None:
    """For the commands that keep running (relay, mcp --http, console): what they do and what
    fails goes to stderr, one line each."""
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("engram").setLevel(logging.INFO)


def write_document(args: argparse.Namespace, document: dict[str, Any]) -> int:
    text = json.dumps(document, indent=2, sort_keys=True)
    if args.out:
        Path(args.out).write_text(text + "\n")
        print_result(args, {"written": args.out}, lambda o: f"wrote {o['written']}")
    else:
        print(text)
    return 0
