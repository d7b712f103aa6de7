"""The subcommands over one user's memory (save, search, forget, ...): each is one or two calls of
``EngramClient`` and prints the reply."""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import msgspec

from engram_ledger.contracts.errors import EngramError, ErrorCode
from engram_ledger.contracts.model import NoteKind, NoteSource, NoteStatus
from engram_ledger.services.cli import render
from engram_ledger.services.cli.output import print_result
from engram_ledger.services.config import Settings
from engram_ledger.services.ops.operator import resolve_url

if TYPE_CHECKING:
    from engram_ledger.services.bus.client import EngramClient


def client_for(settings: Settings, timeout: float | None = None, operator: bool = True) -> EngramClient:
    """The command line is an operator's (``forget --yes`` deletes at once); the MCP server it
    starts serves an agent, whose client is not."""
    from engram_ledger.services.bus.client import EngramClient  # the client pulls in FastStream: not at import

    return EngramClient(
        resolve_url(settings),
        timeout=timeout or settings.request_timeout_seconds,
        cluster=settings.redis_cluster,
        operator=operator,
        user_in_flight=settings.user_in_flight,
    )


def with_client(
    fn: Callable[[EngramClient, argparse.Namespace], Awaitable[None]],
) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        async def go() -> int:
            client = client_for(Settings.from_env(), args.timeout)
            await client.connect()
            try:
                await fn(client, args)
                return 0
            finally:
                await client.close()

        return asyncio.run(go())

    return run


async def cmd_save(client: EngramClient, args: argparse.Namespace) -> None:
    reply = await client.save(
        args.user,
        args.text,
        category=args.category,
        subject=args.subject,
        confidence=args.confidence,
        source=NoteSource(args.source) if args.source else None,
        importance=args.importance,
        occurred_at=args.occurred_at,
        valid_from=args.valid_from,
        valid_until=args.valid_until,
        command_id=args.command_id,
    )
    print_result(args, reply, lambda r: render.saved(r, args.user))


async def cmd_update(client: EngramClient, args: argparse.Namespace) -> None:
    reply = await client.update(
        args.user,
        args.note_id,
        content=args.text,
        category=args.category,
        subject=args.subject,
        expected_version=args.expected_version,
        command_id=args.command_id,
        valid_from=args.valid_from,
        valid_until=args.valid_until,
    )
    print_result(args, reply, render.updated)


async def cmd_supersede(client: EngramClient, args: argparse.Namespace) -> None:
    reply = await client.supersede(
        args.user, args.old_id, args.new_id, command_id=args.command_id, close_validity=not args.keep_validity
    )
    print_result(args, reply, render.superseded)


async def cmd_revert(client: EngramClient, args: argparse.Namespace) -> None:
    # The version before, from the history (a get would count as a read of the note).
    before = None if args.json else len((await client.history(args.user, args.note_id)).versions)
    reply = await client.revert(
        args.user, args.note_id, args.to_version, expected_version=args.expected_version, command_id=args.command_id
    )
    print_result(args, reply, lambda r: render.reverted(r, args.to_version, changed=r.version != before))


async def cmd_diff(client: EngramClient, args: argparse.Namespace) -> None:
    reply = await client.diff(args.user, args.since, args.until, limit=args.limit, after=args.after)
    print_result(args, reply, render.diff)


async def cmd_recalls(client: EngramClient, args: argparse.Namespace) -> None:
    reply = await client.recalls(
        args.user, since=args.since, until=args.until, session_id=args.session, limit=args.limit, after=args.after
    )
    print_result(args, reply, render.recalls)


async def cmd_forget(client: EngramClient, args: argparse.Namespace) -> None:
    if args.all or args.session is not None:
        if args.query is not None or args.note_ids or (args.all and args.session is not None):
            raise EngramError(ErrorCode.INVALID_PARAMETER, "--all and --session take no query and no note ids")
        if args.all:
            reply = await client.forget_user(args.user, confirmed=args.yes, command_id=args.command_id)
        else:
            reply = await client.forget_session(args.user, args.session, confirmed=args.yes, command_id=args.command_id)
        print_result(args, reply, lambda r: render.forget(r, args.user, erasing=True))
        return
    if (args.query is None) == (not args.note_ids):
        raise EngramError(ErrorCode.INVALID_PARAMETER, "give either --query or note ids")
    reply = await client.forget(
        args.user, query=args.query, note_ids=args.note_ids, confirmed=args.yes, command_id=args.command_id
    )
    print_result(args, reply, lambda r: render.forget(r, args.user))


