"""Validation limits, enforced when a message is decoded and documented in README.

Patterns are ASCII-only on purpose: ids end up inside Redis keys and CLI arguments.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

import msgspec

MAX_CONTENT_CHARS = 16_384
MAX_SUBJECT_CHARS = 200
MAX_CATEGORY_CHARS = 200
# A caller-chosen key (PutNote) and the structured value it names.
MAX_KEY_CHARS = 512
MAX_VALUE_BYTES = 65_536
MAX_INDEX_FIELDS = 20
# A conversation turn's item (MessageDraft.item) as JSON: room for an image sent inline.
MAX_ITEM_BYTES = 1024 * 1024
# The longest time to live a put may ask for (ten years).
MAX_TTL_SECONDS = 10 * 365 * 86_400
# How deep a search may page (SearchNotes.offset + top_k).
SEARCH_DEPTH_MAX = 100
MAX_ID_CHARS = 128
MAX_BATCH_NOTES = 100
MAX_BATCH_MESSAGES = 100
MAX_FORGET_IDS = 20
MAX_EPISODE_FIELD_CHARS = 16_384
LIST_RECENT_DEFAULT = 10
LIST_RECENT_MAX = 50
LIST_NOTES_MAX = 1_000
# A page of a listing as the CLI and the LLM tools ask for it unless told otherwise.
LIST_NOTES_PAGE = 100
SEARCH_TOP_K_DEFAULT = 5
SEARCH_TOP_K_MAX = 20
MAX_QUERY_CHARS = 2_000
# The token budget a memory block may be asked for (BuildContext.max_tokens).
MAX_CONTEXT_TOKENS = 200_000
# A whole command or query as it arrives on the bus (the largest valid one, a full SaveNotes of
# episodes, is well under this); a larger body is refused before it is parsed.
MAX_MESSAGE_BYTES = 8 * 1024 * 1024
# The bytes of requests a request stream keeps: each is added with MAXLEN ~ this over its own
# size (and never above the count cap, ENGRAM_REQUEST_STREAM_MAXLEN), so a stream never holds
# more than REQUEST_STREAM_BYTES / s requests of s bytes or more: 32 of the largest, while small
# ones keep the count cap's backlog.
REQUEST_STREAM_BYTES = 256 * 1024 * 1024
DEFAULT_CATEGORY = "general"

# A printable-ASCII id without whitespace: users ("alice@example.com", "tg:12345") and command ids.
ID_PATTERN = r"^[A-Za-z0-9._:@+/=|-]+$"
NOTE_ID_PATTERN = r"^[A-Za-z0-9]{8}$"
# One segment, or a path of them ("memories/alice"): a LangGraph namespace is a category path.
CATEGORY_PATTERN = r"^[a-z0-9][a-z0-9_-]*(/[a-z0-9][a-z0-9_-]*)*$"
# At least one non-whitespace character.
NOT_BLANK = r"\S"
# A consistency token: '<partition>:<log entry id>'.
TOKEN_PATTERN = r"^[0-9]+:[0-9]+-[0-9]+$"

UserId = Annotated[
    str,
    msgspec.Meta(
        min_length=1,
        max_length=MAX_ID_CHARS,
        pattern=ID_PATTERN,
        description="The user whose memory this is. 1-128 chars of A-Za-z0-9 and ._:@+/=|-",
    ),
]
CommandId = Annotated[
    str,
    msgspec.Meta(
        min_length=1,
        max_length=MAX_ID_CHARS,
        pattern=ID_PATTERN,
        description="Idempotency key chosen by the caller; a retry with the same id returns the first outcome.",
    ),
]
NoteId = Annotated[
    str,
    msgspec.Meta(pattern=NOTE_ID_PATTERN, description="Note id: exactly 8 characters of A-Za-z0-9."),
]
Content = Annotated[
    str,
    msgspec.Meta(
        min_length=1,
        max_length=MAX_CONTENT_CHARS,
        pattern=NOT_BLANK,
        description=f"The note's text, 1-{MAX_CONTENT_CHARS} characters, not blank.",
    ),
]
Category = Annotated[
    str,
    msgspec.Meta(
        min_length=1,
        max_length=MAX_CATEGORY_CHARS,
        pattern=CATEGORY_PATTERN,
        description=(
            "Lower-case slug, e.g. person, preference, context, project; or a path of slugs separated by "
            f"'/' (e.g. memories/alice), up to {MAX_CATEGORY_CHARS} characters."
        ),
    ),
]
Key = Annotated[
    str,
    msgspec.Meta(
        min_length=1,
        max_length=MAX_KEY_CHARS,
        pattern=NOT_BLANK,
        description=(
            f"A caller-chosen key, unique among a user's active notes of one category; 1-{MAX_KEY_CHARS} chars."
        ),
    ),
]
Subject = Annotated[
    str,
    msgspec.Meta(
        min_length=1,
        max_length=MAX_SUBJECT_CHARS,
        pattern=NOT_BLANK,
        description="The entity the note is about (a person, a project), up to 200 characters.",
    ),
]
LongText = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_EPISODE_FIELD_CHARS, pattern=NOT_BLANK)]
ShortText = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_ID_CHARS)]
UnitInterval = Annotated[float, msgspec.Meta(ge=0.0, le=1.0)]
Version = Annotated[int, msgspec.Meta(ge=0, description="A note's version; 0 means 'does not exist yet'.")]
AwareTime = Annotated[
    datetime,
    msgspec.Meta(tz=True, description="A time with its zone (ISO 8601 with an offset or Z): naive times are refused."),
]


def parse_time(text: str) -> datetime:
    """An ISO 8601 time typed by a person or an LLM, made an ``AwareTime``: one without a zone
    is taken as UTC."""
    from engram_ledger.contracts.errors import EngramError, ErrorCode

    try:
        at = datetime.fromisoformat(text)
    except ValueError:
        raise EngramError(ErrorCode.INVALID_PARAMETER, f"{text!r} is not an ISO 8601 time") from None
    return at if at.tzinfo is not None else at.replace(tzinfo=UTC)


AsOf = Annotated[
    str,
    msgspec.Meta(
        min_length=1,
        max_length=64,
        description=(
            "A moment in the past: an ISO 8601 time (without a zone it is UTC; a date alone is "
            "that day's start) or a consistency token a command returned "
            "('<partition>:<log entry id>'): the moment right after that write."
        ),
    ),
]
Token = Annotated[
    str,
    msgspec.Meta(
        max_length=64,
        pattern=TOKEN_PATTERN,
        description="Consistency token returned by a command: '<partition>:<log entry id>'.",
    ),
]
