"""The gates every proposal of a structured reply passes, in order, each with its verdict code.

1. `schema`: the proposal has its shape (a belief's `about` an id, its `text` a string, its
   `confidence` a number; a memory's `text` and `significance`; an intent's `name` and
   `args` object).
2. `authority`: it never adds, changes or removes a canonical fact or a world-state entry: a
   belief about a fact's id or a world-state key, or a text that poses as a fact or a
   world-state entry (a label claiming the status, "Fact: ...", "FACT (canonical): ...", a
   "[canonical]" tag, "canonical fact", "## Canonical facts"), is refused. The store refuses
   such a write anyway; the gate says why first.
3. `canonical_fact`: the fact guard finds no kept canonical fact the text denies.
4. `forbidden`: it reveals none of the phrases the author forbade the NPC (`forbidden_phrase`).
5. `intent` / `intent_args`: an intent is on the NPC's allow-list, its arguments exactly
   the allow-list's, each of its type, or one of its values where the allow-list lists them.
6. `bounds`: at most `max_beliefs` beliefs and `max_memories` memories a turn (the first
   ones that passed), a text of 1 to `MAX_PROPOSAL_CHARS` characters once cleaned, a letter
   or digit among them ("..." says nothing, as a line of it does).

A proposal refused is dropped alone, with its verdict; the first gate that refuses it
names the code. Texts are cleaned before they are judged (controls, escapes, bidi marks
removed, whitespace collapsed to one line: `sim.text`) and what passes is kept so; in a
later prompt it is rendered inert like every untrusted text. Confidence and significance
are clamped to [0, 1].

Pure: the fact guard is a parameter (`FactGuard`, sim.output.guard), as in judging a line.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from typing import Any, Literal, get_args

from sim.memory import Fact, WorkingMemory
from sim.output.guard import FactGuard
from sim.text import fold, without_controls
from sim.wire.attempt import Arg, ArgSpec, ArgType, OutputPolicy, ProposalVerdict, WorldValues
from sim.wire.events import NAME_RULE, is_name
from sim.wire.topics import ROLE_LOGINS

__all__ = [
    "CODES",
    "MAX_ARG_CHARS",
    "MAX_PROPOSAL_CHARS",
    "RESERVED_NAMES",
    "accepted",
    "allow_list_problem",
    "arg_schema",
    "world_values",
    "clean_text",
    "forbidden_phrase",
    "gate_proposals",
    "intent_schemas",
    "known_names",
    "rejected",
]

CODES = ("ok", "parse", "salvaged", "empty", "schema", "authority", "canonical_fact", "forbidden", "intent",
         "intent_args", "bounds")
"""Every verdict code, stable: "ok" and "salvaged" accept, the others refuse (docs/npc-output.md)."""

MAX_PROPOSAL_CHARS = 300
"""A belief's or a memory's text, at most (characters, once cleaned)."""

RESERVED_NAMES = ROLE_LOGINS | {"viewer"}
"""The run's own logins: no belief is about them."""

MAX_ARG_CHARS = 120
"""An intent's string argument, at most."""

_ARG_TYPES: tuple[ArgType, ...] = get_args(ArgType)

_CLAIM = r"(?:(?<!\bin )facts?|canonical|world[\s_-]*state)\b"
_FORGED = re.compile(
    # A label that claims the status before a colon: "Fact:", "FACT (canonical):", "Canonical facts (updated):".
    # Each word is followed (or preceded) by a separator, so a long word is never split: no backtracking blow-up.
    rf"^[\W_]*(?:\w+[\s()\[\]-]+){{0,3}}?{_CLAIM}(?:[\s()\[\]-]+\w+){{0,3}}?[\s)\]]*[:=\-]"
    r"|^[\W_]*[\[(]\s*(?:facts?|canonical|official)\b"  # "[canonical] ...", "(fact) ..."
    r"|#+\s*(?:canonical\s+facts?|world\s+state)\b"
    r"|\bcanonical\s+(?:facts?|truths?)\b"
)
_WORDS = re.compile(r"[^\w]+")
_POSSESSIVE = re.compile(r"(?<=\w)'s\b")
WINDOW_SLACK = 3
"""A forbidden phrase of several words is also found with its words in any order, up to this
many other words among them ("the key to the cellar" says "cellar key")."""
_MAX_ARGS = 16

