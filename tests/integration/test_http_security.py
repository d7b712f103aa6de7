"""Who may call the HTTP API, and how much: tried from every side against a real service on the
real Redis (no token, a revoked one, another user's note, an operator's route, a body too large or
too deep, a flood from one token), and the event stream, resumed from Last-Event-ID."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from engram_ledger.contracts.limits import MAX_MESSAGE_BYTES
from engram_ledger.services.http.auth import Shares
from tests.conftest import RunningService, service_settings
from tests.integration.http_api import Api, api_in_front_of, sse_events

pytestmark = pytest.mark.integration

PER_TOKEN = 4


@pytest.fixture
async def api(redis_url: str) -> AsyncIterator[Api]:
    running = await RunningService(service_settings(redis_url, index_enabled=False)).start()
    try:
        async with api_in_front_of(redis_url, Shares(requests=PER_TOKEN, streams=1)) as front:
            yield front
    finally:
        await running.stop()


def refused(answer: httpx.Response, status: int, code: str) -> str:
    assert answer.status_code == status, answer.text
    error: dict[str, Any] = answer.json()["error"]
    assert error["code"] == code, error
    return str(error["message"])


async def test_no_token_or_a_bad_one_is_refused_401(api: Api) -> None:
    for headers in ({}, {"Authorization": "Bearer engram_not-a-token"}, {"Authorization": "Basic YWxpY2U6eA=="}):
        answer = await api.http.get("/v1/notes", headers=headers)
        refused(answer, 401, "PERMISSION_DENIED")
        assert answer.headers["WWW-Authenticate"].startswith("Bearer")
    assert (await api.http.get("/v1/events")).status_code == 401


async def test_a_revoked_token_is_refused_from_its_next_request(api: Api) -> None:
    token, record = await api.registry.create(user_id="alice")
    async with api.client(token) as alice:
        assert (await alice.post("/v1/notes", json={"content": "Ferry at 7:40", "advise": False})).status_code == 201
        await api.registry.revoke(record.id)
        refused(await alice.get("/v1/notes"), 401, "PERMISSION_DENIED")


async def test_another_users_note_is_not_found_like_a_missing_one(api: Api) -> None:
    async with await api.as_user("alice") as alice, await api.as_user("mallory") as mallory:
        saved = await alice.post("/v1/notes", json={"content": "Locker 12, code 3-14-15", "advise": False})
        note, token = saved.json()["note_id"], {"Engram-Read-After": saved.headers["Engram-Token"]}
        theirs = refused(await mallory.get(f"/v1/notes/{note}", headers=token), 404, "MEMORY_NOT_FOUND")
        nobodys = refused(await mallory.get("/v1/notes/ZZZZZZZZ", headers=token), 404, "MEMORY_NOT_FOUND")
        assert theirs.replace(note, "ZZZZZZZZ") == nobodys, "the two answers tell nothing apart"
        refused(await mallory.patch(f"/v1/notes/{note}", json={"content": "mine"}), 404, "MEMORY_NOT_FOUND")
        refused(await mallory.get("/v1/notes", headers={"X-Engram-User": "alice"}), 403, "PERMISSION_DENIED")
        got = await alice.get(f"/v1/notes/{note}", headers=token)
        assert got.json()["note"]["content"] == "Locker 12, code 3-14-15"


async def test_an_operators_route_refuses_a_users_token(api: Api) -> None:
    async with await api.as_user("alice") as alice:
        refused(await alice.delete("/v1/users/alice"), 403, "PERMISSION_DENIED")
        refused(await alice.delete("/v1/users/bob/conversations/c1"), 403, "PERMISSION_DENIED")


async def test_a_body_over_the_limit_is_refused_413_before_it_is_read(api: Api) -> None:
    async with await api.as_user("alice") as alice:
        big = json.dumps({"content": "x" * (MAX_MESSAGE_BYTES + 1)}).encode()
        refused(await alice.post("/v1/notes", content=big), 413, "INVALID_PARAMETER")

        async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: counted as it comes
            for _ in range(MAX_MESSAGE_BYTES // 65_536 + 2):
                yield b" " * 65_536

        refused(await alice.post("/v1/notes", content=chunks()), 413, "INVALID_PARAMETER")


async def test_json_nested_too_deeply_is_refused(api: Api) -> None:
    async with await api.as_user("alice") as alice:
        deep = b'{"value": ' + b'{"a": ' * 5_000 + b"1" + b"}" * 5_000 + b"}"
        message = refused(await alice.put("/v1/keys/k", content=deep), 400, "INVALID_PARAMETER")
        assert "nested too deeply" in message


async def test_a_flood_from_one_token_leaves_another_tokens_requests_answered(api: Api) -> None:
    async with await api.as_user("flood") as flood, await api.as_user("quiet") as quiet:

        async def flooding(i: int) -> httpx.Response:
            return await flood.post("/v1/notes", json={"content": f"Flood note {i}", "advise": False})

        flooded = asyncio.gather(*(flooding(i) for i in range(80)))
        answered = []
        for i in range(5):
            answer = await quiet.post("/v1/notes", json={"content": f"Quiet note {i}", "advise": False})
            answered.append(answer.status_code)
        answers = await flooded
    assert answered == [201] * 5, "the other token's requests were all answered"
    statuses = {a.status_code for a in answers}
    assert statuses <= {201, 429} and 429 in statuses, statuses
    limited = next(a for a in answers if a.status_code == 429)
    assert limited.headers["Retry-After"] == "1" and limited.json()["error"]["code"] == "RATE_LIMITED"


async def test_the_event_stream_resumes_after_the_last_event_id(api: Api) -> None:
    async with await api.as_user("alice") as alice, await api.as_user("bob") as bob:
        lines: list[str] = []

        async def read(headers: dict[str, str], until: int) -> list[dict[str, str]]:
            lines.clear()
            async with alice.stream("GET", "/v1/events", headers=headers) as stream:
                assert stream.status_code == 200 and stream.headers["content-type"].startswith("text/event-stream")
                first = await alice.post("/v1/notes", json={"content": f"Seen live {until}", "advise": False})
                assert first.status_code == 201
                async for line in stream.aiter_lines():
                    lines.append(line)
                    if len(sse_events(lines)) >= until:
                        break
            return sse_events(lines)

        live = await asyncio.wait_for(read({}, 1), 20)
        assert json.loads(live[0]["data"])["type"] == "note_saved"
        # Away: two of alice's notes and one of bob's are written.
        missed = [await alice.post("/v1/notes", json={"content": f"Missed {i}", "advise": False}) for i in range(2)]
        await bob.post("/v1/notes", json={"content": "Not alice's", "advise": False})
        resumed = await asyncio.wait_for(read({"Last-Event-ID": live[0]["id"]}, 3), 20)
        notes = [json.loads(e["data"])["note_id"] for e in resumed]
        assert notes[:2] == [m.json()["note_id"] for m in missed], "what was missed comes first, in order"
        assert [e["id"] for e in resumed[:2]] == [m.json()["token"] for m in missed]
        assert all(json.loads(e["data"])["user_id"] == "alice" for e in resumed)

        refused(await alice.get("/v1/events", headers={"Last-Event-ID": "junk"}), 400, "INVALID_PARAMETER")


async def test_an_event_stream_ends_when_its_token_is_revoked_and_streams_are_bounded(redis_url: str) -> None:
    running = await RunningService(service_settings(redis_url, index_enabled=False)).start()
    try:
        async with api_in_front_of(redis_url, Shares(streams=1), check_seconds=0.2) as api:
            token, record = await api.registry.create(user_id="alice")
            async with api.client(token) as alice, alice.stream("GET", "/v1/events") as stream:
                assert stream.status_code == 200
                second = await alice.get("/v1/events")
                refused(second, 429, "RATE_LIMITED")
                await api.registry.revoke(record.id)
                # The stream ends by itself: reading it to the end returns.
                await asyncio.wait_for(stream.aread(), 10)
    finally:
        await running.stop()
