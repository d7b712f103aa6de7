"""Structured values of keyed notes (``PutNote``): the text a value is searched by, and the
filters (``Where``) a listing or a search applies to values. Pure functions."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from engram_ledger.contracts.errors import EngramError, ErrorCode

WHOLE = "$"
# Control characters other than tab and newlines (Unicode category Cc), and lone surrogates:
# refused in text a caller writes, replaced in text Engram derives from a value.
UNPRINTABLE = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ud800-\udfff]")
OPERATORS = frozenset({"$eq", "$ne", "$gt", "$gte", "$lt", "$lte"})
_MISSING = object()


def key_claim(category: str, key: str) -> str:
    """The claim a keyed note holds in the event store (as a content digest is held): one active
    note per key and category of a user."""
    return "key-" + hashlib.blake2b(f"{category}\x00{key}".encode(), digest_size=16).hexdigest()


def value_json(value: Mapping[str, Any]) -> str:
    """The JSON text a value or an item is kept as, its fields in the order given."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def same_value(kept: str | None, value: Mapping[str, Any]) -> bool:
    """Whether a value kept as JSON text is this value (field order aside)."""
    return kept is not None and json.loads(kept) == value


def text_of(value: Mapping[str, Any], index: Sequence[str] | None) -> str:
    """The text embedded for a value: the fields ``index`` names (dotted paths, ``$`` for the
    whole value), the whole value by default. Strings are taken as they are and other leaves
    as ``name: value`` lines (fields in name order), so a note ``{"content": "likes tea"}`` is searched as "likes
    tea". A value with no text at all is searched by its JSON."""
    paths = list(index) if index else [WHOLE]
    lines: list[str] = []
    for path in paths:
        found = value if path == WHOLE else lookup(value, path)
        if found is not _MISSING:
            _leaves(found, "" if path == WHOLE else path, lines)
    text = printable("\n".join(line for line in lines if line.strip())).strip()
    return text or printable(value_json(value))


def printable(text: str) -> str:
    """The text with every unprintable character a space: a value or an item is kept whole
    (its JSON escapes them), its searched text need not carry them."""
    return UNPRINTABLE.sub(" ", text)


def _leaves(node: Any, name: str, out: list[str]) -> None:
    if isinstance(node, str):
        out.append(node)
    elif isinstance(node, Mapping):
        # In key order: the same value (key order aside) is the same text.
        for k, v in sorted(node.items()):
            _leaves(v, f"{name}.{k}" if name else str(k), out)
    elif isinstance(node, list):
        for item in node:
            _leaves(item, name, out)
    elif node is not None:
        out.append(f"{name}: {json.dumps(node)}" if name else json.dumps(node))


def lookup(value: Mapping[str, Any], path: str) -> Any:
    """The field a dotted path names, or ``_MISSING``. A key that itself holds a dot is found
    whole first (``{"a.b": 1}``)."""
    if path in value:
        return value[path]
    node: Any = value
    for part in path.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return _MISSING
        node = node[part]
    return node


def check_where(where: Mapping[str, Any]) -> None:
    """Refuse an operator the filter does not know, naming it, before any note is read."""
    for field, condition in where.items():
        if isinstance(condition, Mapping) and any(k.startswith("$") for k in condition):
            unknown = sorted(k for k in condition if k not in OPERATORS)
            if unknown:
                raise EngramError(
                    ErrorCode.INVALID_PARAMETER,
                    f"where[{field!r}] uses {', '.join(unknown)}; the operators are {', '.join(sorted(OPERATORS))}",
                )


def matches(value: Mapping[str, Any] | None, where: Mapping[str, Any]) -> bool:
    """Whether a value passes every condition of ``where``."""
    for field, condition in where.items():
        found = _MISSING if value is None else lookup(value, field)
        if isinstance(condition, Mapping) and condition and all(k in OPERATORS for k in condition):
            if not all(_compare(found, op, operand) for op, operand in condition.items()):
                return False
        elif found is _MISSING:
            if condition is not None:  # a missing field equals None, as LangGraph's stores read it
                return False
        elif found != condition:
            return False
    return True


def _compare(found: Any, op: str, operand: Any) -> bool:
    if op == "$ne":
        return found is _MISSING or found != operand
    if found is _MISSING:
        return op == "$eq" and operand is None
    if op == "$eq":
        return bool(found == operand)
    # Order only within one kind of value: numbers with numbers, text with text.
    numbers = all(isinstance(x, int | float) and not isinstance(x, bool) for x in (found, operand))
    if not (numbers or (isinstance(found, str) and isinstance(operand, str))):
        return False
    if op == "$gt":
        return bool(found > operand)
    if op == "$gte":
        return bool(found >= operand)
    if op == "$lt":
        return bool(found < operand)
    return bool(found <= operand)


def normalize_subject(subject: str) -> str:
    """How subjects compare: case and spacing aside ("Sarah  Smith" is "sarah smith")."""
    return " ".join(subject.casefold().split())