Kind = Literal["belief", "memory", "intent"]


def clean_text(text: str) -> str:
    """A proposal's text as it is judged and kept: no controls, one line, spaces collapsed."""
    return " ".join(without_controls(text).split())


def _compact(text: str) -> str:
    return _WORDS.sub("", text).replace("_", "")


def _words(text: str) -> list[str]:
    """`text` folded (`sim.text.fold`) into words, possessives dropped ("the cellar's key": the cellar key)."""
    return _WORDS.sub(" ", _POSSESSIVE.sub("", fold(text))).split()


def _within_window(words: Sequence[str], wanted: Sequence[str]) -> bool:
    """Every word of `wanted` among `len(wanted) + WINDOW_SLACK` consecutive words, in any order."""
    size = len(wanted) + WINDOW_SLACK
    needed = set(wanted)
    return any(needed <= set(words[start:start + size]) for start in range(max(1, len(words) - size + 1)))


def forbidden_phrase(text: str, phrases: Sequence[str]) -> str | None:
    """The first forbidden phrase `text` contains, or None.

    Both are folded (`sim.text.fold`: case, accents, look-alike letters, digits for letters,
    invisible marks) and read as words, possessives dropped; a phrase of several words is
    also found with its words in any order within a short window (`WINDOW_SLACK`), and one
    of six letters or more with the spaces and punctuation between its letters taken out
    ("s.w.o.r.d-fish" says "swordfish").
    """
    said = _words(text)
    words = f" {' '.join(said)} "
    compact = _compact(fold(_compact(text)))  # squeezed first: a digit alone between dots is a letter too
    for phrase in phrases:
        wanted = _words(phrase)
        if not wanted:
            continue
        folded = " ".join(wanted)
        squeezed = folded.replace(" ", "")
        if (f" {folded} " in words or (len(squeezed) >= 6 and squeezed in compact)
                or (len(wanted) > 1 and _within_window(said, wanted))):
            return phrase
    return None


def accepted(kind: str, text: str, **fields: Any) -> ProposalVerdict:
    return ProposalVerdict(kind=kind, text=text, verdict="accepted", code="ok", **fields)


def rejected(kind: str, text: str, code: str, detail: str, **fields: Any) -> ProposalVerdict:
    return ProposalVerdict(kind=kind, text=text, verdict="rejected", code=code, detail=detail, **fields)


def _scalar(value: Any) -> bool:
    return isinstance(value, str | bool) or (isinstance(value, int | float) and _weight(value) is not None)


