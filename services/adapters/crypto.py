"""Crypto-shredding: note content in events is sealed under a per-note data key (AES-256-GCM,
from ``cryptography``), and that key is stored wrapped by the master key. Forgetting a note
deletes its wrapped key in the same atomic append as ``NoteForgotten``: every copy of the
content (the note stream, the log, a backup, an AOF) is then ciphertext nobody can open.

Subjects are sealed too (a person's name, a place: personal data). Where the vector index must
filter by subject it holds a keyed hash instead (``SubjectMatcher``), never the text.

The history read model seals the same content under the same data keys (``RecordKey``), and
finds a keyed note by a keyed hash of its key (``KeyedFields``), so a forget that destroys a
key leaves nothing readable there either.

The master key is a keyring of generations (``MasterKey``), so that it can be rotated
(``engram keys rotate``, services/ops/keys.py) without rewriting the log: a data key wrapped by
generation 1 is stored as every release before generations stored it; a later generation's
wrapping starts with a header naming it. The keyring comes from ``ENGRAM_MASTER_KEYS``
(``G:BASE64`` entries), ``ENGRAM_MASTER_KEY`` (one key: generation 1, or ``G:BASE64``), the
file named by ``ENGRAM_MASTER_KEY_FILE`` (one entry a line), or a file the embedded default
generates under the data dir and says so. The keys hashes are keyed with (``derive``) come from
a root that generation 1 fixed once (an HKDF extract of it), carried forward in Redis wrapped
by the newer generations (services/adapters/keyring.py), so they never change with a rotation.
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import hmac
import logging
import os
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import msgspec
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF, HKDFExpand

from engram_ledger.contracts.events import AnyEvent, MemoryRecalled
from engram_ledger.services.adapters.private_files import private_dir, write_private
from engram_ledger.services.domain.values import normalize_subject

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
    # A recall's query (MemoryRecalled), under ``recall_key``.
    "query",
)
_NONCE = 12
# HKDF info of the subject matching key: a new version of the label is a new key, so changing
# how subjects are hashed means an index rebuild.
SUBJECT_MATCH_LABEL = "engram subject match v1"
KEYED_FIELD_LABEL = "engram keyed field v1"
REQUEST_FINGERPRINT_LABEL = "engram request fingerprint v1"
# The read model's two subkeys of a note's data key: one seals, one makes the nonce.
_RECORD_SEAL_LABEL = b"engram read model v1 seal"
_RECORD_NONCE_LABEL = b"engram read model v1 nonce"

KEYS_VARIABLE = "ENGRAM_MASTER_KEYS"
KEY_VARIABLE = "ENGRAM_MASTER_KEY"
KEY_FILE_VARIABLE = "ENGRAM_MASTER_KEY_FILE"
GENERATED_KEY_FILE = "master.key"
MAX_GENERATION = 2**32 - 1
# A data key wrapped by generation 1 is the nonce and the AES-GCM box of the 32-byte key, as
# every release before generations wrote it (60 bytes): a store written then reads unchanged,
# and one never rotated stays readable by those releases. Any later generation's wrapping
# starts with this tag and its generation (4 bytes), which the box's additional data binds.
_TAGGED = b"\x01"
_HEADER = 1 + 4
_BARE_WRAPPED = _NONCE + 32 + 16
# What the derivation root is wrapped for (services/adapters/keyring.py keeps it in Redis).
ROOT_LABEL = "engram derivation root"
# A key of an unknown generation re-reads the keyring's file at most this often.
_RELOAD_SECONDS = 1.0
_ENTRY = re.compile(r"(?:([0-9]+):)?(\S+)")


class MasterKeyError(RuntimeError):
    """A master key that cannot be used (wrong length, not base64, or not the one that wrapped
    the data keys in this Redis)."""


@dataclass(frozen=True)
class KeySource:
    """Where a keyring comes from, so it can be read again: a variable's text, or a file (which
    an operator, or ``engram keys rotate``, can add a generation to while the service runs)."""

    name: str
    text: str | None = None
    path: Path | None = None

    def read(self) -> dict[int, bytes]:
        text = self.path.read_text() if self.path is not None else self.text or ""
        return parse_keyring(text, self.name)


def parse_keyring(text: str, where: str) -> dict[int, bytes]:
    """Keys by generation from ``G:BASE64`` entries (separated by commas, spaces or lines;
    ``#`` starts a comment). An entry without ``G:`` is generation 1: the one key every file and
    variable held before generations."""
    keys: dict[int, bytes] = {}
    for line in text.splitlines():
        for token in re.split(r"[\s,]+", line.split("#", 1)[0].strip()):
            if not token:
                continue
            entry = _ENTRY.fullmatch(token)
            assert entry is not None  # \S+ matches any token
            generation = int(entry[1]) if entry[1] is not None else 1
            if not 1 <= generation <= MAX_GENERATION:
                raise MasterKeyError(f"{where}: key generation {entry[1]} is not from 1 to {MAX_GENERATION}")
            key = _decode(entry[2], f"{where} (generation {generation})")
            if len(key) != 32:
                raise MasterKeyError(
                    f"{where}: the master key of generation {generation} must be 32 bytes, not {len(key)}"
                )
            if keys.get(generation, key) != key:
                raise MasterKeyError(f"{where} holds two different keys for generation {generation}")
            keys[generation] = key
    if not keys:
        raise MasterKeyError(f"{where} holds no master key")
    return keys


def wrapped_generation(wrapped: bytes) -> int:
    """Which master-key generation wrapped a data key: 1 for the untagged form, else its tag's."""
    if len(wrapped) == _BARE_WRAPPED:
        return 1
    if len(wrapped) > _HEADER + _NONCE and wrapped[:1] == _TAGGED:
        return int.from_bytes(wrapped[1:_HEADER], "big")
    raise MasterKeyError(f"a wrapped data key of {len(wrapped)} bytes is in no known form")


def _extract(key: bytes) -> bytes:
    """HKDF-SHA256's extract step without a salt (RFC 5869: a zero salt): what ``derive`` has
    always expanded, so keys derived from the root are those derived from generation 1 before."""
    return hmac.digest(bytes(32), key, "sha256")


class MasterKey:
    """The master key's generations (a keyring). Wraps new data keys under the active generation
    and unwraps each under the generation that wrapped it, so two generations are live while a
    rotation re-wraps; derives the keys other uses need (never a master key itself) from the
    derivation root. ``MasterKey(key)`` is a keyring of that one key as generation 1."""

    def __init__(self, key: bytes, generation: int = 1, *, source: KeySource | None = None) -> None:
        self._keys: dict[int, bytes] = {}
        self._aeads: dict[int, AESGCM] = {}
        self._root: bytes | None = None
        self._source = source
        self._reloaded_at = float("-inf")
        self._add(generation, key)
        self._active = generation

    @classmethod
    def from_keyring(cls, keys: Mapping[int, bytes], *, source: KeySource | None = None) -> MasterKey:
        """A keyring that wraps under its oldest generation until told otherwise (``use``): a
        newer one given ahead of a rotation is not used before the rotation says so."""
        if not keys:
            raise MasterKeyError("a keyring needs at least one master key")
        oldest = min(keys)
        master = cls(keys[oldest], oldest, source=source)
        for generation, key in keys.items():
            master._add(generation, key)
        return master

    def _add(self, generation: int, key: bytes) -> None:
        if len(key) != 32:
            raise MasterKeyError(f"the master key must be 32 bytes, not {len(key)}")
        if not 1 <= generation <= MAX_GENERATION:
            raise MasterKeyError(f"key generation {generation} is not from 1 to {MAX_GENERATION}")
        if self._keys.get(generation, key) != key:
            raise MasterKeyError(f"{self.source}: generation {generation} is not the key it was")
        self._keys[generation] = key
        self._aeads[generation] = AESGCM(key)
        if generation == 1 and self._root is None:
            self._root = _extract(key)

    @property
    def source(self) -> str:
        """Where the keyring comes from, as an operator would set it (for messages)."""
        return self._source.name if self._source is not None else "the master key given"

    @property
    def key_file(self) -> Path | None:
        """The file the keyring is read from, if it is one (a generation can be added to it)."""
        return self._source.path if self._source is not None else None

    @property
    def generations(self) -> list[int]:
        return sorted(self._keys)

    @property
    def active_generation(self) -> int:
        """The generation new data keys are wrapped under."""
        return self._active

    @property
    def has_root(self) -> bool:
        return self._root is not None

    def holds(self, generation: int) -> bool:
        return generation in self._keys

    def use(self, generation: int) -> None:
        """Wrap new data keys under ``generation`` from now on."""
        if not self.holds(generation):
            raise MasterKeyError(f"key generation {generation} is not in this keyring ({self.source})")
        self._active = generation

    def reload(self) -> list[int]:
        """Read the keyring's source again (a file may have gained a generation); the
        generations it added. Keys already held stay: a running process keeps what it opened."""
        self._reloaded_at = time.monotonic()
        if self._source is None:
            return []
        added = []
        for generation, key in self._source.read().items():
            if generation not in self._keys:
                self._add(generation, key)
                added.append(generation)
            elif self._keys[generation] != key:
                log.error("%s gives generation %d another key than it had: keeping the first", self.source, generation)
        if added:
            log.info("key generation(s) %s read from %s", ", ".join(map(str, added)), self.source)
        return added

    def derive(self, label: str) -> bytes:
        """A 32-byte key for one purpose, named by ``label`` (HKDF-SHA256, expanded from the root)."""
        if self._root is None:
            raise MasterKeyError(
                f"this keyring ({self.source}) holds no generation 1 key, and the derivation root has not "
                "been read from Redis (services/adapters/keyring.attach_keyring)"
            )
        return HKDFExpand(algorithm=hashes.SHA256(), length=32, info=label.encode()).derive(self._root)

    def new_data_key(self) -> bytes:
        return AESGCM.generate_key(bit_length=256)

    def wrap(self, data_key: bytes, label: str, generation: int | None = None) -> bytes:
        """``data_key`` wrapped under ``generation`` (default: the active one), bound to ``label``."""
        generation = self._active if generation is None else generation
        aead = self._aeads.get(generation)
        if aead is None:
            raise MasterKeyError(f"key generation {generation} is not in this keyring ({self.source})")
        nonce = os.urandom(_NONCE)
        if generation == 1:
            return nonce + aead.encrypt(nonce, data_key, label.encode())
        if len(data_key) != 32:  # the untagged form is told apart by its length
            raise MasterKeyError(f"only 32-byte keys are wrapped, not {len(data_key)} bytes")
        header = _TAGGED + generation.to_bytes(4, "big")
        return header + nonce + aead.encrypt(nonce, data_key, header + label.encode())

    def unwrap(self, wrapped: bytes, label: str) -> bytes:
        generation = wrapped_generation(wrapped)
        aead = self._aeads.get(generation)
        if aead is None and self._source is not None and time.monotonic() - self._reloaded_at > _RELOAD_SECONDS:
            # A rotation may have begun since this keyring was read: its file may hold the key now.
            self.reload()
            aead = self._aeads.get(generation)
        if aead is None:
            raise MasterKeyError(
                f"a data key is wrapped under master-key generation {generation}, which this keyring "
                f"({self.source}) does not hold (it holds {', '.join(map(str, self.generations))})"
            )
        try:
            if generation == 1 and len(wrapped) == _BARE_WRAPPED:
                return aead.decrypt(wrapped[:_NONCE], wrapped[_NONCE:], label.encode())
            header, nonce, box = wrapped[:_HEADER], wrapped[_HEADER : _HEADER + _NONCE], wrapped[_HEADER + _NONCE :]
            return aead.decrypt(nonce, box, header + label.encode())
        except InvalidTag:
            raise MasterKeyError(
                f"a data key does not open with generation {generation} of this keyring ({self.source}): "
                "is it the right master key?"
            ) from None

    def rewrap(self, wrapped: bytes, label: str, generation: int) -> bytes:
        """The same data key wrapped under ``generation`` (``wrapped`` itself if it already is)."""
        if wrapped_generation(wrapped) == generation:
            return wrapped
        return self.wrap(self.unwrap(wrapped, label), label, generation)

    def wrapped_root(self, generation: int) -> bytes:
        """The derivation root wrapped under ``generation``, for Redis to carry it forward."""
        if self._root is None:
            raise MasterKeyError(f"this keyring ({self.source}) does not know the derivation root")
        return self.wrap(self._root, ROOT_LABEL, generation)

    def adopt_root(self, wrapped: bytes) -> None:
        """Take the derivation root from its wrapping in Redis (one this keyring can open)."""
        root = self.unwrap(wrapped, ROOT_LABEL)
        if self._root is not None and not hmac.compare_digest(root, self._root):
            raise MasterKeyError(
                f"generation 1 of this keyring ({self.source}) is not the key this store was created with"
            )
        self._root = root

    def add_generation(self, generation: int) -> Path:
        """Generate a key for ``generation`` and add it to the keyring's file (written aside,
        then moved into place, 0600: a reader sees the old file or the new one). The file."""
        path = self.key_file
        if path is None:
            raise MasterKeyError(
                f"the keyring comes from {self.source}, which this command cannot change: add generation "
                f"{generation} there ({KEYS_VARIABLE}=...,{generation}:<32 random bytes, base64>) for every "
                "worker and for this command"
            )
        if self.holds(generation):
            raise MasterKeyError(f"{path} already holds generation {generation}")
        key = AESGCM.generate_key(bit_length=256)
        text = path.read_text()
        text = (text if text.endswith("\n") or not text else text + "\n") + _entry(generation, key) + "\n"
        try:
            write_private(path, text)
        except OSError as e:
            raise MasterKeyError(f"cannot add generation {generation} to {path}: {e.strerror}") from None
        self._add(generation, key)
        log.info("added master-key generation %d to %s", generation, path)
        return path

    def forget_generations(self, generations: Iterable[int]) -> None:
        """Take ``generations`` out of this keyring alone (a running worker, after `engram keys
        retire` took them out of the file): nothing it holds opens them any more."""
        for generation in generations:
            if generation != self._active:
                self._keys.pop(generation, None)
                self._aeads.pop(generation, None)

    def drop_generations(self, generations: Iterable[int]) -> Path | None:
        """Take ``generations`` out of the keyring's file (if it is one; else the operator removes
        them from the variable) and out of this keyring. The file, or None."""
        gone = set(generations)
        if self._active in gone:
            raise MasterKeyError(f"generation {self._active} is the active one: it cannot be retired")
        path = self.key_file
        if path is not None and gone:
            lines = []
            for line in path.read_text().splitlines():
                tokens = _entries(line)
                kept = [t for t in tokens if _generation_of(t) not in gone]
                if not tokens:  # a comment or a blank line
                    lines.append(line)
                elif kept:
                    lines.append(" ".join(kept))
            try:
                write_private(path, "\n".join(lines) + "\n")
            except OSError as e:
                raise MasterKeyError(f"cannot rewrite {path}: {e.strerror}") from None
        for generation in gone:
            self._keys.pop(generation, None)
            self._aeads.pop(generation, None)
        return path


def _entry(generation: int, key: bytes) -> str:
    return f"{generation}:{base64.b64encode(key).decode()}"


def _entries(line: str) -> list[str]:
    return [t for t in re.split(r"[\s,]+", line.split("#", 1)[0].strip()) if t]


def _generation_of(token: str) -> int:
    entry = _ENTRY.fullmatch(token)
    return int(entry[1]) if entry is not None and entry[1] is not None else 1


def load_master_key(data_dir: Path, env: Mapping[str, str] = os.environ) -> MasterKey:
    """The keyring as configured: ``ENGRAM_MASTER_KEYS``, ``ENGRAM_MASTER_KEY``, the file named by
    ``ENGRAM_MASTER_KEY_FILE``, or the data dir's own (generated the first time), first set first."""
    if env.get(KEYS_VARIABLE):
        source = KeySource(KEYS_VARIABLE, text=env[KEYS_VARIABLE])
    elif env.get(KEY_VARIABLE):
        source = KeySource(KEY_VARIABLE, text=env[KEY_VARIABLE])
    elif env.get(KEY_FILE_VARIABLE):
        path = Path(env[KEY_FILE_VARIABLE])
        source = KeySource(str(path), path=path)
    else:
        path = data_dir / GENERATED_KEY_FILE
        if not path.exists():
            _generate(path)
        source = KeySource(str(path), path=path)
    return MasterKey.from_keyring(source.read(), source=source)


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


RECALL_KEY_LABEL = b"engram recall v1"


def recall_key(own: bytes, named: Sequence[bytes]) -> bytes:
    """The key a recall's query is sealed under: drawn (HKDF-SHA256) from the recall's own data
    key and the data key of every note it names (``recall_key_notes``), in order, so destroying
    any one of them (a forget of the note, an erasure of the user) leaves the query unreadable."""
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=RECALL_KEY_LABEL).derive(own + b"".join(named))


