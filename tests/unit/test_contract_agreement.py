"""The contracts state every field's name, limits, choices and default once (their JSON Schema,
from msgspec). What restates them for a caller that cannot read them, the client's methods, the
tool profiles' JSON Schemas and the CLI's options, must agree: what passes a tool's schema or the command line is
never refused by the contract under the same name."""

from __future__ import annotations

import argparse
import inspect
import re
import typing
from typing import Any

import msgspec
import pytest

from engram_ledger.contracts import commands, queries
from engram_ledger.contracts.commands import AnyCommand
from engram_ledger.contracts.queries import AnyQuery
from engram_ledger.services.agents.tools import PROFILES
from engram_ledger.services.bus.client import EngramClient
from engram_ledger.services.cli.parser import build_parser

CONTRACTS = (*typing.get_args(AnyCommand), *typing.get_args(AnyQuery))
# A save's episode and procedure fields: the client passes them through as keywords.
EPISODE_AND_PROCEDURE = {"summary", "narrative", "occurred_at", "links", "trigger", "action"}


def contract_fields() -> dict[str, list[dict[str, Any]]]:
    """Every contract field's schema by name (each non-null alternative; an array's items)."""
    fields: dict[str, list[dict[str, Any]]] = {}
    for struct in CONTRACTS:
        schema = msgspec.json.schema(struct)
        defs = schema["$defs"]
        for name, prop in defs[struct.__name__]["properties"].items():
            for alternative in prop.get("anyOf", [prop]):
                if alternative.get("type") == "null":
                    continue
                if "$ref" in alternative:
                    alternative = defs[alternative["$ref"].rsplit("/", 1)[1]]
                if alternative.get("type") == "array" and "items" in alternative:
                    alternative = alternative["items"]
                fields.setdefault(name, []).append({**alternative, "default": prop.get("default")})
    return fields


FIELDS = contract_fields()


def within(tool: dict[str, Any], contract: dict[str, Any]) -> bool:
    """Whether every value ``tool`` admits, the contract admits too."""
    if "type" in contract and tool.get("type") != contract["type"]:
        return False
    if "enum" in contract and not set(tool.get("enum", [])) <= set(contract["enum"]):
        return False
    if "enum" in tool and contract.get("type") == "string":
        return all(_string_within(v, contract) for v in tool["enum"])
    for low in ("minLength", "minimum"):
        if low in contract and tool.get(low, float("-inf")) < contract[low]:
            return False
    for high in ("maxLength", "maximum"):
        if high in contract and tool.get(high, float("inf")) > contract[high]:
            return False
    return "pattern" not in contract or tool.get("pattern") == contract["pattern"]


def _string_within(value: str, contract: dict[str, Any]) -> bool:
    long_enough = contract.get("minLength", 0) <= len(value) <= contract.get("maxLength", len(value))
    return long_enough and re.search(contract.get("pattern", ""), value) is not None


def tool_parameters() -> list[tuple[str, str, dict[str, Any]]]:
    found = []
    for specs in PROFILES.values():
        for spec in specs:
            for name, schema in spec.parameters["properties"].items():
                if name in FIELDS:
                    if schema.get("type") == "array" and "items" in schema:
                        schema = schema["items"]
                    found.append((spec.name, name, schema))
    return found


@pytest.mark.parametrize(("tool", "name", "schema"), tool_parameters(), ids=lambda v: v if isinstance(v, str) else "")
def test_a_tool_parameter_admits_only_what_the_contract_of_the_same_name_admits(
    tool: str, name: str, schema: dict[str, Any]
) -> None:
    assert any(within(schema, contract) for contract in FIELDS[name]), (tool, name, schema, FIELDS[name])


