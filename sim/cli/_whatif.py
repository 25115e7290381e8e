"""`npcsim replay --db FILE ... --set KEY=VALUE ...`: the what-if with recorded replies.

The CLI side of `sim.replay.what_if`: options, the pass over the stores on every core,
and the report (a table; `--json FILE`; `--plot FILE`, extra `plot`). `npcsim replay`
calls `run` when `--set` is given without `--fork-at`.
"""

from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path
from typing import Any

import msgspec

from sim.cli._terminal import Out, Piece
from sim.errors import ConfigError, StoreError
from sim.replay import (
    CATEGORIES,
    Tally,
    Variant,
    check_jobs,
    default_jobs,
    map_spans,
    parse_overrides,
    plan_spans,
    what_if,
    write_plot,
)

__all__ = ["add_arguments", "run"]

_NPC_ROWS = 10


def _examples(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0, got {text!r}")
    return int(text)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """--set, --examples, --json, --plot and --jobs, for `npcsim replay`."""
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="what-if with the recorded replies: a working-memory setting memory.KEY (a field of "
                        "the scenario's [memory]: memory.max_context_chars, memory.selection, "
                        "memory.scored.half_life_ticks, ...), an output policy's rule (forbidden=PHRASE[;PHRASE...], "
                        "intents=NAME[;NAME...], or none: the gates judge the recorded replies again), "
                        "npc.ID.KEY for one NPC; a comma list sweeps values; repeatable (every combination is a "
                        "variant); with --fork-at, one memory.KEY value, and inference.backend_options.NAME")
    parser.add_argument("--examples", type=_examples, default=0, metavar="N",
                        help="with --set: show up to N items lost and gained per category, and N proposals "
                        "flipped each way")
    parser.add_argument("--json", default=None, metavar="FILE", help="with --set: the whole report as JSON")
    parser.add_argument("--plot", default=None, metavar="FILE", help="with --set: a PNG of it (extra 'plot')")
    parser.add_argument("--jobs", type=int, default=default_jobs(), metavar="N",
                        help="worker processes over record ranges (default: every core)")


def run(args: argparse.Namespace) -> int:
    """The what-if over the stores `args.db`: exit 0 with the report, 2 on a bad option."""
    check_jobs(args.jobs)
    parse_overrides(args.set)  # a bad key or value is refused before any store is read
    if args.plot is not None:
        from sim.loadtest import require_matplotlib

        require_matplotlib()
    for n, db in enumerate(args.db):
        if not Path(db).is_file():
            raise ConfigError(f"--db {db!r}: no such file")
        if any(Path(db).resolve() == Path(earlier).resolve() for earlier in args.db[:n]):
            raise ConfigError(f"--db {db!r}: given twice (its records would count twice)")
    plan = plan_spans(args.db, args.jobs)
    variants = parse_overrides(args.set, plan.agents)
    tallies = [Tally(label=v.label) for v in variants]
    for part in map_spans(functools.partial(what_if, variants=variants, examples=args.examples), plan, args.jobs):
        for tally, later in zip(tallies, part, strict=True):
            tally.add(later, args.examples)
    report = _report(args.db, plan.records, variants, tallies)
    if args.json is not None:
        _write(Path(args.json), msgspec.json.format(msgspec.json.encode(report), indent=2) + b"\n")
    if args.plot is not None:
        write_plot(tallies, Path(args.plot))
    _print(Out(), tallies, args.examples)
    if any(v.sets_policy for v in variants):
        _print_gates(Out(), tallies, args.examples)
    if args.json is not None or args.plot is not None:
        Out(sys.stderr).record("wrote " + " and ".join(p for p in (args.json, args.plot) if p is not None))
    return 0


def _write(path: Path, data: bytes) -> None:
    try:
        path.write_bytes(data)
    except OSError as exc:
        raise StoreError(f"{path}: cannot write the report: {exc}") from exc


def _percent(part: int, whole: int) -> float:
    return 100.0 if whole == 0 else round(100.0 * part / whole, 3)


def _mean(total: int, count: int) -> float:
    return round(total / count, 1) if count else 0.0


