"""The HTTP API's routes against a real service on the real Redis, through ``engram http``'s app:
each resource's happy path, idempotency, read-your-writes, time travel, paging, the two-call
forget and erasures, the error bodies, and MCP on the same port."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from tests.conftest import RunningService
from tests.integration.http_api import Api, api_in_front_of

pytestmark = pytest.mark.integration


@pytest.fixture
async def api(service: RunningService) -> AsyncIterator[Api]:
    async with api_in_front_of(service.settings.redis_url) as running:
        yield running


def key() -> dict[str, str]:
    return {"Idempotency-Key": uuid.uuid4().hex}


def after(written: httpx.Response) -> dict[str, str]:
    return {"Engram-Read-After": written.headers["Engram-Token"]}


async def test_a_note_saved_read_updated_and_listed_over_http(api: Api) -> None:
    async with await api.as_user("alice") as alice:
        saved = await alice.post("/v1/notes", json={"content": "Alec is my boss", "subject": "Alec", "advise": False})
        assert saved.status_code == 201, saved.text
        body = saved.json()
        assert body["type"] == "note_written" and body["version"] == 1
        assert saved.headers["Engram-Token"] == body["token"]
        note = body["note_id"]

        got = await alice.get(f"/v1/notes/{note}", headers=after(saved))
        assert got.status_code == 200 and got.json()["note"]["content"] == "Alec is my boss"

        changed = await alice.patch(f"/v1/notes/{note}", json={"content": "Alec was my boss", "expected_version": 1})
        assert changed.status_code == 200 and changed.json()["version"] == 2, changed.text
        stale = await alice.patch(f"/v1/notes/{note}", json={"content": "again", "expected_version": 1})
        assert stale.status_code == 409 and stale.json()["error"]["code"] == "VERSION_CONFLICT"

        then = await alice.get(f"/v1/notes/{note}", params={"as_of": body["token"]}, headers=after(changed))
        assert then.json()["note"]["content"] == "Alec is my boss", "as_of reads the note as it was"
        history = await alice.get(f"/v1/notes/{note}/history", headers=after(changed))
        assert [v["version"] for v in history.json()["versions"]] == [1, 2]

        reverted = await alice.post(f"/v1/notes/{note}/revert", json={"to_version": 1}, headers=key())
        assert reverted.status_code == 200 and reverted.json()["version"] == 3, reverted.text
        diff = await alice.get("/v1/diff", params={"since": body["token"]}, headers=after(reverted))
        assert [c["change"] for c in diff.json()["changes"]] == ["updated", "reverted"], diff.text

        newer = await alice.post("/v1/notes", json={"content": "Dana is my boss", "advise": False})
        replaced = await alice.post(
            f"/v1/notes/{note}/supersede", json={"superseded_by": newer.json()["note_id"]}, headers=key()
        )
        assert replaced.status_code == 200, replaced.text
        listed = await alice.get("/v1/notes", headers=after(replaced))
        assert [n["content"] for n in listed.json()["notes"]] == ["Dana is my boss"]


async def test_a_listing_pages_and_reads_the_past(api: Api) -> None:
    async with await api.as_user("alice") as alice:
        batch = await alice.post(
            "/v1/notes/batch", json={"notes": [{"content": f"Fact number {i}"} for i in range(5)]}, headers=key()
        )
        assert batch.status_code == 201 and len(batch.json()["notes"]) == 5, batch.text
        later = await alice.post("/v1/notes", json={"content": "A later fact", "advise": False})
        pages = [
            (await alice.get("/v1/notes", params={"offset": offset, "limit": 2}, headers=after(later))).json()
            for offset in (0, 2, 4)
        ]
        assert [p["total"] for p in pages] == [6, 6, 6]
        assert sum(len(p["notes"]) for p in pages) == 6
        past = await alice.get("/v1/notes", params={"as_of": batch.json()["token"]}, headers=after(later))
        assert past.json()["total"] == 5, "the listing as it was after the batch"
        typo = await alice.get("/v1/notes", params={"limt": 2})
        assert typo.status_code == 400 and "limt" in typo.json()["error"]["message"]
        wrong = await alice.get("/v1/notes", params={"limit": "many"})
        assert wrong.status_code == 400 and "limit" in wrong.json()["error"]["message"]


async def test_an_idempotency_key_is_the_command_id(api: Api) -> None:
    async with await api.as_user("alice") as alice:
        same = key()
        first = await alice.post("/v1/notes", json={"content": "Ferry at 7:40", "advise": False}, headers=same)
        again = await alice.post("/v1/notes", json={"content": "Ferry at 7:40", "advise": False}, headers=same)
        assert first.status_code == again.status_code == 201
        assert again.json()["note_id"] == first.json()["note_id"] and again.json()["replayed"] is True
        assert again.headers["Idempotent-Replayed"] == "true" and "Idempotent-Replayed" not in first.headers
        other = await alice.post("/v1/notes", json={"content": "Ferry at 8:10", "advise": False}, headers=same)
        assert other.status_code == 409 and other.json()["error"]["code"] == "IDEMPOTENCY_CONFLICT"
        bad = await alice.post("/v1/notes", json={"content": "x"}, headers={"Idempotency-Key": "has spaces"})
        assert bad.status_code == 400 and "Idempotency-Key" in bad.json()["error"]["message"]


async def test_search_and_the_memory_block_see_the_write_they_are_given(api: Api) -> None:
    async with await api.as_user("alice") as alice:
        saved = await alice.post("/v1/notes", json={"content": "Alec is my boss at TechCorp", "advise": False})
        found = await alice.post(
            "/v1/search", json={"query": "who is my manager?", "min_relevance": 0}, headers=after(saved)
        )
        assert found.status_code == 200, found.text
        assert [h["note_id"] for h in found.json()["results"]] == [saved.json()["note_id"]]
        before = await alice.post(
            "/v1/search",
            json={"query": "who is my manager?", "min_relevance": 0, "as_of": "2001-01-01T00:00:00Z"},
            headers=after(saved),
        )
        assert before.json()["results"] == [], "the memory as it was then held nothing"
        block = await alice.post("/v1/context", json={}, headers=after(saved))
        assert block.status_code == 200 and "Alec is my boss at TechCorp" in block.json()["text"]


async def test_conversations_and_keyed_notes(api: Api) -> None:
    async with await api.as_user("alice") as alice:
        turns = [{"role": "user", "content": "I moved to Lisbon"}, {"role": "assistant", "content": "Noted!"}]
        recorded = await alice.post("/v1/conversations/chat-1/messages", json={"messages": turns}, headers=key())
        assert recorded.status_code == 201, recorded.text
        listed = await alice.get("/v1/conversations/chat-1/messages", headers=after(recorded))
        assert [m["content"] for m in listed.json()["messages"]] == ["I moved to Lisbon", "Noted!"]

        put = await alice.put("/v1/keys/ui%2Ftheme", json={"category": "settings", "value": {"theme": "dark"}})
        assert put.status_code == 200, put.text
        got = await alice.get("/v1/keys/ui%2Ftheme", params={"category": "settings"}, headers=after(put))
        assert got.status_code == 200 and got.json()["note"]["value"] == {"theme": "dark"}
        missing = await alice.get("/v1/keys/nothing", params={"category": "settings"}, headers=after(put))
        assert missing.status_code == 404 and missing.json()["error"]["code"] == "MEMORY_NOT_FOUND"


async def test_forgetting_takes_two_calls_and_erasures_are_an_operators(api: Api) -> None:
    async with await api.as_user("bob") as bob:
        saved = await bob.post("/v1/notes", json={"content": "Locker 12", "advise": False})
        await bob.post("/v1/conversations/chat-9/messages", json={"messages": [{"content": "hello"}]})
        note = saved.json()["note_id"]
        asked = await bob.post("/v1/forget", json={"note_ids": [note]}, headers=after(saved))
        assert asked.status_code == 202 and asked.json()["status"] == "confirmation_required", asked.text
        done = await bob.post("/v1/forget", json={"note_ids": [note], "confirmed": True})
        assert done.status_code == 200 and done.json()["forgotten"] == [note], "the second call; confirmed is ignored"
        gone = await bob.get(f"/v1/notes/{note}", headers=after(done))
        assert gone.json()["note"]["status"] == "forgotten"

    async with api.client(await api.token(None)) as operator:
        first = await operator.delete("/v1/users/bob/conversations/chat-9")
        assert first.status_code == 202, first.text
        second = await operator.delete("/v1/users/bob/conversations/chat-9")
        assert second.status_code == 200 and second.json()["status"] == "forgotten"
        assert (await operator.delete("/v1/users/bob")).status_code == 202
        erased = await operator.delete("/v1/users/bob")
        assert erased.status_code == 200 and erased.json()["erased_at"], erased.text
        # An operator names the user of an ordinary route in X-Engram-User.
        named = await operator.get("/v1/notes", headers={"X-Engram-User": "bob", **after(erased)})
        assert named.status_code == 200 and named.json()["total"] == 0
        unnamed = await operator.get("/v1/notes")
        assert unnamed.status_code == 400 and "X-Engram-User" in unnamed.json()["error"]["message"]


async def test_refusals_are_the_contracts_errors_with_their_statuses(api: Api) -> None:
    async with await api.as_user("alice") as alice:
        blank = await alice.post("/v1/notes", json={"content": "   "})
        assert blank.status_code == 400
        error: dict[str, Any] = blank.json()["error"]
        assert error["code"] == "INVALID_PARAMETER" and "content" in error["message"] and error["type"] == "error"
        broken = await alice.post("/v1/notes", content=b'{"content": ', headers={"Content-Type": "application/json"})
        assert broken.status_code == 400 and "malformed JSON" in broken.json()["error"]["message"]
        missing = await alice.get("/v1/notes/AAAAAAAA")
        assert missing.status_code == 404 and missing.json()["error"]["code"] == "MEMORY_NOT_FOUND"
        nowhere = await alice.get("/v1/nothing-here")
        assert nowhere.status_code == 404 and nowhere.json()["error"]["code"] == "INVALID_PARAMETER"
        not_a_token = await alice.get("/v1/notes", headers={"Engram-Read-After": "yesterday"})
        assert not_a_token.status_code == 400 and "Engram-Read-After" in not_a_token.json()["error"]["message"]


async def test_the_document_and_mcp_are_served_on_the_same_port(api: Api) -> None:
    from engram_ledger.services.http.openapi import openapi

    served = await api.http.get("/v1/openapi.json")
    assert served.status_code == 200 and served.json() == openapi()
    token = await api.token("alice")
    started = await api.http.post(
        "/mcp",
        headers={"Authorization": f"Bearer {token}", "Accept": "application/json, text/event-stream"},
        json={
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "t", "version": "1"},
            },
        },
    )
    assert started.status_code == 200 and started.headers["mcp-session-id"], started.text
