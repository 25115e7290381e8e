"""`npcsim subscribe`: what NPCs say and where they go as it happens, what they propose the
game do (`--intents`), or (`--all`) every message of a run.

Without `--broker`, `--run ID` finds the run's private broker on this machine (sim.attach)
and logs in as its read-only viewer; otherwise mqtt://127.0.0.1:1883. A run found on no
broker is an error within seconds (a run leaves its retained status on its broker), and
two runs of one id on this machine are an error listing them; `--wait` waits for the run
to start instead. Where it connected goes to standard error at once; standard output
holds only the records (or, with `--json`, one JSON object per record: the payload as it
came, with its topic for `--all`). `--all` is for debugging: every topic of the
run, the public ones as the JSON they are, the internal ones decoded from msgpack to JSON, a
signed payload's signature taken off (not checked). On a private broker the viewer may read
the public topics, the trace and player input, so that is what `--all` shows there.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import msgspec

from sim.cli._access import check_access
from sim.cli._attach import check_run, local_broker, local_login
from sim.cli._options import add_broker_arguments, broker_address, tls_files
from sim.cli._terminal import Out, Piece, json_line
from sim.mqtt import BrokerAddress, Link, MqttTransport, ReconnectPolicy, Transport
from sim.protocol.seal import unchecked_body
from sim.wire import topics
from sim.wire.decoding import read_any_json, read_any_msgpack
from sim.wire.events import IntentMessage, LocationMessage, SayMessage, decode_intent, decode_location, decode_say

__all__ = [
    "DEFAULT_BROKER", "SHOWN", "broker_for", "intent_record", "location_record", "register", "say_record",
    "subscribe_command",
]

T = TypeVar("T")

DEFAULT_BROKER = "mqtt://127.0.0.1:1883"
SHOWN = ("lines", "intents", "all", "check")
"""What subscribe prints: the lines said and the moves (`agent/+/say` and `agent/+/location`, the
default: what NPCs do), the intents (`agent/+/intent`: `--intents`), every topic (`--all`), or
which channels its login may publish (`--check`)."""
_LEAVES = {"lines": ("say", "location"), "intents": ("intent",), "all": ()}
"""The last level of the topics each choice subscribes, under `agent/{agent}/` (`--all`: `#`)."""
_WAIT_POLL_S = 0.25  # how often --wait looks for the run's file


class _Shown(argparse.Action):
    """`--intents` or `--all`: one choice of what to print (`SHOWN`), named by the flag given."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        shown = (option_string or "").removeprefix("--")
        if getattr(namespace, self.dest) not in (self.default, shown):
            parser.error("--intents, --all and --check: give one of them")
        setattr(namespace, self.dest, shown)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sub = subparsers.add_parser(
        "subscribe", help="print what NPCs say and where they go (or propose the game do), as it happens",
        description="Print each line an NPC says as it is said and each move it makes (where it stands, retained: "
        "where every NPC is first), or each intent it proposes (standard output; where it connected goes to "
        "standard error). In a pipe: one line per record, nothing wrapped.",
    )
    add_broker_arguments(sub, default=None,
                         found=f"the private broker of --run on this machine, else {DEFAULT_BROKER}")
    sub.add_argument("--run", default="+", help="run id (default: every run)")
    sub.add_argument("--agent", default="+", help="agent id (default: every agent)")
    sub.add_argument("--intents", "--all", "--check", dest="show", action=_Shown, default="lines",
                     help="--intents: what NPCs propose the game do (their `intent` topics) instead of what they "
                     "say; --all: every topic of the run, decoded to JSON (internal msgpack too), for debugging; "
                     "--check: ask the broker which public channels this login may publish (MQTT 5), then exit")
    sub.add_argument("--json", action="store_true",
                     help="JSON Lines: one object per record (its payload; with --all, its topic too)")
    sub.add_argument("--wait", action="store_true",
                     help="wait for --run to start (on --broker, else on this machine's private brokers); "
                     "without it, a run that is not there is an error within seconds")
    sub.set_defaults(func=subscribe_command)


def broker_for(args: argparse.Namespace, note: Out) -> tuple[BrokerAddress, bool]:
    """Where to subscribe, and whether --run is still to be looked for there: --broker (with
    the viewer login of --run when it is that run's private broker here); else the private
    broker of --run on this machine (found); else the default, said on `note`."""
    named = args.run != "+"
    if args.broker:
        address = broker_address(args)
        return (local_login(address, args.run) if named else address), named
    if named:
        found = local_broker(args.run)
        if found is not None:
            return found, False
        note.record(f"no run {args.run} on a private broker of this machine; trying {DEFAULT_BROKER}")
    return BrokerAddress.parse(DEFAULT_BROKER, tls=tls_files(args)), named


async def _located(args: argparse.Namespace, note: Out) -> BrokerAddress:
    """Where --run is: a run that is nowhere is a ConfigError within seconds, unless --wait,
    which waits for it (on --broker, else on this machine's private brokers)."""
    if args.wait and not args.broker and args.run != "+":
        return await _wait_for_local(args.run, note)
    address, look = broker_for(args, note)
    if look and not args.wait:
        await check_run(address, args.run, name="subscribe")
    return address


