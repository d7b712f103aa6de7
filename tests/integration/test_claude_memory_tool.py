"""``EngramMemoryTool`` as Claude meets it: the anthropic SDK's own tool runner, with a scripted
model (canned Messages API replies through an httpx mock transport, no network) that calls the
memory tool, against a real service on real Redis."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx2
import pytest
from anthropic import AsyncAnthropic

from engram_ledger.services.bus.client import EngramClient
from engram_ledger.services.integrations.claude_memory import EngramMemoryTool, memory_path

USER = "alice"


class ScriptedClaude:
    """Answers each Messages API request with the next scripted reply: a list of memory tool
    calls (a ``tool_use`` turn) or, at the end, a text. Keeps every request it was sent, and
    calls ``between`` before each reply (the tool results of the turn before are in by then)."""

    def __init__(self, turns: list[list[dict[str, Any]] | str], between: Callable[[int], None] | None = None) -> None:
        self.turns = list(turns)
        self.requests: list[dict[str, Any]] = []
        self.between = between

    def __call__(self, request: httpx2.Request) -> httpx2.Response:
        self.requests.append(json.loads(request.content))
        if self.between is not None:
            self.between(len(self.requests) - 1)
        turn = self.turns.pop(0)
        n = len(self.requests)
        if isinstance(turn, str):
            content: list[dict[str, Any]] = [{"type": "text", "text": turn}]
            stop = "end_turn"
        else:
            content = [
                {"type": "tool_use", "id": f"toolu_{n}_{i}", "name": "memory", "input": call}
                for i, call in enumerate(turn)
            ]
            stop = "tool_use"
        return httpx2.Response(
            200,
            json={
                "id": f"msg_{n}",
                "type": "message",
                "role": "assistant",
                "model": "claude-scripted",
                "content": content,
                "stop_reason": stop,
                "stop_sequence": None,
                "usage": {"input_tokens": 1, "output_tokens": 1},
            },
        )

    def tool_results(self) -> list[dict[str, Any]]:
        """Every tool result the runner sent back, in order."""
        found: list[dict[str, Any]] = []
        for request in self.requests:
            last = request["messages"][-1]
            if last["role"] == "user" and isinstance(last["content"], list):
                found.extend(block for block in last["content"] if block.get("type") == "tool_result")
        return found


def text_of(result: dict[str, Any]) -> str:
    content = result.get("content")
    if isinstance(content, str):
        return content
    return "\n".join(block.get("text", "") for block in content or [])


async def run(tool: EngramMemoryTool, claude: ScriptedClaude) -> str:
    http = httpx2.AsyncClient(transport=httpx2.MockTransport(claude))
    async with AsyncAnthropic(api_key="test", http_client=http) as anthropic:
        runner = anthropic.beta.messages.tool_runner(
            model="claude-scripted",
            max_tokens=1024,
            messages=[{"role": "user", "content": "Remember what I tell you."}],
            tools=[tool],
        )
        final = await runner.until_done()
    block = final.content[0]
    return block.text if block.type == "text" else ""


PREFS = "/memories/notes/prefs.md"


async def test_the_runner_creates_edits_views_renames_and_deletes_files_with_history_and_time_travel(
    client: EngramClient,
) -> None:
    tool = EngramMemoryTool(client, user_id=USER)
    assert tool.to_dict() == {"type": "memory_20250818", "name": "memory"}
    tokens: dict[int, str | None] = {}
    claude = ScriptedClaude(
        [
            [{"command": "view", "path": "/memories"}],
            [{"command": "create", "path": PREFS, "file_text": "Alice likes green tea\nShe lives in Lisbon\n"}],
            [{"command": "str_replace", "path": PREFS, "old_str": "green tea", "new_str": "black coffee"}],
            [{"command": "insert", "path": PREFS, "insert_line": 1, "insert_text": "She works at TechCorp"}],
            [{"command": "view", "path": PREFS}],
            [{"command": "create", "path": "/memories/scratch.txt", "file_text": "a passing thought"}],
            [{"command": "delete", "path": "/memories/scratch.txt"}],
            [{"command": "rename", "old_path": PREFS, "new_path": "/memories/alice.md"}],
            [{"command": "view", "path": "/memories"}],
            "Noted.",
        ],
        between=lambda step: tokens.__setitem__(step, tool.token),
    )
    assert await run(tool, claude) == "Noted."

    results = claude.tool_results()
    assert not [r for r in results if r.get("is_error")], results
    said = [text_of(r) for r in results]
    assert said[0].endswith("0B\t/memories")  # nothing yet
    assert said[1] == f"File created successfully at: {PREFS}"
    assert "black coffee" in said[2] and "snippet" in said[2]
    assert said[3] == f"The file {PREFS} has been edited."
    assert said[4] == (
        f"Here's the content of {PREFS} with line numbers:\n"
        "     1\tAlice likes black coffee\n     2\tShe works at TechCorp\n     3\tShe lives in Lisbon\n     4\t"
    )
    assert said[6] == "Successfully deleted /memories/scratch.txt"
    assert said[7] == f"Successfully renamed {PREFS} to /memories/alice.md"
    listing = said[8].splitlines()
    assert listing[0].startswith("Here're the files and directories up to 2 levels deep in /memories")
    assert [line.split("\t")[1] for line in listing[1:]] == ["/memories", "/memories/alice.md"]

    # Every version of the file, across its rename: created, edited twice, moved.
    history = await tool.history("/memories/alice.md")
    assert [(v.path, v.change) for v in history] == [
        (PREFS, "saved"),
        (PREFS, "updated"),
        (PREFS, "updated"),
        (PREFS, "superseded"),
        ("/memories/alice.md", "saved"),
    ]
    assert history[0].text == "Alice likes green tea\nShe lives in Lisbon\n"
    assert history[-1].text == history[2].text

    # The directory and the file as they were right after the create (the token it returned).
    created = tokens[2]
    assert created is not None
    then = await tool.view_as_of("/memories", created)
    assert [line.split("\t")[1] for line in then.splitlines()[1:]] == ["/memories", "/memories/notes/", PREFS]
    assert "green tea" in await tool.view_as_of(PREFS, created)

    # The deleted file is forgotten: its text is gone, from the past too (crypto-shredded).
    now = await client.list_notes(USER, category="claude-memory", include_superseded=True, after=tool.token)
    assert all(note.key != "/memories/scratch.txt" for note in now.notes)
    assert "scratch" not in await tool.view_as_of("/memories", tokens[6] or "")
    found = await client.search(USER, "a passing thought", category="claude-memory", min_relevance=0, after=tool.token)
    assert all("passing thought" not in hit.content for hit in found.results)


async def test_errors_reach_claude_worded_as_the_sdk_words_them(client: EngramClient) -> None:
    tool = EngramMemoryTool(client, user_id=USER)
    claude = ScriptedClaude(
        [
            [{"command": "create", "path": "/memories/todo.md", "file_text": "buy milk\nbuy bread\n"}],
            [
                {"command": "view", "path": "/memories/missing.md"},
                {"command": "str_replace", "path": "/memories/todo.md", "old_str": "buy", "new_str": "get"},
                {"command": "str_replace", "path": "/memories/todo.md", "old_str": "eggs", "new_str": "ham"},
                {"command": "view", "path": "/memories/../etc/passwd"},
                {"command": "view", "path": "/memories/%2e%2e/secrets"},
                {"command": "create", "path": "/etc/passwd", "file_text": "x"},
                {"command": "create", "path": "/memories/todo.md", "file_text": "again"},
                {"command": "insert", "path": "/memories/todo.md", "insert_line": 9, "insert_text": "x"},
                {"command": "delete", "path": "/memories/missing.md"},
                {"command": "delete", "path": "/memories"},
                {"command": "rename", "old_path": "/memories/missing.md", "new_path": "/memories/b.md"},
            ],
            "Done.",
        ]
    )
    await run(tool, claude)
    results = claude.tool_results()
    errors = [(r.get("is_error", False), text_of(r)) for r in results[1:]]
    assert errors == [
        (True, "The path /memories/missing.md does not exist. Please provide a valid path."),
        (
            True,
            "No replacement was performed. Multiple occurrences of old_str `buy` in lines: 1, 2. Please ensure it "
            "is unique",
        ),
        (True, "No replacement was performed, old_str `eggs` did not appear verbatim in /memories/todo.md."),
        (True, "Path /memories/../etc/passwd would escape /memories directory"),
        (True, "Path /memories/%2e%2e/secrets would escape /memories directory"),
        (True, "Path must start with /memories, got: /etc/passwd"),
        (True, "File /memories/todo.md already exists"),
        (True, "Invalid `insert_line` parameter: 9. It should be within the range [0, 2]."),
        (True, "The path /memories/missing.md does not exist"),
        (True, "Cannot delete the /memories directory itself"),
        (True, "The path /memories/missing.md does not exist"),
    ]
    # Nothing of it changed the file.
    note = await client.get_by_key(USER, "claude-memory", "/memories/todo.md", after=tool.token)
    assert note is not None and note.version == 1


async def test_each_user_sees_only_their_own_files(client: EngramClient) -> None:
    alice = EngramMemoryTool(client, user_id="alice")
    bob = EngramMemoryTool(client, user_id="bob")
    await run(alice, ScriptedClaude([[{"command": "create", "path": "/memories/a.md", "file_text": "mine"}], "ok"]))
    claude = ScriptedClaude(
        [[{"command": "view", "path": "/memories/a.md"}, {"command": "view", "path": "/memories"}], "ok"]
    )
    await run(bob, claude)
    missing, listing = claude.tool_results()
    assert missing.get("is_error") and "does not exist" in text_of(missing)
    assert "a.md" not in text_of(listing)


async def test_an_edit_that_loses_a_race_is_made_again_on_the_winners_text(client: EngramClient) -> None:
    tool = EngramMemoryTool(client, user_id=USER)
    await run(tool, ScriptedClaude([[{"command": "create", "path": "/memories/list.md", "file_text": "one\n"}], "ok"]))
    note = await client.get_by_key(USER, "claude-memory", "/memories/list.md", after=tool.token)
    assert note is not None
    original_put = client.put
    raced = False

    async def put_after_a_rival(*args: Any, **kwargs: Any) -> Any:
        nonlocal raced
        if not raced:  # another writer edits the file between the tool's read and its write
            raced = True
            await original_put(
                USER, "claude-memory", "/memories/list.md", {"path": "/memories/list.md", "text": "zero\none\n"}
            )
        return await original_put(*args, **kwargs)

    client.put = put_after_a_rival  # type: ignore[method-assign]
    try:
        await run(
            tool,
            ScriptedClaude(
                [[{"command": "str_replace", "path": "/memories/list.md", "old_str": "one", "new_str": "1"}], "ok"]
            ),
        )
    finally:
        client.put = original_put  # type: ignore[method-assign]
    after = await client.get_by_key(USER, "claude-memory", "/memories/list.md", after=tool.token)
    assert after is not None and after.value == {"path": "/memories/list.md", "text": "zero\n1\n"}
    assert after.version == 3


@pytest.mark.parametrize(
    ("given", "canonical"),
    [("/memories", "/memories"), ("/memories/", "/memories"), ("/memories//a/./b.md", "/memories/a/b.md")],
)
def test_paths_are_canonical(given: str, canonical: str) -> None:
    assert memory_path(given) == canonical


@pytest.mark.parametrize(
    "path",
    [
        "/memories/a/../../x",
        "/memories/%252e%252e/x",
        "/memories/a\\..\\x",
        "/memoriesx",
        "memories/a",
        "/memories/a\x00",
    ],
)
def test_escaping_paths_are_refused(path: str) -> None:
    from anthropic.lib.tools import ToolError

    with pytest.raises(ToolError):
        memory_path(path)
