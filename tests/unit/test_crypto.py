"""Sealing content under per-note data keys, and the master key's handling."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
from cryptography.exceptions import InvalidTag

from services.adapters.crypto import MasterKey, MasterKeyError, NoteCipher, is_sealed, load_master_key, shredded
from tests.builders import saved


def test_content_is_sealed_and_opens_only_with_the_notes_key() -> None:
    master = MasterKey(bytes(32))
    key = master.new_data_key()
    event = saved(content="Alec is my boss")
    sealed = NoteCipher(key).seal_event(event)
    assert is_sealed(sealed) and "Alec" not in sealed.content and sealed.subject == "Alec"
    assert NoteCipher(key).open_event(sealed) == event
    with pytest.raises(InvalidTag):
        NoteCipher(master.new_data_key()).open_event(sealed)


def test_a_shredded_event_reads_without_content() -> None:
    sealed = NoteCipher(MasterKey(bytes(32)).new_data_key()).seal_event(saved())
    assert shredded(sealed).content == "" and shredded(sealed).version == 1


def test_data_keys_are_wrapped_for_one_note_and_one_master_key() -> None:
    master = MasterKey(bytes(32))
    key = master.new_data_key()
    wrapped = master.wrap(key, "alice/AAAAAAAA")
    assert master.unwrap(wrapped, "alice/AAAAAAAA") == key and key not in wrapped
    with pytest.raises(MasterKeyError):
        master.unwrap(wrapped, "mallory/AAAAAAAA")
    with pytest.raises(MasterKeyError):
        MasterKey(bytes([1]) * 32).unwrap(wrapped, "alice/AAAAAAAA")


def test_the_embedded_default_generates_a_private_key_file_once(tmp_path: Path) -> None:
    first = load_master_key(tmp_path, env={})
    path = tmp_path / "master.key"
    assert path.stat().st_mode & 0o777 == 0o600
    again = load_master_key(tmp_path, env={})
    key = first.new_data_key()
    assert again.unwrap(first.wrap(key, "x"), "x") == key
    explicit = base64.b64encode(bytes(32)).decode()
    assert (
        load_master_key(tmp_path, env={"ENGRAM_MASTER_KEY": explicit}).unwrap(MasterKey(bytes(32)).wrap(key, "y"), "y")
        == key
    )
    with pytest.raises(MasterKeyError):
        load_master_key(tmp_path, env={"ENGRAM_MASTER_KEY": "too short"})
