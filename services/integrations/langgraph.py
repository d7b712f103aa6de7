"""``EngramStore``: a LangGraph ``BaseStore`` kept in Engram.

A store is bound to one Engram user. Each item is a note put by key (``EngramClient.put``) in
that user's memory, so it is sealed at rest, versioned (``engram history``), searchable and
forgettable like any other note; ``created_at``/``updated_at`` are the note's.

Namespace -> category. Each label becomes one path segment and the segments are joined with
"/". A label that already is a category segment (``^[a-z0-9][a-z0-9_-]*$``) and does not start
with ``x--`` is kept as it is; any other label becomes ``x--`` and the base32 of its UTF-8 bytes,
lower-cased, without padding::

    ("memories", "alice")    -> "memories/alice"
    ("memories", "Alice")    -> "memories/x--ifwgsy3f"
    ("café", "x--y")         -> "x--mnqwnq5j/x--paws26i"

The mapping is one-to-one and ``list_namespaces`` reads it back; a category no namespace maps to
(``x--`` followed by anything else) is not one of the store's namespaces. A category holds at
most 200 characters: a namespace whose category would be longer is refused with
``InvalidNamespaceError`` naming it.

Where Engram differs from LangGraph's in-memory and Postgres stores:

- Engram embeds every item with its own model (all-MiniLM-L6-v2, with BM25): ``index``'s
  ``dims`` and ``embed`` are ignored, its ``fields`` (or a put's ``index=[...]``: ``"field"``,
  ``"a.b"``, ``"$"``) choose the text embedded, the whole value by default. ``index=False`` still
  embeds the item as a put without ``index`` would: Engram has no unsearchable notes. Array
  paths (``"a[*].b"``, ``"a[0]"``) name no field in Engram: give the list's field (``"a"``).
- A search with a query is ranked by Engram's fused score (``SearchItem.score``) and reaches at
  most the 100 best matches (``offset + limit``); without a query, items come in (category,
  created_at) order and ``score`` is None.
- ``filter``: LangGraph's operators (``$eq $ne $gt $gte $lt $lte``); a nested object without
  operators matches field by field, and a key with a dot (``"a.b"``) names a nested field.
- Notes the user saved some other way (no key) are never items: searches, listings and
  ``list_namespaces`` ask Engram for keyed notes only (``keyed_only``), so pages are full.
- TTL (``supports_ttl = True``): a put's ``ttl`` (minutes; the store's ``ttl={"default_ttl":
  ...}`` when not given) becomes the note's time to live, and when it runs out Engram forgets the
  note as it forgets any (``NoteForgotten``, its key and value shredded): its own timer does it,
  so ``sweep_interval_minutes`` is not used. An expired item reads as gone at once. A read with
  ``refresh_ttl`` (LangGraph's default, or ``ttl={"refresh_on_read": ...}``) renews the items it
  returns that have a TTL (``RenewNote``, one event each).

Every read passes the token of the store's last write as ``after``, so it sees that write.
The async client lives on a private event loop in a daemon thread: the sync methods work from
any thread (a sync node of a running graph too), and the async ones hop onto that loop. A store
dropped without ``close()``, or still open when the program exits, is closed as ``close()``
closes it, so that nothing is left to warn at exit.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import logging
import re
import threading
import weakref
from collections.abc import Coroutine, Iterable, Mapping
from types import TracebackType
from typing import Any, TypeVar

from langgraph.store.base import (
    BaseStore,
    GetOp,
    IndexConfig,
    InvalidNamespaceError,
    Item,
    ListNamespacesOp,
    MatchCondition,
    NotProvided,
    Op,
    PutOp,
    Result,
    SearchItem,
    SearchOp,
    TTLConfig,
    validate_op_namespace,
)

from engram_ledger.contracts.channels import parse_token
from engram_ledger.contracts.errors import EngramError, ErrorCode
from engram_ledger.contracts.limits import (
    LIST_NOTES_MAX,
    MAX_CATEGORY_CHARS,
    MAX_TTL_SECONDS,
    SEARCH_DEPTH_MAX,
    SEARCH_TOP_K_MAX,
)
from engram_ledger.contracts.model import NoteView
from engram_ledger.services.bus.client import EngramClient

T = TypeVar("T")
log = logging.getLogger("engram.integrations")

ENCODED = "x--"
# How long closing a store waits for its calls to end and its client to close (the client's own
# stop is bounded too): past it the loop is stopped all the same, so that an exit never hangs.
CLOSE_SECONDS = 15.0
_SEGMENT = re.compile(r"[a-z0-9][a-z0-9_-]*")


# The mapping (pure) --------------------------------------------------------------------------


def encode_label(label: str) -> str:
    if _SEGMENT.fullmatch(label) and not label.startswith(ENCODED):
        return label
    return ENCODED + base64.b32encode(label.encode()).decode("ascii").rstrip("=").lower()


def decode_segment(segment: str) -> str | None:
    """The label ``encode_label`` turns into ``segment``, or None when there is none."""
    if not segment.startswith(ENCODED):
        return segment if _SEGMENT.fullmatch(segment) else None
    body = segment[len(ENCODED) :].upper()
    try:
        label = base64.b32decode(body + "=" * (-len(body) % 8)).decode()
    except (binascii.Error, UnicodeDecodeError):
        return None
    # Some byte strings have several base32 spellings (trailing bits), and a plain label has an
    # x-- spelling too: only the one encode_label writes names a namespace, so the map stays 1:1.
    if encode_label(label) != segment or not label or "." in label or "\x00" in label:
        return None
    return label


def namespace_to_category(namespace: tuple[str, ...]) -> str:
    if not namespace:
        raise InvalidNamespaceError("Namespace cannot be empty.")
    category = "/".join(encode_label(label) for label in namespace)
    if len(category) > MAX_CATEGORY_CHARS:
        raise InvalidNamespaceError(
            f"namespace {namespace!r} does not fit in an Engram category: encoded it takes {len(category)} "
            f"characters, at most {MAX_CATEGORY_CHARS} fit (labels other than lower-case slugs take about "
            "1.6 times their UTF-8 bytes); use fewer or shorter labels"
        )
    return category


def category_to_namespace(category: str) -> tuple[str, ...] | None:
    """The namespace that maps to ``category``, or None when none does."""
    labels: list[str] = []
    for segment in category.split("/"):
        label = decode_segment(segment)
        if label is None:
            return None
        labels.append(label)
    return tuple(labels)


def filter_to_where(filter: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """LangGraph's ``filter`` as Engram's ``where``. LangGraph's stores match a nested object
    without operators field by field ({"a": {"b": 1}} holds for {"a": {"b": 1, "c": 2}}), which
    is Engram's dotted path "a.b"."""
    if not filter:
        return None
    where: dict[str, Any] = {}

    def walk(path: str, conditions: Mapping[str, Any]) -> None:
        for field, expected in conditions.items():
            if isinstance(expected, Mapping) and expected and not any(str(k).startswith("$") for k in expected):
                walk(f"{path}{field}.", expected)
            else:
                where[f"{path}{field}"] = expected

    walk("", filter)
    return where


