"""Sealing content under per-note data keys, and the master key's handling."""

from __future__ import annotations

import base64
from pathlib import Path

import msgspec
import pytest
from cryptography.exceptions import InvalidTag

from engram_ledger.contracts.events import NoteUpdated
from engram_ledger.services.adapters.crypto import (
    KeyedFields,
    MasterKey,
    MasterKeyError,
    NoteCipher,
    RecordKey,
    RecordKeys,
    SubjectMatcher,
    is_sealed,
    load_master_key,
    shredded,
)
from tests.builders import NOW, saved


def test_content_is_sealed_and_opens_only_with_the_notes_key() -> None:
    master = MasterKey(bytes(32))
    key = master.new_data_key()
    event = saved(content="Alec is my boss")
    sealed = NoteCipher(key).seal_event(event)
    assert is_sealed(sealed) and "Alec" not in sealed.content
    assert NoteCipher(key).open_event(sealed) == event
    with pytest.raises(InvalidTag):
        NoteCipher(master.new_data_key()).open_event(sealed)


def test_the_subject_is_sealed_like_content_in_a_save_and_in_an_update() -> None:
    """A subject is free text (a person's name, a place): personal data, gone with the key."""
    cipher = NoteCipher(MasterKey(bytes(32)).new_data_key())
    renamed = NoteUpdated(
        event_id="e2", note_id="AAAAAAAA", user_id="alice", version=2, command_id="c1", at=NOW, subject="Ottoline"
    )
    for event in (saved(subject="Ottoline"), renamed):
        sealed = cipher.seal_event(event)
        assert is_sealed(sealed) and sealed.subject is not None and "Ottoline" not in sealed.subject
        assert cipher.open_event(sealed) == event
        assert shredded(sealed).subject is None


def test_an_event_sealed_before_subjects_were_opens_with_its_plaintext_subject() -> None:
    cipher = NoteCipher(MasterKey(bytes(32)).new_data_key())
    event = saved(subject="Alec")
    legacy = msgspec.structs.replace(cipher.seal_event(saved(subject=None)), subject="Alec")
    assert cipher.open_event(legacy) == event
    assert shredded(legacy).subject is None, "its key gone, it reads without its subject"


def test_a_shredded_event_reads_without_content() -> None:
    sealed = NoteCipher(MasterKey(bytes(32)).new_data_key()).seal_event(saved())
    assert shredded(sealed).content == "" and shredded(sealed).version == 1 and shredded(sealed).subject is None


def test_subjects_match_by_a_keyed_hash_case_and_spacing_aside() -> None:
    matcher = SubjectMatcher.from_master(MasterKey(bytes(32)))
    key = matcher.match_key("alice", "Sarah Smith")
    assert key == matcher.match_key("alice", "  sarah\tSMITH ") == matcher.match_key("alice", "SARAH  smith")
    assert "sarah" not in key.casefold() and "smith" not in key.casefold()
    assert key != matcher.match_key("alice", "Sarah Smyth")
    assert key != matcher.match_key("bob", "Sarah Smith"), "one user's subjects cannot be linked to another's"
    other = SubjectMatcher.from_master(MasterKey(bytes([1]) * 32))
    assert key != other.match_key("alice", "Sarah Smith"), "without the master key no guess can be checked"
    assert SubjectMatcher.from_master(MasterKey(bytes(32))).match_key("alice", "Sarah Smith") == key, "stable"


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


def test_a_read_model_value_is_deterministic_and_bound_to_its_note_and_name() -> None:
    master = MasterKey(bytes(32))
    key = RecordKey(master.new_data_key())
    sealed = key.seal(b"Alec is my boss", b'["note","alice","AAAAAAAA"]')
    assert b"Alec" not in sealed
    assert key.seal(b"Alec is my boss", b'["note","alice","AAAAAAAA"]') == sealed, "a rebuild writes the same bytes"
    assert key.seal(b"Alec is my boss", b'["note","alice","BBBBBBBB"]')[:12] != sealed[:12], "one nonce per name"
    assert key.open(sealed, b'["note","alice","AAAAAAAA"]') == b"Alec is my boss"
    with pytest.raises(InvalidTag):
        key.open(sealed, b'["note","alice","BBBBBBBB"]')
    with pytest.raises(InvalidTag):
        RecordKey(master.new_data_key()).open(sealed, b'["note","alice","AAAAAAAA"]')


def test_unwrapped_keys_are_cached_per_note_and_a_missing_key_is_none() -> None:
    master = MasterKey(bytes(32))
    data_key = master.new_data_key()
    wrapped = master.wrap(data_key, "alice/AAAAAAAA")
    keys = RecordKeys(master, cache_size=2)
    first = keys.of(wrapped, "alice", "AAAAAAAA")
    assert first is not None and keys.of(wrapped, "alice", "AAAAAAAA") is first
    assert keys.of(None, "alice", "AAAAAAAA") is None, "a forgotten note's key is gone, cached or not"
    with pytest.raises(MasterKeyError):
        keys.of(wrapped, "mallory", "AAAAAAAA")  # the cache keeps the unwrap's binding to its note


def test_a_keyed_notes_key_is_looked_up_by_a_keyed_hash() -> None:
    fields = KeyedFields.from_master(MasterKey(bytes(32)))
    digest = fields.digest("alice", "prefs", "sarah@example.com")
    assert "sarah" not in digest and digest == fields.digest("alice", "prefs", "sarah@example.com")
    assert digest != fields.digest("bob", "prefs", "sarah@example.com")
    assert digest != fields.digest("alice", "prefs/x", "sarah@example.com")
    assert digest != KeyedFields.from_master(MasterKey(bytes([1]) * 32)).digest("alice", "prefs", "sarah@example.com")
