"""The routes of ``operations.py``: each decodes a request into its contract, sends it through
``EngramClient`` and answers the reply as JSON. No rule of the domain lives here: a request the
contracts refuse is refused by the same decoding as on the bus, in the same words.

Headers: ``Idempotency-Key`` is a command's ``command_id`` (a retry under the same key answers the
first outcome, ``Idempotent-Replayed: true``); a write answers its consistency token in
``Engram-Token`` (and in its body); a read given it in ``Engram-Read-After`` sees that write.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from engram_ledger.contracts.errors import EngramError, ErrorCode
from engram_ledger.contracts.limits import MAX_MESSAGE_BYTES, CommandId, Token
from engram_ledger.contracts.queries import ForgetReply
from engram_ledger.services.agents.mcp_server import USER_HEADER
from engram_ledger.services.application.decoding import decode_request
from engram_ledger.services.bus.client import EngramClient, new_command_id
from engram_ledger.services.http.auth import Caller, Shares, caller
from engram_ledger.services.http.errors import Refusal, error_response, refused
from engram_ledger.services.http.operations import Operation

IDEMPOTENCY_KEY = "Idempotency-Key"
READ_AFTER = "Engram-Read-After"
WRITE_TOKEN = "Engram-Token"
REPLAYED = "Idempotent-Replayed"


@dataclass
class Front:
    """What every route shares."""

    client: EngramClient
    shares: Shares

    def caller(self, request: Request, operator_route: bool = False) -> Caller:
        return caller(
            request.scope,
            request.headers.getlist(USER_HEADER),
            operator_route=operator_route,
            path_user=request.path_params.get("user_id"),
        )


def endpoint(op: Operation, front: Front) -> Callable[[Request], Awaitable[Response]]:
    decoder = msgspec.json.Decoder(op.takes_struct, strict=op.takes != "query") if op.takes_struct else None

    async def handle(request: Request) -> Response:
        try:
            who = front.caller(request, op.operator)
            with front.shares.request(who.holder):
                given = await _given(request, op, decoder)
                message = op.sends(**given, **_filled_in(request, op, who))
                if op.is_command:
                    reply = await front.client.execute(message, op.answers)  # type: ignore[arg-type]
                else:
                    reply = await front.client.ask(message, op.answers)  # type: ignore[arg-type]
            return _answer(op, reply)
        except Refusal as r:
            return refused(r)
        except EngramError as e:
            return error_response(e)

    handle.__name__ = op.name
    return handle


async def _given(request: Request, op: Operation, decoder: msgspec.json.Decoder[Any] | None) -> dict[str, Any]:
    """The contract's fields the caller gave: the body's or the query string's, and the path's."""
    given: dict[str, Any] = {name: request.path_params[name] for name in op.path_fields if name != "user_id"}
    if decoder is None:
        return given
    if op.takes == "body":
        raw = await read_body(request)
    else:
        # Each parameter once, as its text: the Struct's non-strict decoding reads numbers,
        # booleans and times out of it.
        raw = json.dumps(dict(request.query_params)).encode()
    decoded = decode_request(raw or b"{}", decoder, "request")
    return {**msgspec.structs.asdict(decoded), **given}


def _filled_in(request: Request, op: Operation, who: Caller) -> dict[str, Any]:
    """What the front door fills in: the user, and the headers' command id and write token."""
    filled: dict[str, Any] = {"user_id": who.user}
    if op.is_command:
        key = request.headers.get(IDEMPOTENCY_KEY)
        filled["command_id"] = _header(IDEMPOTENCY_KEY, key, CommandId) if key is not None else new_command_id()
    if op.reads_after:
        after = request.headers.get(READ_AFTER)
        filled["after"] = _header(READ_AFTER, after, Token) if after else None
    return filled


def _header(name: str, value: str, rule: Any) -> str:
    try:
        return str(msgspec.convert(value, rule))
    except msgspec.ValidationError:
        if rule is Token:
            raise EngramError(
                ErrorCode.INVALID_PARAMETER, f"{name}: {value!r} is not a consistency token a write returned"
            ) from None
        raise EngramError(
            ErrorCode.INVALID_PARAMETER,
            f"{name} must be 1-128 characters of A-Za-z0-9 and ._:@+/=|- (a UUID will do); you gave {value!r}",
        ) from None


async def read_body(request: Request) -> bytes:
    """The body, refused 413 past the bus's own limit on a message, before it is all read."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > MAX_MESSAGE_BYTES:
        raise _too_large(int(declared))
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_MESSAGE_BYTES:
            raise _too_large(size)
        chunks.append(chunk)
    return b"".join(chunks)


def _too_large(size: int) -> Refusal:
    message = f"a body of {size:,} bytes or more: the limit is {MAX_MESSAGE_BYTES:,}"
    return Refusal(413, EngramError(ErrorCode.INVALID_PARAMETER, message))


def _answer(op: Operation, reply: Any) -> Response:
    headers: dict[str, str] = {}
    token = getattr(reply, "token", None)
    if token:
        headers[WRITE_TOKEN] = token
    if getattr(reply, "replayed", False):
        headers[REPLAYED] = "true"
    status = op.status
    if isinstance(reply, ForgetReply) and reply.status == "confirmation_required":
        status = 202  # nothing is gone yet: the same request again confirms
    return Response(msgspec.json.encode(reply), status_code=status, headers=headers, media_type="application/json")
