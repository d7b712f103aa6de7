"""Requests off the bus: bytes to a contract, or a typed INVALID_PARAMETER refusal in plain words.

A person or an LLM reads a refusal to correct the request, so msgspec's own words (``Expected
`str` matching regex '\\S' - at `$.content```) are said again as the field the caller sent and the
whole rule it broke: "content must not be blank", "top_k must be a whole number from 1 to 20; you
gave 50". The rules are the contracts' own, read with ``msgspec.inspect`` and put as the JSON
Schema they amount to; ``explain`` words any such rule, and the tool dispatcher words its own
schemas' refusals with it too.
"""

from __future__ import annotations

import contextlib
import functools
import json
import re
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, TypeVar

import msgspec
import msgspec.inspect as mi

from engram_ledger.contracts.errors import EngramError, ErrorCode
from engram_ledger.contracts.limits import (
    CATEGORY_PATTERN,
    ID_PATTERN,
    MAX_MESSAGE_BYTES,
    NOT_BLANK,
    NOTE_ID_PATTERN,
    TOKEN_PATTERN,
    UserId,
)

T = TypeVar("T")
# A JSON Schema: the part of it the contracts and the tool schemas use.
Rule = Mapping[str, Any]


def refuse_oversized(body: bytes) -> None:
    if len(body) > MAX_MESSAGE_BYTES:
        raise EngramError(
            ErrorCode.INVALID_PARAMETER, f"message of {len(body):,} bytes: the limit is {MAX_MESSAGE_BYTES:,}"
        )


def decode_request(body: bytes, decoder: msgspec.json.Decoder[T], what: str) -> T:
    """``what`` names the request kind in the refusal ("command", "query")."""
    refuse_oversized(body)
    try:
        decoded = _decode(body, decoder, what)
        _refuse_duplicate_keys(body, what)
        return decoded
    except RecursionError:
        # msgspec's depth limit raises this rather than a DecodeError, from either decode.
        raise EngramError(ErrorCode.INVALID_PARAMETER, f"malformed JSON: the {what} is nested too deeply") from None


def _decode(body: bytes, decoder: msgspec.json.Decoder[T], what: str) -> T:
    try:
        return decoder.decode(body)
    except msgspec.ValidationError as e:
        try:
            # A typed decode can stop at the first wrong value before reaching broken JSON after it.
            document = msgspec.json.decode(body)
        except UnicodeDecodeError:
            # A string of bytes that are not UTF-8 ("\x80"): the untyped decode reads into it.
            raise EngramError(ErrorCode.INVALID_PARAMETER, f"malformed JSON: the {what} is not valid UTF-8") from None
        except msgspec.DecodeError as broken:
            if " - at `$" in str(e):
                # Valid JSON the untyped decode refuses too (a number out of range): msgspec's own
                # words, which name the field.
                raise EngramError(ErrorCode.INVALID_PARAMETER, f"invalid {what}: {e}") from None
            raise _malformed(broken) from None
        reason = _plain(str(e), decoder.type, document, f"a {what}")
        raise EngramError(ErrorCode.INVALID_PARAMETER, f"invalid {what}: {reason}") from None
    except msgspec.DecodeError as e:
        raise _malformed(e) from None


def _refuse_duplicate_keys(body: bytes, what: str) -> None:
    """msgspec, like most JSON parsers, keeps the last of two equal keys; a request that names
    a field twice (``"user_id":"fz","user_id":"alice"``) is ambiguous, and refused."""

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        seen: set[str] = set()
        for key, _ in items:
            if key in seen:
                raise EngramError(ErrorCode.INVALID_PARAMETER, f"invalid {what}: the field {key!r} is given twice")
            seen.add(key)
        return dict(items)

    with contextlib.suppress(ValueError):  # msgspec read it: Python's reader only looks for twins
        json.loads(body, object_pairs_hook=pairs)


def _malformed(e: msgspec.DecodeError) -> EngramError:
    return EngramError(ErrorCode.INVALID_PARAMETER, f"malformed JSON: {str(e).removeprefix('JSON is malformed: ')}")


def check_user_id(user_id: str, name: str = "user_id") -> None:
    """Refuse a user id the contracts would refuse, before it is used for anything, in plain words
    under ``name``: how the caller gave it (``--user``, a header)."""
    try:
        msgspec.convert(user_id, UserId)
    except msgspec.ValidationError as e:
        raise EngramError(ErrorCode.INVALID_PARAMETER, _plain(str(e), UserId, user_id, name)) from None


# msgspec's messages --------------------------------------------------------------------------------

