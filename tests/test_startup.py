"""Start-up at scale: indexed scenario lookups, agents created in bulk, a stop at any moment."""

from __future__ import annotations

import contextlib
import signal
import sqlite3
import subprocess
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import aiosqlite
import pytest

from sim.errors import AuthorityError
from sim.generate import generate_scenario
from sim.memory import Episode, NpcState
from sim.scenario import parse_scenario
from sim.shard import StartupProgress, create_agents
from sim.store import Writer, open_store
from tests.helpers import MosquittoProcess, elapse, elapse_sync, eventually, npcsim_in_process, popen_npcsim


def states(start: int, count: int) -> list[NpcState]:
    return [NpcState(agent_id=f"n{i}", system_prompt=f"You are n{i}.") for i in range(start, start + count)]


@pytest.fixture
def round_trips(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Counts every call the store sends to SQLite's thread (aiosqlite's one entry point)."""
    count = [0]
    real: Callable[..., Awaitable[Any]] = aiosqlite.Connection._execute

    async def counting(self: aiosqlite.Connection, fn: Any, *args: Any, **kwargs: Any) -> Any:
        count[0] += 1
        return await real(self, fn, *args, **kwargs)

    monkeypatch.setattr(aiosqlite.Connection, "_execute", counting)
    yield count


def test_scenario_lookups_and_initial_state_by_spec() -> None:
    scenario = parse_scenario(generate_scenario(npcs=300, locations=7, seed=3))
    spec = scenario.npcs[123]
    assert scenario.npc(spec.id) is spec
    assert scenario.initial_state(spec) == scenario.initial_state(spec.id)
    assert [w.key for w in scenario.initial_state(spec).world_state] == ["season"]
    with pytest.raises(KeyError):
        scenario.npc("nobody")


async def test_bulk_creation_costs_round_trips_per_chunk_not_per_agent(
    tmp_path: Path, round_trips: list[int]
) -> None:
    """The same number of store round trips for a chunk of 20 agents and one of 2,000."""
    costs = []
    async with open_store(tmp_path / "s.db") as store:
        for start, size in ((0, 20), (20, 2_000), (2_020, 20), (2_040, 2_000)):
            before = round_trips[0]
            assert await store.ensure_agents(states(start, size), writer=Writer.SCENARIO) == size
            costs.append(round_trips[0] - before)
        before = round_trips[0]
        assert await store.ensure_agents(states(0, 4_040), writer=Writer.SCENARIO) == 0
        assert round_trips[0] == before  # all in memory: nothing to ask the database
    assert costs[0] == costs[1] == costs[2] == costs[3] <= 30, costs
    async with open_store(tmp_path / "s.db") as store:  # resume: loaded, not created again
        before = round_trips[0]
        assert await store.ensure_agents(states(0, 2_000), writer=Writer.SCENARIO) == 0
        assert round_trips[0] - before <= 30
        assert store.state("n1999").system_prompt == "You are n1999."
    with sqlite3.connect(tmp_path / "s.db") as conn:
        assert conn.execute("SELECT count(*) FROM agents").fetchone() == (4_040,)


async def test_start_up_round_trips_grow_with_chunks_only(tmp_path: Path, round_trips: list[int]) -> None:
    """create_agents, fresh and on resume: bounded round trips per chunk of NPCs."""
    scenario = parse_scenario(generate_scenario(npcs=3_000, locations=10, seed=1))
    progress = StartupProgress()
    for attempt in ("fresh", "resume"):
        async with open_store(tmp_path / "s.db") as store:
            before = round_trips[0]
            held = await create_agents(store, scenario, scenario.npcs, progress, chunk=500)
            used = round_trips[0] - before
            assert held == 3_000 and store.agents() == tuple(sorted(spec.id for spec in scenario.npcs))
        assert (progress.done, progress.total) == (3_000, 3_000)
        assert used <= 6 * 50, f"{attempt}: {used} round trips for 6 chunks"


async def test_bulk_creation_keeps_history_and_authority(tmp_path: Path) -> None:
    async with open_store(tmp_path / "s.db") as store:
        await store.ensure_agents(states(0, 3), writer=Writer.SCENARIO)
        await store.add_episode("n1", Episode(id="e", tick=0, text="met a bard"), writer=Writer.NPC)
        changed = [NpcState(agent_id=f"n{i}", system_prompt="rewritten") for i in range(5)]
        assert await store.ensure_agents(changed, writer=Writer.SCENARIO) == 2
        assert store.state("n1").system_prompt == "You are n1."
        assert [e.text for e in store.state("n1").episodic] == ["met a bard"]
        assert store.state("n4").system_prompt == "rewritten"
        with pytest.raises(AuthorityError, match="writer NPC may not write agent"):
            await store.ensure_agents(states(10, 2), writer=Writer.NPC)
        assert "n10" not in store.agents()


# --- a real `npcsim run` process stopped with SIGTERM during start-up -----------------------


def _start_run(tmp_path: Path, broker: str, npcs: int) -> tuple[subprocess.Popen[str], Path]:
    world = tmp_path / "world.toml"
    world.write_text(generate_scenario(npcs=npcs, locations=50, seed=2))
    db = tmp_path / "run.db"
    # not --quiet: the test reads the summary (stopped by signal), which --quiet leaves out
    proc = popen_npcsim("-v", "run", str(world), "--broker", broker, "--db", str(db), "--ticks", "5")
    return proc, db


def _wait_for_line(proc: subprocess.Popen[str], needle: str, deadline_s: float = 90.0) -> list[str]:
    """Read stderr until a line holds `needle`; returns the lines read."""
    assert proc.stderr is not None
    lines = []
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        lines.append(line)
        if needle in line:
            return lines
    raise AssertionError(f"no {needle!r} in the run's log: {''.join(lines)[-2000:]}")


def _stop(proc: subprocess.Popen[str]) -> tuple[int, str, str, float]:
    """SIGTERM; the exit code, the output and how long the process took to exit."""
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return proc.returncode, out, err, time.monotonic() - sent


@pytest.mark.mosquitto
@pytest.mark.slow
@pytest.mark.parametrize("phase", ["loading the scenario", "creating or loading agents"])
def test_sigterm_during_start_up_stops_the_run_cleanly(
    tmp_path: Path, mosquitto: MosquittoProcess, phase: str
) -> None:
    """Before the fix a SIGTERM while parsing killed the process (exit -15) and one while
    creating agents waited for all of them; now the run ends at once, exit 0, with what it
    committed intact and no tick started."""
    npcs = 40_000
    proc, db = _start_run(tmp_path, mosquitto.url, npcs)
    try:
        _wait_for_line(proc, f"start-up: {phase}")
        code, out, err, took = _stop(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    print(f"stopped {took:.2f} s after SIGTERM during {phase!r}")
    assert code == 0, err[-2000:]
    assert "Traceback" not in err
    assert "stopped by signal" in out and "yes" in out.split("stopped by signal")[1].splitlines()[0]
    if not db.exists():
        assert phase == "loading the scenario", "the store was never opened"
        return
    with sqlite3.connect(db) as conn:
        (created,) = conn.execute("SELECT count(*) FROM agents").fetchone()
        assert conn.execute("SELECT value FROM meta WHERE key = 'last_tick'").fetchone() is None
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    assert created < npcs, "start-up ran to its end before acting on SIGTERM"


def test_the_live_display_says_what_start_up_is_doing() -> None:
    from rich.console import Console

    from sim.cli.run import _progress
    from sim.shard import RunStats, StartupPhase

    def shown(stats: RunStats) -> str:
        console = Console(width=200, record=True)
        console.print(_progress(stats))
        return " ".join(console.export_text().split())

    stats = RunStats()
    assert "start-up loading the scenario" in shown(stats)
    stats.startup_progress.enter(StartupPhase.CREATING, 100_000)
    stats.startup_progress.done = 12_000
    assert "creating or loading agents (12,000 of 100,000)" in shown(stats)
    stats.startup_progress.enter(StartupPhase.RUNNING)
    assert "start-up" not in shown(stats)


@pytest.mark.parametrize(
    ("content", "message"),
    [(None, "cannot read the scenario file"), ("[scenario\n", "not valid TOML"), ("[scenario]\nname = 1\n", "name")],
)
def test_a_bad_scenario_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str | None, message: str
) -> None:
    """The scenario is parsed in a thread now: its errors still reach the user as one line."""
    path = tmp_path / "bad.toml"
    if content is not None:
        path.write_text(content)
    ran = npcsim_in_process(capsys, "run", str(path), "--broker", "mqtt://127.0.0.1:9", "--quiet")
    assert ran.code == 2
    err = ran.err
    assert err.startswith("npcsim: error: ") and message in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"\xff\xfe[scenario]", "not UTF-8 text"),
        (b"[scenario]\nname = 'x'\n[scenario]\n", "not valid TOML"),
        (b"x = " + b"[" * 5000 + b"]" * 5000, "evil.toml"),
        (b"[scenario]\nname = 1979-05-27T07:32:00Z\n", "name"),
    ],
)
def test_hostile_scenario_bytes_give_a_scenario_error(data: bytes, message: str) -> None:
    from sim.errors import ScenarioError

    with pytest.raises(ScenarioError, match=message):
        parse_scenario(data, source="evil.toml")


@pytest.mark.mosquitto
async def test_one_inbox_subscription_serves_every_local_agent(mosquitto: MosquittoProcess) -> None:
    """Inboxes use one wildcard subscription; another shard's inbox traffic is ignored, not
    counted as malformed, and each local agent still gets exactly its own events."""
    from sim.bus import BusConfig, open_bus
    from sim.protocol.outbox import Outbox
    from sim.wire import topics
    from sim.wire.events import Speech

    def speech(n: int, to: str) -> Speech:
        return Speech(id=f"r:p:0:{n}", tick=0, speaker="p", to=to, text=f"line {n}")

    async with open_bus(BusConfig(broker=mosquitto.address, run="r", shard="0")) as local, \
            open_bus(BusConfig(broker=mosquitto.address, run="r", shard="1")) as other:
        await local.listen_inboxes([f"a{i}" for i in range(3)])
        await local.listen_inboxes(["a3"])
        await other.listen_inboxes(["b0"])
        outbox = Outbox("0")
        for n, to in enumerate(["a0", "b0", "a3", "a0"]):
            outbox.emit(topics.agent_inbox("r", to), speech(n, to))
        for batch in outbox.flush(0):
            await local.publish(batch.topic, batch.payload)
        await eventually(
            lambda: len(local.mail.mailbox("a0")) == 2 and len(local.mail.mailbox("a3")) == 1
            and len(other.mail.mailbox("b0")) > 0,
            what="the mailboxes the buses fill",
        )
        assert [e.text for e in local.mail.mailbox("a0").drain()] == ["line 0", "line 3"]
        assert [e.text for e in local.mail.mailbox("a3").drain()] == ["line 2"]
        assert len(local.mail.mailbox("b0")) == 0 and len(other.mail.mailbox("a0")) == 0
        assert [e.text for e in other.mail.mailbox("b0").drain()] == ["line 1"]
        assert local.stats.malformed == {} and other.stats.malformed == {}


async def test_a_large_scenario_is_parsed_in_a_child_process_and_comes_back_whole(tmp_path: Path) -> None:
    """The parser holds the GIL for seconds on a large file: it runs in a child process, and
    what comes back is the scenario the parser made, or its error, word for word."""
    from sim.errors import ScenarioError
    from sim.scenario import load_scenario, read_scenario
    from sim.shard._startup import CHILD_PARSE_BYTES, load_scenario_in_thread

    text = generate_scenario(npcs=40_000, locations=50, seed=2)
    path = tmp_path / "large.toml"
    path.write_text(text)
    assert path.stat().st_size > CHILD_PARSE_BYTES
    scenario, read = await load_scenario_in_thread(path)
    assert scenario == load_scenario(path)
    assert read == read_scenario(path)
    bad = tmp_path / "bad.toml"
    bad.write_text(text + '\n[[npcs]]\nid = "n0"\nname = "again"\nlocation = "nowhere"\nsystem_prompt = "x"\n')
    with pytest.raises(ScenarioError) as direct:
        load_scenario(bad)
    with pytest.raises(ScenarioError) as through_the_child:
        await load_scenario_in_thread(bad)
    assert str(through_the_child.value) == str(direct.value)


class _Noticing:
    """A decoder that calls `then` after each decode: the moment a frame of the child's came back."""

    def __init__(self, decoder: Any, then: Callable[[], None]) -> None:
        self._decoder, self._then = decoder, then

    def decode(self, payload: bytes) -> Any:
        value = self._decoder.decode(payload)
        self._then()
        return value


