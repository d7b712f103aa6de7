"""The OpenAPI 3.1 document of the HTTP API (``engram openapi``, served at ``/v1/openapi.json``,
checked in as ``docs/openapi.json``), generated from ``operations.py``'s table: every request and
response body is a contract's Struct (or one derived from it) as msgspec writes its JSON Schema,
the contract's docstring its description. OpenAPI 3.1's schemas are JSON Schema 2020-12, msgspec's
dialect, so they go in as they are."""

from __future__ import annotations

import inspect
from typing import Any

import msgspec
import msgspec.inspect as mi

from engram_ledger.contracts.limits import CommandId, Token, UserId
from engram_ledger.services.agents.mcp_server import USER_HEADER
from engram_ledger.services.console.live import LogEvent
from engram_ledger.services.http.errors import ErrorBody
from engram_ledger.services.http.events import LAST_EVENT_ID
from engram_ledger.services.http.operations import OPERATIONS, Operation
from engram_ledger.services.http.routes import IDEMPOTENCY_KEY, READ_AFTER, REPLAYED, WRITE_TOKEN

REF = "#/components/schemas/{name}"
DESCRIPTION = (
    "Engram's memory over HTTP: each route sends one contract on the bus and answers its reply. "
    "Authenticate with `Authorization: Bearer <token>` (`engram tokens create`): a user's token acts as "
    f"its user; an operator's names the user in `{USER_HEADER}`. A write's `{IDEMPOTENCY_KEY}` is its "
    f"command id (a retry answers the first outcome); its `{WRITE_TOKEN}`, sent back as `{READ_AFTER}`, "
    'lets a read see it. Every refusal is `{"error": {"code", "message", ...}}`.'
)
ERRORS: dict[str, str] = {
    "400": "The request breaks a contract's rule (`INVALID_PARAMETER`), named in words.",
    "401": "No valid bearer token: missing, unknown, revoked or expired.",
    "403": "The token may not do this: another user's, or an operator's route.",
    "404": "No such note for this user (`MEMORY_NOT_FOUND`); another user's id answers the same.",
    "409": "A stale `expected_version` (`VERSION_CONFLICT`), or a used Idempotency-Key with another body.",
    "413": "The body is over the bus's limit on a message.",
    "429": "This token holds its share of the front door, or its user of the service (`RATE_LIMITED`).",
    "503": "The service is starting or unreachable; try again after Retry-After.",
    "504": "No reply in time (`TIMEOUT`); a write may still be applied: send it again, same Idempotency-Key.",
}


def openapi() -> dict[str, Any]:
    replies: list[Any] = [ErrorBody, LogEvent, *(op.answers for op in OPERATIONS)]
    requests = [op.takes_struct for op in OPERATIONS if op.takes_struct is not None]
    sent_whole = _sent_whole(replies, requests)
    shown = list(dict.fromkeys([*replies, *requests, *sent_whole]))
    refs, schemas = msgspec.json.schema_components(shown, ref_template=REF)
    ref_of = dict(zip(shown, refs, strict=True))
    for struct in sent_whole:
        _require_every_field(schemas[_name(ref_of[struct])])
    paths: dict[str, dict[str, Any]] = {}
    for op in OPERATIONS:
        paths.setdefault(op.documented_path, {})[op.method.lower()] = _operation(op, ref_of, schemas)
    paths["/v1/events"] = {"get": _events(ref_of[LogEvent])}
    paths["/v1/openapi.json"] = {"get": _itself()}
    return {
        "openapi": "3.1.0",
        "info": {"title": "Engram HTTP API", "version": "v1", "description": DESCRIPTION},
        "servers": [{"url": "http://127.0.0.1:8788", "description": "`engram http` (loopback by default)"}],
        "security": [{"bearer": []}],
        "paths": paths,
        "components": {
            "schemas": schemas,
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer", "description": "A token of `engram tokens create`."}
            },
            "parameters": _header_parameters(),
            "headers": {
                WRITE_TOKEN: _header("The write's consistency token: send it as Engram-Read-After to read it.", Token),
                REPLAYED: {
                    "description": "`true`: this answers a retry with the first outcome.",
                    "schema": {"type": "string"},
                },
                "Retry-After": {"description": "Seconds to wait before sending again.", "schema": {"type": "integer"}},
            },
            "responses": {code: _error(code, text) for code, text in ERRORS.items()},
        },
    }


