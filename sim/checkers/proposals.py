"""An independent check of the gates' verdicts (docs/npc-output.md): no accepted part breaks a rule.

It trusts no verdict: every part a gate accepted is read again, with rules written here
apart from the gates (sim.output.gates), and each rule it breaks is a `Violation` named
by the gate that should have refused it:

- `authority`: a belief about a canonical fact's id or a world-state key, or about someone
  who is neither the NPC, the one talking to it nor a speaker of its kept dialogue (or is
  one of the run's own logins), or a text that begins "Fact:", "Canonical fact:", "World
  state:" (and kin) or holds a "## Canonical facts" header;
- `canonical_fact`: a line, belief or memory that the fact guard finds denying a kept fact;
- `forbidden`: a part that says a phrase of the NPC's `forbidden` list (on whole words, or
  with the separators between its letters taken out for a phrase of six letters or more);
- `intent` / `intent_args`: an intent off the allow-list, or arguments not exactly the
  allow-list's, each of its type (or, where it lists an argument's values, one of them);
- `bounds`: more accepted beliefs, memories or intents in one attempt than the policy
  allows, or a text empty or over `MAX_PROPOSAL_CHARS`.

`npcsim loadtest --output structured` runs it on every attempt; tests use it as the oracle.
Pure: the fact guard is a parameter.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence

from sim.audit import Attempt
from sim.checkers.violation import Violation
from sim.memory import WorkingMemory
from sim.output import (
    MAX_ARG_CHARS,
    MAX_PROPOSAL_CHARS,
    ArgSpec,
    FactGuard,
    OutputPolicy,
    ProposalVerdict,
    WorldValues,
)
from sim.text import fold

__all__ = ["check_proposals"]

_POSING_WORDS = {"new", "canonical", "official", "true", "real", "added"}
_LOGINS = {"shard", "worker", "game", "viewer"}
_HEADER = re.compile(r"#+\s*(?:canonical\s+facts?|world\s+state)\b")
_TYPES: dict[str, Callable[[object], bool]] = {
    "string": lambda v: isinstance(v, str) and 0 < len(" ".join(v.split())) <= MAX_ARG_CHARS,
    "boolean": lambda v: isinstance(v, bool),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool) and abs(v) < 2**53,
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
    and abs(v) < 2**53,
}


def _allowed(value: object, spec: ArgSpec, memory: WorkingMemory) -> bool:
    """Whether an accepted argument is as the allow-list gives it: one of its values where it
    lists them, or where the NPC's world-state entry it names lists them (comma-separated)."""
    if isinstance(spec, WorldValues):
        listed = next((w.value for w in memory.world_state if w.key == spec.world), "")
        return value in {" ".join(part.split()) for part in listed.split(",")} - {""}
    return value in spec if isinstance(spec, tuple) else _TYPES[spec](value)


def _poses_as_fact(text: str) -> bool:
    folded = fold(text)
    if _HEADER.search(folded):
        return True
    head, colon, _ = re.sub(r"^[\W_]+", "", folded).partition(":")
    if not colon:
        return False
    words = head.replace("_", " ").replace("-", " ").split()
    if words[-2:] == ["world", "state"] or words[-1:] == ["worldstate"]:
        words = words[:-2] if words[-1] == "state" else words[:-1]
    elif words and words[-1] in ("fact", "facts"):
        words = words[:-1]
    else:
        return False
    return all(w in _POSING_WORDS for w in words)


def _says(text: str, phrase: str) -> bool:
    spoken = [w for w in re.split(r"\W+", fold(text).replace("_", " ")) if w]
    wanted = [w for w in re.split(r"\W+", fold(phrase).replace("_", " ")) if w]
    if not wanted:
        return False
    n = len(wanted)
    if any(spoken[i:i + n] == wanted for i in range(len(spoken) - n + 1)):
        return True
    joined = "".join(wanted)
    return len(joined) >= 6 and joined in "".join(spoken)


def _may_be_about(name: str, memory: WorkingMemory) -> bool:
    """Whether a belief may name `name`: the NPC, the input's speaker, a speaker of its dialogue."""
    if name in _LOGINS:
        return False
    speaker = memory.player_input.split(":", 1)[0] if ":" in memory.player_input else None
    return name in (memory.agent_id, speaker) or any(line.speaker == name for line in memory.dialogue)


def _part_problems(part: ProposalVerdict, memory: WorkingMemory, policy: OutputPolicy,
                   guard: FactGuard) -> list[Violation]:
    found: list[Violation] = []
    what = f"accepted {part.kind} {part.text[:60]!r}"
    guarded = {f.id for f in memory.canonical_facts} | {w.key for w in memory.world_state}
    if part.kind in ("belief", "memory"):
        if part.about in guarded or _poses_as_fact(part.text):
            found.append(Violation("authority", f"{what} poses as or is about a fact or world-state entry"))
        if part.kind == "belief" and not _may_be_about(part.about, memory):
            found.append(Violation("authority", f"{what} is about {part.about[:40]!r}, whom the NPC does not know"))
        if not 0 < len(part.text) <= MAX_PROPOSAL_CHARS:
            found.append(Violation("bounds", f"{what}: a text of {len(part.text)} characters"))
    if part.kind != "intent" and (fact := guard(part.text, memory.canonical_facts)) is not None:
        found.append(Violation("canonical_fact", f"{what} denies canonical fact {fact.id!r}"))
    said = " ".join([part.about, part.text, *(v for v in part.args.values() if isinstance(v, str))])
    for n, phrase in enumerate(policy.forbidden, 1):
        if _says(said, phrase):
            found.append(Violation("forbidden", f"{what} says forbidden phrase #{n}"))
    if part.kind == "intent":
        allowed = policy.intents.get(part.text)
        if allowed is None:
            found.append(Violation("intent", f"{what}: not on the allow-list"))
        elif set(part.args) != set(allowed) or not all(_allowed(part.args[k], t, memory) for k, t in allowed.items()):
            found.append(Violation("intent_args", f"{what}: arguments {sorted(part.args)} not as allowed"))
    return found


def check_proposals(attempts: Sequence[Attempt], memory: WorkingMemory, policy: OutputPolicy,
                    guard: FactGuard) -> list[Violation]:
    """Every rule an accepted part of `attempts` breaks; `memory` holds the kept facts the guard reads."""
    found: list[Violation] = []
    for attempt in attempts:
        taken = [p for p in attempt.proposals if p.verdict == "accepted"]
        for part in taken:
            found += _part_problems(part, memory, policy, guard)
        for kind, limit in (("belief", policy.max_beliefs), ("memory", policy.max_memories), ("intent", 1)):
            count = sum(p.kind == kind for p in taken)
            if count > limit:
                found.append(Violation("bounds", f"{count} accepted {kind} proposals in one attempt (at most {limit})"))
    return found
