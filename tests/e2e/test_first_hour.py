"""What a new user meets in the first hour, through the surface where they meet it: the AutoGen
memory that must not erase notes it never wrote, servers that say where they listen and what
fails, a busy port in one line, and progress for a long export."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from autogen_core.memory import MemoryContent, MemoryMimeType
from autogen_core.model_context import BufferedChatCompletionContext
from autogen_core.models import UserMessage

from engram_ledger.services import cli
from engram_ledger.services.bus.client import EngramClient
from engram_ledger.services.integrations.autogen import AUTOGEN_CATEGORY, EngramMemory
from tests.support import ENGRAM_CLI, ROOT, engram_env


async def test_the_autogen_memory_keeps_to_its_own_category_and_clears_only_that(
    engram: EngramClient, user: str
) -> None:
    mine = await engram.save(user, "Alec retired in May", advise=False)  # the user's own, as the CLI saves it
    memory = EngramMemory(engram, user_id=user)
    assert memory.category == AUTOGEN_CATEGORY != "general"
    await memory.add(MemoryContent(content="Alice is vegetarian", mime_type=MemoryMimeType.TEXT))
    context = BufferedChatCompletionContext(buffer_size=5)
    await context.add_message(UserMessage(content="What should I cook for Alice?", source="user"))
    await memory.update_context(context)
    block = str((await context.get_messages())[-1].content)
    assert "Alice is vegetarian" in block
    assert "tool" not in block, "an AutoGen agent has no update tool: the block names none"

    await memory.clear()
    left = await engram.list_notes(user, include_superseded=True, after=memory.token)
    assert [n.content for n in left.notes] == ["Alec retired in May"]
    assert left.notes[0].id == mine.note_id

    shared = EngramMemory(engram, user_id=user, category="general")
    with pytest.raises(ValueError, match="category of its own"):
        await shared.clear()
    assert (await engram.list_notes(user)).total == 1


def _busy_port() -> tuple[socket.socket, int]:
    holder = socket.create_server(("127.0.0.1", 0))
    return holder, holder.getsockname()[1]


def test_mcp_over_http_says_where_it_serves_and_a_busy_port_is_one_line(engram_url: str) -> None:
    env = engram_env(ENGRAM_REDIS_URL=engram_url)
    holder, port = _busy_port()
    with holder:
        busy = subprocess.run(
            [*ENGRAM_CLI, "mcp", "--http", str(port)],
            env=env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert busy.returncode == 1
    assert busy.stderr.strip().splitlines() == [
        f"engram: INVALID_PARAMETER: cannot listen on 127.0.0.1:{port}: Address already in use; "
        "choose another with --http PORT"
    ], busy.stderr

    holder, port = _busy_port()
    holder.close()
    server = subprocess.Popen(
        [*ENGRAM_CLI, "mcp", "--profile", "runtime", "--http", str(port)],
        env=env,
        cwd=ROOT,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stderr is not None
        line = server.stderr.readline()
        assert f"the runtime profile over streamable HTTP at http://127.0.0.1:{port}/mcp" in line, line
    finally:
        server.terminate()
        server.wait(timeout=20)


def test_the_relay_says_where_it_posts_and_logs_a_failed_post(engram_url: str, user: str) -> None:
    async def save() -> None:
        async with EngramClient(engram_url) as client:
            await client.save(user, "something to relay", advise=False)

    asyncio.run(save())
    holder, port = _busy_port()
    holder.close()  # nothing listens there: every post fails
    env = engram_env(ENGRAM_REDIS_URL=engram_url)
    relay = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "engram_ledger.services.cli",
            "relay",
            "--url",
            f"http://127.0.0.1:{port}/hook",
            "--group",
            f"first-hour-{user}",
            "--from-start",
            "--user",
            user,
            "--secret-file",
            str(ROOT / "tests" / "e2e" / "conftest.py"),  # any file of 16 characters or more
        ],
        env=env,
        cwd=ROOT,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: list[str] = []
    try:
        assert relay.stderr is not None
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not any("failed" in line for line in lines):
            lines.append(relay.stderr.readline())
    finally:
        relay.terminate()
        relay.wait(timeout=20)
    said = "".join(lines)
    assert f"relaying the log to http://127.0.0.1:{port}/hook" in said, said
    assert "post of event" in said and "failed: ConnectError" in said, said


def test_export_shows_progress_on_a_terminal_and_none_under_json(
    engram_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("ENGRAM_REDIS_URL", engram_url)
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    assert cli.main(["export", "--out", str(tmp_path / "a.jsonl")]) == 0
    shown = capsys.readouterr()
    assert "export: 100%" in shown.err, shown.err
    assert cli.main(["export", "--json", "--out", str(tmp_path / "b.jsonl")]) == 0
    quiet = capsys.readouterr()
    assert quiet.err == "" and json.loads(quiet.out)["events"] > 0