def _sent_whole(replies: list[Any], requests: list[Any]) -> list[type[msgspec.Struct]]:
    """The Structs of replies whose every field an answer carries: msgspec writes each field,
    defaulted or not, unless the Struct says ``omit_defaults``. Their schemas require every
    property, so a generated client's types do not make optional what is always there. A Struct
    a request body holds too keeps the required list of a request (its defaults may be left out)."""
    in_requests = _structs(requests)
    return sorted(
        (s for s in _structs(replies) - in_requests if not s.__struct_config__.omit_defaults),
        key=lambda s: s.__name__,
    )


def _structs(types: list[Any]) -> set[type[msgspec.Struct]]:
    """Every Struct ``types`` hold, at any depth."""
    found: set[type[msgspec.Struct]] = set()

    def walk(t: mi.Type) -> None:
        if isinstance(t, mi.StructType):
            if t.cls not in found:
                found.add(t.cls)
                for f in t.fields:
                    walk(f.type)
        elif isinstance(t, mi.Metadata):
            walk(t.type)
        elif isinstance(t, mi.CollectionType):
            walk(t.item_type)
        elif isinstance(t, (mi.DictType, mi.FrozenDictType)):
            walk(t.value_type)
        elif isinstance(t, mi.UnionType):
            for each in t.types:
                walk(each)
        elif isinstance(t, mi.TupleType):
            for each in t.item_types:
                walk(each)

    for t in mi.multi_type_info(types):
        walk(t)
    return found


def _require_every_field(schema: dict[str, Any]) -> None:
    required = schema.get("required", [])
    schema["required"] = [*required, *(name for name in schema["properties"] if name not in required)]


def _name(ref: dict[str, Any]) -> str:
    return str(ref["$ref"]).removeprefix(REF.format(name=""))


def _operation(op: Operation, ref_of: dict[Any, Any], schemas: dict[str, Any]) -> dict[str, Any]:
    parameters = [_path_parameter(op, name) for name in op.path_fields]
    if op.takes == "query" and op.takes_struct is not None:
        parameters += _query_parameters(schemas[op.takes_struct.__name__])
    headers = ["Idempotency-Key"] if op.is_command else []
    headers += ["Engram-Read-After"] if op.reads_after else []
    headers += [] if op.operator else ["X-Engram-User"]
    parameters += [{"$ref": f"#/components/parameters/{name}"} for name in headers]
    done: dict[str, Any] = {
        "description": _doc(op.answers),
        "content": {"application/json": {"schema": ref_of[op.answers]}},
    }
    if op.is_command:
        done["headers"] = {h: {"$ref": f"#/components/headers/{h}"} for h in (WRITE_TOKEN, REPLAYED)}
    responses: dict[str, Any] = {str(op.status): done}
    if op.answers.__name__ == "ForgetReply":
        responses["202"] = {
            **done,
            "description": "Pending: the same request again (a new Idempotency-Key) confirms it.",
        }
    for code in _errors(op):
        responses[code] = {"$ref": f"#/components/responses/{code}"}
    operation: dict[str, Any] = {
        "operationId": op.name,
        "summary": op.summary,
        "description": _doc(op.sends),
        "tags": [op.documented_path.split("/")[2]],
        "parameters": parameters,
        "responses": responses,
    }
    if op.takes == "body" and op.takes_struct is not None:
        body = {"application/json": {"schema": ref_of[op.takes_struct]}}
        operation["requestBody"] = {"required": True, "content": body}
    return operation


