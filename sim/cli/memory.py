"""`npcsim memory show`: every NPC's working memory at the default and a tight budget."""

from __future__ import annotations

import argparse
from typing import Any

import msgspec

from sim.cli._terminal import Out
from sim.cli._values import whole
from sim.errors import ConfigError
from sim.memory import NpcState, WorkingMemory, WorkingMemoryConfig, build_working_memory
from sim.scenario import Scenario, load_scenario

__all__ = ["print_report", "register"]

_CATEGORIES = ("canonical_facts", "world_state", "dialogue", "episodic", "beliefs")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    group = subparsers.add_parser("memory", help="inspect working memories")
    commands = group.add_subparsers(dest="memory_command", required=True, metavar="COMMAND")
    show = commands.add_parser("show", help="print each NPC's working memory and truncation report")
    show.add_argument("scenario", help="scenario TOML file, or a bundled scenario's name (npcsim scenario list)")
    show.add_argument("--npc", action="append", help="only this NPC (repeatable)")
    show.add_argument("--tight", type=whole(1), default=600, metavar="CHARS", help="the tight budget (default 600)")
    show.add_argument("--tokens", type=whole(1), default=None, metavar="T", help="also limit to T tokens (cl100k)")
    show.add_argument("--input", default=None, help="what is said to the NPC (default: the scenario's first line)")
    show.add_argument("--json", action="store_true",
                      help="JSON Lines: one object per NPC and budget (npc, budget, limit, prompt, report)")
    show.set_defaults(func=show_command)


def _report_rows(wm: WorkingMemory) -> list[tuple[str, str, str, str, str]]:
    report = wm.report
    rows = []
    for name in _CATEGORIES:
        row = getattr(report, name)
        budget = "mandatory" if name in ("canonical_facts", "world_state") and row.dropped == 0 else str(row.budget)
        rows.append((name, budget, str(row.used), str(row.kept), str(row.dropped)))
    return rows


def _report_caption(wm: WorkingMemory) -> str:
    report = wm.report
    tokens = f", {report.prompt_tokens}/{report.limit_tokens} tokens" if report.limit_tokens else ""
    flag = " OVER BUDGET" if report.over_budget else ""
    return (f"prompt {report.prompt_chars}/{report.limit_chars} chars{tokens}; "
            f"mandatory {report.mandatory_chars} chars{flag}")


def print_report(out: Out, wm: WorkingMemory) -> None:
    """The truncation report: one row per category, then the prompt's size (its own line in a pipe too)."""
    caption = _report_caption(wm)
    out.table(("category", "budget", "used", "kept", "dropped"), _report_rows(wm),
              caption=caption, right=("budget", "used", "kept", "dropped"), header=True)
    if not out.terminal:
        out.record(caption)


def _first_input(scenario: Scenario, npc_id: str) -> str:
    for player in scenario.players:
        for line in player.script:
            if line.to == npc_id:
                return f"{player.id}: {line.text}"
    return ""


def show_command(args: argparse.Namespace) -> int:
    scenario = load_scenario(args.scenario)
    out = Out()
    default = scenario.memory
    if args.tokens is not None:
        default = msgspec.structs.replace(default, max_context_tokens=args.tokens)
    tight = msgspec.structs.replace(default, max_context_chars=args.tight)
    known = [spec.id for spec in scenario.npcs]
    wanted = set(args.npc or known)
    unknown = wanted - set(known)
    if unknown:
        raise ConfigError(f"--npc: no NPC {', '.join(sorted(unknown))} in {args.scenario}; "
                          f"its NPCs: {', '.join(sorted(known))}")
    for spec in scenario.npcs:
        if spec.id not in wanted:
            continue
        state: NpcState = scenario.initial_state(spec.id)
        said = args.input if args.input is not None else _first_input(scenario, spec.id)
        for label, config in (("default", default), ("tight", tight)):
            wm = build_working_memory(state, said, config)
            if args.json:
                out.json(_as_json(spec.id, label, config, wm))
            else:
                _show_one(out, spec.id, f"{label} budget", config, wm)
    return 0


def _as_json(npc: str, label: str, config: WorkingMemoryConfig, wm: WorkingMemory) -> dict[str, Any]:
    return {"npc": npc, "budget": label, "max_context_chars": config.max_context_chars,
            "max_context_tokens": config.max_context_tokens, "prompt": wm.prompt, "report": wm.report}


def _show_one(out: Out, npc_id: str, label: str, config: WorkingMemoryConfig, wm: WorkingMemory) -> None:
    out.block(f"{npc_id}: {label} ({config.max_context_chars} chars)", wm.prompt)
    print_report(out, wm)
    out.blank()