def _matches(namespace: tuple[str, ...], condition: MatchCondition) -> bool:
    path = condition.path
    if len(namespace) < len(path):
        return False
    labels = namespace[: len(path)] if condition.match_type == "prefix" else namespace[len(namespace) - len(path) :]
    return all(want in ("*", label) for want, label in zip(path, labels, strict=True))


def listing_prefix(conditions: Iterable[MatchCondition] | None) -> str | None:
    """The category prefix that narrows ``list_categories`` for these conditions: the labels of
    a prefix condition up to its first wildcard."""
    for condition in conditions or ():
        if condition.match_type != "prefix":
            continue
        head: list[str] = []
        for label in condition.path:
            if label == "*":
                break
            head.append(label)
        if head:
            return namespace_to_category(tuple(head))
    return None


def select_namespaces(categories: Iterable[str], op: ListNamespacesOp) -> list[tuple[str, ...]]:
    """LangGraph's ``list_namespaces`` over the user's categories: conditions, then ``max_depth``
    (truncates, so several namespaces may become one), sorted, then ``offset``/``limit``."""
    found: set[tuple[str, ...]] = set()
    for category in categories:
        namespace = category_to_namespace(category)
        if namespace is not None and all(_matches(namespace, c) for c in op.match_conditions or ()):
            found.add(namespace if op.max_depth is None else namespace[: op.max_depth])
    return sorted(found)[op.offset : op.offset + op.limit]


