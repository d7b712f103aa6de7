"""The master key's generations: how a wrapped data key names its generation, the keyring's
sources and format, and the derived keys that must not change with a rotation."""

from __future__ import annotations

import base64
import os
import re
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from engram_ledger.services.adapters.crypto import (
    KEYED_FIELD_LABEL,
    SUBJECT_MATCH_LABEL,
    KeyedFields,
    MasterKey,
    MasterKeyError,
    RecordKeys,
    SubjectMatcher,
    load_master_key,
    parse_keyring,
    wrapped_generation,
)

OLD, NEW = bytes(range(32)), bytes(range(100, 132))


def b64(key: bytes) -> str:
    return base64.b64encode(key).decode()


def test_generation_one_wraps_exactly_as_before_generations() -> None:
    """A store written by an earlier release opens unchanged, and one never rotated stays
    readable by that release: generation 1 is the untagged nonce + box it always was."""
    data_key = os.urandom(32)
    nonce = os.urandom(12)
    written_before = nonce + AESGCM(OLD).encrypt(nonce, data_key, b"alice/AAAAAAAA")
    master = MasterKey(OLD)
    assert master.unwrap(written_before, "alice/AAAAAAAA") == data_key
    wrapped = master.wrap(data_key, "alice/AAAAAAAA")
    assert len(wrapped) == 60 and wrapped_generation(wrapped) == 1
    assert AESGCM(OLD).decrypt(wrapped[:12], wrapped[12:], b"alice/AAAAAAAA") == data_key


def test_a_later_generation_is_named_in_the_wrapping_and_unwrap_picks_its_key() -> None:
    both = MasterKey.from_keyring({1: OLD, 2: NEW})
    assert both.active_generation == 1, "a newer key given ahead of a rotation is not used before it"
    data_key = both.new_data_key()
    under_old = both.wrap(data_key, "alice/AAAAAAAA")
    both.use(2)
    under_new = both.wrap(data_key, "alice/AAAAAAAA")
    assert under_new[:5] == b"\x01\x00\x00\x00\x02" and len(under_new) == 65
    assert wrapped_generation(under_new) == 2 and wrapped_generation(under_old) == 1
    assert both.unwrap(under_old, "alice/AAAAAAAA") == both.unwrap(under_new, "alice/AAAAAAAA") == data_key

    new_only = MasterKey(NEW, 2)
    assert new_only.unwrap(under_new, "alice/AAAAAAAA") == data_key
    with pytest.raises(MasterKeyError, match=r"generation 1, which this keyring .* does not hold"):
        new_only.unwrap(under_old, "alice/AAAAAAAA")
    with pytest.raises(MasterKeyError):
        new_only.unwrap(under_new, "mallory/AAAAAAAA")  # still bound to its note
    relabelled = b"\x01\x00\x00\x00\x03" + under_new[5:]
    with pytest.raises(MasterKeyError, match="generation 3"):
        MasterKey.from_keyring({2: NEW, 3: NEW}).unwrap(relabelled, "alice/AAAAAAAA")  # the header is bound too
    with pytest.raises(MasterKeyError, match="no known form"):
        wrapped_generation(b"\x07" * 70)


def test_rewrap_moves_a_key_to_a_generation_and_leaves_one_already_there() -> None:
    both = MasterKey.from_keyring({1: OLD, 2: NEW})
    data_key = both.new_data_key()
    old = both.wrap(data_key, "bob/BBBBBBBB")
    new = both.rewrap(old, "bob/BBBBBBBB", 2)
    assert wrapped_generation(new) == 2 and MasterKey(NEW, 2).unwrap(new, "bob/BBBBBBBB") == data_key
    assert both.rewrap(new, "bob/BBBBBBBB", 2) is new


def test_derived_keys_stay_what_they_were_and_survive_the_first_generation() -> None:
    """Subject match keys and keyed-note lookups are stored in Redis and in the index: a
    rotation must not change them, even once generation 1's key is gone."""
    label = "engram subject match v1"
    before = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=label.encode()).derive(OLD)
    first = MasterKey(OLD)
    assert first.derive(label) == before, "the derivation a store was written with"

    # Built before the root is known (as the service builds before it connects); used after.
    new_only = MasterKey(NEW, 2)
    subjects, fields = SubjectMatcher.from_master(new_only), KeyedFields.from_master(new_only)
    with pytest.raises(MasterKeyError, match="derivation root"):
        subjects.match_key("alice", "Sarah")
    both = MasterKey.from_keyring({1: OLD, 2: NEW})
    new_only.adopt_root(both.wrapped_root(2))
    assert new_only.derive(label) == before
    assert subjects.match_key("alice", "Sarah") == SubjectMatcher.from_master(first).match_key("alice", "Sarah")
    assert fields.digest("alice", "prefs", "k") == KeyedFields(first.derive(KEYED_FIELD_LABEL)).digest(
        "alice", "prefs", "k"
    )
    assert SubjectMatcher(first.derive(SUBJECT_MATCH_LABEL)).match_key("a", "b") == subjects.match_key("a", "b")

    impostor = MasterKey.from_keyring({1: bytes(32), 2: NEW})
    with pytest.raises(MasterKeyError, match="not the key this store was created with"):
        impostor.adopt_root(both.wrapped_root(2))


