"""The guide's framework examples run as written: each adapter snippet, copied out of the docs as
they stand, runs in a fresh interpreter against a running `engram serve`, finding it as a user's
code would (``engram_url()``), and prints what its comments say it prints."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.support import ROOT, engram_env

DOCS = "\n".join(p.read_text() for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))])


def snippet(name: str) -> str:
    """The python block the docs mark with ``(example: <name>)``."""
    blocks = re.findall(r"```python\n(.*?)```", DOCS, flags=re.DOTALL)
    (found,) = [b for b in blocks if f"(example: {name})" in b]
    return found


@pytest.mark.parametrize(
    ("name", "printed"),
    [
        ("langgraph", "Alice likes sushi"),
        ("openai-agents", "Hi, I'm Alice"),
        ("autogen", "Alice is vegetarian"),
        ("client", "Alice's sister Sarah lives in Lisbon\nconfirmation_required\nforgotten"),
    ],
)
def test_a_readme_snippet_runs_as_shown(engram_url: str, name: str, printed: str) -> None:
    env = engram_env(ENGRAM_REDIS_URL=engram_url, HF_HUB_OFFLINE="1")
    run = subprocess.run(
        [sys.executable, "-c", snippet(name)], env=env, cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr
    assert printed in run.stdout
