"""`npcsim contract`: the public topics' contract, generated from the wire types (sim.wire.contract).

The AsyncAPI 3.0 document (YAML, or `--json`), one message's JSON Schema (`--schema NAME`),
or the table of docs/topics.md (`--markdown`); to standard output, or to `--out FILE`. With a
scenario, the intent payload is one of the intents its NPCs may propose, with their arguments'
types or listed values (sim.output's `intent_schemas`). With `--markdown`, `--out` replaces
the part of FILE between the contract's markers, so a document
keeps its prose around the generated table.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sim import __version__
from sim.errors import ConfigError
from sim.output import intent_schemas
from sim.scenario import load_scenario
from sim.wire.contract import (
    CHANNELS,
    MARKDOWN_BEGIN,
    MARKDOWN_END,
    Intents,
    asyncapi,
    encode_document,
    markdown,
    message_schema,
)

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    names = [c.name for c in CHANNELS]
    sub = subparsers.add_parser(
        "contract", help="the public topics as an AsyncAPI 3.0 document, or one message's JSON Schema",
        description="Print the AsyncAPI 3.0 document of the public MQTT topics (YAML; --json for JSON), "
        "generated from the wire types: every channel, its JSON Schema, who publishes it, QoS and retain flag.",
    )
    sub.add_argument("scenario", nargs="?", default=None,
                     help="a scenario file or bundled name: the intent schema then holds the intents its NPCs "
                     "may propose, each argument's type or listed values")
    form = sub.add_mutually_exclusive_group()
    form.add_argument("--json", action="store_true", help="the document as JSON (YAML without it)")
    form.add_argument("--markdown", action="store_true", help="the table of public topics docs/topics.md shows")
    form.add_argument("--schema", choices=names, metavar="NAME",
                      help=f"only the JSON Schema (draft-07) of one message: {', '.join(names)}")
    sub.add_argument("--out", type=Path, default=None, metavar="FILE",
                     help="write to FILE (with --markdown: replace the part of FILE between the contract markers)")
    sub.set_defaults(func=contract_command)


def contract_command(args: argparse.Namespace) -> int:
    if args.markdown and args.scenario is not None:
        raise ConfigError("--markdown: the table is every run's; a scenario narrows the schemas only")
    intents = _intents(args.scenario)
    if args.schema:
        output = encode_document(message_schema(args.schema, intents), "json").decode()
    elif args.markdown:
        output = markdown() if args.out is None else _spliced(args.out, markdown())
    else:
        output = encode_document(asyncapi(__version__, intents), "json" if args.json else "yaml").decode()
    if args.out is None:
        sys.stdout.write(output)
        return 0
    try:
        args.out.write_text(output)
    except OSError as exc:
        raise ConfigError(f"--out {args.out}: {exc.strerror or exc}") from exc
    return 0


def _intents(scenario: str | None) -> Intents | None:
    """The intents the NPCs of `scenario` may propose, as the contract's alternatives; None without one."""
    if scenario is None:
        return None
    return intent_schemas({npc.id: npc.policy() for npc in load_scenario(scenario).npcs})


def _spliced(path: Path, block: str) -> str:
    """`path`'s text with the part from MARKDOWN_BEGIN's line to MARKDOWN_END's replaced by `block`."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"--out {path}: {exc.strerror or exc}") from exc
    start, end = text.find(MARKDOWN_BEGIN), text.find(MARKDOWN_END)
    if start < 0 or end < start:
        raise ConfigError(f"--out {path}: no {MARKDOWN_BEGIN} ... {MARKDOWN_END} to write between")
    return text[:start] + block + text[end + len(MARKDOWN_END):].removeprefix("\n")
