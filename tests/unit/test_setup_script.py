"""scripts/setup.sh as a person reads it: one line per step, pip's output in .venv/setup.log, and a
failure that shows the log's end and says where the log is. pip is a stand-in here (a
``.venv/bin/python`` that prints as much as pip does), so no package is installed."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from tests.support import ROOT

# pip, as the set-up calls it: a screen of output for every call; it fails when FAIL_PIP is set.
PIP = """#!/usr/bin/env bash
for i in $(seq 1 60); do echo "Collecting package-$i ($*)"; done
echo "a warning on stderr" >&2
if [ -n "${FAIL_PIP:-}" ] && [[ "$*" == *" -e "* ]]; then echo "ERROR: No matching distribution for torch"; exit 1; fi
"""


def checkout(tmp_path: Path, stamped: bool) -> Path:
    """A copy of the set-up's files with a .venv whose python is the stand-in; ``stamped``: the
    dev tools already installed (their stamp newer than pyproject.toml and setup.py)."""
    (tmp_path / "scripts").mkdir()
    shutil.copy2(ROOT / "scripts" / "setup.sh", tmp_path / "scripts" / "setup.sh")
    for name in ("pyproject.toml", "setup.py"):
        shutil.copy2(ROOT / name, tmp_path / name)
        os.utime(tmp_path / name, (1_000_000_000, 1_000_000_000))
    python = tmp_path / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(PIP)
    python.chmod(0o755)
    if stamped:
        (tmp_path / ".venv" / ".engram-installed-dev").touch()
    return tmp_path


def setup(root: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "scripts/setup.sh"],
        cwd=root,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_an_installed_venv_is_one_line(tmp_path: Path) -> None:
    done = setup(checkout(tmp_path, stamped=True))
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["setup: .venv is up to date (Engram with dev)"]
    assert done.stderr == ""


def test_an_install_is_a_line_per_step_and_pip_goes_to_the_log(tmp_path: Path) -> None:
    root = checkout(tmp_path, stamped=False)
    done = setup(root, ENGRAM_EXTRAS="dev,langgraph")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 3 and done.stderr == "", done.stdout + done.stderr
    assert lines[0].startswith("setup: installing Engram and its dependencies into .venv (first run")
    assert ".venv/setup.log" in lines[0]
    assert lines[1].startswith("setup: preparing the embedding model (once per machine")
    assert lines[2].startswith("setup: done in ") and lines[2].endswith(" s")
    log = (root / ".venv" / "setup.log").read_text()
    assert "Collecting package-60 (-m pip install --progress-bar off -e .[dev,langgraph])" in log
    assert "a warning on stderr" in log
    assert "Collecting package-60 (-m engram_ledger.services.cli model)" in log
    assert (root / ".venv" / ".engram-installed-langgraph").exists()
    # pyproject.toml changed since: the next run installs again, and says it updates.
    for stamp in (root / ".venv").glob(".engram-installed-*"):
        os.utime(stamp, (1_000_000_001, 1_000_000_001))
    (root / "pyproject.toml").touch()
    again = setup(root)
    assert again.stdout.splitlines()[0].startswith("setup: updating Engram's packages in .venv"), again.stdout


def test_a_failed_install_shows_the_end_of_the_log_and_where_it_is(tmp_path: Path) -> None:
    root = checkout(tmp_path, stamped=False)
    done = setup(root, FAIL_PIP="1")
    assert done.returncode == 1
    assert len(done.stdout.splitlines()) == 1  # the step that was running
    err = done.stderr.splitlines()
    assert err[0].startswith("setup: failed: .venv/bin/python -m pip install")
    assert "ERROR: No matching distribution for torch" in done.stderr
    assert len(err) < 40, "the end of the log, not all of it"
    assert err[-1] == f"setup: the whole output is in {root / '.venv' / 'setup.log'}"
    assert not (root / ".venv" / ".engram-installed-dev").exists()


def test_the_test_script_says_one_line_for_the_checks_unless_they_find_something(tmp_path: Path) -> None:
    root = checkout(tmp_path, stamped=True)
    shutil.copy2(ROOT / "scripts" / "test.sh", root / "scripts" / "test.sh")
    for extra in ("langgraph", "openai-agents", "autogen", "claude", "adk", "llamaindex", "integrations-test"):
        (root / ".venv" / f".engram-installed-{extra}").touch()
    banner = (
        'echo Contracts; echo ---------; if [ -n "${BROKEN:-}" ]; then echo "Engram\'s layers BROKEN"; exit 1; fi\n'
        'echo "Engram\'s layers KEPT"\n'
    )
    for tool, body in (("lint-imports", banner), ("ruff", "exit 0\n")):
        (root / ".venv" / "bin" / tool).write_text("#!/usr/bin/env bash\n" + body)
        (root / ".venv" / "bin" / tool).chmod(0o755)
    # The TypeScript client's tests are not this copy's: only the Python side is looked at.
    quiet = {**os.environ, "ENGRAM_TEST_TYPESCRIPT": "off"}
    done = subprocess.run(["bash", "scripts/test.sh"], cwd=root, env=quiet, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[:2] == [
        "setup: .venv is up to date (Engram with dev, langgraph, openai-agents, autogen, claude, adk, llamaindex, "
        "integrations-test)",
        "test: checking the layers (lint-imports) and the code (ruff)",
    ]
    assert "KEPT" not in done.stdout and lines[2].startswith("Collecting package-1 (-m pytest")

    broken = subprocess.run(
        ["bash", "scripts/test.sh"], cwd=root, env={**quiet, "BROKEN": "1"}, capture_output=True, text=True
    )
    assert broken.returncode == 1 and "Engram's layers BROKEN" in broken.stderr
