"""The docs' examples run as written, against a running `engram serve`: each Python snippet,
copied out of the docs as they stand, runs in a fresh interpreter, finding the service as a
user's code would (``engram_url()``), prints what its comments say it prints and exits with
nothing to warn about; README's command-line example runs line by line, in its order, and does
what each comment says."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Callable

import pytest

from tests.support import ROOT, cli, cli_text, engram_env

README = (ROOT / "README.md").read_text()
DOCS = "\n".join([README, *(p.read_text() for p in sorted((ROOT / "docs").glob("*.md")))])
# What a program that closes what it opened must never print at exit (`-W error -X dev` turns
# every warning into an error, and shows ResourceWarnings and asyncio's debug checks).
EXIT_NOISE = ("Task was destroyed", "Unclosed", "unclosed", "ResourceWarning", "was never awaited", "Exception ignored")


def snippet(name: str) -> str:
    """The python block the docs mark with ``(example: <name>)``."""
    blocks = re.findall(r"```python\n(.*?)```", DOCS, flags=re.DOTALL)
    (found,) = [b for b in blocks if f"(example: {name})" in b]
    return found


def run_strict(engram_url: str, program: str) -> subprocess.CompletedProcess[str]:
    """``program`` in a fresh interpreter with every warning an error (``-W error -X dev``)."""
    env = engram_env(ENGRAM_REDIS_URL=engram_url, HF_HUB_OFFLINE="1")
    return subprocess.run(
        [sys.executable, "-W", "error", "-X", "dev", "-c", program],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def assert_clean_exit(run: subprocess.CompletedProcess[str]) -> None:
    assert run.returncode == 0, run.stderr
    assert not [noise for noise in EXIT_NOISE if noise in run.stderr], run.stderr


@pytest.mark.parametrize(
    ("name", "printed"),
    [
        ("langgraph", "Alice likes sushi"),
        ("openai-agents", "Hi, I'm Alice"),
        ("autogen", "Alice is vegetarian"),
        (
            "claude",
            "1 saved Alice likes green tea\n2 updated Alice likes black tea\n"
            "Path /memories/../etc/passwd would escape /memories directory",
        ),
        ("adk", "I fly to Lisbon on May 3rd"),
        ("llamaindex", "user: My sister Sarah moved to Lisbon last spring."),
        ("client", "Alice's sister Sarah lives in Lisbon\nconfirmation_required\nforgotten"),
        ("adapters", ""),
    ],
)
def test_a_docs_snippet_runs_as_shown_and_exits_cleanly(engram_url: str, name: str, printed: str) -> None:
    run = run_strict(engram_url, snippet(name))
    assert_clean_exit(run)
    assert printed in run.stdout


STORE_USED = """
from engram_ledger.services import engram_url
from engram_ledger.services.integrations.langgraph import EngramStore

def remember() -> None:
    store = EngramStore(engram_url(), user_id="{user}")
    store.put(("memories",), "food", {{"content": "Alice likes sushi"}})
    print(store.search(("memories",), query="what does she like to eat?", limit=1)[0].value["content"])
"""


def test_a_store_dropped_without_close_leaves_nothing_to_warn(engram_url: str) -> None:
    program = STORE_USED.format(user=f"user-{uuid.uuid4().hex[:8]}") + textwrap.dedent(
        """
        import gc, threading, time

        remember()
        # The store is gone; its thread ends once the store has closed. What it leaves behind is
        # collected now, while the program still runs.
        deadline = time.monotonic() + 30
        while any(t.name == "engram-store" for t in threading.enumerate()) and time.monotonic() < deadline:
            time.sleep(0.01)
        gc.collect()
        print("collected")
        """
    )
    run = run_strict(engram_url, program)
    assert_clean_exit(run)
    assert run.stdout.splitlines() == ["Alice likes sushi", "collected"]


def test_a_store_still_open_at_exit_is_closed_without_a_warning(engram_url: str) -> None:
    program = STORE_USED.format(user=f"user-{uuid.uuid4().hex[:8]}").replace("def remember() -> None:\n", "if True:\n")
    run = run_strict(engram_url, program)
    assert_clean_exit(run)
    assert run.stdout == "Alice likes sushi\n"


# README's command-line example ------------------------------------------------------------------


def readme_cli_steps() -> list[tuple[str, str]]:
    """The `engram` lines of README's command-line example, in order: each one's command (after
    `engram`) and its comment."""
    section = README.split("### From the command line", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, flags=re.DOTALL)
    assert block is not None
    steps = []
    for line in block.group(1).splitlines():
        command, *comment = re.split(r"\s+#\s", line, maxsplit=1)
        if command.startswith("engram "):
            steps.append((command.removeprefix("engram "), "".join(comment)))
    return steps


class Walkthrough:
    """README's commands as a new user types them: `alice` is a user of the test's own, and each
    placeholder (`<old id>`, ...) is what an earlier command printed."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.user = f"alice-{uuid.uuid4().hex[:8]}"
        self.filled: dict[str, str] = {}
        self.last = ""

    def run(self, command: str) -> str:
        self.last = command
        for placeholder, value in self.filled.items():
            command = command.replace(placeholder, value)
        assert "<" not in command, f"README's `{command}` names something no earlier command printed"
        argv = [self.user if word == "alice" else word for word in shlex.split(command)]
        done = cli_text(self.env, *argv)
        assert done.returncode == 0, (argv, done.stdout, done.stderr)
        return done.stdout

    def status(self, note_id: str) -> str:
        """The note's status now, as `engram get --json` reads it."""
        code, note, err = cli(self.env, "get", "--user", self.user, note_id)
        assert code == 0, (note, err)
        return str(note["status"])