def _weight(value: Any) -> float | None:
    """A number clamped to [0, 1]; None for what is not a finite number."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return min(1.0, max(0.0, number)) if math.isfinite(number) else None


def _shaped(kind: Kind, item: Any) -> ProposalVerdict:
    """The proposal read with its shape (an accepted verdict, to be judged further), or `schema`."""
    if kind == "intent":
        args = item.get("args", {}) if isinstance(item, dict) else None
        if not isinstance(item, dict) or not isinstance(item.get("name"), str) or set(item) - {"name", "args"} or not (
                isinstance(args, dict) and len(args) <= _MAX_ARGS and all(_scalar(v) for v in args.values())):
            return rejected(kind, clean_text(str(item))[:MAX_PROPOSAL_CHARS], "schema",
                            f"an intent is {{\"name\": \"...\", \"args\": {{...}}}}, at most {_MAX_ARGS} "
                            "arguments, each a string, a number or a boolean")
        return accepted(kind, clean_text(item["name"])[:MAX_PROPOSAL_CHARS],
                        args={clean_text(str(k))[:MAX_ARG_CHARS]: v[:MAX_PROPOSAL_CHARS] if isinstance(v, str) else v
                              for k, v in args.items()})
    weight_key = "confidence" if kind == "belief" else "significance"
    keys = {"about", "text", weight_key} if kind == "belief" else {"text", weight_key}
    if not isinstance(item, dict) or set(item) != keys or not isinstance(item.get("text"), str):
        return rejected(kind, clean_text(str(item))[:MAX_PROPOSAL_CHARS], "schema",
                        f"a {kind} has exactly {', '.join(sorted(keys))}")
    text = clean_text(item["text"])
    weight = _weight(item[weight_key])
    if weight is None:
        return rejected(kind, text, "schema", f"{weight_key} is not a number")
    if kind == "belief":
        about = item["about"]
        if not isinstance(about, str) or not is_name(about):
            return rejected(kind, text, "schema", f"about is not an id ({NAME_RULE})")
        return accepted(kind, text, about=about, weight=weight)
    return accepted(kind, text, weight=weight)


def known_names(memory: WorkingMemory) -> frozenset[str]:
    """Whom the NPC of `memory` may hold a belief about: itself, who is talking to it (the
    speaker of its input, `name: words`) and whoever speaks in its kept dialogue; never an
    internal role's login."""
    speaker, colon, _ = memory.player_input.partition(":")
    names = {memory.agent_id, *(line.speaker for line in memory.dialogue)}
    if colon and is_name(speaker):
        names.add(speaker)
    return frozenset(names - RESERVED_NAMES)


def _authority(p: ProposalVerdict, guarded: Collection[str], known: Collection[str]) -> str | None:
    if p.about and p.about in guarded:
        return f"about {p.about!r}: a canonical fact or world-state entry, which only the scenario and the game write"
    if p.about and p.about not in known:
        return (f"about {p.about[:40]!r}: not the NPC itself, who is talking to it nor anyone in its dialogue"
                if p.about not in RESERVED_NAMES else f"about {p.about!r}: a name the run reserves")
    if p.kind != "intent" and _FORGED.search(fold(p.text)):
        return "poses as a canonical fact or world-state entry, which only the scenario and the game write"
    return None


def _intent(p: ProposalVerdict, policy: OutputPolicy, world: Mapping[str, str]) -> tuple[str, str] | None:
    schema = policy.intents.get(p.text)
    if schema is None:
        allowed = ", ".join(sorted(policy.intents)) or "none"
        return "intent", f"{p.text[:80]!r} is not on the allow-list ({allowed})"
    if set(p.args) != set(schema):
        return "intent_args", f"arguments {sorted(p.args)[:8]}, expected {sorted(schema)}"
    for name, spec in schema.items():
        problem = _arg_problem(p.args[name], spec, world)
        if problem:
            return "intent_args", f"argument {name!r}: {problem}"
    return None


def world_values(value: str) -> tuple[str, ...]:
    """The values a world-state entry lists: its comma-separated parts, each cleaned as a
    string argument is (`clean_text`), the empty ones left out."""
    return tuple(part for part in map(clean_text, value.split(",")) if part)


def _arg_problem(value: Arg, kind: ArgSpec, world: Mapping[str, str]) -> str:
    if isinstance(kind, WorldValues):
        values = world_values(world.get(kind.world, ""))
        if isinstance(value, str) and clean_text(value) in values:
            return ""
        listed = _listed(values) if values else "none now"
        return f"{str(value)[:40]!r} is not one of world state {kind.world!r}'s values ({listed})"
    if isinstance(kind, tuple):
        if isinstance(value, str) and clean_text(value) in kind:
            return ""
        return f"{str(value)[:40]!r} is not one of its values ({_listed(kind)})"
    if kind == "string":
        if not isinstance(value, str):
            return "not a string"
        return "" if 0 < len(clean_text(value)) <= MAX_ARG_CHARS else f"1 to {MAX_ARG_CHARS} characters"
    if kind == "boolean":
        return "" if isinstance(value, bool) else "not a boolean"
    if isinstance(value, bool) or not isinstance(value, int | float):
        return f"not {'an integer' if kind == 'integer' else 'a number'}"
    if kind == "integer" and not isinstance(value, int):
        return "not an integer"
    return "" if math.isfinite(value) and abs(value) < 2**53 else "out of range"


