"""Start-up of a shard at scale: the scenario parsed and the layout built off the loop, agents created in chunks.

A large scenario is parsed in a child process (the parser holds the GIL), a small one in a
thread.

A 100,000-NPC scenario takes seconds to parse and its agents tens of thousands of rows to
create. Both are done so that the event loop stays responsive (SIGINT/SIGTERM are acted on
at once) and the live display can say what start-up is doing (`StartupProgress`). The
phases, in order: loading the scenario, creating or loading agents (n of N), subscribing,
then running.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from types import TracebackType
from typing import TypeVar

import msgspec

from sim.errors import ConfigError, ScenarioError
from sim.helper import Helper
from sim.scenario import NpcSpec, Scenario, ScenarioText, parse_scenario, read_scenario
from sim.shard._clock import checkpoint
from sim.store import Store, Writer
from sim.wire.local import ParsedHead, ParseDone, ParseFailed, ParseScenario, decode_parsed, encode

__all__ = [
    "CHILD_PARSE_BYTES",
    "CHUNK",
    "PausedCollector",
    "StartupPhase",
    "StartupProgress",
    "cancel_start_up_on",
    "create_agents",
    "in_thread",
    "load_scenario_in_thread",
]

CHUNK = 2_000
"""Agents per store transaction at start-up: large enough that round trips are few, small
enough that a stop request waits for at most one chunk's commit."""



class StartupPhase(StrEnum):
    """What start-up is doing, in order; the value is what the display and the log say."""

    LOADING = "loading the scenario"
    CREATING = "creating or loading agents"
    SUBSCRIBING = "subscribing"
    RUNNING = "running"


T = TypeVar("T")

log = logging.getLogger(__name__)


@dataclass
class StartupProgress:
    """What start-up is doing, for the live display: a phase and, for agents, n of N."""

    phase: StartupPhase = StartupPhase.LOADING
    done: int = 0
    total: int = 0

    def enter(self, phase: StartupPhase, total: int = 0) -> None:
        """Start a phase (logged at INFO, so `-v` shows where start-up is)."""
        self.phase, self.done, self.total = phase, 0, total
        log.info("start-up: %s", self.describe())

    def describe(self) -> str:
        if self.total:
            return f"{self.phase} ({self.done:,} of {self.total:,})"
        return self.phase


class PausedCollector:
    """No cyclic garbage collection during start-up; what start-up built is then frozen.

    Start-up allocates millions of long-lived objects (the parsed scenario, hot state,
    agents, their tasks); each allocation burst triggers full collections that scan all of
    them again, which can take start-up longer than its own work. `start_up_done` moves
    everything alive into the permanent generation (`gc.freeze`), so tick-time collections
    never scan it, and collects from then on with
    a first generation of `TICK_THRESHOLD` allocations instead of 700: a tick allocates
    hundreds of thousands of objects that refcounting frees (states, memories, requests,
    records) and that the default made the collector scan thousands of times a tick, for
    a tenth of a 100,000-NPC tick and pauses of a tenth of a second, finding nothing.
    Cyclic garbage is still collected, a little later. On exit the frozen objects are
    handed back (`gc.unfreeze`) and the thresholds restored, so a process that runs many
    shards one after another (the tests) loses nothing.
    """

    TICK_THRESHOLD = 50_000

    def __enter__(self) -> PausedCollector:
        self._was_enabled = gc.isenabled()
        self._thresholds = gc.get_threshold()
        gc.disable()
        return self

    def start_up_done(self) -> None:
        gc.freeze()
        gc.set_threshold(self.TICK_THRESHOLD, *self._thresholds[1:])
        if self._was_enabled:
            gc.enable()

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        # Through the permanent generation into the oldest: a start-up stopped before
        # `start_up_done` leaves millions of objects in the first generation, and the first
        # collection after `gc.enable` would scan them all.
        gc.freeze()
        gc.unfreeze()
        gc.set_threshold(*self._thresholds)
        if self._was_enabled:
            gc.enable()


def _settle(future: asyncio.Future[T], result: T | None, error: BaseException | None) -> None:
    if future.done():  # the waiter was cancelled: a stop came during the parse
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)  # type: ignore[arg-type]


async def load_scenario_in_thread(path: str | Path) -> tuple[Scenario, ScenarioText]:
    """Read the scenario and parse it off the event loop, so a stop request need not wait
    for it; the scenario and the bytes read (what the store records of it, with their SHA-256).

    The file is read first, in a daemon thread, within its bounds (`read_scenario`: a
    regular file of at most MAX_SCENARIO_BYTES, or a bundled scenario): nothing is parsed
    before. Those bytes are parsed in the thread too or, past `CHILD_PARSE_BYTES`, in a
    helper process (`sim.helper`): the parser (rtoml, then msgspec) holds the GIL for the whole of each of
    its two calls, seconds for a large world, during which a thread would leave the loop
    no turn at all (a SIGTERM would wait for it). The child is handed the bytes read (so what
    is parsed is what was hashed) and hands the scenario back in chunks of NPCs, each
    decoded between two turns of the loop.
    """

    text = await in_thread(lambda: read_scenario(path), "npcsim-read-scenario")
    if len(text.data) > CHILD_PARSE_BYTES:
        return await _parse_in_child(text), text
    return await in_thread(lambda: parse_scenario(text.data, source=text.source), "npcsim-load-scenario"), text


