"""The subcommands that run and look after a deployment: serve, tail, relay, rebuild, health,
keys, export and import, acl, the documents and the console. The work is in ``services/ops``
(and the console's package); each command here reads its arguments and prints the outcome."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any

import msgspec

from engram_ledger.contracts.errors import EngramError, ErrorCode
from engram_ledger.services.adapters.redis_conn import close_redis
from engram_ledger.services.cli import render
from engram_ledger.services.cli.output import log_to_terminal, print_result, progress, write_document
from engram_ledger.services.config import Settings, parse_roles
from engram_ledger.services.ops.operator import connect, operator_redis, resolve_url, subscriber_key

log = logging.getLogger("engram")


def comma_list(given: list[str] | None) -> list[str] | None:
    """``--kinds a,b --kinds c`` (and the like) as one list; None when none was given."""
    return [v.strip() for each in given or [] for v in each.split(",") if v.strip()] or None


def cmd_serve(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        settings = Settings.from_env()
        if args.role:
            settings = Settings(**{**settings.__dict__, "roles": parse_roles(",".join(args.role))})
    except ValueError as e:
        log.error("bad configuration: %s", e)
        return 2
    from engram_ledger.services.ops.serve import serve

    return serve(settings)


def cmd_tail(args: argparse.Namespace) -> int:
    """The log as typed events, one line each (a JSON object each with --json); with --group
    through that consumer group, each entry acked once its line is written."""
    from engram_ledger.services.bus.subscription import Subscription

    settings = Settings.from_env()
    if args.count is not None and args.count < 1:
        raise EngramError(ErrorCode.INVALID_PARAMETER, f"--count must be at least 1; got {args.count}")
    kinds = comma_list(args.kinds)
    subscription = Subscription.connect(
        resolve_url(settings),
        args.group,
        cluster=settings.redis_cluster,
        from_start=args.from_start,
        users=args.user,
        kinds=kinds,
        key=subscriber_key(settings, args.key_file, args.content),
        # Its own name in the group: a tail never takes over an application consumer's pending entries.
        consumer="tail",
    )

    async def go() -> None:
        shown = 0
        async with subscription:
            async for delivery in subscription:
                if args.json:
                    line = {
                        "token": delivery.token,
                        "partition": delivery.partition,
                        "position": delivery.position,
                        "type": delivery.event.__struct_config__.tag,
                        "content": delivery.content,
                        "erase": delivery.erasure,
                        "redelivered": delivery.redelivered,
                        "event": delivery.event,
                    }
                    sys.stdout.write(msgspec.json.encode(line).decode() + "\n")
                else:
                    render.show(render.event_line(delivery))
                # Written before it is acked: a tail killed in between shows it again, never loses it.
                sys.stdout.flush()
                await delivery.ack()
                shown += 1
                if args.count is not None and shown >= args.count:
                    return

    asyncio.run(go())
    return 0


def cmd_relay(args: argparse.Namespace) -> int:
    """`engram relay`: every event of the log posted to a URL, signed, until SIGINT/SIGTERM."""
    from engram_ledger.services.ops.relay import RelayOptions, RetryPolicy, relay_secret, run_relay

    log_to_terminal()
    settings = Settings.from_env()
    if not args.url.startswith(("http://", "https://")):
        raise EngramError(ErrorCode.INVALID_PARAMETER, f"--url must be an http:// or https:// URL; got {args.url!r}")
    if args.give_up_after <= 0:
        raise EngramError(ErrorCode.INVALID_PARAMETER, "--give-up-after must be a positive number of seconds")
    if not args.post_seconds > 0:
        raise EngramError(ErrorCode.INVALID_PARAMETER, "--post-seconds must be a positive number of seconds")
    secret, secret_file = relay_secret(settings.data_dir, args.secret_file)
    log.info("signing posts with the secret in %s (give the receiver this file)", secret_file)
    options = RelayOptions(
        url=args.url,
        group=args.group,
        secret=secret,
        kinds=comma_list(args.kinds),
        users=args.user,
        from_start=args.from_start,
        key=subscriber_key(settings, args.key_file, args.content),
        metrics_port=args.metrics_port,
        retry=RetryPolicy(give_up_after=args.give_up_after),
        post_seconds=args.post_seconds,
    )

    async def go() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await run_relay(resolve_url(settings), settings.redis_cluster, options, stop)

    asyncio.run(go())
    return 0


def cmd_rebuild(args: argparse.Namespace) -> int:
    from engram_ledger.services.ops.rebuild import rebuild_history, rebuild_index

    rebuild = rebuild_index if args.projection == "index" else rebuild_history

    async def go() -> dict[str, Any]:
        settings = Settings.from_env()
        async with operator_redis(settings) as (redis, partitions):
            return await rebuild(redis, settings, partitions, progress(args))

    result = asyncio.run(go())
    if args.projection == "index":
        print_result(
            args, result, lambda r: f"rebuilt the index from {r['events']} events; generation {r['generation']} is live"
        )
    else:
        print_result(
            args, result, lambda r: f"rebuilt history from {r['events']} events; live generations {r['generations']}"
        )
    return 0


def cmd_health(args: argparse.Namespace) -> int:
    from engram_ledger.services.observability.health import health

    async def go() -> dict[str, Any]:
        settings = Settings.from_env()
        redis = connect(settings, socket_connect_timeout=2)
        try:
            return await health(redis)
        finally:
            await close_redis(redis)

    report = asyncio.run(go())
    if args.json:
        sys.stdout.write(json.dumps(report) + "\n")
    else:
        render.show(render.health(report))
    return 0 if report["status"] == "ok" else 1


def cmd_model(args: argparse.Namespace) -> int:
    """Export (once) and load the configured encoder: at install time, so that no start waits."""
    import time

    from engram_ledger.services.adapters.minilm import indexed_model_name, load_encoder

    settings = Settings.from_env()
    encoder = args.encoder or settings.encoder
    started = time.perf_counter()
    load_encoder(encoder, settings.model_cache_dir).encode(["ready"])
    report = {
        "encoder": encoder,
        "model": indexed_model_name(encoder),
        "model_cache": str(settings.model_cache_dir),
        "seconds": round(time.perf_counter() - started, 1),
    }
    print_result(
        args, report, lambda r: f"{r['model']} ({r['encoder']}) ready in {r['model_cache']} in {r['seconds']} s"
    )
    return 0


def cmd_keys(args: argparse.Namespace) -> int:
    from engram_ledger.services.ops.keys import human, run_keys

    options = {k: getattr(args, k) for k in ("wait_seconds", "batch", "pause") if hasattr(args, k)}
    result = asyncio.run(run_keys(Settings.from_env(), args.action, progress(args), **options))
    print_result(args, result, lambda r: human(args.action, r))
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from engram_ledger.services.adapters.private_files import open_private
    from engram_ledger.services.ops.portable import export_log

    async def go() -> dict[str, int]:
        async with operator_redis(Settings.from_env()) as (redis, partitions):
            with open_private(args.out) as out:  # it holds every wrapped data key
                return await export_log(redis, partitions, out, progress(args))

    counts = asyncio.run(go())
    print_result(args, {"written": args.out, **counts}, lambda o: f"exported {o['events']} events to {o['written']}")
    return 0


def cmd_import(args: argparse.Namespace) -> int:
    from engram_ledger.services.adapters.crypto import load_master_key
    from engram_ledger.services.adapters.event_store import RedisEventStore
    from engram_ledger.services.ops.portable import import_log, read_partitions

    settings = Settings.from_env()

    async def go() -> dict[str, int]:
        redis = connect(settings)
        try:
            with open(args.source) as source:
                partitions = read_partitions(source)
                store = RedisEventStore(redis, partitions, 0, load_master_key(settings.data_dir))
                return await import_log(redis, store, source, progress(args))
        except ValueError as e:
            raise EngramError(ErrorCode.INVALID_PARAMETER, str(e)) from None
        finally:
            await close_redis(redis)

    counts = asyncio.run(go())
    print_result(args, counts, lambda o: f"imported {o['events']} events; projections rebuild when engram serve starts")
    return 0


def cmd_acl(args: argparse.Namespace) -> int:
    """`engram acl`: each role's Redis ACL rules, or (--write) an ACL file and URL files."""
    from engram_ledger.services.ops import acl

    partitions = args.partitions or Settings.from_env().partitions
    if args.write:
        if args.role or args.name:
            raise EngramError(ErrorCode.INVALID_PARAMETER, "--write makes every role's user: give no ROLE or --name")
        paths = acl.write_deployment(
            Path(args.write), args.host, database=args.database, cluster=args.cluster, partitions=partitions
        )
        written = {name: str(path) for name, path in paths.items()}
        print_result(args, {"written": written}, lambda o: "wrote (0600) " + ", ".join(o["written"].values()))
        return 0
    roles = acl.describe(args.role, args.name, cluster=args.cluster, partitions=partitions)
    print_result(args, {"roles": roles}, lambda o: acl.as_redis_cli(o["roles"]))
    return 0