async def test_a_parse_cancelled_while_its_frames_stream_back_ends_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stop while the child hands the scenario back, the loop busy and the pipe full: the
    child is killed and the start-up ends at once. (At a million NPCs a stop 15 s into loading
    waited forever for the killed child: its exit is seen only with its pipes at their end,
    so what it sent is now read to the end first. This smaller case did not hang before.)"""
    import asyncio

    import sim.shard._startup as startup

    path = tmp_path / "large.toml"
    path.write_text(generate_scenario(npcs=40_000, locations=50, seed=2))
    task: asyncio.Task[Any] = asyncio.create_task(startup.load_scenario_in_thread(path))
    loop = asyncio.get_running_loop()

    def busy_then_stop() -> None:
        elapse_sync(0.3)  # the subject: a busy loop, while the child fills the pipe
        loop.call_soon(task.cancel)

    monkeypatch.setattr(startup, "_NPCS_DECODER", _Noticing(startup._NPCS_DECODER, busy_then_stop))
    started = time.monotonic()
    async with asyncio.timeout(20):
        with pytest.raises(asyncio.CancelledError):
            await task
    assert time.monotonic() - started < 20


async def test_a_parse_stopped_and_continued_comes_back_whole(tmp_path: Path) -> None:
    """Ctrl-Z then fg (SIGSTOP, SIGCONT) while the child writes its frames cuts its writes
    short; every byte still arrives, in order (before, some went through sys.stdout's buffer
    out of place and the parent decoded a corrupt frame)."""
    import asyncio

    import psutil

    from sim.scenario import load_scenario
    from sim.shard._startup import load_scenario_in_thread

    path = tmp_path / "large.toml"
    path.write_text(generate_scenario(npcs=40_000, locations=50, seed=3))
    task = asyncio.create_task(load_scenario_in_thread(path))
    stops = 0
    while not task.done():
        for child in psutil.Process().children():
            with contextlib.suppress(psutil.NoSuchProcess):
                child.send_signal(signal.SIGSTOP)
                await elapse(0.002)  # the subject: a child stopped a moment
                child.send_signal(signal.SIGCONT)
                stops += 1
        await elapse(0.005)  # the subject: running a moment between stops
    scenario, _ = await task
    assert stops > 10
    assert scenario == load_scenario(path)