async def cmd_get(client: EngramClient, args: argparse.Namespace) -> None:
    as_of = getattr(args, "as_of", None)
    note = await client.get_note(args.user, args.note_id, after=args.after, as_of=as_of)
    print_result(args, note, lambda n: render.as_of(as_of, render.note(n)))


async def cmd_history(client: EngramClient, args: argparse.Namespace) -> None:
    reply = await client.history(args.user, args.note_id, after=args.after)
    if not args.json:
        # A forgotten note's versions are gone; its tombstone says when it was forgotten.
        tombstone = None
        if reply.status == NoteStatus.FORGOTTEN.value:
            tombstone = await client.get_note(args.user, args.note_id)
        render.show(render.history(reply, tombstone))
        return
    print_result(args, {"note_id": reply.note_id, "status": reply.status, "versions": reply.versions})


async def cmd_list(client: EngramClient, args: argparse.Namespace) -> None:
    reply = await client.list_notes(
        args.user,
        category=args.category,
        include_superseded=args.include_superseded,
        offset=args.offset,
        limit=args.limit,
        after=args.after,
        as_of=args.as_of,
        valid_at=args.valid_at,
    )
    more = max(reply.total - args.offset - len(reply.notes), 0)
    listed = {"notes": reply.notes, "total": reply.total, "more": more}
    print_result(args, listed, lambda o: render.as_of(args.as_of, render.notes(o["notes"], o["total"], args.offset)))


async def cmd_recent(client: EngramClient, args: argparse.Namespace) -> None:
    reply = await client.list_recent(args.user, limit=args.limit, after=args.after)
    print_result(args, {"notes": reply.notes, "total": reply.total}, lambda o: render.notes(o["notes"], o["total"]))


async def cmd_search(client: EngramClient, args: argparse.Namespace) -> None:
    reply = await client.search(
        args.user,
        args.query,
        top_k=args.top_k,
        category=args.category,
        kind=NoteKind(args.kind) if args.kind else None,
        subject=args.subject,
        include_superseded=args.include_superseded,
        include_conversation=args.session is not None or args.conversations,
        session_id=args.session,
        since=args.since,
        until=args.until,
        after=args.after,
        ranking=args.ranking,
        min_relevance=args.min_relevance,
        as_of=args.as_of,
        valid_at=args.valid_at,
    )
    results = [
        {
            **msgspec.to_builtins(hit.note or hit.message),
            "note_id": hit.note_id,
            "content": hit.content,
            "score": hit.score,
            "similarity": hit.similarity,
            "relevance": hit.relevance,
            "found_in": hit.found_in,
        }
        for hit in reply.results
    ]
    print_result(args, {"results": results}, lambda _: render.as_of(args.as_of, render.search(reply, args.query)))


async def cmd_context(client: EngramClient, args: argparse.Namespace) -> None:
    reply = await client.context(
        args.user,
        format=args.format,
        query=args.query,
        max_tokens=args.max_tokens,
        after=args.after,
        min_relevance=args.min_relevance,
        as_of=args.as_of,
        # The block is for a model: it names a tool only when told which one the model has.
        update_tool=args.update_tool,
    )
    if args.json:
        print_result(args, reply)
    elif reply.text.strip():
        sys.stdout.write(reply.text)
    else:
        print(f"No memory of {args.user} to put in a block yet.")


async def cmd_memory(client: EngramClient, args: argparse.Namespace) -> None:
    """The user's memories as a list, and deletion at once (a person typed it)."""
    if args.action == "list":
        listed = await client.list_notes(args.user)
        if args.json:
            print_result(args, {"notes": listed.notes, "total": listed.total})
            return
        sys.stdout.write(render.memory_list(listed.notes, listed.total, args.user))
        return
    note = await client.get_note(args.user, args.note_id)
    reply = await client.forget(args.user, note_ids=[args.note_id], confirmed=True, command_id=args.command_id)
    print_result(args, reply, lambda r: f"Deleted: '{note.content}'")
