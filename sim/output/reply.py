"""The structured reply's shape, its JSON Schema, and how a raw reply is read as one.

A structured reply is one JSON object (docs/npc-output.md):

    {"say": "...", "beliefs": [{"about": "<id>", "text": "...", "confidence": 0.0-1.0}],
     "remember": [{"text": "...", "significance": 0.0-1.0}], "intent": {"name": "...", "args": {...}} | null}

`reply_schema` is what a backend hands the model server to constrain it, every string and
list of it bounded, and `reply_tokens` the most a reply of it takes. `read_reply`
reads the object loosely: the reply as a whole must be an object with a string `say`
(else it is not a reply at all), while each proposal is kept as it came, so that a
malformed one is dropped alone by the schema gate (sim.output.gates) instead of costing
the whole reply. `say_part` is the repair of last resort: the `say` string of a reply
that is not valid JSON, when one can be found.

Pure: no I/O.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

import msgspec

from sim.output.gates import MAX_PROPOSAL_CHARS, arg_schema
from sim.wire.attempt import OutputPolicy
from sim.wire.events import MAX_NAME_CHARS

__all__ = ["SCHEMA_RULE", "WEIGHTS", "RawReply", "longest_reply", "read_reply", "reply_schema", "reply_tokens",
           "say_part"]

WEIGHTS = tuple(n / 10 for n in range(11))
"""The confidences and significances a reply may give: tenths, so that a number ends (a grammar
bounds no number's digits) and the longest reply is known."""
_DOUBLE = -2.2250738585072014e-308
"""A number of the longest text a double prints as (24 characters): a number argument's longest."""


def _text(most: int) -> dict[str, Any]:
    return {"type": "string", "minLength": 1, "maxLength": most}


def _items(item: dict[str, Any], most: int) -> dict[str, Any]:
    return {"type": "array", "items": item, "maxItems": most}


def _object(properties: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": list(properties), "additionalProperties": False}


def reply_schema(policy: OutputPolicy, max_line_chars: int) -> dict[str, Any]:
    """The reply's JSON Schema for an NPC of `policy` (`response_format` on a chat endpoint,
    `json_schema` on llama-server's completions, a grammar in llama-cpp-python): every string
    and every list bounded by what the gates keep, so that a model that repeats itself inside
    a string is ended by the grammar, and the longest reply is known (`longest_reply`). `say`
    comes first, the intent is one of the allow-list's (or null)."""
    weight = {"type": "number", "enum": list(WEIGHTS)}
    intents = [_object({"name": {"const": name}, "args": _object({a: arg_schema(spec) for a, spec in args.items()})})
               for name, args in policy.intents.items()]
    return _object({
        "say": _text(max_line_chars),
        "beliefs": _items(_object({"about": _text(MAX_NAME_CHARS), "text": _text(MAX_PROPOSAL_CHARS),
                                   "confidence": weight}), policy.max_beliefs),
        "remember": _items(_object({"text": _text(MAX_PROPOSAL_CHARS), "significance": weight}),
                           policy.max_memories),
        "intent": {"anyOf": [*intents, {"type": "null"}]},
    })


def _longest(schema: Mapping[str, Any]) -> Any:
    """The value of `schema` whose JSON is the longest; a ValueError when it is unbounded."""
    if "const" in schema:
        return schema["const"]
    if "enum" in schema or "anyOf" in schema:
        values = schema["enum"] if "enum" in schema else [_longest(s) for s in schema["anyOf"]]
        return max(values, key=lambda v: len(json.dumps(v)))
    kind = schema.get("type")
    if kind == "object":
        return {key: _longest(value) for key, value in schema.get("properties", {}).items()}
    if kind == "array" and "maxItems" in schema:
        return [_longest(schema["items"])] * schema["maxItems"]
    if kind == "string" and "maxLength" in schema:
        return "x" * schema["maxLength"]
    if kind == "integer" and "minimum" in schema and "maximum" in schema:
        return max(schema["minimum"], schema["maximum"], key=lambda n: len(str(n)))
    if kind == "number":
        return _DOUBLE
    if kind in ("boolean", "null"):
        return False if kind == "boolean" else None
    raise ValueError(f"unbounded: {json.dumps(schema)[:80]}")


def longest_reply(schema: Mapping[str, Any]) -> str:
    """The longest reply `schema` lets a model write, as JSON (", " and ": " between its parts)."""
    return json.dumps(_longest(schema))


def reply_tokens(schema: Mapping[str, Any]) -> int:
    """The most tokens a reply of `schema` takes, counted as its longest reply's characters: a
    token of text is at least one character."""
    return len(longest_reply(schema))


SCHEMA_RULE = (
    'Answer with one JSON object only, "say" being your spoken line: {"say": "...", "beliefs": [{"about": "<id>", '
    '"text": "...", "confidence": 0.5}], "remember": [{"text": "...", "significance": 0.5}], "intent": null}'
)
"""The retry's rule after a reply that is not of the shape: the schema, told to the model. Its
placeholders say nothing when a model copies them: a `say` or a text of "..." is empty, an
`about` of "<id>" is no id."""


class RawReply(msgspec.Struct, frozen=True, kw_only=True):
    """A reply read as an object: `say`, and each proposal as it came (judged one by one)."""

    say: str
    beliefs: tuple[Any, ...] = ()
    remember: tuple[Any, ...] = ()
    intent: Any = None


_FENCE = re.compile(r"^\s*```[a-zA-Z]*\s*\n?(.*?)\n?\s*```\s*$", re.DOTALL)
# The say string: its key, then a JSON string (escapes included), closed or cut off.
_SAY = re.compile(r'"say"\s*:\s*"((?:[^"\\]|\\.)*)"')


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _body(raw: str) -> str:
    """The reply without a Markdown code fence around it (models add them)."""
    fenced = _FENCE.match(raw)
    return fenced.group(1) if fenced else raw.strip()


def read_reply(raw: str) -> RawReply | str:
    """The reply read as an object, or why it is not one (a one-line reason)."""
    try:
        value = json.loads(_body(raw), parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        return f"not JSON ({exc.msg} at character {exc.pos})"
    except (ValueError, RecursionError):  # NaN, an integer of thousands of digits, nesting past the stack
        return "not JSON that can be read (NaN or Infinity, a number too long, or nested too deep)"
    if not isinstance(value, dict):
        return f"not a JSON object but {type(value).__name__}"
    say = value.get("say")
    if not isinstance(say, str):
        return "no string `say`"
    beliefs, remember = value.get("beliefs", []), value.get("remember", [])
    if not isinstance(beliefs, list) or not isinstance(remember, list):
        return "`beliefs` and `remember` must be lists"
    return RawReply(say=say, beliefs=tuple(beliefs), remember=tuple(remember), intent=value.get("intent"))


def say_part(raw: str) -> str | None:
    """The `say` string of a reply that is not a valid object, when one can be found."""
    found = _SAY.search(raw)
    if found is None:
        return None
    try:
        said = json.loads(f'"{found.group(1)}"')
    except json.JSONDecodeError:
        return None
    return said if isinstance(said, str) else None
