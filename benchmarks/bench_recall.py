"""Recall of a planted memory: recency against scored selection, and what each costs to build.

Synthetic (the default): each NPC has one important memory planted first (significance 0.9)
and N everyday ones after it (significance 0.1 to 0.5), a little dialogue and a few beliefs;
it is asked about the planted memory. For each N and budget: the share of prompts that keep
the planted memory under each selection, and working memories built per second (build only,
one core), on a state already built once (its rendering and index cached, as for the retry
and the explanation of one inference) and on a fresh state each time (everything included).
Targets: scored within 3x of recency's time and above 10,000 working memories a second.
Run: .venv/bin/python benchmarks/bench_recall.py [--sizes 10,100,500] [--write docs/benchmarks.md]

Live (`--live`): real runs of a busy place (benchmarks/recall_live.py): 12 NPCs chattering at
one place, a scripted player there who tells n0 one secret per age and asks about it that
many ticks later, and asks it the price of bread before any of those questions. One run per
chatter rate (`ambient_chance` of every NPC), seed and selection: recency, scored (the hot
window only) and scored+recall (`--set memory.scored.recall=8`, "n/a" while npcsim refuses
that setting). Recalled: the prompt n0 answers a question with holds that secret's marker,
from its own memory or from another NPC retelling it; clean: the bread prompt holds none of
the secrets told long before it. The 5-tick secret is the control: it is still in the hot
window. Every age shares one run of max(age) + about 250 ticks; the default (ages
5,50,500,5000, two chatter rates, one seed: four runs of 5,191 ticks, six once recall exists)
takes about 2.5 minutes on 2 cores (4 with recall): 20 to 60 s a run, more chatter slower.
Run: .venv/bin/python benchmarks/bench_recall.py --live [--ages 5,50,500,5000] [--chatter 0.05,0.2]
    [--seeds 1] [--write docs/benchmarks.md]
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import msgspec

from benchmarks._report import machine_line, write_section
from benchmarks.bench_working_memory import rate
from benchmarks.recall_live import SELECTIONS, Outcome, Plan, plan, read_outcome, run, scenario_toml
from sim.memory import Belief, Episode, Line, NpcState, WorkingMemoryConfig, build_working_memory

BUDGETS = (700, 2000)
TARGET_RATIO = 3.0
TARGET_RATE = 10_000.0

# (the planted memory, the question about it)
PLANTED = (
    ("Watched the player hold the east gate against the raiders during the siege.",
     "Do you remember the siege at the east gate?"),
    ("Pulled the miller's children out of the fire at the old mill.", "What happened at the old mill fire?"),
    ("Saw a wolf with a white scar drag a lamb from the orchard.", "Have you seen the scarred wolf again?"),
    ("The abbot hid the silver chalice under the chapel floor.", "Where did the abbot hide the chalice?"),
    ("Heard the stranger in grey swear revenge on the mayor.", "Who swore revenge on the mayor?"),
)
SUBJECTS = ("The baker", "A farmer", "Old Tom", "The innkeeper", "A child", "The priest", "A merchant", "Young Tam",
            "The miller's wife", "A tinker", "The cooper", "Two pedlars")
VERBS = ("complained about", "laughed at", "asked about", "sold", "bought", "mended", "lost", "found",
         "argued over", "carried")
OBJECTS = ("the price of flour", "a lame goat", "the harvest", "his boots", "the well rope", "fresh eggs",
           "a broken cart", "the rain", "a basket of turnips", "the church roof", "a new hat", "the market toll")


def everyday(rng: random.Random) -> str:
    return f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(OBJECTS)}."


def npc(rng: random.Random, n: int, everyday_count: int) -> tuple[NpcState, str]:
    """An NPC with one planted memory and `everyday_count` later ones, and the question about it."""
    planted, question = PLANTED[n % len(PLANTED)]
    episodes = [Episode("planted", 0, planted, 0.9)]
    episodes += [Episode(f"e{i:04}", 1 + i, everyday(rng), round(rng.uniform(0.1, 0.5), 2))
                 for i in range(everyday_count)]
    last = everyday_count
    state = NpcState(
        agent_id=f"npc{n:03}",
        system_prompt="You are a villager of Oakridge. Answer in one short line.",
        episodic=episodes,
        beliefs=[Belief(f"b{i}", max(last - 3 * i, 0), everyday(rng), 0.5) for i in range(4)],
        dialogue=[Line(max(last - 10 + i, 0), "player" if i % 2 else f"npc{n:03}", everyday(rng), i)
                  for i in range(10)],
    )
    return state, f"player: {question}"


def fresh(state: NpcState) -> NpcState:
    """The same state as a new object: nothing rendered or indexed yet."""
    return NpcState(state.agent_id, state.system_prompt, episodic=state.episodic, beliefs=state.beliefs,
                    dialogue=state.dialogue)


def measure(size: int, npcs: int, seconds: float, seed: int) -> list[tuple[str, ...]]:
    rng = random.Random(seed + size)
    people = [npc(rng, n, size) for n in range(npcs)]
    rows = []
    for budget in BUDGETS:
        recency = WorkingMemoryConfig(max_context_chars=budget)
        scored = msgspec.structs.replace(recency, selection="scored")
        kept = {}
        for name, config in (("recency", recency), ("scored", scored)):
            memories = [build_working_memory(state, said, config) for state, said in people]
            kept[name] = sum(any(e.id == "planted" for e in m.episodic) for m in memories) / npcs
        configs = (("recency", recency), ("scored", scored))
        warm = {name: npcs * rate(lambda c=config: [build_working_memory(s, said, c) for s, said in people], seconds)
                for name, config in configs}
        cold = {name: npcs * rate(lambda c=config: [build_working_memory(fresh(s), said, c) for s, said in people],
                                  seconds)
                for name, config in configs}
        ratio = warm["recency"] / warm["scored"]
        met = "yes" if ratio <= TARGET_RATIO and warm["scored"] >= TARGET_RATE else "no"
        rows.append((
            f"{size}", f"{budget:,}", f"{kept['recency']:.0%}", f"{kept['scored']:.0%}",
            f"{warm['recency']:,.0f}", f"{warm['scored']:,.0f}", f"{ratio:.1f}x", met,
            f"{cold['recency']:,.0f}", f"{cold['scored']:,.0f}",
        ))
    return rows


def table(rows: Sequence[tuple[str, ...]]) -> list[str]:
    head = ("everyday memories", "budget (chars)", "kept: recency", "kept: scored", "built/s: recency",
            "built/s: scored", "scored's time vs recency's", "targets met", "fresh state/s: recency",
            "fresh state/s: scored")
    return [
        "| " + " | ".join(head) + " |",
        "|" + "|".join("---:" for _ in head) + "|",
        *["| " + " | ".join(row) + " |" for row in rows],
    ]


def live(script: Plan, rates: Sequence[float], seeds: Sequence[int]) -> list[tuple[str, ...]]:
    """The live runs' rows: for each chatter rate, each selection's recall by age, precision and time."""
    outcomes: dict[tuple[float, str], list[Outcome]] = {}
    walls: dict[tuple[float, str], list[float]] = {}
    refused: set[str] = set()
    with tempfile.TemporaryDirectory(prefix="bench-recall-") as folder:
        for seed in seeds:
            for chatter in rates:
                world = Path(folder) / f"busy-{chatter}-{seed}.toml"
                world.write_text(scenario_toml(script, chatter, seed))
                for selection in SELECTIONS:
                    if selection in refused:
                        continue
                    db = world.with_name(f"{world.stem}-{selection}.db")
                    wall = run(world, db, script.ticks, selection)
                    if wall is None:
                        refused.add(selection)
                        print(f"{selection}: npcsim refuses the recall setting: n/a", file=sys.stderr)
                        continue
                    outcomes.setdefault((chatter, selection), []).append(read_outcome(db, script))
                    walls.setdefault((chatter, selection), []).append(wall)
                    print(f"chatter {chatter}, seed {seed}, {selection}: {wall:.1f} s", file=sys.stderr)
    rows = []
    for chatter in rates:
        for selection in SELECTIONS:
            if selection in refused:
                rows.append((selection, f"{chatter:g}", *("n/a" for _ in range(len(script.ages) + 2))))
                continue
            done = outcomes[(chatter, selection)]
            recalled = [f"{sum(o.recalled[age] for o in done)}/{len(done)}" for age in script.ages]
            clean = f"{sum(not o.leaked for o in done)}/{len(done)}"
            wall = sum(walls[(chatter, selection)]) / len(done)
            rows.append((selection, f"{chatter:g}", *recalled, clean, f"{wall:.1f}"))
    return rows


def live_table(script: Plan, rows: Sequence[tuple[str, ...]]) -> list[str]:
    head = ("selection", "ambient_chance", *(f"recalled at {age:,} ticks" for age in script.ages),
            f"bread prompt clean ({len(script.old)} old secrets)", "wall s/run")
    return [
        "| " + " | ".join(head) + " |",
        "|---|" + "|".join("---:" for _ in head[1:]) + "|",
        *["| " + " | ".join(row) + " |" for row in rows],
    ]


def main_live(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    ages = [int(a) for a in args.ages.split(",")]
    rates = [float(r) for r in args.chatter.split(",")]
    if args.seeds < 1 or not 0 <= min(rates) <= max(rates) <= 1:
        parser.error("--seeds must be positive, --chatter probabilities from 0 to 1")
    try:
        script = plan(ages)
    except ValueError as exc:
        parser.error(f"--ages: {exc}")
    rows = live(script, rates, range(args.seed, args.seed + args.seeds))
    lines = [
        f"Machine: {machine_line()}.",
        "",
        f"Command: `.venv/bin/python benchmarks/bench_recall.py --live --ages {args.ages} --chatter {args.chatter} "
        f"--seeds {args.seeds} --write docs/benchmarks.md`. Each run: `npcsim run` of 12 generated NPCs at one "
        f"place, {script.ticks:,} ticks, `--tick-ms 0`, the scripted backend, a private Mosquitto "
        "(benchmarks/recall_live.py). "
        "A scripted player there tells n0 one secret per age and asks where it hid the thing that many ticks later; "
        "before those questions it asks the price of bread. *Recalled at N ticks*: runs whose prompt for n0's "
        "answer holds that secret's place (from n0's own memory or from another NPC retelling it; a secret a "
        "few ticks old is still in the hot window: the control). *Bread prompt clean*: runs whose bread prompt "
        "holds none of the secrets told long before it. *Wall s/run*: `npcsim run` end to end (start-up "
        "included). Selections: recency; scored, the hot window only (`--set memory.selection=scored`); "
        "scored+recall (and `--set memory.scored.recall=8`); n/a where npcsim refuses that setting.",
        "",
        *live_table(script, rows),
    ]
    return report(lines, args.write, "Recall of a told secret: live runs of a busy place")


def report(lines: Sequence[str], write: Path | None, title: str) -> int:
    """Print the section; with `write`, put it into that markdown file under `title`."""
    body = "\n".join(lines)
    print(body)
    if write:
        write_section(write, title, body)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="10,50,100,500", help="everyday memories per NPC, a comma list")
    parser.add_argument("--npcs", type=int, default=20, help="NPCs per size (default 20)")
    parser.add_argument("--seconds", type=float, default=3.0, help="time per rate measurement (default 3)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--write", type=Path, help="write the figures into this markdown file")
    parser.add_argument("--live", action="store_true", help="real runs of a busy place instead (see above)")
    parser.add_argument("--ages", default="5,50,500,5000", help="--live: ticks between a secret and its question")
    parser.add_argument("--chatter", default="0.05,0.2", help="--live: every NPC's ambient_chance, a comma list")
    parser.add_argument("--seeds", type=int, default=1, help="--live: runs per chatter rate and selection")
    args = parser.parse_args()
    if args.live:
        return main_live(args, parser)
    sizes = [int(s) for s in args.sizes.split(",")]
    if args.npcs < 1 or not sizes or min(sizes) < 0 or args.seconds <= 0:
        parser.error("--npcs and --seconds must be positive, --sizes whole numbers >= 0")
    rows = [row for size in sizes for row in measure(size, args.npcs, args.seconds, args.seed)]
    lines = [
        f"Machine: {machine_line()}.",
        "",
        f"Command: `.venv/bin/python benchmarks/bench_recall.py --sizes {args.sizes} --npcs {args.npcs} --write "
        "docs/benchmarks.md` (one process, one core). Each NPC holds one planted memory (significance 0.9, the "
        "oldest), N everyday memories after it, ten lines of dialogue and four beliefs, and is asked about the "
        "planted memory. *Kept*: the share of its prompts that hold the planted memory. *Built/s*: working "
        "memories built per second on a state built once before (its rendering and index cached); *fresh "
        "state/s*: on a new state object each time. Default config but for the budget and the selection. "
        f"Targets: scored within {TARGET_RATIO:g}x of recency's time and at least {TARGET_RATE:,.0f}/s.",
        "",
        *table(rows),
    ]
    return report(lines, args.write, "Recall of a planted memory: recency and scored selection")


if __name__ == "__main__":
    sys.exit(main())
