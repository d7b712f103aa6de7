"""The client's memory operations as OpenTelemetry's generative-AI conventions name them: one
CLIENT span per save, search, forget and memory block with the conventions' attributes, the
operation duration histogram, no content unless the operator turns it on, and the service's own
spans (FastStream's middleware) joining the client's trace; read with the SDK's in-memory
exporter and reader, against a real service on real Redis."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from engram_ledger.contracts.errors import EngramError
from engram_ledger.services.bus import genai
from engram_ledger.services.bus.client import EngramClient
from tests.conftest import RunningService, service_settings

EXPORTER = InMemorySpanExporter()
READER = InMemoryMetricReader()


@pytest.fixture(scope="module", autouse=True)
def _providers() -> Iterator[None]:
    """The process's tracer and meter providers, as a deployment sets them (once per process)."""
    tracers = trace.get_tracer_provider()
    if isinstance(tracers, TracerProvider):
        tracers.add_span_processor(SimpleSpanProcessor(EXPORTER))
    else:
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(EXPORTER))
        trace.set_tracer_provider(provider)
    meters = metrics.get_meter_provider()
    assert not isinstance(meters, MeterProvider), "another test set the meter provider of this process"
    metrics.set_meter_provider(MeterProvider(metric_readers=[READER]))
    yield


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    EXPORTER.clear()
    READER.get_metrics_data()  # what earlier tests recorded is read off (cumulative points stay)
    yield EXPORTER


@pytest.fixture
async def traced_client(redis_url: str) -> AsyncIterator[EngramClient]:
    """A client of a service whose FastStream middleware traces each request it handles."""
    running = await RunningService(service_settings(redis_url, tracing=True)).start()
    async with EngramClient(redis_url, timeout=10, operator=True) as client:
        yield client
    await running.stop()


def memory_spans(exporter: InMemorySpanExporter) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.attributes and genai.GEN_AI_MEMORY_STORE_ID in s.attributes]


def durations() -> dict[tuple[str, str | None], int]:
    """Each (operation, error type) measured, and how many times."""
    found: dict[tuple[str, str | None], int] = {}
    data = READER.get_metrics_data()
    for resource in data.resource_metrics if data else []:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name != "gen_ai.client.operation.duration":
                    continue
                assert metric.unit == "s"
                for point in metric.data.data_points:  # type: ignore[union-attr]
                    attrs: Any = point.attributes
                    key = (attrs["gen_ai.operation.name"], attrs.get("error.type"))
                    found[key] = found.get(key, 0) + point.count  # type: ignore[union-attr]
    return found


async def test_save_search_block_and_forget_are_spans_named_by_the_conventions(
    traced_client: EngramClient, spans: InMemorySpanExporter, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(genai.CAPTURE_CONTENT, raising=False)
    client = traced_client
    saved = await client.save("alice", "Alice's sister Sarah lives in Lisbon", advise=False)
    await client.search("alice", "where does Sarah live?", after=saved.token)
    await client.context("alice", query="Sarah", after=saved.token)
    await client.forget("alice", note_ids=[saved.note_id], confirmed=True)

    save, search, block, forget = memory_spans(spans)
    assert [s.name for s in (save, search, block, forget)] == [
        "create_memory",
        "search_memory",
        "search_memory",
        "delete_memory",
    ]
    for span in (save, search, block, forget):
        attrs = dict(span.attributes or {})
        assert span.kind is SpanKind.CLIENT
        assert attrs["gen_ai.operation.name"] == span.name and attrs["gen_ai.provider.name"] == "engram"
        assert attrs["gen_ai.memory.store.id"] == "alice"
        assert attrs["server.address"] == "127.0.0.1" and attrs["server.port"] == 6379
        # No content unless the operator turns it on.
        assert "gen_ai.memory.query.text" not in attrs and "gen_ai.memory.records" not in attrs
        assert "Lisbon" not in json.dumps(attrs) and "Sarah" not in json.dumps(attrs)
    assert dict(save.attributes or {})["gen_ai.memory.record.id"] == saved.note_id
    assert dict(save.attributes or {})["engram.operation"] == "save_note"
    assert dict(search.attributes or {})["gen_ai.memory.record.count"] == 1
    assert dict(block.attributes or {})["engram.operation"] == "build_context"
    assert dict(forget.attributes or {})["gen_ai.memory.record.count"] == 1
    assert dict(forget.attributes or {})["engram.forget.status"] == "forgotten"

    # The service's own span (FastStream's middleware) is part of the client's trace, below it.
    served = [s for s in spans.get_finished_spans() if s.context.trace_id == save.context.trace_id and s is not save]
    assert served and all(s.parent is not None for s in served)
    assert save.context.span_id in {s.parent.span_id for s in served if s.parent is not None}

    measured = durations()
    assert measured[("create_memory", None)] >= 1 and measured[("search_memory", None)] >= 2
    assert measured[("delete_memory", None)] >= 1


async def test_content_is_recorded_when_the_operator_turns_it_on(
    client: EngramClient, spans: InMemorySpanExporter, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(genai.CAPTURE_CONTENT, "true")
    saved = await client.save("alice", "Alice's sister Sarah lives in Lisbon", advise=False)
    found = await client.search("alice", "where does Sarah live?", after=saved.token)
    save, search = memory_spans(spans)
    assert json.loads(str(dict(save.attributes or {})["gen_ai.memory.records"])) == [
        {"id": saved.note_id, "content": "Alice's sister Sarah lives in Lisbon"}
    ]
    attrs = dict(search.attributes or {})
    assert attrs["gen_ai.memory.query.text"] == "where does Sarah live?"
    (record,) = json.loads(str(attrs["gen_ai.memory.records"]))
    assert record["id"] == saved.note_id and record["score"] == found.results[0].score


async def test_a_refusal_is_an_error_span_with_its_code_and_no_message(
    client: EngramClient, spans: InMemorySpanExporter, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(genai.CAPTURE_CONTENT, raising=False)
    saved = await client.save("alice", "Alice likes green tea", advise=False)
    with pytest.raises(EngramError):
        await client.update("alice", saved.note_id, content="Alice likes black tea", expected_version=7)
    _, update = memory_spans(spans)
    assert update.name == "update_memory"
    assert update.status.status_code is StatusCode.ERROR and update.status.description == "VERSION_CONFLICT"
    assert dict(update.attributes or {})["error.type"] == "VERSION_CONFLICT"
    assert dict(update.attributes or {})["gen_ai.memory.record.id"] == saved.note_id
    assert not update.events  # the message (which may quote what was sent) is not recorded
    assert durations()[("update_memory", "VERSION_CONFLICT")] == 1


async def test_reads_that_are_not_memory_operations_make_no_memory_span(
    client: EngramClient, spans: InMemorySpanExporter
) -> None:
    saved = await client.save("alice", "Alice likes green tea", advise=False)
    await client.get_note("alice", saved.note_id, after=saved.token)
    await client.history("alice", saved.note_id, after=saved.token)
    assert [s.name for s in memory_spans(spans)] == ["create_memory"]