CHILD_PARSE_BYTES = 8 << 20
"""Scenario files larger than this (a 100,000-NPC file is 21 MB) are parsed in a child process."""

_HEAD_DECODER = msgspec.msgpack.Decoder(Scenario)
_NPCS_DECODER = msgspec.msgpack.Decoder(list[NpcSpec])


async def _parse_in_child(text: ScenarioText) -> Scenario:
    """The parent's side: a helper process parses the bytes it is given
    (`sim.shard._parse_child`), its parts are decoded as they come."""
    try:
        parser = await Helper.start(
            "sim.shard._parse_child", encode(ParseScenario(source=text.source, data=text.data)), what="parser"
        )
    except ConfigError as exc:
        raise ScenarioError(f"{text.source}: parsing failed: {exc}") from None
    head: Scenario | None = None
    npcs: list[NpcSpec] = []
    try:
        while True:
            body = await parser.read()
            if body is None:
                code = await parser.ended()
                raise ScenarioError(f"{text.source}: parsing failed: the parser process ended (exit code {code})")
            try:
                part = decode_parsed(body)
                if isinstance(part, ParseFailed):
                    raise ScenarioError(part.error)
                if isinstance(part, ParseDone):
                    break
                if isinstance(part, ParsedHead):
                    head = _HEAD_DECODER.decode(part.scenario)
                else:
                    npcs += _NPCS_DECODER.decode(part.npcs)
            except msgspec.DecodeError as exc:  # ValidationError too: what came back is not what was sent
                raise ScenarioError(f"{text.source}: parsing failed: the parser's output is corrupt ({exc})") from None
        await parser.stop()
    except BaseException:
        await parser.abort()  # a stop request cancelled the start-up: the parse goes too
        raise
    if head is None:
        raise ScenarioError(f"{text.source}: parsing failed: no scenario came back")
    return msgspec.structs.replace(head, npcs=npcs)


async def in_thread(work: Callable[[], T], name: str) -> T:
    """`work()` in a daemon thread: start-up's long computations (the parse, a shard's layout)
    leave the event loop free, and a stop request need not wait for them.

    Not `asyncio.to_thread`: `asyncio.run` joins the default executor on exit, which would
    hold a stopped run until a multi-second parse had finished for nothing.
    """
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def run() -> None:
        result: T | None = None
        error: BaseException | None = None
        try:
            result = work()
        except BaseException as exc:  # noqa: BLE001 - handed over to the waiting coroutine
            error = exc
        with contextlib.suppress(RuntimeError):  # the loop is already closed: nobody waits
            loop.call_soon_threadsafe(_settle, future, result, error)

    threading.Thread(target=run, name=name, daemon=True).start()
    return await future


async def create_agents(
    store: Store,
    scenario: Scenario,
    specs: Sequence[NpcSpec],
    progress: StartupProgress,
    *,
    chunk: int = CHUNK,
) -> int:
    """Load the agents the store has, create the others from the scenario, chunk by chunk.

    Per chunk: one `load_agents` (on resume, the only store work) and, for the agents not on
    disk, one `ensure_agents` transaction; an initial state is built only for those. No
    agent object is made: the shard builds one for each turn (sim.shard._turns). Returns how
    many agents the store holds for `specs`.
    """
    progress.enter(StartupPhase.CREATING, len(specs))
    for start in range(0, len(specs), chunk):
        part = specs[start : start + chunk]
        missing = set(await store.load_agents(spec.id for spec in part))
        if missing:
            states = [scenario.initial_state(spec) for spec in part if spec.id in missing]
            await store.ensure_agents(states, writer=Writer.SCENARIO)
        progress.done = start + len(part)
        await checkpoint()  # a stop request and the display get their turn between chunks
    return len(specs)


async def cancel_start_up_on(stop: asyncio.Event, progress: StartupProgress, run: asyncio.Task[object]) -> None:
    """Cancel `run` when `stop` is set before start-up has finished.

    After start-up, the run itself notices `stop` between ticks and ends in order; before,
    there is no tick to finish, so the run is cancelled and unwinds its context managers
    (store flushed, bus closed, broker stopped) at once.
    """
    await stop.wait()
    if progress.phase != StartupPhase.RUNNING:
        run.cancel()