def _errors(op: Operation) -> list[str]:
    codes = ["400", "401", "403", "404"]
    codes += ["409"] if op.is_command else []
    codes += ["413"] if op.takes == "body" else []
    return [*codes, "429", "503", "504"]


def _path_parameter(op: Operation, name: str) -> dict[str, Any]:
    return {"name": name, "in": "path", "required": True, "schema": _schema_of(op.path_type(name))}


def _query_parameters(struct_schema: dict[str, Any]) -> list[dict[str, Any]]:
    required = set(struct_schema.get("required", []))
    found = []
    for name, schema in struct_schema["properties"].items():
        parameter: dict[str, Any] = {"name": name, "in": "query", "required": name in required, "schema": schema}
        if "description" in schema:
            parameter["description"] = schema["description"]
        found.append(parameter)
    return found


def _header_parameters() -> dict[str, Any]:
    return {
        IDEMPOTENCY_KEY: {
            "name": IDEMPOTENCY_KEY,
            "in": "header",
            "description": "The command id: a retry under the same key is applied once and answers the first outcome.",
            "schema": _schema_of(CommandId),
        },
        READ_AFTER: {
            "name": READ_AFTER,
            "in": "header",
            "description": "A write's Engram-Token: the read waits (bounded) until it sees that write.",
            "schema": _schema_of(Token),
        },
        USER_HEADER: {
            "name": USER_HEADER,
            "in": "header",
            "description": "With an operator's token (or a gateway's secret): the user the request acts as.",
            "schema": _schema_of(UserId),
        },
    }


def _events(event: dict[str, Any]) -> dict[str, Any]:
    resume = {
        "name": LAST_EVENT_ID,
        "in": "header",
        "description": "The id of the last event a client had: the stream resumes right after it.",
        "schema": _schema_of(Token),
    }
    # OpenAPI 3.1 has no schema for the events of a stream: the data's is named beside it.
    lines = {"type": "string", "description": "Server-sent events: `id:` a consistency token, `data:` a LogEvent."}
    stream = {"text/event-stream": {"schema": lines, "x-event-data": event}}
    return {
        "operationId": "streamEvents",
        "summary": "The user's memory events, as server-sent events",
        "description": (
            "Each event's `data` is a LogEvent (ids, type, times, channel; never content) and its `id` the "
            "event's consistency token. Reconnect with Last-Event-ID to resume after it."
        ),
        "tags": ["events"],
        "parameters": [resume, {"$ref": f"#/components/parameters/{USER_HEADER}"}],
        "responses": {
            "200": {"description": "The stream, until the client leaves or the token is revoked.", "content": stream},
            **{code: {"$ref": f"#/components/responses/{code}"} for code in ("400", "401", "403", "429", "503")},
        },
    }


def _itself() -> dict[str, Any]:
    return {
        "operationId": "openapi",
        "summary": "This document",
        "tags": ["openapi"],
        "security": [],
        "responses": {"200": {"description": "The OpenAPI 3.1 document.", "content": {"application/json": {}}}},
    }


def _error(code: str, text: str) -> dict[str, Any]:
    answer: dict[str, Any] = {
        "description": text,
        "content": {"application/json": {"schema": {"$ref": REF.format(name="ErrorBody")}}},
    }
    if code in ("429", "503"):
        answer["headers"] = {"Retry-After": {"$ref": "#/components/headers/Retry-After"}}
    if code == "401":
        answer["headers"] = {"WWW-Authenticate": {"schema": {"type": "string"}}}
    return answer


def _header(description: str, rule: Any) -> dict[str, Any]:
    return {"description": description, "schema": _schema_of(rule)}


def _schema_of(rule: Any) -> dict[str, Any]:
    schema: dict[str, Any] = msgspec.json.schema(rule)
    return schema


def _doc(cls: type[msgspec.Struct]) -> str:
    return inspect.cleandoc(cls.__doc__ or "")
