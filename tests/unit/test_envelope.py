"""The request formats as ``EnvelopeFormat`` reads them and the JSON envelope replies are written
in (services/bus/envelope.py); the running service's side is tests/integration/test_bus_envelope.py."""

from __future__ import annotations

import json

import pytest
from faststream.redis.parser import BinaryMessageFormatV1

from engram_ledger.services.bus.envelope import ENVELOPE_ERROR, EnvelopeFormat, JSONEnvelopeFormat, is_binary


async def test_a_json_reply_is_the_request_envelope_read_by_both_parsers() -> None:
    encoded = await JSONEnvelopeFormat.encode(
        message=b'{"type": "note_written"}', reply_to=None, headers=None, correlation_id="c-1"
    )
    assert json.loads(encoded) == {"data": '{"type": "note_written"}', "headers": {"correlation_id": "c-1"}}
    assert not is_binary(encoded)
    for parser in (EnvelopeFormat, BinaryMessageFormatV1):
        assert parser.parse(encoded) == (b'{"type": "note_written"}', {"correlation_id": "c-1"})


async def test_binary_requests_are_read_as_faststream_reads_them() -> None:
    encoded = await BinaryMessageFormatV1.encode(
        message=b'{"type": "get_note"}', reply_to="engram:replies:x", headers={"a": "b"}, correlation_id="c-2"
    )
    assert is_binary(encoded)
    assert EnvelopeFormat.parse(encoded) == BinaryMessageFormatV1.parse(encoded)


def test_a_well_formed_json_envelope_is_read_as_faststream_reads_it() -> None:
    envelope = json.dumps({"data": '{"type": "get_note"}', "headers": {"reply_to": "r", "correlation_id": "c"}})
    assert EnvelopeFormat.parse(envelope.encode()) == BinaryMessageFormatV1.parse(envelope.encode())


@pytest.mark.parametrize(
    ("envelope", "problem"),
    [
        ({"headers": {"reply_to": "r", "correlation_id": "c"}}, "has no `data`"),
        ({"data": [], "headers": {"reply_to": "r", "correlation_id": "c"}}, "not an array"),
        ({"data": None, "headers": {"reply_to": "r", "correlation_id": "c"}}, "not null"),
        ({"data": "{}", "headers": {"reply_to": "r", "correlation_id": "c", "n": True}}, "`n` must be a string"),
    ],
)
def test_a_malformed_envelope_naming_a_reply_to_keeps_it_and_says_what_is_wrong(
    envelope: dict[str, object], problem: str
) -> None:
    body, headers = EnvelopeFormat.parse(json.dumps(envelope).encode())
    assert body == b""
    assert headers["reply_to"] == "r" and headers["correlation_id"] == "c"
    assert problem in headers[ENVELOPE_ERROR]


@pytest.mark.parametrize(
    "raw",
    [
        b"plain text",
        b'{"type": "save_note"}',
        b'{"data": "{}", "headers": 5}',
        b'{"data": "{}", "headers": {"reply_to": 5}}',
        b'{"data": "{}", "headers": {"reply_to": ""}}',
        b"[1, 2]",
    ],
)
def test_what_names_no_reply_channel_is_read_without_one(raw: bytes) -> None:
    _, headers = EnvelopeFormat.parse(raw)
    assert not headers.get("reply_to") and ENVELOPE_ERROR not in headers


def test_the_envelope_error_header_sent_by_a_caller_is_dropped() -> None:
    envelope = {"data": "{}", "headers": {"reply_to": "r", ENVELOPE_ERROR: "forged"}}
    assert EnvelopeFormat.parse(json.dumps(envelope).encode()) == (b"{}", {"reply_to": "r"})
