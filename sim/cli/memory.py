"""`npcsim memory show`: every NPC's working memory at the default and a tight budget.

Built as a run builds it at its first tick: from the newest `HOT_LIMIT` items per category,
with what a scored selection's `recall` brings back of the significant episodes beyond
them (`sim.memory.recalled_for`, the rule a live run recalls by).

Each is printed as its prompt, its truncation report and what it dropped (and why); with
`--json`, one JSON object per NPC and budget instead.

With `--db RUN.db` instead of a scenario: the working memory an NPC built in a recorded run,
rebuilt from its last audit record (at or before `--tick T`), which holds the state it was
built from, its budget and what it was answering.
"""

from __future__ import annotations

import argparse
from typing import Any

import msgspec

from sim.audit import AuditRecord
from sim.cli._options import add_set_argument, settings_of, whole
from sim.cli._terminal import Out
from sim.cli._truncation import dropped_json, print_truncation, report_json
from sim.errors import ConfigError
from sim.memory import (
    TruncationExplanation,
    WorkingMemory,
    WorkingMemoryConfig,
    build_working_memory,
    explain_truncation,
    hot_and_kept,
    recalled_for,
    with_recalled,
)
from sim.scenario import Scenario, load_scenario
from sim.settings import with_settings
from sim.store import HOT_LIMIT, StoreReader, open_reader

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    group = subparsers.add_parser("memory", help="inspect working memories")
    commands = group.add_subparsers(dest="memory_command", required=True, metavar="COMMAND")
    show = commands.add_parser("show", help="print each NPC's working memory and truncation report")
    show.add_argument("scenario", nargs="?",
                      help="scenario TOML file, or a bundled scenario's name (npcsim scenario list); or --db")
    show.add_argument("--db", default=None, metavar="RUN.db",
                      help="a run's store instead: each --npc's working memory as of its last inference "
                      "(opened read-only)")
    show.add_argument("--tick", type=whole(0), default=None, metavar="T",
                      help="--db: as of its last inference at or before tick T")
    show.add_argument("--npc", action="append", help="only this NPC (repeatable; needed with --db)")
    show.add_argument("--tight", type=whole(1), default=None, metavar="CHARS", help="the tight budget (default 600)")
    show.add_argument("--input", default=None, help="what is said to the NPC (default: the scenario's first line)")
    add_set_argument(show, "memory.KEY, a field of the scenario's [memory] (memory.selection=recency, "
                     "memory.max_context_tokens=300, memory.tokenizer=gguf:PATH, ...)")
    show.add_argument("--json", action="store_true",
                      help="JSON Lines: one object per NPC and budget (npc, budget, limits, prompt, report, dropped)")
    show.set_defaults(func=show_command)


def _first_input(scenario: Scenario, npc_id: str) -> str:
    for player in scenario.players:
        for line in player.script:
            if line.to == npc_id:
                return f"{player.id}: {line.text}"
    return ""


def show_command(args: argparse.Namespace) -> int:
    if args.db is not None or args.scenario is None:
        return recorded_command(args)
    if args.tick is not None:
        raise ConfigError("--tick: with --db only (a scenario's memory is that of its first tick)")
    scenario = load_scenario(args.scenario)
    out = Out()
    settings = settings_of(args.set, ("memory.",), "memory show")
    default = with_settings(scenario.memory, {k.removeprefix("memory."): v for k, v in settings.items()}, "memory.")
    tight = msgspec.structs.replace(default, max_context_chars=600 if args.tight is None else args.tight)
    known = [spec.id for spec in scenario.npcs]
    wanted = set(args.npc or known)
    unknown = wanted - set(known)
    if unknown:
        raise ConfigError(f"--npc: no NPC {', '.join(sorted(unknown))} in {args.scenario}; "
                          f"its NPCs: {', '.join(sorted(known))}")
    for spec in scenario.npcs:
        if spec.id not in wanted:
            continue
        said = args.input if args.input is not None else _first_input(scenario, spec.id)
        hot, kept = hot_and_kept(scenario.initial_state(spec.id), HOT_LIMIT)
        for label, config in (("default", default), ("tight", tight)):
            state = with_recalled(hot, recalled_for(hot, kept, said, config, speaker=said.partition(": ")[0]))
            wm = build_working_memory(state, said, config)
            explanation = explain_truncation(state, said, config, wm)
            if args.json:
                out.json(_as_json(spec.id, label, config, wm, explanation))
            else:
                _show_one(out, spec.id, f"{label} budget", config, wm, explanation)
    return 0


def _as_json(
    npc: str, label: str, config: WorkingMemoryConfig, wm: WorkingMemory, explanation: TruncationExplanation
) -> dict[str, Any]:
    """One JSON line: the NPC, the budget, the prompt, the report and the dropped list."""
    return {"npc": npc, "budget": label, "max_context_chars": config.max_context_chars,
            "max_context_tokens": config.max_context_tokens, "prompt": wm.prompt, "report": report_json(wm.report),
            "dropped": dropped_json(explanation)}


def _show_one(
    out: Out, npc_id: str, label: str, config: WorkingMemoryConfig, wm: WorkingMemory,
    explanation: TruncationExplanation,
) -> None:
    out.block(f"{npc_id}: {label} ({config.max_context_chars} chars, {config.selection} selection)", wm.prompt)
    print_truncation(out, wm.report, explanation)
    out.blank()


def recorded_command(args: argparse.Namespace) -> int:
    """`memory show --db RUN.db --npc ID [--tick T]`: each NPC's working memory as its last
    audit record (at or before T) holds it: what the run built, so only that budget."""
    if args.db is None or args.scenario is not None:
        raise ConfigError("give a scenario or --db RUN.db (a run's store), not both" if args.db is not None
                          else "give a scenario, or --db RUN.db for a recorded run")
    given = [flag for flag, value in (("--tight", args.tight), ("--input", args.input), ("--set", args.set)) if value]
    if given:
        raise ConfigError(f"{', '.join(given)}: with a scenario only; --db shows the working memory the run built "
                          "(npcsim replay --set ... asks what another would have said)")
    if not args.npc:
        raise ConfigError(f"--db {args.db}: name the NPC with --npc ID (repeatable)")
    with open_reader(args.db) as reader:
        records = [_latest(reader, npc, args.tick, args.db) for npc in dict.fromkeys(args.npc)]
    out = Out()
    for record in records:
        wm = record.memory()
        explanation = record.explanation(wm)
        if args.json:
            out.json({**_as_json(record.agent_id, "recorded", record.config, wm, explanation),
                      "record": record.id, "tick": record.tick})
        else:
            _show_one(out, record.agent_id, f"record {record.id}, tick {record.tick}", record.config, wm, explanation)
    return 0


def _latest(reader: StoreReader, npc: str, tick: int | None, db: str) -> AuditRecord:
    """The NPC's last record at or before `tick`; a ConfigError saying why there is none."""
    record = reader.latest_audit_record(npc, tick)
    if record is not None:
        return record
    if not reader.has_agent(npc):
        raise ConfigError(f"--npc {npc}: no NPC {npc} in {db}")
    summaries = reader.audit_summaries(npc)
    if not summaries:
        raise ConfigError(f"--npc {npc}: {npc} never spoke in {db} (no inference recorded)")
    raise ConfigError(f"--npc {npc}: {npc} had not spoken by tick {tick} in {db} "
                      f"(its first inference: tick {summaries[0].tick})")