def _report(dbs: list[str], records: int, variants: list[Variant], tallies: list[Tally]) -> dict[str, Any]:
    return {
        "stores": dbs,
        "records": records,
        "variants": [
            {
                "label": t.label,
                "settings": v.settings,
                "npc_settings": v.npcs,
                "inferences": t.inferences,
                "prompts_changed": t.prompts_changed,
                "lost": t.lost,
                "gained": t.gained,
                "npcs": {agent: {"lost": c[0], "gained": c[1]} for agent, c in sorted(t.npcs.items())},
                "prompt_chars_mean": _mean(t.chars, t.inferences),
                "prompt_chars_max": t.chars_max,
                "recorded_prompt_chars_mean": _mean(t.recorded_chars, t.inferences),
                "over_budget": t.over_budget,
                "recorded_over_budget": t.recorded_over_budget,
                "duplicate": t.duplicate,
                "recorded_duplicate": t.recorded_duplicate,
                "selections": t.selections,
                "recorded_selections": t.recorded_selections,
                "canonical_facts_present_percent": _percent(t.facts_present, t.facts),
                "world_state_present_percent": _percent(t.world_present, t.world),
                "examples": [msgspec.to_builtins(c) for c in t.examples],
                "gates": {"attempts_judged": t.judged, "to_rejected": t.to_rejected, "to_accepted": t.to_accepted,
                          "flips": [msgspec.to_builtins(f) for f in t.flips]},
            }
            for v, t in zip(variants, tallies, strict=True)
        ],
    }


def _present(part: int, whole: int) -> Piece:
    share = _percent(part, whole)
    return (f"{share:g} %", "" if share == 100.0 else "bold red")


def _selections(counts: dict[str, int]) -> str:
    """Which selection built the memories: its name, or each one's count when they differ."""
    used = [(name, n) for name, n in counts.items() if n]
    return used[0][0] if len(used) == 1 else ", ".join(f"{name} {n}" for name, n in used)


def _item_text(item: dict[str, Any]) -> str:
    if "speaker" in item:
        return f"{item['speaker']}: {item['text']}"
    if "key" in item:
        return f"{item['key']}: {item['value']}"
    return f"{item.get('id', '')}: {item.get('text', '')}"


def _print(out: Out, tallies: list[Tally], examples: int) -> None:
    out.table(
        ("variant", "selection (recorded)", "inferences", "prompts changed", "items lost", "items gained",
         "mean chars (recorded)", "max chars", "over budget (recorded)", "duplicate (recorded)", "facts present",
         "world present"),
        [(t.label, f"{_selections(t.selections)} ({_selections(t.recorded_selections)})", str(t.inferences),
          str(t.prompts_changed), str(sum(t.lost.values())), str(sum(t.gained.values())),
          f"{_mean(t.chars, t.inferences):g} ({_mean(t.recorded_chars, t.inferences):g})", str(t.chars_max),
          f"{t.over_budget} ({t.recorded_over_budget})", f"{t.duplicate} ({t.recorded_duplicate})",
          _present(t.facts_present, t.facts),
          _present(t.world_present, t.world)) for t in tallies],
        title="what-if with the recorded replies", header=True, whole=("variant",),
        right=("inferences", "prompts changed", "items lost", "items gained", "max chars"),
    )
    out.table(
        ("variant", "category", "lost", "gained"),
        [(t.label, c, str(t.lost[c]), str(t.gained[c])) for t in tallies for c in CATEGORIES
         if t.lost[c] or t.gained[c]],
        title="by category", header=True, right=("lost", "gained"),
    )
    rows = []
    for t in tallies:
        ranked = sorted(t.npcs.items(), key=lambda kv: (-(kv[1][0] + kv[1][1]), kv[0]))
        rows += [(t.label, agent, str(c[0]), str(c[1])) for agent, c in ranked[:_NPC_ROWS]]
    out.table(("variant", "npc", "lost", "gained"), rows, header=True, right=("lost", "gained"),
              title=f"by NPC (the {_NPC_ROWS} most changed per variant; every NPC in --json)",
              caption=", ".join(f"{t.label}: {len(t.npcs)} NPCs changed" for t in tallies))
    if examples:
        out.table(("variant", "tick", "npc", "record", "category", "change", "item"),
                  [(t.label, str(c.tick), c.agent, c.record, c.category, c.change, _item_text(c.item))
                   for t in tallies for c in t.examples],
                  title="examples", header=True, whole=("record",), stretch="item")


def _print_gates(out: Out, tallies: list[Tally], examples: int) -> None:
    """The recorded replies judged again under each variant's rules, and what flipped."""
    out.table(("variant", "attempts judged", "accepted -> rejected", "rejected -> accepted"),
              [(t.label, str(t.judged), str(t.to_rejected), str(t.to_accepted)) for t in tallies],
              title="the gates under the variant's rules", header=True, whole=("variant",),
              right=("attempts judged", "accepted -> rejected", "rejected -> accepted"))
    if examples:
        out.table(("variant", "tick", "npc", "record", "attempt", "kind", "text", "was", "now"),
                  [(t.label, str(f.tick), f.agent, f.record, str(f.attempt), f.kind, f.text,
                    f"{f.was} ({f.was_code})", f"{f.now} ({f.now_code})") for t in tallies for f in t.flips],
                  title="proposals flipped", header=True, whole=("record",), stretch="text")