def _saved(printed: str) -> tuple[str, str]:
    found = re.match(r"saved (\w{8}) \(version 1\) token (\S+)", printed)
    assert found, printed
    return found[1], found[2]


def _ids(printed: str) -> list[str]:
    return re.findall(r"\[id:(\w{8})\]", printed)


def _first_save(walk: Walkthrough, printed: str) -> None:
    walk.filled["<old id>"], walk.filled["<first token>"] = _saved(printed)


def _second_save(walk: Walkthrough, printed: str) -> None:
    walk.filled["<new id>"], _ = _saved(printed)
    # It names the first note as one the new one may make outdated.
    assert "outdated" in printed and walk.filled["<old id>"] in printed


def _supersede(walk: Walkthrough, printed: str) -> None:
    assert walk.status(walk.filled["<old id>"]) == "superseded"


def _search(walk: Walkthrough, printed: str) -> None:
    assert "No memory matched" not in printed
    assert _ids(printed) == [walk.filled["<new id>"]]
    relevance = re.findall(r"^(\d\.\d+) \[id:", printed, flags=re.MULTILINE)
    assert len(relevance) == 1 and 0 < float(relevance[0]) <= 1


def _history(walk: Walkthrough, printed: str) -> None:
    v1, v2 = printed.splitlines()
    assert v1.startswith("v1 ") and "saved" in v1 and "Alec is my boss" in v1
    assert v2.startswith("v2 ") and "superseded" in v2 and walk.filled["<new id>"] in v2


def _as_of(walk: Walkthrough, printed: str) -> None:
    # Right after the first save the memory held that note alone, not yet superseded.
    assert _ids(printed) == [walk.filled["<old id>"]] and "Alec is my boss" in printed


def _context(walk: Walkthrough, printed: str) -> None:
    assert "## Your Memory" in printed and "Alec retired in May" in printed
    assert "Alec is my boss" not in printed


def _candidates(walk: Walkthrough, printed: str) -> None:
    assert walk.filled["<new id>"] in printed and "Alec retired in May" in printed
    assert walk.status(walk.filled["<new id>"]) == "active"


def _forget_twice(walk: Walkthrough, printed: str) -> None:
    assert walk.status(walk.filled["<new id>"]) == "active", "the first call only asks"
    walk.run(walk.last)
    assert walk.status(walk.filled["<new id>"]) == "forgotten"


# Each line of the example (its subcommand) and what its comment promises, in README's order.
PROMISES: list[tuple[str, Callable[[Walkthrough, str], None]]] = [
    ("save", _first_save),
    ("save", _second_save),
    ("supersede", _supersede),
    ("search", _search),
    ("history", _history),
    ("list", _as_of),
    ("context", _context),
    ("forget", _candidates),
    ("forget", _forget_twice),
]


def test_the_readme_command_line_example_does_what_its_comments_say(engram_url: str) -> None:
    steps = readme_cli_steps()
    assert [command.split()[0] for command, _ in steps] == [name for name, _ in PROMISES], (
        "README's command-line example changed: say here what each line promises"
    )
    walk = Walkthrough(engram_env(ENGRAM_REDIS_URL=engram_url, HF_HUB_OFFLINE="1"))
    for (command, comment), (_, promise) in zip(steps, PROMISES, strict=True):
        printed = walk.run(command)
        try:
            promise(walk, printed)
        except (AssertionError, ValueError) as e:
            raise AssertionError(f"`engram {command}` (# {comment}) printed:\n{printed}") from e