def arg_schema(spec: ArgSpec) -> dict[str, Any]:
    """The JSON Schema of the values an argument passes the gate with, as the intent topic
    carries them: one of its values, else a value of its type (`_arg_problem`'s bounds)."""
    if isinstance(spec, WorldValues):
        return {"type": "string", "minLength": 1, "maxLength": MAX_ARG_CHARS,
                "description": f"one of the values the NPC's world-state entry `{spec.world}` lists (comma-separated)"
                               " when it proposes: a list the game keeps current"}
    if isinstance(spec, tuple):
        return {"type": "string", "enum": list(spec)}
    if spec == "string":
        return {"type": "string", "minLength": 1, "maxLength": MAX_ARG_CHARS}
    if spec == "boolean":
        return {"type": "boolean"}
    return {"type": spec, "minimum": 1 - 2**53, "maximum": 2**53 - 1}


def intent_schemas(policies: Mapping[str, OutputPolicy | None]) -> list[dict[str, Any]]:
    """What the NPCs of `policies` (id -> policy) may publish on their intent topics, as JSON
    Schema alternatives of its payload: one for each intent with its arguments, naming the
    NPCs that may propose it (`agent`) and each argument's type or values (`arg_schema`)."""
    agents: dict[tuple[str, tuple[tuple[str, ArgSpec], ...]], list[str]] = {}
    for agent, policy in policies.items():
        for name, args in (policy.intents if policy is not None else {}).items():
            agents.setdefault((name, tuple(args.items())), []).append(agent)
    return [{"properties": {
        "agent": {"enum": ids},
        "name": {"const": name},
        "args": {"type": "object", "properties": {arg: arg_schema(spec) for arg, spec in args},
                 "required": [arg for arg, _ in args], "additionalProperties": False},
    }} for (name, args), ids in agents.items()]


def _listed(values: Sequence[str], most: int = 8) -> str:
    shown = ", ".join(repr(v[:40]) for v in values[:most])
    return shown + (f" and {len(values) - most} more" if len(values) > most else "")


def allow_list_problem(intents: object) -> str | None:
    """Why an NPC's `intents` as its scenario writes them (TOML read to Python) hold an
    argument no value passes the gate with, as `intents.NAME.ARG: why`; None when each is a
    type or a list of the values it may be: some, none twice, each kept as the
    gate keeps a string (one line, spaces collapsed, 1 to MAX_ARG_CHARS characters). What is
    not a table is left to the scenario's types."""
    tables = intents.items() if isinstance(intents, dict) else ()
    for intent, args in tables:
        for arg, spec in args.items() if isinstance(args, dict) else ():
            if (problem := _spec_problem(spec)) is not None:
                return f"intents.{intent}.{arg}: {problem}"
    return None


def _spec_problem(spec: object) -> str | None:
    either = (f"an argument is a type ({', '.join(_ARG_TYPES)}), a list of the values it may be, or "
              "{ world = KEY }: the values the NPC's world-state entry KEY lists")
    if isinstance(spec, str):
        return None if spec in _ARG_TYPES else f"unknown type {spec[:40]!r}: {either}"
    if isinstance(spec, dict):
        key = spec.get("world")
        if set(spec) != {"world"} or not (isinstance(key, str) and is_name(key)):
            return f"{repr(spec)[:60]}: {either}"
        return None
    if not isinstance(spec, list):
        return f"{repr(spec)[:40]}: {either}"
    if not spec:
        return "an empty list of values: none would pass"
    odd = next((v for v in spec if not (isinstance(v, str) and 0 < len(v) <= MAX_ARG_CHARS and clean_text(v) == v)),
               None)
    if odd is not None:
        return (f"value {repr(odd)[:40]}: each value is a string of 1 to {MAX_ARG_CHARS} characters on one line, "
                "no space at either end nor two together")
    twice = [value for value, n in Counter(spec).items() if n > 1]
    return f"value {twice[0][:40]!r} is listed twice" if twice else None


