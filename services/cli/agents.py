"""The agent's surface from the command line: tool definitions, the MCP server, and the MCP
server's bearer tokens."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Mapping
from typing import Any

from engram_ledger.contracts.errors import EngramError, ErrorCode
from engram_ledger.services.adapters.redis_conn import close_redis
from engram_ledger.services.cli.notes import client_for
from engram_ledger.services.cli.output import log_to_terminal
from engram_ledger.services.config import Settings
from engram_ledger.services.ops.operator import connect


def cmd_tools(args: argparse.Namespace) -> int:
    from engram_ledger.services.agents.tools import PROFILES, profile

    specs = profile(args.profile) if args.profile else [t for p in PROFILES for t in profile(p)]
    if args.format == "openai":
        out: Any = [t.openai() for t in specs]
    elif args.format == "anthropic":
        out = [t.anthropic() for t in specs]
    else:
        out = [
            {**t.anthropic(), "read_only": t.read_only, "side_effecting": not t.read_only, "timeout_s": t.timeout}
            for t in specs
        ]
    sys.stdout.write(json.dumps({"profile": args.profile, "tools": out}, indent=None if args.json else 2) + "\n")
    return 0


def cmd_mcp(args: argparse.Namespace) -> int:
    from engram_ledger.services.agents.mcp_server import serve_http, serve_stdio
    from engram_ledger.services.agents.tokens import token_verifier
    from engram_ledger.services.application.decoding import check_user_id

    if args.http is None:
        if not args.user:
            raise EngramError(
                ErrorCode.INVALID_PARAMETER, "--user is required for stdio (or serve --http for many users)"
            )
        check_user_id(args.user, "--user")  # refused at start, before looking for the bus
    elif args.user:
        raise EngramError(
            ErrorCode.INVALID_PARAMETER,
            "--user is for stdio; over HTTP the user comes from each request's token (engram tokens create)",
        )
    if bool(args.tls_cert) != bool(args.tls_key):
        raise EngramError(ErrorCode.INVALID_PARAMETER, "--tls-cert and --tls-key go together")
    settings = Settings.from_env()
    client = client_for(settings, operator=False)
    if args.http is not None:
        log_to_terminal()
        verifier = token_verifier(connect(settings), args.gateway_secret_file)
        tls = (args.tls_cert, args.tls_key) if args.tls_cert else None
        idle = settings.mcp_session_idle_seconds
        per_token = settings.mcp_sessions_per_token
        asyncio.run(serve_http(client, args.profile, args.host, args.http, verifier, tls, idle, per_token))
        return 0
    asyncio.run(serve_stdio(client, args.profile, args.user, args.session))
    return 0


def cmd_http(args: argparse.Namespace) -> int:
    """`engram http`: the HTTP API and MCP on one port, until SIGINT/SIGTERM."""
    from engram_ledger.services.agents.tokens import token_verifier
    from engram_ledger.services.http.app import serve_api
    from engram_ledger.services.http.auth import Shares

    if bool(args.tls_cert) != bool(args.tls_key):
        raise EngramError(ErrorCode.INVALID_PARAMETER, "--tls-cert and --tls-key go together")
    settings = Settings.from_env()
    log_to_terminal()
    verifier = token_verifier(connect(settings), args.gateway_secret_file)
    serving = serve_api(
        client_for(settings, operator=False),
        verifier,
        args.host,
        args.port,
        tls=(args.tls_cert, args.tls_key) if args.tls_cert else None,
        profile=args.profile,
        shares=Shares(requests=args.requests_per_token),
        session_idle_seconds=settings.mcp_session_idle_seconds,
        sessions_per_token=settings.mcp_sessions_per_token,
        cluster=settings.redis_cluster,
    )
    asyncio.run(serving)
    return 0


def cmd_openapi(args: argparse.Namespace) -> int:
    from engram_ledger.services.cli.output import write_document
    from engram_ledger.services.http.openapi import openapi

    return write_document(args, openapi())


def cmd_tokens(args: argparse.Namespace) -> int:
    """`engram tokens create|list|revoke`: the bearer tokens of the HTTP API and MCP over HTTP."""
    from engram_ledger.services.agents.tokens import TokenRegistry, check_create, manage_tokens

    if args.action == "create":  # refused before looking for the bus
        check_create(args.user, args.operator, args.expires_in_days)

    async def go() -> dict[str, Any]:
        redis = connect(Settings.from_env())
        try:
            return await manage_tokens(
                TokenRegistry(redis),
                args.action,
                user_id=getattr(args, "user", None),
                operator=getattr(args, "operator", False),
                label=getattr(args, "label", ""),
                expires_in_days=getattr(args, "expires_in_days", None),
                token_id=getattr(args, "token_id", None),
            )
        finally:
            await close_redis(redis)

    outcome = asyncio.run(go())
    if args.json:
        sys.stdout.write(json.dumps(outcome) + "\n")
    elif "token" in outcome:
        # The token alone on stdout (for a pipe); what it is, on stderr.
        sys.stdout.write(f"{outcome['token']}\n")
        sys.stderr.write(_token_created(outcome))
    else:
        sys.stdout.write(_tokens(outcome))
    return 0


def _token_created(outcome: Mapping[str, Any]) -> str:
    """What a new MCP token is (the token itself goes to stdout alone)."""
    whom = f"user {outcome['user_id']}" if outcome["user_id"] else "the operator role"
    return f"token {outcome['id']} for {whom}: shown once, keep it secret (Redis keeps only its hash)\n"


def _tokens(outcome: Mapping[str, Any]) -> str:
    """``engram tokens list`` (one line each) or ``revoke``."""
    if "revoked" in outcome:
        return f"revoked {outcome['revoked']['id']}\n"
    lines = []
    for r in outcome["tokens"]:
        whom = f"user {r['user_id']}" if r["user_id"] else "operator"
        expires = f" expires {r['expires_at']}" if r["expires_at"] else ""
        label = f" {r['label']!r}" if r["label"] else ""
        lines.append(f"{r['id']}  {whom}  created {r['created_at']}{expires}{label}\n")
    return "".join(lines)
