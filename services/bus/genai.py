"""OpenTelemetry spans and a metric for the client's memory operations, as OpenTelemetry's
conventions for generative AI name them, so that a tool reading those conventions shows
Engram's work without configuration.

One span per save, put, update, conversation turn, forget, search and memory block: the
conventions' memory client span (``gen_ai.memory.client``: kind CLIENT, named after its
operation), with ``gen_ai.operation.name`` (``create_memory``, ``upsert_memory``,
``update_memory``, ``delete_memory``, ``search_memory``), ``gen_ai.provider.name`` (``engram``),
``gen_ai.memory.store.id`` (the Engram user: each user's memory is a store of its own),
``gen_ai.memory.record.id`` and ``gen_ai.memory.record.count`` where the operation has them,
``gen_ai.conversation.id`` for a conversation's turns, ``server.address``/``server.port`` (the
bus's Redis) and, on failure, ``error.type`` (Engram's error code). ``engram.operation`` says
which of Engram's commands or queries it was (``build_context`` is a memory block, ``save_note``
a save). Every operation also records ``gen_ai.client.operation.duration`` (seconds).

Content (a search's query, what a write stores, what a search finds) is recorded only when the
operator turns it on, with ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true`` (as the
conventions' other instrumentations read it): ``gen_ai.memory.query.text`` and
``gen_ai.memory.records`` (a JSON array of ``{"id", "content", "score"}``). An error's message
is never recorded (it may quote what was sent): its code is.

Spans and measurements go to the process's tracer and meter providers (set up by the
deployment: ``opentelemetry-instrument``, the ``OTEL_*`` variables, or code); without one they
cost next to nothing. The request carries the span's trace context, so the service's own spans
(``ENGRAM_TRACING=on``, FastStream's middleware) are its children.

The memory names are the conventions' (open-telemetry/semantic-conventions-genai); the
``opentelemetry-semantic-conventions`` package does not define them yet, so they are spelled
here, beside the ones it does define.
"""

from __future__ import annotations

import functools
import json
import os
import time
from collections.abc import Callable, Coroutine, Mapping
from typing import Any, Protocol, TypeVar
from urllib.parse import urlsplit

from opentelemetry import metrics, trace
from opentelemetry.semconv._incubating.attributes.gen_ai_attributes import (
    GEN_AI_CONVERSATION_ID,
    GEN_AI_OPERATION_NAME,
    GEN_AI_PROVIDER_NAME,
)
from opentelemetry.semconv._incubating.metrics.gen_ai_metrics import GEN_AI_CLIENT_OPERATION_DURATION
from opentelemetry.semconv.attributes.error_attributes import ERROR_TYPE
from opentelemetry.semconv.attributes.server_attributes import SERVER_ADDRESS, SERVER_PORT
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from opentelemetry.util.types import AttributeValue

from engram_ledger.contracts import commands, queries
from engram_ledger.contracts.errors import EngramError

# The conventions' memory operations (gen_ai.operation.name) and attributes.
CREATE_MEMORY = "create_memory"
UPDATE_MEMORY = "update_memory"
UPSERT_MEMORY = "upsert_memory"
DELETE_MEMORY = "delete_memory"
SEARCH_MEMORY = "search_memory"
GEN_AI_MEMORY_STORE_ID = "gen_ai.memory.store.id"
GEN_AI_MEMORY_RECORD_ID = "gen_ai.memory.record.id"
GEN_AI_MEMORY_RECORD_COUNT = "gen_ai.memory.record.count"
GEN_AI_MEMORY_QUERY_TEXT = "gen_ai.memory.query.text"
GEN_AI_MEMORY_RECORDS = "gen_ai.memory.records"
# Engram's own: which command or query the operation was (its wire tag).
ENGRAM_OPERATION = "engram.operation"

PROVIDER = "engram"
CAPTURE_CONTENT = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
_CAPTURE_ON = {"true", "1", "yes", "on", "span_only", "span_and_event"}

OPERATIONS: dict[type, str] = {
    commands.SaveNote: CREATE_MEMORY,
    commands.SaveNotes: CREATE_MEMORY,
    commands.RecordMessage: CREATE_MEMORY,
    commands.RecordMessages: CREATE_MEMORY,
    # A put creates the key's note or updates it, the caller does not choose which.
    commands.PutNote: UPSERT_MEMORY,
    commands.UpdateNote: UPDATE_MEMORY,
    commands.SupersedeNote: UPDATE_MEMORY,
    commands.RevertNote: UPDATE_MEMORY,
    commands.RequestForget: DELETE_MEMORY,
    commands.RequestForgetUser: DELETE_MEMORY,
    commands.RequestForgetSession: DELETE_MEMORY,
    commands.RetractMessage: DELETE_MEMORY,
    queries.SearchNotes: SEARCH_MEMORY,
    # A memory block is the memory records relevant to a query, rendered for a prompt.
    queries.BuildContext: SEARCH_MEMORY,
}

# The conventions' boundaries for gen_ai.client.operation.duration, below which Engram's
# operations mostly fall: a few finer ones first, so that milliseconds are told apart.
DURATION_BUCKETS = [0.001, 0.002, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48]