# A put's ttl is in minutes (LangGraph's unit).
MAX_TTL_MINUTES = MAX_TTL_SECONDS / 60


# The store ------------------------------------------------------------------------------------


class EngramStore(BaseStore):
    """A LangGraph store in one Engram user's memory (see the module's docstring for the mapping).

    ``url_or_client``: the Engram bus's Redis URL, or an ``EngramClient`` that is not connected
    yet (to choose ``cluster=True``, say); the store connects it on its own loop, at first use,
    and closes it in ``close()``. ``index``: LangGraph's ``IndexConfig``; only ``fields`` is used.
    """

    supports_ttl = True

    def __init__(
        self,
        url_or_client: str | EngramClient,
        *,
        user_id: str,
        index: IndexConfig | None = None,
        ttl: TTLConfig | None = None,
        timeout: float = 10.0,
    ) -> None:
        if isinstance(url_or_client, EngramClient):
            # A connected client's Redis connections and reply reader belong to another loop.
            if url_or_client.connected:
                raise ValueError(
                    "EngramStore drives its client on its own event loop: pass a URL or an EngramClient "
                    "that is not connected yet"
                )
            self.client = url_or_client
        else:
            # The developer's own code, as trusted as the command line: a delete is one call.
            self.client = EngramClient(url_or_client, timeout=timeout, operator=True)
        self.user_id = user_id
        self.ttl_config = ttl
        fields = index.get("fields") if index else None
        self.index_fields: list[str] | None = list(fields) if fields else None  # None: the whole value
        self.token: str | None = None  # the last write's, passed as ``after`` to every read
        self._connecting: asyncio.Task[None] | None = None
        self._closed = False
        # What the store runs on its loop (calls and the connect), ended first when it closes.
        self._tasks: set[asyncio.Task[Any]] = set()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=_run_loop, args=(self._loop,), name="engram-store", daemon=True)
        self._thread.start()
        # The one way a store closes: called by close(), or when the store is dropped or the
        # program exits with it open (a finalizer runs while daemon threads still do), so that the
        # client's connections and reply reader always end on the loop they belong to.
        self._finalizer = weakref.finalize(self, _close_on_loop, self._loop, self._thread, self.client, self._tasks)

    # BaseStore -----------------------------------------------------------------------------

    def batch(self, ops: Iterable[Op]) -> list[Result]:
        checked, loop = self._checked(ops), self._open_loop()
        if threading.get_ident() == self._thread.ident:
            raise RuntimeError("EngramStore's sync methods cannot be called from its own event loop")
        return asyncio.run_coroutine_threadsafe(self._run(checked), loop).result()

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        checked, loop = self._checked(ops), self._open_loop()
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(self._run(checked), loop))

    # Life cycle ----------------------------------------------------------------------------

    def close(self) -> None:
        """Ends the calls still in flight (CancelledError in their callers), closes the client
        the store owns and stops its loop. Calling it again does nothing."""
        self._closed = True
        self._finalizer()

    async def aclose(self) -> None:
        self._closed = True
        if self._finalizer.alive:
            await asyncio.to_thread(self._finalizer)

    def __enter__(self) -> EngramStore:
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.close()

    async def __aenter__(self) -> EngramStore:
        return self

    async def __aexit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        await self.aclose()

    def _open_loop(self) -> asyncio.AbstractEventLoop:
        if self._closed:
            raise RuntimeError("this EngramStore is closed")
        return self._loop

    def _started(self, task: asyncio.Task[T]) -> asyncio.Task[T]:
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # On the store's loop -------------------------------------------------------------------

    def _checked(self, ops: Iterable[Op]) -> list[Op]:
        """Every op is checked before any runs, so a bad one leaves nothing half applied."""
        checked = list(ops)
        for op in checked:
            validate_op_namespace(op)
            if isinstance(op, PutOp):
                if not isinstance(op.ttl, NotProvided) and op.ttl is not None and not 0 < op.ttl <= MAX_TTL_MINUTES:
                    raise ValueError(f"ttl is in minutes, more than 0 and at most {MAX_TTL_MINUTES:g}; got {op.ttl}")
                namespace_to_category(op.namespace)
            elif isinstance(op, GetOp):
                namespace_to_category(op.namespace)
            elif isinstance(op, SearchOp):
                if op.namespace_prefix:
                    namespace_to_category(op.namespace_prefix)
            elif isinstance(op, ListNamespacesOp):
                listing_prefix(op.match_conditions)
            else:
                raise ValueError(f"Unknown operation type: {type(op)}")
        return checked

    async def _run(self, ops: list[Op]) -> list[Result]:
        task = asyncio.current_task()
        if task is not None:
            self._started(task)
        client = await self._ready()
        results: list[Result] = [None] * len(ops)
        reads: dict[int, Coroutine[Any, Any, Result]] = {}

        async def flush() -> None:
            if len(reads) == 1:  # the usual batch of one: no task to create
                [(i, read)] = reads.items()
                results[i] = await read
            elif reads:
                for i, value in zip(reads, await asyncio.gather(*reads.values()), strict=True):
                    results[i] = value
            reads.clear()

        # Reads run together; a write waits for the reads before it, and the reads after it see it.
        for i, op in enumerate(ops):
            if isinstance(op, PutOp):
                await flush()
                await self._put(client, op)
            elif isinstance(op, GetOp):
                reads[i] = self._get(client, op)
            elif isinstance(op, SearchOp):
                reads[i] = self._search(client, op)
            elif isinstance(op, ListNamespacesOp):
                reads[i] = self._list_namespaces(client, op)
        await flush()
        return results

    async def _ready(self) -> EngramClient:
        task = self._connecting
        if task is None or (task.done() and (task.cancelled() or task.exception() is not None)):
            # Connect at first use, and again after a failure: the service may have come up since.
            task = self._connecting = self._started(asyncio.ensure_future(self.client.connect()))
        if not task.done():
            await asyncio.shield(task)  # one caller's cancellation must not cancel everyone's connect
        task.result()
        return self.client

    def _track(self, token: str | None) -> None:
        # Concurrent writes may answer out of order: keep the latest token, not the last reply's.
        if token is not None and (self.token is None or parse_token(token) > parse_token(self.token)):
            self.token = token

    async def _by_key(self, client: EngramClient, category: str, key: str) -> NoteView | None:
        try:
            return await client.get_by_key(self.user_id, category, key, after=self.token)
        except EngramError as e:
            if e.code is ErrorCode.MEMORY_NOT_FOUND:
                return None
            raise

    async def _get(self, client: EngramClient, op: GetOp) -> Item | None:
        note = await self._by_key(client, namespace_to_category(op.namespace), op.key)
        if note is None:
            return None
        if op.refresh_ttl:
            await self._renew(client, [note])
        return Item(
            value=note.value or {},
            key=op.key,
            namespace=op.namespace,
            created_at=note.created_at,
            updated_at=note.updated_at,
        )

    async def _put(self, client: EngramClient, op: PutOp) -> None:
        category = namespace_to_category(op.namespace)
        if op.value is None:
            note = await self._by_key(client, category, op.key)
            if note is None:
                return
            try:
                forgotten = await client.forget(self.user_id, note_ids=[note.id], confirmed=True)
            except EngramError as e:
                if e.code is not ErrorCode.MEMORY_NOT_FOUND:  # else deleted meanwhile: the same outcome
                    raise
                return
            self._track(forgotten.token)
            return
        index = list(op.index) if isinstance(op.index, list) else self.index_fields
        minutes = op.ttl if not isinstance(op.ttl, NotProvided) else None
        written = await client.put(
            self.user_id, category, op.key, dict(op.value), index=index, ttl_seconds=minutes * 60 if minutes else None
        )
        self._track(written.token)

    async def _renew(self, client: EngramClient, notes: Iterable[NoteView]) -> None:
        """Start the time to live of the items a read returns again (those that have one)."""
        renewing = [client.renew(self.user_id, note.id) for note in notes if note.expires_at is not None]
        for written in await asyncio.gather(*renewing, return_exceptions=True):
            if isinstance(written, EngramError) and written.code is ErrorCode.MEMORY_NOT_FOUND:
                continue  # it ran out between the read and the renewal: the read stands
            if isinstance(written, BaseException):
                raise written
            self._track(written.token)

    async def _search(self, client: EngramClient, op: SearchOp) -> list[SearchItem]:
        prefix = namespace_to_category(op.namespace_prefix) if op.namespace_prefix else None
        where = filter_to_where(op.filter)
        found: list[tuple[NoteView | None, SearchItem]] = []
        offset, wanted = op.offset, op.limit
        if op.query and op.query.strip():
            # Paged by Engram's top_k, every page the same size: the pages of one search are then
            # slices of one ranking. A search reaches SEARCH_DEPTH_MAX deep at most.
            size = min(wanted, SEARCH_TOP_K_MAX)
            while wanted > 0 and offset < SEARCH_DEPTH_MAX:
                page = min(size, SEARCH_DEPTH_MAX - offset)
                reply = await client.search(
                    self.user_id,
                    op.query,
                    top_k=page,
                    category_prefix=prefix,
                    where=where,
                    keyed_only=True,
                    offset=offset,
                    after=self.token,
                    # A LangGraph store's search ranks every item it holds (its InMemoryStore
                    # has no floor): the whole ranking, as LangGraph's callers expect.
                    min_relevance=0.0,
                )
                hits = reply.results[:wanted]
                found += [(hit.note, item) for hit in hits if (item := _search_item(hit.note, hit.score))]
                if len(reply.results) < page:
                    break
                offset, wanted = offset + page, wanted - len(hits)
            return await self._returned(client, op, found)
        while wanted > 0:
            page = min(wanted, LIST_NOTES_MAX)
            listed = await client.list_notes(
                self.user_id,
                category_prefix=prefix,
                where=where,
                keyed_only=True,
                offset=offset,
                limit=page,
                after=self.token,
            )
            found += [(note, item) for note in listed.notes if (item := _search_item(note, None))]
            if len(listed.notes) < page:
                break
            offset, wanted = offset + page, wanted - page
        return await self._returned(client, op, found)

    async def _returned(
        self, client: EngramClient, op: SearchOp, found: list[tuple[NoteView | None, SearchItem]]
    ) -> list[SearchItem]:
        if op.refresh_ttl:
            await self._renew(client, [note for note, _ in found if note is not None])
        return [item for _, item in found]

    async def _list_namespaces(self, client: EngramClient, op: ListNamespacesOp) -> list[tuple[str, ...]]:
        prefix = listing_prefix(op.match_conditions)
        reply = await client.list_categories(self.user_id, prefix=prefix, keyed_only=True, after=self.token)
        return select_namespaces(reply.categories, op)