def cmd_schema(args: argparse.Namespace) -> int:
    from engram_ledger.contracts.schema import json_schema

    return write_document(args, json_schema())


def cmd_docs(args: argparse.Namespace) -> int:
    from engram_ledger.contracts.asyncapi import asyncapi

    return write_document(args, asyncapi())


def cmd_console(args: argparse.Namespace) -> int:
    """`engram console`: the memory console in a browser (services/console), until SIGINT/SIGTERM."""
    from engram_ledger.services.console.app import serve_console
    from engram_ledger.services.console.auth import check_token, new_token

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = Settings.from_env()
    chosen = os.environ.get("ENGRAM_CONSOLE_TOKEN")
    token = check_token(chosen) if chosen else new_token()

    def announce(url: str) -> None:
        # The generated token is shown here once; a chosen one is never printed.
        shown = {"url": url, "token": None if chosen else token}
        if args.json:
            print(json.dumps(shown), flush=True)
            return
        print(f"engram console on {url}", flush=True)
        if not chosen:
            print(f"console token (log in with it; set ENGRAM_CONSOLE_TOKEN to choose one): {token}", flush=True)

    url = resolve_url(settings)
    asyncio.run(
        serve_console(
            url,
            token,
            args.host,
            args.port,
            cluster=settings.redis_cluster,
            timeout=settings.request_timeout_seconds,
            announce=announce,
            ended_sessions=settings.data_dir / "console-ended-sessions",
        )
    )
    return 0