_tracer = trace.get_tracer("engram_ledger")
_duration = metrics.get_meter("engram_ledger").create_histogram(
    name=GEN_AI_CLIENT_OPERATION_DURATION,
    unit="s",
    description="GenAI operation duration.",
    explicit_bucket_boundaries_advisory=DURATION_BUCKETS,
)


class _Client(Protocol):
    url: str


C = TypeVar("C", bound=_Client)
M = TypeVar("M")
R = TypeVar("R")


def memory_operation(
    send: Callable[[C, M, type[R]], Coroutine[Any, Any, R]],
) -> Callable[[C, M, type[R]], Coroutine[Any, Any, R]]:
    """Wraps the client's ``execute``/``ask``: a memory operation is sent inside its span and
    timed; any other command or query is sent as it is."""

    @functools.wraps(send)
    async def traced(client: C, message: M, expect: type[R]) -> R:
        operation = OPERATIONS.get(type(message))
        if operation is None:
            return await send(client, message, expect)
        base = {GEN_AI_OPERATION_NAME: operation, GEN_AI_PROVIDER_NAME: PROVIDER, **_server(client.url)}
        started = time.perf_counter()
        with _tracer.start_as_current_span(
            operation,
            kind=SpanKind.CLIENT,
            attributes={**base, **_request_attributes(message)},
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            try:
                reply = await send(client, message, expect)
            except BaseException as e:
                error = e.code.value if isinstance(e, EngramError) else type(e).__qualname__
                span.set_attribute(ERROR_TYPE, error)
                span.set_status(Status(StatusCode.ERROR, error))
                _duration.record(time.perf_counter() - started, {**base, ERROR_TYPE: error})
                raise
            _describe_reply(span, message, reply)
            _duration.record(time.perf_counter() - started, base)
            return reply

    return traced


def capturing_content() -> bool:
    return os.environ.get(CAPTURE_CONTENT, "").strip().lower() in _CAPTURE_ON


@functools.lru_cache(maxsize=64)
def _server(url: str) -> Mapping[str, AttributeValue]:
    parts = urlsplit(url)
    found: dict[str, AttributeValue] = {}
    if parts.hostname:
        found[SERVER_ADDRESS] = parts.hostname
        found[SERVER_PORT] = parts.port or 6379
    return found


def _request_attributes(message: Any) -> dict[str, AttributeValue]:
    found: dict[str, AttributeValue] = {
        ENGRAM_OPERATION: message.__struct_config__.tag,
        GEN_AI_MEMORY_STORE_ID: message.user_id,
    }
    note_id = getattr(message, "note_id", None) or getattr(message, "message_id", None)
    if note_id:
        found[GEN_AI_MEMORY_RECORD_ID] = note_id
    session_id = getattr(message, "session_id", None)
    if session_id:
        found[GEN_AI_CONVERSATION_ID] = session_id
    if capturing_content():
        query = getattr(message, "query", None)
        if query:
            found[GEN_AI_MEMORY_QUERY_TEXT] = query
    return found


def _describe_reply(span: Span, message: Any, reply: Any) -> None:
    if not span.is_recording():
        return
    if isinstance(reply, queries.NoteWritten):
        span.set_attribute(GEN_AI_MEMORY_RECORD_ID, reply.note_id)
    count = _record_count(reply)
    if count is not None:
        span.set_attribute(GEN_AI_MEMORY_RECORD_COUNT, count)
    if isinstance(reply, queries.ForgetReply):
        span.set_attribute("engram.forget.status", reply.status)
    if capturing_content():
        records = _records(message, reply)
        if records:
            span.set_attribute(GEN_AI_MEMORY_RECORDS, json.dumps(records, ensure_ascii=False, default=str))


def _record_count(reply: Any) -> int | None:
    if isinstance(reply, queries.NoteWritten):
        return 1
    if isinstance(reply, queries.NotesWritten):
        return len(reply.notes)
    if isinstance(reply, queries.ForgetReply):
        return len(reply.forgotten)
    if isinstance(reply, queries.SearchReply):
        return len(reply.results)
    if isinstance(reply, queries.ContextReply):
        return len(reply.note_ids)
    return None


def _records(message: Any, reply: Any) -> list[dict[str, Any]]:
    """The memory records the operation stored or found, in the conventions' shape."""
    if isinstance(reply, queries.SearchReply):
        return [{"id": hit.note_id, "content": hit.content, "score": hit.score} for hit in reply.results]
    if isinstance(reply, queries.ContextReply):
        return [{"content": reply.text, "metadata": {"note_ids": reply.note_ids}}]
    if isinstance(reply, queries.NoteWritten):
        content = getattr(message, "content", None) or getattr(message, "value", None)
        return [{"id": reply.note_id, "content": content}] if content is not None else []
    if isinstance(reply, queries.NotesWritten):
        drafts = getattr(message, "notes", None) or getattr(message, "messages", None) or []
        return [
            {"id": written.note_id, "content": draft.content}
            for written, draft in zip(reply.notes, drafts, strict=False)
            if isinstance(draft, commands.NoteDraft | commands.MessageDraft)
        ]
    return []
