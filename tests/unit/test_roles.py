"""`engram serve --role`: which workers a process runs, and the splits Qdrant Edge forbids."""

from __future__ import annotations

import pytest

from engram_ledger.services.bootstrap import ConfigurationError, build, check_roles
from engram_ledger.services.config import ROLES, Settings, parse_roles


def test_roles_parse_from_a_comma_list_and_all() -> None:
    assert parse_roles("all") == frozenset(ROLES)
    assert parse_roles(" commands , queries ") == {"commands", "queries"}
    with pytest.raises(ValueError, match="unknown role"):
        parse_roles("commands,indexer")


def test_edge_readers_must_live_with_the_index_but_a_qdrant_server_frees_them() -> None:
    with pytest.raises(ConfigurationError, match="ENGRAM_QDRANT_URL"):
        check_roles(Settings(roles=parse_roles("queries")))
    with pytest.raises(ConfigurationError):
        check_roles(Settings(roles=parse_roles("commands,history")))
    check_roles(Settings(roles=parse_roles("commands,queries,index")))
    check_roles(Settings(roles=parse_roles("history,saga")))
    check_roles(Settings(roles=parse_roles("queries"), qdrant_url="http://qdrant:6333"))
    check_roles(Settings(roles=parse_roles("queries"), index_enabled=False))


def test_a_process_builds_only_the_workers_of_its_roles() -> None:
    # build() only constructs: nothing connects until run().
    engram = build(Settings(roles=parse_roles("history,saga"), index_enabled=False))
    assert {r.name for r in engram.runners} == {"history", "forget-saga"}
    assert engram.reclaimers == [] and engram.scrubber is None and engram.forget_timer is not None
    front = build(Settings(roles=parse_roles("commands,queries"), index_enabled=False, partitions=2))
    assert front.runners == [] and front.forget_timer is None and front.scrubber is not None
    assert sorted(r.stream for r in front.reclaimers) == [
        "engram:{0}:commands",
        "engram:{0}:operator",
        "engram:{0}:queries",
        "engram:{1}:commands",
        "engram:{1}:operator",
        "engram:{1}:queries",
    ]
