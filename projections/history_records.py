"""How the history read model stores a view: what the user said sealed under the note's own data
key, the rest as it is.

A view is split in two. Its *secrets*, the fields the log seals (a note's content, subject,
summary, narrative, trigger, action, key and value; a turn's text, speaker and item) and besides
those a turn's session name and a version's origin, are sealed with the note's ``RecordKey``.
The box is bound to a *label* (what the value is: a note's view, a turn, one version of a
note, with the user and the ids) and to the shell, so a value moved under another note's name,
or a shell changed, does not open. The label leaves out the key's generation and layout, so a
rebuild writes the very bytes the live projection wrote. Its *shell*, the rest of the view,
stays readable: it is what the log keeps in plain text too (ids, kind, category, times, status,
version, scores), and the projection needs it when the key is gone: a forget destroys the key in
the same append as ``NoteForgotten``, and the tombstone, the listing member to remove and the key
lookup to drop are all made from the shell (the lookup's field is a keyed hash, kept beside the
shell for that).

Stored forms: a JSON array ``[shell, sealed secrets, keyed hash or null]``; or a JSON object, the
view as it is, for a note without a data key: a tombstone (it holds no secrets), a note whose
key a forget has just destroyed (its events read with their content empty), a note saved before
the log sealed content (the log holds its text in plain too); and every view written before the
read model was sealed (read as it is, until ``engram rebuild history`` seals it).
"""

from __future__ import annotations

from typing import Any, Generic, TypeVar

import msgspec
from cryptography.exceptions import InvalidTag

from engram_ledger.contracts.errors import EngramError, ErrorCode
from engram_ledger.contracts.model import MessageView, NoteView, Origin, RecallView, VersionView
from engram_ledger.services.adapters.crypto import RecordKey

V = TypeVar("V", NoteView, MessageView, VersionView, RecallView)


class _Sealed(msgspec.Struct, array_like=True, frozen=True):
    # The view without its secrets' fields (a JSON object).
    shell: msgspec.Raw
    # The secrets, sealed (empty: written when the key was already gone).
    box: bytes
    keyed: str | None = None


# Every field is written, null or not, so the secrets spliced into the shell make a whole view.
class _NoteSecrets(msgspec.Struct, frozen=True):
    content: str = ""
    subject: str | None = None
    summary: str | None = None
    narrative: str | None = None
    trigger: str | None = None
    action: str | None = None
    key: str | None = None
    value: dict[str, Any] | None = None


class _MessageSecrets(msgspec.Struct, frozen=True):
    # The session's name too: a conversation id may name a person (a phone number, a handle).
    session_id: str = ""
    content: str = ""
    speaker: str | None = None
    item: dict[str, Any] | None = None


class _VersionSecrets(msgspec.Struct, frozen=True):
    content: str = ""
    subject: str | None = None
    value: dict[str, Any] | None = None
    # Where the change came from: a channel and a session name.
    origin: Origin | None = None


class _RecallSecrets(msgspec.Struct, frozen=True):
    # Where the recall was asked from: a channel and a session name (which may name a person).
    channel: str | None = None
    session_id: str | None = None


class _PlainPart(msgspec.Struct, array_like=True, frozen=True):
    # A sealed value read for its shell alone: the box is left as it is, unread.
    shell: msgspec.Raw
    box: msgspec.Raw
    keyed: msgspec.Raw | None = None


_sealed_decoder = msgspec.json.Decoder(_Sealed)
_plain_decoder = msgspec.json.Decoder(_PlainPart)
P = TypeVar("P", bound=msgspec.Struct)
_encode = msgspec.json.Encoder().encode


class Stored(msgspec.Struct, Generic[V], frozen=True):
    """A stored value as the projection reads it back: the view (whole when its key opened it,
    else its shell) and the keyed hash kept beside it."""

    view: V
    keyed: str | None = None


