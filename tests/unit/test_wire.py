"""The client's framing of requests (services/bus/wire.py) is FastStream's own: the same bytes as
``BinaryMessageFormatV1.encode`` for every body and header, and it reads whatever FastStream's
``parse`` reads (its frames, a JSON envelope, raw bytes)."""

from __future__ import annotations

import asyncio
import json
import string

from faststream.redis.parser.binary import BinaryMessageFormatV1
from hypothesis import given, settings
from hypothesis import strategies as st

from engram_ledger.services.bus import wire

names = st.text(string.ascii_letters + string.digits + "-_", min_size=1, max_size=40)
values = st.text(string.printable, max_size=200)


@settings(max_examples=200, deadline=None)
@given(
    body=st.binary(max_size=2_000),
    reply_to=st.one_of(st.none(), names),
    headers=st.dictionaries(names.filter(lambda k: k not in ("correlation_id", "reply_to")), values, max_size=5),
    correlation_id=names,
)
def test_a_request_is_framed_byte_for_byte_as_faststream_frames_it(
    body: bytes, reply_to: str | None, headers: dict[str, str], correlation_id: str
) -> None:
    theirs = asyncio.run(
        BinaryMessageFormatV1.encode(message=body, reply_to=reply_to, headers=headers, correlation_id=correlation_id)
    )
    ours = wire.encode(body, reply_to=reply_to, headers=headers, correlation_id=correlation_id)
    assert ours == theirs
    assert wire.parse(theirs) == BinaryMessageFormatV1.parse(theirs)


def test_a_reply_in_any_format_faststream_reads_is_read_the_same() -> None:
    envelope = json.dumps({"data": '{"type": "note"}', "headers": {"correlation_id": "7"}}).encode()
    for message in (envelope, b'{"type": "note"}', b"not json", wire.IDENTITY + b"\x00\x01 cut short", b""):
        assert wire.parse(message) == BinaryMessageFormatV1.parse(message), message
    assert wire.parse(envelope) == (b'{"type": "note"}', {"correlation_id": "7"})


def test_a_header_that_is_not_ascii_is_framed_by_its_length_in_bytes() -> None:
    framed = wire.encode(b"{}", reply_to="r", headers={"engram-note": "café"}, correlation_id="1")
    assert wire.parse(framed) == (b"{}", {"correlation_id": "1", "reply_to": "r", "engram-note": "café"})
    assert BinaryMessageFormatV1.parse(framed) == wire.parse(framed)