def _run_loop(loop: asyncio.AbstractEventLoop) -> None:
    """A store's thread: its loop until stopped, then closed there."""
    try:
        loop.run_forever()
    finally:
        loop.close()


def _close_on_loop(
    loop: asyncio.AbstractEventLoop, thread: threading.Thread, client: EngramClient, tasks: set[asyncio.Task[Any]]
) -> None:
    """Closes a store (its ``close()`` and its finalizer): on its loop, the calls still in
    flight end (rather than wait forever on a loop that no longer runs), then its client closes
    (the reply reader stopped, every connection closed); then the loop stops."""

    async def shut_down() -> None:
        pending = list(tasks)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        await client.close()

    def stop(_: object = None) -> None:
        loop.stop()

    if not thread.is_alive():
        return
    if threading.get_ident() == thread.ident:
        # Dropped by a call running on the loop itself: nothing can be waited for here, so the
        # loop stops once its client is closed, and its thread closes it.
        loop.create_task(shut_down()).add_done_callback(stop)
        return
    try:
        asyncio.run_coroutine_threadsafe(shut_down(), loop).result(CLOSE_SECONDS)
    except Exception as e:  # a close that failed or hung still stops the loop: the store is done
        log.warning("closing an EngramStore's client did not end cleanly: %r", e)
    finally:
        loop.call_soon_threadsafe(stop)
        thread.join(CLOSE_SECONDS)


def _search_item(note: NoteView | None, score: float | None) -> SearchItem | None:
    """Only notes put by key are items; one in a category no namespace maps to is not."""
    if note is None or note.key is None:
        return None
    namespace = category_to_namespace(note.category)
    if namespace is None:
        return None
    return SearchItem(
        namespace=namespace,
        key=note.key,
        value=note.value or {},
        created_at=note.created_at,
        updated_at=note.updated_at,
        score=score,
    )