def _said(p: ProposalVerdict) -> str:
    """What the proposal would reveal: its subject, its text, an intent's string arguments."""
    return " ".join([p.about, p.text, *(v for v in p.args.values() if isinstance(v, str))])


def _judge(p: ProposalVerdict, facts: Sequence[Fact], guarded: Collection[str], known: Collection[str],
           policy: OutputPolicy, guard: FactGuard, counts: dict[str, int], world: Mapping[str, str]) -> ProposalVerdict:
    """Gates 2 to 6 on a proposal of its shape: the first that refuses it, or accepted."""
    why = _authority(p, guarded, known)
    if why is not None:
        return _refuse(p, "authority", why)
    if p.kind != "intent" and (fact := guard(p.text, facts)) is not None:
        return _refuse(p, "canonical_fact", f"denies canonical fact {fact.id!r}")
    if (phrase := forbidden_phrase(_said(p), policy.forbidden)) is not None:
        return _refuse(p, "forbidden", f"reveals forbidden phrase #{policy.forbidden.index(phrase) + 1}")
    if p.kind == "intent" and (problem := _intent(p, policy, world)) is not None:
        return _refuse(p, *problem)
    limit = {"belief": policy.max_beliefs, "memory": policy.max_memories, "intent": 1}[p.kind]
    if counts[p.kind] >= limit:
        return _refuse(p, "bounds", f"over {limit} {p.kind} proposals a turn")
    if p.kind != "intent" and not (0 < len(p.text) <= MAX_PROPOSAL_CHARS and any(c.isalnum() for c in p.text)):
        return _refuse(p, "bounds", f"a text of {len(p.text)} characters (1 to {MAX_PROPOSAL_CHARS}, "
                                    "a letter or digit among them)")
    counts[p.kind] += 1
    if p.kind == "intent":  # arguments kept cleaned, as every text that passes
        return accepted(p.kind, p.text, args={k: clean_text(v) if isinstance(v, str) else v
                                              for k, v in p.args.items()})
    return p


def _refuse(p: ProposalVerdict, code: str, detail: str) -> ProposalVerdict:
    return rejected(p.kind, p.text, code, detail, about=p.about, weight=p.weight, args=p.args)


def gate_proposals(
    beliefs: Sequence[Any],
    memories: Sequence[Any],
    intent: Any,
    *,
    facts: Sequence[Fact],
    guarded: Collection[str],
    known: Collection[str],
    policy: OutputPolicy,
    guard: FactGuard,
    world: Mapping[str, str] | None = None,
) -> tuple[ProposalVerdict, ...]:
    """Every proposal's verdict, in the reply's order (beliefs, memories, the intent).

    `facts` are the canonical facts the working memory kept (the fact guard's), `guarded`
    the ids no proposal may be about: every canonical fact's and world-state key of the NPC;
    `known` the ids a belief may be about (`known_names`); `world` the NPC's world state as
    its working memory holds it (key -> value), whose lists an intent's argument may be
    limited to (`WorldValues`).
    """
    counts = {"belief": 0, "memory": 0, "intent": 0}
    items: list[tuple[Kind, Any]] = [("belief", b) for b in beliefs] + [("memory", m) for m in memories]
    if intent is not None:
        items.append(("intent", intent))
    verdicts = []
    for kind, item in items:
        shaped = _shaped(kind, item)
        verdicts.append(shaped if shaped.verdict == "rejected"
                        else _judge(shaped, facts, guarded, known, policy, guard, counts, world or {}))
    return tuple(verdicts)