_AT = re.compile(r"^(?P<what>.*?)(?: - at `\$(?P<path>[^`]*)`)?$", re.DOTALL)
_STEP = re.compile(r"\.([^.\[]+)|\[(\d+)\]")
_MISSING_FIELD = re.compile(r"^Object missing required field `(?P<field>[^`]+)`$")
TIME_EXAMPLE = "2024-05-01T09:00:00Z"
# What msgspec refuses that the rules below cannot tell apart from what they accept.
_OTHERWISE = {"Invalid RFC3339 encoded datetime": f"must be a time in RFC 3339, like {TIME_EXAMPLE}"}


def _plain(message: str, root_type: Any, document: Any, root_name: str) -> str:
    """msgspec's ``message`` about ``document`` (of type ``root_type``) in words; the document
    itself is ``root_name``. Words that cannot be found leave msgspec's: a refusal never fails."""
    try:
        return _words(message, _type_info(root_type), document, root_name)
    except Exception:  # the refusal is what matters; these are only its words
        return message


@functools.lru_cache(maxsize=64)
def _type_info(root_type: Any) -> mi.Type:
    # msgspec builds the whole tree of a request type on each call (about 4 ms for the union of
    # every command): a flood of malformed requests would cost a worker that much each.
    return mi.type_info(root_type)


def _words(message: str, root: mi.Type, document: Any, root_name: str) -> str:
    found = _AT.match(message)
    assert found is not None  # the pattern matches any text
    what, steps = found["what"], [name or int(index) for name, index in _STEP.findall(found["path"] or "")]
    name = path_name(steps) or root_name
    rule, value = _resolve(root, document, steps)
    missing = _MISSING_FIELD.match(what)
    if missing:
        field = missing["field"]
        tags = _tags(_unwrap(root)) if not steps and field == _tag_field(_unwrap(root)) else []
        return f"{join(path_name(steps), field)} is required" + (f"; one of {_choices(tags)}" if tags else "")
    said = explain(name, rule, value) if rule is not None else None
    if said is not None:
        return said
    if what in _OTHERWISE:
        return f"{name} {_OTHERWISE[what]}; you gave {shown(value)}"
    return f"{name}: {what}"


def _resolve(t: mi.Type, value: Any, steps: Sequence[str | int]) -> tuple[Rule | None, Any]:
    """The rule at ``steps`` inside a value of type ``t``, and the value found there."""
    for step in steps:
        t = _one(t, value)
        if isinstance(step, int):
            if not isinstance(t, mi.ListType | mi.SetType | mi.FrozenSetType | mi.VarTupleType):
                return None, None
            t, value = t.item_type, value[step] if isinstance(value, list) and step < len(value) else None
            continue
        tags = _tags(t)
        if tags and step == _tag_field(t):
            return {"enum": tags}, value.get(step) if isinstance(value, dict) else None
        if not isinstance(t, mi.StructType):
            return None, None
        field = next((f for f in t.fields if f.encode_name == step), None)
        if field is None:
            return None, None
        t, value = field.type, value.get(step) if isinstance(value, dict) else None
    return _rule(t), value


def _unwrap(t: mi.Type) -> mi.Type:
    while isinstance(t, mi.Metadata):
        t = t.type
    return t


def _one(t: mi.Type, value: Any) -> mi.Type:
    """``t`` without its metadata and null; of a union of tagged structs, the one ``value`` names."""
    t = _unwrap(t)
    if isinstance(t, mi.UnionType):
        kinds = [_unwrap(k) for k in t.types if not isinstance(_unwrap(k), mi.NoneType)]
        if isinstance(value, dict):
            named = [
                k for k in kinds if isinstance(k, mi.StructType) and k.tag_field and k.tag == value.get(k.tag_field)
            ]
            if named:
                return named[0]
        if len(kinds) == 1:
            return _one(kinds[0], value)
    return t


def _tags(t: mi.Type) -> list[str]:
    """The tags of a union of tagged structs (empty for anything else)."""
    kinds = t.types if isinstance(t, mi.UnionType) else ()
    return [str(k.tag) for k in map(_unwrap, kinds) if isinstance(k, mi.StructType) and k.tag_field]


def _tag_field(t: mi.Type) -> str | None:
    kinds = [_unwrap(k) for k in t.types] if isinstance(t, mi.UnionType) else []
    return next((k.tag_field for k in kinds if isinstance(k, mi.StructType)), None)


