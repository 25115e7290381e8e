"""The busy-place secret, run for real: a player tells an NPC secrets and asks about them much later.

One place, 12 generated NPCs (`sim.generate`) who all chatter at one `ambient_chance`, and a
scripted player standing there who tells n0 one secret per age and asks about it `age` ticks
later. Before any question, once the older secrets are long out of every hot window, the
player asks n0 something unrelated (the price of bread): no secret belongs in that prompt.
A secret is recalled when the prompt n0 answers the question with holds its marker, words
said only when it was told (the question names the object, not the place). The run is
`npcsim run` in a fresh process with the scripted backend, and the prompts are read from its
audit store: the exact text of each answer's first attempt.

Shared by benchmarks/bench_recall.py (`--live`) and tests/test_recall_live.py: one definition
of the world, the script, the selections and what counts as recalled.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from sim.generate import generate_scenario
from sim.store import open_reader

__all__ = [
    "BREAD",
    "NPCS",
    "PLAYER",
    "SECRETS",
    "SELECTIONS",
    "Outcome",
    "Plan",
    "Secret",
    "Told",
    "plan",
    "read_outcome",
    "run",
    "scenario_toml",
]

NPCS = 12
PLAYER = "player"
BREAD = "What is the price of bread today?"
_CLI = "import sys; from sim.cli import main; sys.exit(main(sys.argv[1:]))"
_RECALL_KEY = "memory.scored.recall"


@dataclass(frozen=True)
class Secret:
    """What the player says, what it asks later, and the words only the telling holds."""

    told: str
    question: str
    marker: str


def _secret(verb: str, thing: str, place: str, marker: str) -> Secret:
    return Secret(f"Keep this secret: I {verb} the {thing} {place}.", f"Where did I say I {verb} the {thing}?", marker)


# Content words distinct from secret to secret, none of bread, price or today, none in the NPCs' trades or lines.
SECRETS = (
    _secret("buried", "silver relic", "under the crooked yew behind the tannery", "crooked yew"),
    _secret("hid", "copper key", "inside the hollow bell of the chapel", "hollow bell"),
    _secret("sank", "jade idol", "beneath the black pond near the quarry", "black pond"),
    _secret("stashed", "sealed letters", "behind the loose brick in the granary wall", "loose brick"),
    _secret("left", "ruby ring", "in the blue jar on the widow's shelf", "blue jar"),
    _secret("tucked", "treasure map", "inside the torn saddle at the stables", "torn saddle"),
    _secret("dropped", "ivory dice", "down the dry well at the crossroads", "dry well"),
    _secret("wrapped", "golden compass", "under the ferry dock in oilcloth", "ferry dock"),
)

SELECTIONS: dict[str, tuple[str, ...]] = {
    "recency": (),
    "scored": ("memory.selection=scored",),
    "scored+recall": ("memory.selection=scored", f"{_RECALL_KEY}=8"),
}
"""Each selection's `--set` settings; "scored" is the hot window only (recall 0, the default)."""


@dataclass(frozen=True)
class Told:
    """One secret of the script: its age, and the ticks it is told and asked at."""

    secret: Secret
    age: int
    told_at: int
    asked_at: int


@dataclass(frozen=True)
class Plan:
    """The player's script to one NPC: the secrets, and the unrelated question asked before theirs."""

    npc: str
    told: tuple[Told, ...]
    bread_at: int
    gap: int

    @property
    def ticks(self) -> int:
        """Ticks to run: the last question is answered the tick after it is asked."""
        return max(t.asked_at for t in self.told) + 3

    @property
    def ages(self) -> list[int]:
        """The secrets' ages, youngest first."""
        return sorted(t.age for t in self.told)

    @property
    def old(self) -> tuple[Told, ...]:
        """The secrets told at least `gap` ticks before the bread question: those it must not bring back."""
        return tuple(t for t in self.told if t.told_at <= self.bread_at - self.gap)


