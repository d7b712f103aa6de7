"""The event store keeps the data keys its loads read for the append that follows, briefly: an
unwrapped key of a note another worker has forgotten must not stay in this one's memory."""

from __future__ import annotations

import os
import time

import pytest

from engram_ledger.services.adapters.crypto import NoteCipher
from engram_ledger.services.adapters.event_store import _LoadedKeys

pytestmark = pytest.mark.unit


def test_a_kept_key_serves_the_next_append_then_expires_and_is_bounded() -> None:
    cipher = NoteCipher(os.urandom(32))
    keys = _LoadedKeys(size=2, seconds=0.05)
    keys.keep("alice", "n1", b"wrapped-1", cipher)
    assert keys.get("alice", "n1") == (b"wrapped-1", cipher)
    assert keys.get("bob", "n1") is None, "kept per user and note"
    time.sleep(0.06)  # its time runs out
    assert keys.get("alice", "n1") is None, "expired"
    keys.keep("alice", "n2", b"w2", cipher)  # also sweeps the expired n1 out
    keys.keep("alice", "n3", b"w3", cipher)
    keys.keep("alice", "n4", b"w4", cipher)
    assert keys.get("alice", "n2") is None and keys.get("alice", "n4") is not None, "the least recent goes"
    assert len(keys._keys) == 2
    keys.drop("alice", "n4")
    assert keys.get("alice", "n4") is None