def cli_options() -> list[tuple[str, argparse.Action]]:
    parser = build_parser()
    (commands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    found = []
    for command, sub in commands.choices.items():
        nested = [a for a in sub._actions if isinstance(a, argparse._SubParsersAction)]
        parsers = list(nested[0].choices.values()) if nested else [sub]
        for each in parsers:
            if not any(a.dest == "user" and a.required for a in each._actions):
                continue  # not a call of the bus on a user's behalf (tools --format is about the output)
            for action in each._actions:
                if action.dest in FIELDS and (action.choices is not None or action.default not in (None, False)):
                    found.append((command, action))
    return found


@pytest.mark.parametrize(("command", "option"), cli_options(), ids=lambda v: v if isinstance(v, str) else v.dest)
def test_a_cli_option_offers_the_contracts_choices_and_default(command: str, option: argparse.Action) -> None:
    contracts = FIELDS[option.dest]
    if option.choices is not None:
        # The CLI may offer fewer (a search's ranking), never one the contract refuses.
        assert any(set(option.choices) <= set(c.get("enum", option.choices)) for c in contracts), command
    if option.default not in (None, False) and not isinstance(option.default, bool):
        assert any(c["default"] == option.default for c in contracts) or any(
            within({"type": c.get("type"), "minimum": option.default, "maximum": option.default}, c) for c in contracts
        ), (command, option.dest, option.default)


def test_the_agreement_checks_see_the_fields_they_are_about() -> None:
    names = {name for _, name, _ in tool_parameters()}
    assert {"content", "category", "subject", "query", "top_k"} <= names
    assert {"kind", "source", "top_k", "limit"} <= {a.dest for _, a in cli_options()}


# Each client method and the contract it sends; what of the contract it leaves out on purpose.
CLIENT_CALLS: dict[str, tuple[type[msgspec.Struct], set[str]]] = {
    "save": (commands.SaveNote, {"expected_version", *EPISODE_AND_PROCEDURE}),  # those by **keyword
    "save_many": (commands.SaveNotes, {"expected_version"}),
    "put": (commands.PutNote, set()),
    "update": (commands.UpdateNote, set()),
    "supersede": (commands.SupersedeNote, set()),
    "record_message": (commands.RecordMessage, {"expected_version"}),
    "record_messages": (commands.RecordMessages, {"expected_version"}),
    "renew": (commands.RenewNote, {"expected_version", "origin"}),
    "retract_message": (commands.RetractMessage, {"expected_version", "origin"}),
    "forget": (commands.RequestForget, {"expected_version", "origin"}),
    "forget_user": (commands.RequestForgetUser, {"expected_version", "origin"}),
    "forget_session": (commands.RequestForgetSession, {"expected_version", "origin"}),
    "revert": (commands.RevertNote, set()),
    "context": (queries.BuildContext, set()),
    "search": (queries.SearchNotes, set()),
    # A query's origin names who asked in a recall: only searches and memory blocks record one.
    "get_note": (queries.GetNote, {"origin"}),
    "get_by_key": (queries.GetNoteByKey, {"origin"}),
    "list_categories": (queries.ListCategories, {"origin"}),
    "list_messages": (queries.ListMessages, {"origin"}),
    "history": (queries.GetHistory, {"origin"}),
    "list_notes": (queries.ListNotes, {"origin"}),
    "list_recent": (queries.ListRecent, {"origin"}),
    "diff": (queries.DiffNotes, {"origin"}),
    "recalls": (queries.ListRecalls, {"origin"}),
}


@pytest.mark.parametrize("method", sorted(CLIENT_CALLS))
def test_a_client_method_takes_its_contracts_names_and_defaults(method: str) -> None:
    contract, left_out = CLIENT_CALLS[method]
    fields = {f.name: f for f in msgspec.structs.fields(contract)}
    parameters = {
        p.name: p
        for p in inspect.signature(getattr(EngramClient, method)).parameters.values()
        if p.name != "self" and p.kind is not inspect.Parameter.VAR_KEYWORD
    }
    assert set(parameters) <= set(fields), f"{method} names what {contract.__name__} does not"
    assert set(fields) - set(parameters) - {"schema_version"} == left_out, f"{contract.__name__} grew a field"
    for name, parameter in parameters.items():
        if parameter.default is inspect.Parameter.empty or parameter.default is None:
            continue  # required, or None: the contract's own default applies
        field = fields[name]
        expected = field.default if field.default is not msgspec.NODEFAULT else field.default_factory()
        given = list(parameter.default) if isinstance(parameter.default, tuple) else parameter.default
        assert given == expected, (method, name)