class RecordForm(Generic[V]):
    """The stored form of one kind of view. Opening splices the secrets' JSON object into the
    shell's and decodes the view once. The sealed box is bound to the label and to the shell
    (both are its additional data), so neither can be changed or swapped for another's."""

    def __init__(self, view: type[V], secrets: type[msgspec.Struct]) -> None:
        self._view: msgspec.json.Decoder[V] = msgspec.json.Decoder(view)
        self._secrets_type = secrets
        self._fields = frozenset(secrets.__struct_fields__)
        self._blank_json = _encode(secrets())

    def encode(self, view: V, key: RecordKey | None, label: bytes, keyed: str | None = None) -> bytes:
        """``key`` None: the note has no data key, so nothing is sealed: the view as it is, or,
        with a keyed hash to keep (the projection needs it to drop the lookup), its shell."""
        if key is None and keyed is None:
            return _encode(view)
        fields = msgspec.structs.asdict(view)
        shell = _encode({f: v for f, v in fields.items() if f not in self._fields})
        if key is None:
            return _encode(_Sealed(msgspec.Raw(shell), b"", keyed))
        secrets = _encode(self._secrets_type(**{f: fields[f] for f in self._secrets_type.__struct_fields__}))
        return _encode(_Sealed(msgspec.Raw(shell), key.seal(secrets, _bound(label, shell)), keyed))

    def open(self, raw: bytes, key: RecordKey | None, label: bytes) -> V | None:
        """The view, or None when it is sealed and its key is gone (its note is forgotten)."""
        if not raw.startswith(b"["):
            return self._view.decode(raw)
        if key is None:
            return None
        return self._opened(_sealed_decoder.decode(raw), key, label)

    def shell(self, raw: bytes) -> V:
        """The view without opening its secrets (they read blank): what is kept in plain text."""
        if not raw.startswith(b"["):
            return self._view.decode(raw)
        return self._opened(_sealed_decoder.decode(raw), None, b"")

    def plain(self, raw: bytes, into: msgspec.json.Decoder[P]) -> P:
        """Some of the fields kept in plain text, decoded by ``into`` (a struct of a few of the
        view's fields): cheaper than ``shell`` where a reader needs only those."""
        if not raw.startswith(b"["):
            return into.decode(raw)
        return into.decode(_plain_decoder.decode(raw).shell)

    def read(self, raw: bytes, key: RecordKey | None, label: bytes) -> Stored[V]:
        """What the projection needs of a stored value, with or without its key."""
        if not raw.startswith(b"["):
            return Stored(self._view.decode(raw))
        sealed = _sealed_decoder.decode(raw)
        return Stored(self._opened(sealed, key, label), sealed.keyed)

    def _opened(self, sealed: _Sealed, key: RecordKey | None, label: bytes) -> V:
        shell = bytes(sealed.shell)
        secrets = self._blank_json
        if key is not None and sealed.box:
            try:
                secrets = key.open(sealed.box, _bound(label, shell))
            except InvalidTag:
                # Not the note's key, not this value (moved from another note's), or a shell
                # changed: refused rather than shown.
                raise EngramError(
                    ErrorCode.STORAGE_ERROR, f"a stored value of {label.decode()} does not open under its note's key"
                ) from None
        return self._view.decode(shell[:-1] + b"," + secrets[1:])


def _bound(label: bytes, shell: bytes) -> bytes:
    """The additional data of a sealed box: what it is the value of, and the rest of the view."""
    return len(label).to_bytes(4, "big") + label + shell


def note_label(user_id: str, note_id: str) -> bytes:
    return _encode(["note", user_id, note_id])


def message_label(user_id: str, message_id: str) -> bytes:
    return _encode(["message", user_id, message_id])


def version_label(user_id: str, note_id: str, version: str) -> bytes:
    return _encode(["version", user_id, note_id, version])


def recall_label(user_id: str, recall_id: str) -> bytes:
    return _encode(["recall", user_id, recall_id])


NOTES: RecordForm[NoteView] = RecordForm(NoteView, _NoteSecrets)
MESSAGES: RecordForm[MessageView] = RecordForm(MessageView, _MessageSecrets)
VERSIONS: RecordForm[VersionView] = RecordForm(VersionView, _VersionSecrets)
RECALLS: RecordForm[RecallView] = RecordForm(RecallView, _RecallSecrets)
