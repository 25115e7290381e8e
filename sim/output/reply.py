"""The structured reply's shape, its JSON Schema, and how a raw reply is read as one.

A structured reply is one JSON object (docs/npc-output.md):

    {"say": "...", "beliefs": [{"about": "<id>", "text": "...", "confidence": 0.0-1.0}],
     "remember": [{"text": "...", "significance": 0.0-1.0}], "intent": {"name": "...", "args": {...}} | null}

`REPLY_SCHEMA` is what a backend hands the model server to constrain it. `read_reply`
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
from typing import Any

import msgspec

__all__ = ["REPLY_SCHEMA", "SCHEMA_RULE", "RawReply", "read_reply", "say_part"]

REPLY_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "say": {"type": "string"},
        "beliefs": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "about": {"type": "string"},
                    "text": {"type": "string"},
                    "confidence": {"type": "number", "minimum": 0, "maximum": 1},
                },
                "required": ["about", "text", "confidence"],
                "additionalProperties": False,
            },
        },
        "remember": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "text": {"type": "string"},
                    "significance": {"type": "number", "minimum": 0, "maximum": 1},
                },
                "required": ["text", "significance"],
                "additionalProperties": False,
            },
        },
        "intent": {
            "anyOf": [
                {
                    "type": "object",
                    "properties": {"name": {"type": "string"}, "args": {"type": "object"}},
                    "required": ["name", "args"],
                    "additionalProperties": False,
                },
                {"type": "null"},
            ]
        },
    },
    "required": ["say", "beliefs", "remember", "intent"],
    "additionalProperties": False,
}
"""The reply's JSON Schema: `response_format` on a chat endpoint, `json_schema` on llama-server's
completions, a grammar in llama-cpp-python."""

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
