"""What the HTTP API promises beyond each route's happy path, against a real service on the real
Redis: an id holding "/" or "%" is one path segment (and never picks another route), a key is read
back with the category a put defaults to, the forget confirmation speaks of requests (not of a
tool's parameters), and the OpenAPI document's ``required`` says exactly what a reply carries."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import quote

import httpx
import pytest
import pytest_asyncio

from engram_ledger.services.http.openapi import openapi
from tests.conftest import RunningService
from tests.integration.http_api import Api, api_in_front_of

# One service and one API for the module (``shared_service``): each test is a user of its own.
pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]

SCHEMAS: dict[str, Any] = openapi()["components"]["schemas"]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def api(shared_service: RunningService) -> AsyncIterator[Api]:
    async with api_in_front_of(shared_service.settings.redis_url) as running:
        yield running


def segment(value: str) -> str:
    """``value`` as one path segment, as a client encodes it (encodeURIComponent)."""
    return quote(value, safe="")


def after(written: httpx.Response) -> dict[str, str]:
    return {"Engram-Read-After": written.headers["Engram-Token"]}


async def test_a_key_with_slashes_and_percent_signs_is_one_segment(api: Api, user: str) -> None:
    key = "/memories/100%/notes.md"
    async with await api.as_user(user) as alice:
        put = await alice.put(f"/v1/keys/{segment(key)}", json={"value": {"text": "buy milk"}})
        assert put.status_code == 200, put.text
        got = await alice.get(f"/v1/keys/{segment(key)}", headers=after(put))
        assert got.status_code == 200, got.text
        assert got.json()["note"]["key"] == key and got.json()["note"]["value"] == {"text": "buy milk"}
        # Its "/" sent as separators is another path: no such route, not the same key.
        spelled = await alice.get("/v1/keys/memories/100%25/notes.md", headers=after(put))
        assert spelled.status_code == 404 and "no such route" in spelled.json()["error"]["message"]


async def test_a_session_id_with_slashes_and_percent_signs_is_one_segment(api: Api, user: str) -> None:
    session = "support/chat 1 at 100%"
    async with await api.as_user(user) as alice:
        path = f"/v1/conversations/{segment(session)}/messages"
        recorded = await alice.post(path, json={"messages": [{"content": "My order never came"}]})
        assert recorded.status_code == 201, recorded.text
        listed = await alice.get(path, headers=after(recorded))
        assert listed.status_code == 200, listed.text
        assert [(m["session_id"], m["content"]) for m in listed.json()["messages"]] == [
            (session, "My order never came")
        ]


async def test_a_user_id_with_slashes_is_one_segment_of_the_operators_routes(api: Api, user: str) -> None:
    team_user = f"team/{user}"
    async with api.client(await api.token(None), **{"X-Engram-User": team_user}) as operator:
        saved = await operator.post("/v1/notes", json={"content": "Team notes live in the wiki", "advise": False})
        assert saved.status_code == 201, saved.text
        await operator.post("/v1/conversations/chat%2F1/messages", json={"messages": [{"content": "hello"}]})
        chat = f"/v1/users/{segment(team_user)}/conversations/chat%2F1"
        asked = await operator.delete(chat)
        assert asked.status_code == 202, asked.text
        assert f"of conversation chat/1 of {team_user}" in asked.json()["message"]
        assert (await operator.delete(chat)).status_code == 200
        erase = f"/v1/users/{segment(team_user)}"
        assert (await operator.delete(erase)).status_code == 202
        erased = await operator.delete(erase)
        assert erased.status_code == 200 and erased.json()["erased_at"], erased.text
        left = await operator.get("/v1/notes", headers=after(erased))
        assert left.json()["total"] == 0, "the user the path named is the one erased"


async def test_an_encoded_slash_never_moves_a_request_to_another_route(api: Api) -> None:
    async with api.client(await api.token(None)) as operator:
        smuggled = await operator.delete("/v1/users/a%2Fconversations%2Fx")
        # The erase-user route, for the user named (whose memory is empty), not user "a"'s conversation "x".
        assert smuggled.status_code == 202, smuggled.text
        message = smuggled.json()["message"]
        assert "ALL 0 memories" in message and "of a/conversations/x?" in message, message
        assert "conversation x" not in message


async def test_a_key_is_read_in_the_category_a_put_defaults_to(api: Api, user: str) -> None:
    async with await api.as_user(user) as alice:
        put = await alice.put("/v1/keys/theme", json={"value": {"theme": "dark"}})
        assert put.status_code == 200, put.text
        got = await alice.get("/v1/keys/theme", headers=after(put))
        assert got.status_code == 200, got.text
        assert got.json()["note"]["category"] == "general" and got.json()["note"]["value"] == {"theme": "dark"}
        named = await alice.get("/v1/keys/theme", params={"category": "general"}, headers=after(put))
        assert named.json()["note"]["id"] == got.json()["note"]["id"]
        elsewhere = await alice.get("/v1/keys/theme", params={"category": "settings"}, headers=after(put))
        assert elsewhere.status_code == 404


async def test_the_forget_confirmation_says_what_to_send_again_not_a_tools_parameter(api: Api, user: str) -> None:
    async with await api.as_user(user) as alice:
        saved = await alice.post("/v1/notes", json={"content": "My locker code is 1234", "advise": False})
        note = saved.json()["note_id"]
        found = await alice.post("/v1/forget", json={"query": "locker code"}, headers=after(saved))
        assert found.status_code == 200 and found.json()["candidates"], found.text
        asked = await alice.post("/v1/forget", json={"note_ids": [note]})
        assert asked.status_code == 202, asked.text
        for said in (found.json()["message"], asked.json()["message"]):
            assert "memory_id" not in said and "call forget" not in said.lower(), said
        assert f"({note})? Send the same request again to delete it." in asked.json()["message"]
        done = await alice.post("/v1/forget", json={"note_ids": [note]})
        assert done.status_code == 200 and done.json()["forgotten"] == [note], done.text


# Structs that leave their defaulted fields out when written (msgspec's omit_defaults): the
# document rightly calls those optional.
MAY_OMIT = frozenset({"Origin"})


def _named(schema: dict[str, Any]) -> tuple[str | None, dict[str, Any]]:
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[1]
        return name, SCHEMAS[name]
    return None, schema


def mismatches(value: Any, schema: dict[str, Any], where: str = "$") -> list[str]:
    """Where ``value`` (a reply's JSON) and the document's ``required`` disagree, at any depth: a
    required property absent, or one present that the document calls optional."""
    name, schema = _named(schema)
    if "anyOf" in schema:
        fits = [mismatches(value, option, where) for option in schema["anyOf"] if _fits(value, _named(option)[1])]
        return min(fits, key=len) if fits else []
    if isinstance(value, list):
        return [m for i, item in enumerate(value) for m in mismatches(item, schema.get("items", {}), f"{where}[{i}]")]
    if not isinstance(value, dict) or "properties" not in schema:
        return []
    required = set(schema.get("required", []))
    found = [f"{where}.{field} is required and absent" for field in sorted(required - set(value))]
    if name not in MAY_OMIT:
        found += [f"{where}.{field} is always sent and not required" for field in sorted(set(value) - required)]
    for field, item in value.items():
        found += mismatches(item, schema["properties"].get(field, {}), f"{where}.{field}")
    return found


def _fits(value: Any, option: dict[str, Any]) -> bool:
    """Whether ``value`` is of an ``anyOf`` option's kind: null or not."""
    return (value is None) == (option.get("type") == "null")


async def test_required_in_the_document_is_exactly_what_replies_carry(api: Api, user: str) -> None:
    answered: list[tuple[str, httpx.Response]] = []
    async with await api.as_user(user) as alice:
        saved = await alice.post("/v1/notes", json={"content": "Alec is my boss at TechCorp", "subject": "Alec"})
        answered.append(("NoteWritten", saved))
        note = saved.json()["note_id"]
        changed = await alice.patch(f"/v1/notes/{note}", json={"content": "Alec was my boss at TechCorp"})
        answered.append(("NoteReply", await alice.get(f"/v1/notes/{note}", headers=after(changed))))
        answered.append(("HistoryReply", await alice.get(f"/v1/notes/{note}/history", headers=after(changed))))
        search = {"query": "who is my manager?", "min_relevance": 0}
        answered.append(("SearchReply", await alice.post("/v1/search", json=search, headers=after(changed))))
        recorded = await alice.post("/v1/conversations/c1/messages", json={"messages": [{"content": "Hi"}]})
        answered.append(("NotesWritten", recorded))
        answered.append(("MessagesReply", await alice.get("/v1/conversations/c1/messages", headers=after(recorded))))
        answered.append(("ForgetReply", await alice.post("/v1/forget", json={"note_ids": [note]})))
        answered.append(("ErrorBody", await alice.get("/v1/notes/AAAAAAAA")))
    for name, reply in answered:
        assert reply.status_code < 500, reply.text
        assert mismatches(reply.json(), SCHEMAS[name]) == [], f"{name}: {reply.text}"
    assert answered[3][1].json()["results"], "the search found the note: its hits were checked too"