async def _wait_for_local(run: str, note: Out) -> BrokerAddress:
    """The private broker of run `run` on this machine, once the run has started."""
    told = False
    while (found := local_broker(run)) is None:
        if not told:
            note.record(f"waiting for run {run} to start on a private broker of this machine (Ctrl-C stops)")
            told = True
        await asyncio.sleep(_WAIT_POLL_S)
    return found


def subscribe_command(args: argparse.Namespace) -> int:
    note = Out(sys.stderr, flush=True)

    async def located_then_subscribed() -> None:
        address = await _located(args, note)
        if args.show == "check":
            await check_access(address, Out(flush=True))
            return
        await _subscribe(address, args, Out(flush=True), note)

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(located_then_subscribed())
    return 0


def decoded(payload: bytes) -> tuple[bool, Any]:
    """(signed, the payload as JSON-able data): JSON as it is, else msgpack, else its size and first bytes."""
    body = unchecked_body(payload)
    signed = body is not None
    body = payload if body is None else body
    readers = (read_any_json, read_any_msgpack) if body[:1] in (b"{", b"[", b'"') else (read_any_msgpack,)
    for read in readers:
        try:
            value = read(body)
            msgspec.json.encode(value)  # an extension type would not go into JSON
        except (msgspec.DecodeError, TypeError, RecursionError):  # RecursionError: nesting the encoder cannot follow
            continue
        return signed, value
    return signed, {"undecoded_bytes": len(body), "head_hex": body[:32].hex()}


async def _subscribe(
    address: BrokerAddress, args: argparse.Namespace, out: Out, note: Out, *, transport: Transport | None = None
) -> None:
    """Print every line said and move (or message); rides out a broker restart like every npcsim
    client. `transport` defaults to MQTT to `address`."""
    root = f"{topics.ROOT}/{args.run}"  # --run and --agent may be wildcards: no topic function
    filters = [f"{root}/agent/{args.agent}/{leaf}" for leaf in _LEAVES[args.show]] or [f"{root}/#"]
    show = {"lines": _print_said_or_moved, "intents": _print_intent, "all": _print_any}[args.show]
    what = {"lines": "lines and moves", "intents": "intents", "all": "messages"}[args.show]
    told = False

    async def session(link: Link) -> None:
        nonlocal told
        await link.subscribe(filters)
        if not told:
            note.record(f"connected to {address.url}, waiting for {what} on {' and '.join(filters)}")
            told = True
        async for received, payload, _ in link.messages():
            show(out, received, payload, json=args.json)

    await (transport or MqttTransport(address, name="subscribe", policy=ReconnectPolicy())).run(session)


def say_record(say: SayMessage) -> list[Piece]:
    """A line said, as one record: `run tTICK agent [to whom]: text` (`run --follow` prints it too)."""
    to: list[Piece] = [(" to ", "dim"), (say.to, "bold")] if say.to else []
    return [(f"{say.run} t{say.tick:>4}", "dim"), " ", (say.agent, "bold cyan"), *to, ": ", say.text]


def intent_record(intent: IntentMessage) -> list[Piece]:
    """An intent, as one record: `run tTICK agent intends NAME {args}`, and the input it answers."""
    answers: list[Piece] = [(f" (reply_to {intent.reply_to})", "dim")] if intent.reply_to else []
    return [(f"{intent.run} t{intent.tick:>4}", "dim"), " ", (intent.agent, "bold cyan"), " intends ",
            (intent.name, "bold"), " ", json_line(intent.args), *answers]


def location_record(moved: LocationMessage) -> list[Piece]:
    """A move, as one record: `run tTICK agent -> place (activity)`."""
    doing: list[Piece] = [(f" ({moved.activity})", "dim")] if moved.activity else []
    return [(f"{moved.run} t{moved.tick:>4}", "dim"), " ", (moved.agent, "bold cyan"), " -> ", (moved.location, "bold"),
            *doing]


def _print_said_or_moved(out: Out, topic: str, payload: bytes, *, json: bool) -> None:
    if topic.endswith("/location"):
        _print_read(out, topic, payload, decode_location, location_record, json=json)
    else:
        _print_read(out, topic, payload, decode_say, say_record, json=json)


def _print_intent(out: Out, topic: str, payload: bytes, *, json: bool) -> None:
    _print_read(out, topic, payload, decode_intent, intent_record, json=json)


def _print_read(out: Out, topic: str, payload: bytes, decode: Callable[[bytes], T],
                record: Callable[[T], list[Piece]], *, json: bool) -> None:
    try:
        message = decode(payload)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        if json:
            out.json({"topic": topic, "unreadable": str(exc)})
        else:
            out.record((f"{topic}: unreadable payload ({exc})", "dim"))
        return
    if json:
        out.json(message)
    else:
        out.record(*record(message))


def _print_any(out: Out, topic: str, payload: bytes, *, json: bool) -> None:
    signed, value = decoded(payload)
    if json:
        out.json({"topic": topic, "signed": signed, "payload": value})
        return
    out.record((topic, "bold"), " (signed)" if signed else "", " ", json_line(value))
