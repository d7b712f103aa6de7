"""README's framework sections run as written: each adapter snippet, copied out of README.md
as it stands, runs in a fresh interpreter against a running `engram serve` and prints what its
comments say it prints."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.support import ROOT, engram_env

README = (ROOT / "README.md").read_text()


def snippet(name: str) -> str:
    """The python block README marks with ``(readme: <name>)``."""
    blocks = re.findall(r"```python\n(.*?)```", README, flags=re.DOTALL)
    (found,) = [b for b in blocks if f"(readme: {name})" in b]
    return found


@pytest.mark.parametrize(
    ("name", "printed"),
    [
        ("langgraph", "Alice likes sushi"),
        ("openai-agents", "Hi, I'm Alice"),
        ("autogen", "Alice is vegetarian"),
    ],
)
def test_a_readme_snippet_runs_as_shown(engram_url: str, name: str, printed: str) -> None:
    env = engram_env(ENGRAM_REDIS_URL=engram_url, HF_HUB_OFFLINE="1")
    run = subprocess.run(
        [sys.executable, "-c", snippet(name)], env=env, cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr
    assert printed in run.stdout