def _rule(t: mi.Type) -> Rule:
    """A msgspec type as the JSON Schema it amounts to (what ``explain`` reads)."""
    t = _unwrap(t)
    if isinstance(t, mi.UnionType):
        kinds = [_unwrap(k) for k in t.types if not isinstance(_unwrap(k), mi.NoneType)]
        if len(kinds) == 1:
            return _rule(kinds[0])
        if all(isinstance(k, mi.StructType) for k in kinds):
            return {"type": "object"}
        return {"anyOf": [_rule(k) for k in kinds]}
    if isinstance(t, mi.IntType | mi.FloatType):
        bounds = {"minimum": t.ge, "maximum": t.le, "exclusiveMinimum": t.gt, "exclusiveMaximum": t.lt}
        kind = "integer" if isinstance(t, mi.IntType) else "number"
        return {"type": kind, **{k: v for k, v in bounds.items() if v is not None}}
    if isinstance(t, mi.StrType):
        limits = {"minLength": t.min_length, "maxLength": t.max_length, "pattern": t.pattern}
        return {"type": "string", **{k: v for k, v in limits.items() if v is not None}}
    if isinstance(t, mi.ListType | mi.SetType | mi.FrozenSetType | mi.VarTupleType):
        limits = {"minItems": t.min_length, "maxItems": t.max_length}
        return {"type": "array", "items": _rule(t.item_type), **{k: v for k, v in limits.items() if v is not None}}
    if isinstance(t, mi.EnumType):
        return {"enum": [m.value for m in t.cls]}
    if isinstance(t, mi.LiteralType):
        return {"enum": list(t.values)}
    if isinstance(t, mi.DateTimeType):
        return {"type": "string", "format": "date-time", **({"x-with-zone": True} if t.tz else {})}
    if isinstance(t, mi.BoolType):
        return {"type": "boolean"}
    if isinstance(t, mi.NoneType):
        return {"type": "null"}
    if isinstance(t, mi.StructType | mi.DictType | mi.TypedDictType | mi.DataclassType):
        return {"type": "object"}
    return {}


# Plain words for a rule ----------------------------------------------------------------------------

_PATTERNS = {
    ID_PATTERN: "may contain only ASCII letters, digits and . _ : @ + / = | - (no spaces)",
    NOTE_ID_PATTERN: "must be a memory id: 8 letters or digits, like 'Ab3dE5gH'",
    CATEGORY_PATTERN: "must be a lower-case word of a-z, 0-9, _ and - that starts with a letter or digit, "
    "like 'person'",
    NOT_BLANK: "must not be blank",
    TOKEN_PATTERN: "must be a consistency token as a write returned it, like '0:1718000000000-0'",
}
_ALTERNATIVES = re.compile(r"^\^\((?P<choices>[\w|]+)\)\$$")
_TYPES: dict[str, type | tuple[type, ...]] = {
    "integer": int,
    "number": (int, float),
    "string": str,
    "boolean": bool,
    "array": list,
    "object": dict,
    "null": type(None),
}


def explain(name: str, rule: Rule, value: Any) -> str | None:
    """Why ``value`` breaks ``rule`` (a JSON Schema), in words that name ``name`` and say the whole
    rule ("limit must be a whole number from 1 to 20; you gave 1000"); None when it does not, as
    far as these words go."""
    gave = f"; you gave {shown(value)}"
    if "enum" in rule:
        choices = rule["enum"]
        if any(value == c and type(value) is type(c) for c in choices):
            return None
        return f"{name} must be one of {_choices(choices)}{gave}"
    if "anyOf" in rule:
        if any(explain(name, r, value) is None for r in rule["anyOf"]):
            return None
        return f"{name} must be {' or '.join(describe(r) for r in rule['anyOf'])}{gave}"
    kind = rule.get("type")
    if not isinstance(kind, str) or kind not in _TYPES:
        return None
    if not _is(kind, value):
        return f"{name} must be {describe(rule)}{gave}"
    if kind in ("integer", "number"):
        low, high = rule.get("minimum"), rule.get("maximum")
        above, below = rule.get("exclusiveMinimum"), rule.get("exclusiveMaximum")
        if (
            (low is not None and value < low)
            or (high is not None and value > high)
            or (above is not None and value <= above)
            or (below is not None and value >= below)
        ):
            return f"{name} must be {describe(rule)}{gave}"
    if kind == "string":
        return _explain_text(name, rule, value)
    if kind == "array":
        low, high = rule.get("minItems"), rule.get("maxItems")
        if (low is not None and len(value) < low) or (high is not None and len(value) > high):
            return f"{name} must have {_between(low, high, 'item')}; you gave {len(value):,}"
    return None


