"""`npcsim memory show`: every NPC's working memory at the default and a tight budget."""

from __future__ import annotations

import argparse

import msgspec
from rich.console import Console
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from sim.cli._values import whole
from sim.memory import NpcState, WorkingMemory, WorkingMemoryConfig, build_working_memory
from sim.scenario import Scenario, load_scenario

__all__ = ["register", "report_table"]


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    group = subparsers.add_parser("memory", help="inspect working memories")
    commands = group.add_subparsers(dest="memory_command", required=True, metavar="COMMAND")
    show = commands.add_parser("show", help="print each NPC's working memory and truncation report")
    show.add_argument("scenario", help="scenario TOML file, or a bundled scenario's name (npcsim scenario list)")
    show.add_argument("--npc", action="append", help="only this NPC (repeatable)")
    show.add_argument("--tight", type=whole(1), default=600, metavar="CHARS", help="the tight budget (default 600)")
    show.add_argument("--tokens", type=whole(1), default=None, metavar="T", help="also limit to T tokens (cl100k)")
    show.add_argument("--input", default=None, help="what is said to the NPC (default: the scenario's first line)")
    show.set_defaults(func=show_command)


def report_table(wm: WorkingMemory) -> Table:
    """The truncation report as a table: one row per category."""
    report = wm.report
    table = Table(title_justify="left", show_edge=False)
    for column in ("category", "budget", "used", "kept", "dropped"):
        table.add_column(column, justify="left" if column == "category" else "right")
    for name in ("canonical_facts", "world_state", "dialogue", "episodic", "beliefs"):
        row = getattr(report, name)
        budget = "mandatory" if name in ("canonical_facts", "world_state") and row.dropped == 0 else str(row.budget)
        table.add_row(name, budget, str(row.used), str(row.kept), str(row.dropped))
    tokens = f", {report.prompt_tokens}/{report.limit_tokens} tokens" if report.limit_tokens else ""
    flag = " [bold red]OVER BUDGET[/]" if report.over_budget else ""
    table.caption = (
        f"prompt {report.prompt_chars}/{report.limit_chars} chars{tokens}; "
        f"mandatory {report.mandatory_chars} chars{flag}"
    )
    return table


def _first_input(scenario: Scenario, npc_id: str) -> str:
    for player in scenario.players:
        for line in player.script:
            if line.to == npc_id:
                return f"{player.id}: {line.text}"
    return ""


def show_command(args: argparse.Namespace) -> int:
    scenario = load_scenario(args.scenario)
    console = Console()
    default = scenario.memory
    if args.tokens is not None:
        default = msgspec.structs.replace(default, max_context_tokens=args.tokens)
    tight = msgspec.structs.replace(default, max_context_chars=args.tight)
    wanted = set(args.npc or [spec.id for spec in scenario.npcs])
    unknown = wanted - {spec.id for spec in scenario.npcs}
    if unknown:
        console.print(f"[red]unknown NPC(s): {', '.join(sorted(unknown))}[/]")
        return 2
    for spec in scenario.npcs:
        if spec.id not in wanted:
            continue
        state: NpcState = scenario.initial_state(spec.id)
        said = args.input if args.input is not None else _first_input(scenario, spec.id)
        for label, config in (("default budget", default), ("tight budget", tight)):
            _show_one(console, spec.id, label, state, said, config)
    return 0


def _show_one(
    console: Console, npc_id: str, label: str, state: NpcState, said: str, config: WorkingMemoryConfig
) -> None:
    wm = build_working_memory(state, said, config)
    console.print(Panel(Text(wm.prompt), title=f"{npc_id}: {label} ({config.max_context_chars} chars)", expand=False))
    console.print(report_table(wm))
    console.print()
