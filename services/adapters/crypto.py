"""Crypto-shredding: note content in events is sealed under a per-note data key (AES-256-GCM,
from ``cryptography``), and that key is stored wrapped by the master key. Forgetting a note
deletes its wrapped key in the same atomic append as ``NoteForgotten``: every copy of the
content (the note stream, the log, a backup, an AOF) is then ciphertext nobody can open.

Subjects are sealed too (a person's name, a place: personal data). Where the vector index must
filter by subject it holds a keyed hash instead (``SubjectMatcher``), never the text.

The history read model seals the same content under the same data keys (``RecordKey``), and
finds a keyed note by a keyed hash of its key (``KeyedFields``), so a forget that destroys a
key leaves nothing readable there either.

The master key comes from ``ENGRAM_MASTER_KEY`` (32 bytes, base64), or the file named by
``ENGRAM_MASTER_KEY_FILE``; the embedded default generates one under the data dir and says so.
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import hmac
import logging
import os
from collections.abc import Mapping
from pathlib import Path

import msgspec
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from contracts.events import AnyEvent
from services.adapters.private_files import private_dir

log = logging.getLogger("engram.crypto")

SEALED_PREFIX = "enc1:"
# The event fields that hold what the user said or whom it is about; everything else is metadata.
# Events written before a field joined this list keep it in plain text and still load.
SEALED_FIELDS = (
    "content",
    "summary",
    "narrative",
    "trigger",
    "action",
    "speaker",
    "subject",
    "key",
    "value",
    "item",
)
_NONCE = 12
# HKDF info of the subject matching key: a new version of the label is a new key, so changing
# how subjects are hashed means an index rebuild.
SUBJECT_MATCH_LABEL = "engram subject match v1"
KEYED_FIELD_LABEL = "engram keyed field v1"
# The read model's two subkeys of a note's data key: one seals, one makes the nonce.
_RECORD_SEAL_LABEL = b"engram read model v1 seal"
_RECORD_NONCE_LABEL = b"engram read model v1 nonce"


class MasterKeyError(RuntimeError):
    """A master key that cannot be used (wrong length, not base64, or not the one that wrapped
    the data keys in this Redis)."""


class MasterKey:
    """Wraps the per-note data keys, and derives the keys other uses need (never itself reused)."""

    def __init__(self, key: bytes) -> None:
        if len(key) != 32:
            raise MasterKeyError(f"the master key must be 32 bytes, not {len(key)}")
        self._aead = AESGCM(key)
        self._key = key

    def derive(self, label: str) -> bytes:
        """A 32-byte key for one purpose, named by ``label`` (HKDF-SHA256)."""
        return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=label.encode()).derive(self._key)

    def new_data_key(self) -> bytes:
        return AESGCM.generate_key(bit_length=256)

    def wrap(self, data_key: bytes, label: str) -> bytes:
        nonce = os.urandom(_NONCE)
        return nonce + self._aead.encrypt(nonce, data_key, label.encode())

    def unwrap(self, wrapped: bytes, label: str) -> bytes:
        try:
            return self._aead.decrypt(wrapped[:_NONCE], wrapped[_NONCE:], label.encode())
        except InvalidTag:
            raise MasterKeyError(
                "a data key does not open with this master key: is ENGRAM_MASTER_KEY the right one?"
            ) from None


def load_master_key(data_dir: Path, env: Mapping[str, str] = os.environ) -> MasterKey:
    if env.get("ENGRAM_MASTER_KEY"):
        return MasterKey(_decode(env["ENGRAM_MASTER_KEY"], "ENGRAM_MASTER_KEY"))
    if env.get("ENGRAM_MASTER_KEY_FILE"):
        path = Path(env["ENGRAM_MASTER_KEY_FILE"])
        return MasterKey(_decode(path.read_text().strip(), str(path)))
    path = data_dir / "master.key"
    if not path.exists():
        _generate(path)
    return MasterKey(_decode(path.read_text().strip(), str(path)))


def _generate(path: Path) -> None:
    """Written aside, then linked into place: a link never overwrites, so two processes starting
    together on one data dir end up with the same key (the first one's)."""
    private_dir(path.parent)
    draft = path.with_name(f".master.key.{os.getpid()}")
    fd = os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(base64.b64encode(AESGCM.generate_key(bit_length=256)).decode() + "\n")
    try:
        os.link(draft, path)
        log.warning(
            "generated a master key at %s: back it up with the data, or set ENGRAM_MASTER_KEY; "
            "without it no note content can be read",
            path,
        )
    except FileExistsError:
        pass
    finally:
        draft.unlink()


def _decode(text: str, where: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise MasterKeyError(f"{where} is not base64") from None


class NoteCipher:
    """Seals and opens the content fields of one note's events."""

    def __init__(self, data_key: bytes) -> None:
        self._aead = AESGCM(data_key)

    def seal_event(self, event: AnyEvent) -> AnyEvent:
        changes = {}
        for field in SEALED_FIELDS:
            value = getattr(event, field, None)
            if isinstance(value, str):
                nonce = os.urandom(_NONCE)
                sealed = self._aead.encrypt(nonce, value.encode(), f"{event.event_id}/{field}".encode())
                changes[field] = SEALED_PREFIX + base64.b64encode(nonce + sealed).decode()
        return msgspec.structs.replace(event, **changes) if changes else event

    def open_event(self, event: AnyEvent) -> AnyEvent:
        changes = {}
        for field in SEALED_FIELDS:
            value = getattr(event, field, None)
            if isinstance(value, str) and value.startswith(SEALED_PREFIX):
                raw = base64.b64decode(value[len(SEALED_PREFIX) :])
                plain = self._aead.decrypt(raw[:_NONCE], raw[_NONCE:], f"{event.event_id}/{field}".encode())
                changes[field] = plain.decode()
        return msgspec.structs.replace(event, **changes) if changes else event


def is_sealed(event: AnyEvent) -> bool:
    return any(isinstance(v := getattr(event, f, None), str) and v.startswith(SEALED_PREFIX) for f in SEALED_FIELDS)


def shredded(event: AnyEvent) -> AnyEvent:
    """The event as it reads once its key is gone: every content field empty."""
    changes = {f: ("" if f == "content" else None) for f in SEALED_FIELDS if getattr(event, f, None) is not None}
    return msgspec.structs.replace(event, **changes) if changes else event


def needs_key(event: AnyEvent) -> bool:
    return any(isinstance(getattr(event, f, None), str) for f in SEALED_FIELDS)


def normalize_subject(subject: str) -> str:
    """How subjects compare: case and spacing aside ("Sarah  Smith" is "sarah smith")."""
    return " ".join(subject.casefold().split())


def keyed_hash(key: bytes, *parts: str) -> str:
    """An HMAC of the parts (as one JSON array, so they cannot run into each other), shortened
    to 128 bits: a guess cannot be checked without the key."""
    digest = hmac.new(key, msgspec.json.encode(list(parts)), hashlib.sha256).digest()[:16]
    return base64.urlsafe_b64encode(digest).decode().rstrip("=")


class SubjectMatcher:
    """Keyed hashes of subjects: what the vector index filters by subject on, so its payloads
    (which stay in the shard's files after a point is deleted, FIELD-NOTES) never hold the text.
    Keyed by a key derived from the master key, so a guess cannot be checked without it; the
    user is part of the hash, so one user's subjects cannot be linked to another's."""

    def __init__(self, key: bytes) -> None:
        self._key = key

    @classmethod
    def from_master(cls, master: MasterKey) -> SubjectMatcher:
        return cls(master.derive(SUBJECT_MATCH_LABEL))

    def match_key(self, user_id: str, subject: str) -> str:
        """The same for two subjects that ``normalize_subject`` makes equal, for one user."""
        return keyed_hash(self._key, user_id, normalize_subject(subject))


class KeyedFields:
    """Keyed hashes of the keys notes are put under (``PutNote``): what the read model's key
    lookup is indexed by, so a caller's key (which may be personal: an email address, a
    name) is not left in a hash field. Keyed like ``SubjectMatcher``, by its own derived key."""

    def __init__(self, key: bytes) -> None:
        self._key = key

    @classmethod
    def from_master(cls, master: MasterKey) -> KeyedFields:
        return cls(master.derive(KEYED_FIELD_LABEL))

    def digest(self, user_id: str, category: str, key: str) -> str:
        return keyed_hash(self._key, user_id, category, key)


class RecordKey:
    """A note's data key as the read model uses it: values sealed with AES-256-GCM under a
    subkey, bound to the name they are stored under (the additional data), with a synthetic
    nonce (an HMAC of that name and the plaintext under a second subkey). Deterministic on
    purpose: a rebuild writes the very bytes the live projection wrote, and a replayed write
    changes nothing; all it shows is that a value stored under one name did not change. Both
    subkeys are HMACs of the data key, so the events' key is never used for anything else."""

    __slots__ = ("_aead", "_nonce_key")

    def __init__(self, data_key: bytes) -> None:
        self._aead = AESGCM(hmac.digest(data_key, _RECORD_SEAL_LABEL, "sha256"))
        self._nonce_key = hmac.digest(data_key, _RECORD_NONCE_LABEL, "sha256")

    def seal(self, plain: bytes, name: bytes) -> bytes:
        bound = len(name).to_bytes(4, "big") + name + plain
        nonce = hmac.digest(self._nonce_key, bound, "sha256")[:_NONCE]
        return nonce + self._aead.encrypt(nonce, plain, name)

    def open(self, box: bytes, name: bytes) -> bytes:
        """Raises ``InvalidTag`` for a value sealed under another name or another key."""
        return self._aead.decrypt(box[:_NONCE], box[_NONCE:], name)


class RecordKeys:
    """Unwraps notes' data keys for the read model. Unwrapped keys are kept in a bounded LRU
    (by the wrapped key and the note it is wrapped for, as the unwrap's label binds them):
    callers read the wrapped key from Redis with every value, so a key the cache still holds
    opens nothing once a forget has deleted the wrapped one."""

    def __init__(self, master: MasterKey, cache_size: int = 4096) -> None:
        self._master = master
        self._unwrapped = functools.lru_cache(maxsize=cache_size)(self._unwrap)

    def _unwrap(self, wrapped: bytes, user_id: str, note_id: str) -> RecordKey:
        return RecordKey(self._master.unwrap(wrapped, f"{user_id}/{note_id}"))

    def of(self, wrapped: bytes | None, user_id: str, note_id: str) -> RecordKey | None:
        """The note's key, or None when it has none (forgotten)."""
        return None if wrapped is None else self._unwrapped(wrapped, user_id, note_id)