def _explain_text(name: str, rule: Rule, value: str) -> str | None:
    low, high, pattern = rule.get("minLength"), rule.get("maxLength"), rule.get("pattern")
    if not value and low:
        return f"{name} must not be {'blank' if pattern == NOT_BLANK else 'empty'}"
    if (low is not None and len(value) < low) or (high is not None and len(value) > high):
        return (
            f"{name} must be {_between(low if low and low > 1 else None, high, 'character')}; you gave {len(value):,}"
        )
    if pattern is not None and not re.search(pattern, value):
        return f"{name} {_pattern_words(pattern)}" + ("" if pattern == NOT_BLANK else f"; you gave {shown(value)}")
    if rule.get("format") == "date-time":
        try:
            at = datetime.fromisoformat(value)
        except ValueError:
            return f"{name} must be {describe(rule)}; you gave {shown(value)}"
        if rule.get("x-with-zone") and at.tzinfo is None:
            return f"{name} must be a time with its zone (an offset or Z), like {TIME_EXAMPLE}; you gave {shown(value)}"
    return None


def describe(rule: Rule) -> str:
    """What a value of ``rule`` is, as the words after "must be"."""
    if "enum" in rule:
        return f"one of {_choices(rule['enum'])}"
    if "anyOf" in rule:
        return " or ".join(describe(r) for r in rule["anyOf"])
    kind = rule.get("type")
    if kind in ("integer", "number"):
        return ("a whole number" if kind == "integer" else "a number") + _range(rule)
    if kind == "string":
        if rule.get("format") == "date-time":
            return f"a time in ISO 8601, like {TIME_EXAMPLE}"
        words = _pattern_words(rule["pattern"]) if "pattern" in rule else ""
        if words.startswith("must be "):
            return words.removeprefix("must be ")
        low, high = rule.get("minLength"), rule.get("maxLength")
        bounds = _between(low if low and low > 1 else None, high, "character")
        return f"text of {bounds}" if bounds else "text"
    if kind == "array":
        bounds = _between(rule.get("minItems"), rule.get("maxItems"), "item")
        return f"a list of {bounds}" if bounds else "a list"
    return {"boolean": "true or false", "object": "a JSON object", "null": "null"}.get(str(kind), "a value")


def shown(value: Any) -> str:
    """A value as the caller wrote it (JSON's words), short."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return repr(value if len(value) <= 60 else value[:57] + "...")
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a JSON object"
    return str(value)


def count(n: int, noun: str, plural: str | None = None) -> str:
    """``n`` and the noun agreeing with it: "1 note", "2 notes"; "1 memory", "2 memories" (given
    the plural)."""
    return f"{n:,} {noun}" if n == 1 else f"{n:,} {plural or noun + 's'}"


def _is(kind: str, value: Any) -> bool:
    if isinstance(value, bool):
        return kind == "boolean"
    return isinstance(value, _TYPES[kind])


def _range(rule: Rule) -> str:
    low, high = rule.get("minimum"), rule.get("maximum")
    above, below = rule.get("exclusiveMinimum"), rule.get("exclusiveMaximum")
    if low is not None and high is not None:
        return f" from {_number(low)} to {_number(high)}"
    parts = []
    if low is not None:
        parts.append(f"of at least {_number(low)}")
    if above is not None:
        parts.append(f"greater than {_number(above)}")
    if high is not None:
        parts.append(f"of at most {_number(high)}")
    if below is not None:
        parts.append(f"less than {_number(below)}")
    return " " + " and ".join(parts) if parts else ""


def _between(low: int | None, high: int | None, noun: str) -> str:
    if low is not None and high is not None:
        return f"{low:,} to {count(high, noun)}" if low != high else count(low, noun)
    if low is not None:
        return f"at least {count(low, noun)}"
    if high is not None:
        return f"at most {count(high, noun)}"
    return ""


def _number(x: float) -> str:
    return f"{int(x):,}" if float(x).is_integer() else f"{x:g}"


def _choices(values: Sequence[Any]) -> str:
    words = [str(v) for v in values]
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} or {words[-1]}"


def _pattern_words(pattern: str) -> str:
    if pattern in _PATTERNS:
        return _PATTERNS[pattern]
    found = _ALTERNATIVES.match(pattern)
    if found:
        return f"must be one of {_choices(found['choices'].split('|'))}"
    return f"must match the pattern {pattern}"


def path_name(steps: Sequence[str | int]) -> str:
    """A field's place as the caller wrote it: ``notes[0].content``."""
    out = ""
    for step in steps:
        out += f"[{step}]" if isinstance(step, int) else (f".{step}" if out else step)
    return out


def join(where: str, name: str) -> str:
    return f"{where}.{name}" if where else name
