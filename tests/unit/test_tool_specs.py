"""The tool profiles' definitions and the MCP server's gateway secret, without a service."""

from __future__ import annotations

import pytest

from engram_ledger.contracts.errors import EngramError
from engram_ledger.services.agents.tokens import GatewayVerifier
from engram_ledger.services.agents.tools import PROFILES, profile


def test_every_profile_has_schemas_marks_and_timeouts() -> None:
    assert set(PROFILES) == {"engram", "forget", "runtime", "versioned", "memento", "assistant"}
    assert profile("prd29") == profile("versioned"), "the old name stays an alias"
    for specs in PROFILES.values():
        for spec in specs:
            assert spec.parameters["type"] == "object" and spec.description
            assert spec.timeout == (15.0 if spec.read_only else 10.0)
            assert spec.openai()["function"]["name"] == spec.name == spec.anthropic()["name"]
    runtime = {t.name: t for t in PROFILES["runtime"]}
    assert runtime["memory_search"].read_only and not runtime["memory_save"].read_only


def test_a_gateway_secret_too_short_to_be_safe_is_refused() -> None:
    with pytest.raises(EngramError, match="at least 32 characters"):
        GatewayVerifier("short")