def recall_key_notes(event: MemoryRecalled) -> list[str]:
    """The notes whose data keys a recall's query key is drawn from, in that order: those it
    showed, then those not shown whose subject it names."""
    return [*event.notes, *event.named]


def is_sealed(event: AnyEvent) -> bool:
    return any(isinstance(v := getattr(event, f, None), str) and v.startswith(SEALED_PREFIX) for f in SEALED_FIELDS)


def shredded(event: AnyEvent) -> AnyEvent:
    """The event as it reads once its key is gone: every content field empty."""
    changes = {f: ("" if f == "content" else None) for f in SEALED_FIELDS if getattr(event, f, None) is not None}
    return msgspec.structs.replace(event, **changes) if changes else event


def needs_key(event: AnyEvent) -> bool:
    return any(isinstance(getattr(event, f, None), str) for f in SEALED_FIELDS)


def keyed_hash(key: bytes, *parts: str) -> str:
    """An HMAC of the parts (as one JSON array, so they cannot run into each other), shortened
    to 128 bits: a guess cannot be checked without the key."""
    digest = hmac.new(key, msgspec.json.encode(list(parts)), hashlib.sha256).digest()[:16]
    return base64.urlsafe_b64encode(digest).decode().rstrip("=")


def _when_needed(key: bytes | Callable[[], bytes]) -> Callable[[], bytes]:
    """A derived key is derived on first use, not when its holder is built: a keyring without
    generation 1 learns the derivation root from Redis as the service starts, after ``build``."""
    if isinstance(key, bytes):
        return lambda: key
    return functools.cache(key)