def test_record_keys_open_a_note_whichever_generation_wrapped_its_key() -> None:
    both = MasterKey.from_keyring({1: OLD, 2: NEW})
    data_key = both.new_data_key()
    old = both.wrap(data_key, "alice/AAAAAAAA")
    keys = RecordKeys(both)
    sealed = keys.of(old, "alice", "AAAAAAAA")
    assert sealed is not None
    box = sealed.seal(b"Alec is my boss", b"name")
    reopened = keys.of(both.rewrap(old, "alice/AAAAAAAA", 2), "alice", "AAAAAAAA")
    assert reopened is not None and reopened.open(box, b"name") == b"Alec is my boss"


def test_the_keyring_format() -> None:
    text = f"# engram master keys\n{b64(OLD)}\n2:{b64(NEW)}  # added by engram keys rotate\n"
    assert parse_keyring(text, "f") == {1: OLD, 2: NEW}, "a bare key is generation 1, as every file was"
    assert parse_keyring(f"1:{b64(OLD)}, 2:{b64(NEW)}", "V") == {1: OLD, 2: NEW}
    for bad, message in (
        ("", "holds no master key"),
        (f"0:{b64(OLD)}", "generation 0 is not from 1"),
        ("2:not*base64", r"V \(generation 2\) is not base64"),
        (f"2:{b64(OLD[:16])}", "generation 2 must be 32 bytes, not 16"),
        (f"2:{b64(OLD)} 2:{b64(NEW)}", "two different keys for generation 2"),
    ):
        with pytest.raises(MasterKeyError, match=message):
            parse_keyring(bad, "V")


def test_where_the_keyring_comes_from(tmp_path: Path) -> None:
    env = {"ENGRAM_MASTER_KEYS": f"1:{b64(OLD)},2:{b64(NEW)}", "ENGRAM_MASTER_KEY": b64(bytes(32))}
    assert load_master_key(tmp_path, env).generations == [1, 2], "ENGRAM_MASTER_KEYS first"
    only_new = load_master_key(tmp_path, {"ENGRAM_MASTER_KEY": f"2:{b64(NEW)}"})
    assert only_new.generations == [2] and only_new.active_generation == 2
    key_file = tmp_path / "keys"
    key_file.write_text(f"{b64(OLD)}\n")
    from_file = load_master_key(tmp_path, {"ENGRAM_MASTER_KEY_FILE": str(key_file)})
    assert from_file.generations == [1] and from_file.key_file == key_file
    generated = load_master_key(tmp_path / "data", {})
    assert generated.key_file == tmp_path / "data" / "master.key" and generated.generations == [1]
    with pytest.raises(MasterKeyError, match="ENGRAM_MASTER_KEY"):
        load_master_key(tmp_path, {"ENGRAM_MASTER_KEY": "2:short"})


def test_a_generation_added_to_the_file_reaches_a_process_that_read_it_before(tmp_path: Path) -> None:
    key_file = tmp_path / "keys"
    key_file.write_text(f"# ours\n{b64(OLD)}\n")
    key_file.chmod(0o600)
    env = {"ENGRAM_MASTER_KEY_FILE": str(key_file)}
    running, rotating = load_master_key(tmp_path, env), load_master_key(tmp_path, env)
    assert rotating.add_generation(2) == key_file
    assert key_file.read_text().startswith(f"# ours\n{b64(OLD)}\n2:"), "the file keeps what it held"
    assert key_file.stat().st_mode & 0o777 == 0o600
    rotating.use(2)
    data_key = rotating.new_data_key()
    wrapped = rotating.wrap(data_key, "alice/AAAAAAAA")
    assert running.unwrap(wrapped, "alice/AAAAAAAA") == data_key, "read again from the file on first sight"
    assert running.generations == [1, 2]
    with pytest.raises(MasterKeyError, match="already holds generation 2"):
        rotating.add_generation(2)
    with pytest.raises(MasterKeyError, match=re.escape("ENGRAM_MASTER_KEYS=...,3:")):
        load_master_key(tmp_path, {"ENGRAM_MASTER_KEY": b64(OLD)}).add_generation(3)


def test_retiring_takes_old_generations_out_of_the_file(tmp_path: Path) -> None:
    key_file = tmp_path / "keys"
    key_file.write_text(f"# ours\n{b64(OLD)}\n2:{b64(NEW)}\n")
    master = load_master_key(tmp_path, {"ENGRAM_MASTER_KEY_FILE": str(key_file)})
    with pytest.raises(MasterKeyError, match="active one"):
        master.drop_generations([1])  # still wrapping under 1
    master.use(2)
    assert master.drop_generations([1]) == key_file
    assert key_file.read_text() == f"# ours\n2:{b64(NEW)}\n" and master.generations == [2]
    assert key_file.stat().st_mode & 0o777 == 0o600
