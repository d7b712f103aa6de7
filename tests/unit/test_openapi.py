"""The HTTP API's OpenAPI document: the checked-in one is the one the code generates, its schemas
are the contracts', and it names every route the app serves; and each error code has its status."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
from starlette.routing import Mount, Route

from engram_ledger.contracts.errors import EngramError, ErrorCode
from engram_ledger.services.http.errors import STATUS_OF, error_response
from engram_ledger.services.http.openapi import openapi

CHECKED_IN = Path(__file__).resolve().parents[2] / "docs" / "openapi.json"


def test_the_checked_in_document_is_the_generated_one() -> None:
    assert json.loads(CHECKED_IN.read_text()) == openapi(), (
        "docs/openapi.json differs from the code: run `engram openapi --out docs/openapi.json`, "
        "then `npm run generate` in clients/typescript (its types are made from the document)"
    )


def _refs(node: Any) -> list[str]:
    if isinstance(node, dict):
        own = [node["$ref"]] if "$ref" in node else []
        return own + [r for v in node.values() for r in _refs(v)]
    if isinstance(node, list):
        return [r for v in node for r in _refs(v)]
    return []


def test_every_reference_resolves_and_every_schema_is_json_schema_2020_12() -> None:
    doc = openapi()
    assert doc["openapi"] == "3.1.0"
    for ref in _refs(doc):
        node: Any = doc
        for step in ref.removeprefix("#/").split("/"):
            node = node[step]
    for name, schema in doc["components"]["schemas"].items():
        try:
            jsonschema.Draft202012Validator.check_schema(schema)
        except jsonschema.SchemaError as e:
            raise AssertionError(f"{name}: {e.message}") from None
    save = doc["components"]["schemas"]["SaveNoteRequest"]
    assert "user_id" not in save["properties"] and "command_id" not in save["properties"]
    assert save["properties"]["content"]["maxLength"] == 16_384, "the contract's rule"
    assert save["description"].startswith("Save a new note."), "the contract's docstring"
    forget = doc["components"]["schemas"]["ForgetRequest"]
    assert "confirmed" not in forget["properties"], "deleting at once is the operators' stream's"


def test_the_document_names_every_route_the_app_serves() -> None:
    from engram_ledger.services.http.app import rest_app

    app = rest_app(None, None)  # type: ignore[arg-type]  # routes only: nothing is called
    served = set()
    for route in app.routes:
        assert isinstance(route, Route) and not isinstance(route, Mount)
        path = "/v1" + route.path.replace(":path}", "}")
        served |= {(path, m.lower()) for m in route.methods or () if m != "HEAD"}
    documented = {(path, method) for path, ops in openapi()["paths"].items() for method in ops}
    assert served == documented


def test_every_error_code_has_its_status_and_the_same_body() -> None:
    assert set(STATUS_OF) == set(ErrorCode)
    limited = error_response(EngramError(ErrorCode.RATE_LIMITED, "slow down", retry_after_ms=2_500))
    assert limited.status_code == 429 and limited.headers["Retry-After"] == "3"
    assert json.loads(bytes(limited.body))["error"] == {
        "type": "error",
        "schema_version": 1,
        "code": "RATE_LIMITED",
        "message": "slow down",
        "retry_after_ms": 2_500,
    }
    starting = error_response(EngramError(ErrorCode.STARTING, "loading the model"))
    assert starting.status_code == 503 and starting.headers["Retry-After"] == "1"
    assert error_response(EngramError(ErrorCode.TIMEOUT, "late")).status_code == 504


def test_engram_openapi_writes_the_document_and_engram_http_checks_its_flags() -> None:
    from tests.support import engram_env, run_cli

    written = run_cli(engram_env(), ["openapi"])
    assert written.returncode == 0 and json.loads(written.stdout) == openapi()
    half = run_cli(engram_env(), ["http", "--tls-cert", "chain.pem", "--json"])
    assert half.returncode == 1 and "--tls-cert and --tls-key go together" in half.stdout + half.stderr


def test_a_reply_requires_every_property_and_a_request_only_its_own() -> None:
    schemas = openapi()["components"]["schemas"]
    for reply in ("NoteWritten", "ForgetReply", "NoteView", "ErrorReply", "SearchHit", "LogEvent", "VersionView"):
        assert set(schemas[reply]["required"]) == set(schemas[reply]["properties"]), reply
    assert schemas["SaveNoteRequest"]["required"] == ["content"], "a request's defaults may be left out"
    # Origin is in requests too, and leaves its defaults out when written (omit_defaults).
    assert not schemas["Origin"].get("required")


def test_a_key_is_read_in_the_category_a_put_defaults_to() -> None:
    get = openapi()["paths"]["/v1/keys/{key}"]["get"]
    category = next(p for p in get["parameters"] if p["name"] == "category")
    assert category["required"] is False and category["schema"]["default"] == "general"
