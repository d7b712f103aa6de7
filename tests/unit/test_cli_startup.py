"""The `engram` command answers at once and speaks to people: its help imports nothing heavy (each
command imports what it uses when it runs), the bus client a command uses imports no FastStream,
help texts name no spec sections, and every tool profile says what it is for."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Iterator

import pytest

from engram_ledger.services.agents.profiles import ALIASES, DESCRIPTIONS
from engram_ledger.services.agents.tools import PROFILES
from engram_ledger.services.cli.parser import build_parser
from tests.support import ROOT, cli_text, engram_env

# What a command pays for only when it uses it: Redis and its OpenTelemetry, the bus framework,
# the terminal renderer, time parsing, schemas, the model and the index, the web servers.
HEAVY = (
    "redis",
    "opentelemetry",
    "faststream",
    "fast_depends",
    "pydantic",
    "rich",
    "dateparser",
    "jsonschema",
    "cryptography",
    "qdrant_edge",
    "qdrant_client",
    "numpy",
    "onnxruntime",
    "torch",
    "sentence_transformers",
    "transformers",
    "tokenizers",
    "starlette",
    "uvicorn",
    "mcp",
    "httpx",
    "jinja2",
    "tqdm",
)
# What a command over a user's memory (get, search...) needs to ask the bus, and what it does not.
NOT_FOR_A_CLIENT = ("faststream", "fast_depends", "pydantic", "jsonschema", "numpy", "qdrant_edge", "dateparser")


def imported_by(code: str) -> set[str]:
    """The top-level packages a fresh interpreter has imported after running ``code``."""
    probe = f"{code}\nimport json, sys\nprint(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}})))"
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, env=engram_env(), capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return set(json.loads(done.stdout.splitlines()[-1]))


@pytest.mark.parametrize("argv", [["--help"], ["--version"], ["get", "--help"], ["mcp", "--help"]])
def test_the_help_imports_nothing_heavy(argv: list[str]) -> None:
    code = (
        "import contextlib, io\n"
        "from engram_ledger.services.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
        f"    main({argv!r})"
    )
    assert imported_by(code) & set(HEAVY) == set()


def test_the_bus_client_of_a_users_commands_imports_no_faststream() -> None:
    # What `engram get` imports: its command's module, and the client it opens when it runs.
    code = "from engram_ledger.services.cli import notes\nfrom engram_ledger.services.bus.client import EngramClient"
    imported = imported_by(code)
    assert "redis" in imported, "the probe sees what the client imports"
    assert imported & set(NOT_FOR_A_CLIENT) == set()


def every_parser(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from every_parser(sub)


def test_no_help_text_names_a_spec_section() -> None:
    for parser in every_parser(build_parser()):
        shown = parser.format_help()
        for word in ("requirements", "§", "seed", "prd29"):
            assert word not in shown, (parser.prog, word)


def test_every_profile_says_what_it_is_for_and_an_old_name_is_taken_unsaid() -> None:
    assert list(DESCRIPTIONS) == list(PROFILES)
    for command in ("mcp", "tools"):
        shown = cli_text(engram_env(), command, "--help").stdout
        for name, description in DESCRIPTIONS.items():
            assert f"  {name:<10} {description}" in shown, (command, name)
        assert not any(old in shown for old in ALIASES), command
    old, new = next(iter(ALIASES.items()))
    listed = json.loads(cli_text(engram_env(), "tools", "--profile", old).stdout)
    assert listed["profile"] == new and [t["name"] for t in listed["tools"]] == [t.name for t in PROFILES[new]]