def plan(ages: Sequence[int], *, npc: str = "n0", start: int = 5, gap: int = 61) -> Plan:
    """Secrets told to `npc`, the oldest at `start`; the bread question, then one question every `gap` ticks.

    Oldest first, so each secret younger than `gap` is told after the bread question and
    every other one long before it. A ValueError for ages that put two lines on one tick (an
    age a multiple of `gap` may: an odd gap keeps round ages apart)."""
    if not ages or min(ages) < 1 or len(set(ages)) != len(ages) or len(ages) > len(SECRETS):
        raise ValueError(f"1 to {len(SECRETS)} distinct ages of at least 1 tick, got {list(ages)}")
    ordered = sorted(ages, reverse=True)
    bread_at = max(start + ordered[0] - gap, start)
    told = tuple(Told(secret, age, bread_at + gap * k - age, bread_at + gap * k)
                 for k, (secret, age) in enumerate(zip(SECRETS, ordered, strict=False), start=1))
    ticks = [bread_at, *(t.told_at for t in told), *(t.asked_at for t in told)]
    if len(set(ticks)) != len(ticks):
        raise ValueError(f"ages {list(ages)} put two of the player's lines on one tick; choose others")
    return Plan(npc, told, bread_at, gap)


def scenario_toml(script: Plan, ambient_chance: float, seed: int = 0) -> str:
    """The generated 12-NPC world on one place, everyone at `ambient_chance`, the player standing there."""
    world = generate_scenario(npcs=NPCS, locations=1, seed=seed, ambient_chance=ambient_chance)
    lines = sorted([(script.bread_at, BREAD), *((t.told_at, t.secret.told) for t in script.told),
                    *((t.asked_at, t.secret.question) for t in script.told)])
    said = ",\n".join(f"  {{ tick = {tick}, to = {json.dumps(script.npc)}, text = {json.dumps(text)} }}"
                      for tick, text in lines)
    return f'{world}\n[[players]]\nid = "{PLAYER}"\nlocation = "l0"\nscript = [\n{said},\n]\n'


def run(scenario: Path, db: Path, ticks: int, selection: str, *, broker: str = "auto") -> float | None:
    """`npcsim run` of the scenario under a selection, as fast as it goes: its wall time in seconds,
    or None when npcsim has no recall setting (it refuses the key). Any other failure raises."""
    settings = [arg for setting in SELECTIONS[selection] for arg in ("--set", setting)]
    args = ["run", str(scenario), "--db", str(db), "--ticks", str(ticks), "--tick-ms", "0", "--broker", broker,
            "--backend", "scripted", "--quiet", *settings]
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", _CLI, *args], capture_output=True, text=True, check=False)
    wall = time.perf_counter() - start
    if done.returncode != 0 and f"--set {_RECALL_KEY}: no setting 'recall'" in done.stderr:
        return None
    if done.returncode != 0:
        raise RuntimeError(f"npcsim {' '.join(args)}: exit {done.returncode}: {done.stderr.strip()}")
    return wall


@dataclass(frozen=True)
class Outcome:
    """What one run's prompts held: each age's secret recalled or not, and the old secrets the
    bread question brought back (their ages)."""

    recalled: dict[int, bool]
    leaked: tuple[int, ...]


def read_outcome(db: Path, script: Plan) -> Outcome:
    """The prompts `script.npc` answered the player's questions with, read from the run's audit."""
    recalled = {t.age: t.secret.marker in _answer(db, script.npc, t.asked_at, t.secret.question).casefold()
                for t in script.told}
    bread = _answer(db, script.npc, script.bread_at, BREAD).casefold()
    return Outcome(recalled, tuple(t.age for t in script.old if t.secret.marker in bread))


def _answer(db: Path, npc: str, asked_at: int, question: str) -> str:
    """The exact prompt of the NPC's answer to the player's question (heard the tick after it is asked)."""
    with open_reader(db) as reader:
        for record in reader.audit_records(npc, from_tick=asked_at, to_tick=asked_at + 2):
            if record.player_input == f"{PLAYER}: {question}":
                return record.attempts[0].prompt
    raise LookupError(f"{db}: no answer of {npc} to {question!r} asked at tick {asked_at}")
