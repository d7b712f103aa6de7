"""What the commands that serve HTTP (``engram console``, ``engram mcp --http``) share: the port
tried before anything starts, and the address they announce."""

from __future__ import annotations

import os
import socket

from engram_ledger.contracts.errors import EngramError, ErrorCode


def check_port(host: str, port: int, option: str = "--port") -> None:
    """One clear error now for a port that cannot be had (taken, or not ours to take), rather
    than the server's own traceback once everything else has started."""
    try:
        with socket.create_server((host, port)):
            pass
    except OSError as e:
        why = os.strerror(e.errno) if e.errno else str(e)
        raise EngramError(
            ErrorCode.INVALID_PARAMETER, f"cannot listen on {host}:{port}: {why}; choose another with {option}"
        ) from None


def http_url(host: str, port: int, path: str = "/", tls: bool = False) -> str:
    """The address a person opens or configures."""
    shown = f"[{host}]" if ":" in host else host
    return f"{'https' if tls else 'http'}://{shown}:{port}{path}"