class SubjectMatcher:
    """Keyed hashes of subjects: what the vector index filters by subject on, so its payloads
    (which stay in the shard's files after a point is deleted) never hold the text.
    Keyed by a key derived from the master key, so a guess cannot be checked without it; the
    user is part of the hash, so one user's subjects cannot be linked to another's."""

    def __init__(self, key: bytes | Callable[[], bytes]) -> None:
        self._key = _when_needed(key)

    @classmethod
    def from_master(cls, master: MasterKey) -> SubjectMatcher:
        return cls(functools.partial(master.derive, SUBJECT_MATCH_LABEL))

    def match_key(self, user_id: str, subject: str) -> str:
        """The same for two subjects that ``normalize_subject`` makes equal, for one user."""
        return keyed_hash(self._key(), user_id, normalize_subject(subject))


class KeyedFields:
    """Keyed hashes of the keys notes are put under (``PutNote``): what the read model's key
    lookup is indexed by, so a caller's key (which may be personal: an email address, a
    name) is not left in a hash field. Keyed like ``SubjectMatcher``, by its own derived key."""

    def __init__(self, key: bytes | Callable[[], bytes]) -> None:
        self._key = _when_needed(key)

    @classmethod
    def from_master(cls, master: MasterKey) -> KeyedFields:
        return cls(functools.partial(master.derive, KEYED_FIELD_LABEL))

    def digest(self, user_id: str, category: str, key: str) -> str:
        return keyed_hash(self._key(), user_id, category, key)


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
