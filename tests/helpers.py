"""What the tests share: where things are, waiting for a condition, a private Mosquitto, small
worlds, and running `npcsim`.

- Waiting: `await eventually(condition, what=...)` polls a condition (plain or async) until it
  holds and returns what it gave, or fails saying what never happened. A test never sleeps
  for a fixed time in place of a condition; where the time itself is the subject (an outage
  of 2.5 s, a shard started seconds later) it calls `elapse` (or `elapse_sync`) and says
  why in a comment, and where a shard's time is the subject the test runs on
  `sim.shard.VirtualClock`. tests/test_layout.py holds every other test module to this.
- Brokers: `MosquittoProcess` (the `mosquitto` fixture in conftest.py starts one per test).
- Worlds: the village, `small_world(...)` for the few-NPC worlds tests write by hand, and
  `generated_world(...)`, the 200-NPC world the determinism tests run.
- Stores: `audit(db)`, what a run's audit says (ids, prompt digests, lines), to compare runs.
- Commands: `start_npcsim` (asyncio), `popen_npcsim` and `run_npcsim` (blocking) run `npcsim ...` as a child process
  (this interpreter, this worktree's code), `ended` waits for one with a timeout and kills
  it if need be, `read_until` reads its output up to a line; `npcsim_in_process` calls
  `sim.cli.main` in the test's process. `NPCSIM` is the package's own console script, for
  the tests of what a user's shell sees (pipes, the README), with `env_for` giving such a
  child a run directory of the test's own.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import json
import os
import shutil
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TypeVar

import pytest

from sim.broker import loopback_interface
from sim.cli import main
from sim.generate import generate_scenario, write_scenario
from sim.mqtt import BrokerAddress
from sim.store import open_reader

__all__ = [
    "BROKER_CONFIG",
    "IN_CI",
    "NPCSIM",
    "TOWN",
    "REPO",
    "VILLAGE",
    "MosquittoProcess",
    "Ran",
    "SmallNpc",
    "audit",
    "committed_tick",
    "elapse",
    "elapse_sync",
    "ended",
    "env_for",
    "eventually",
    "eventually_sync",
    "fingerprint",
    "free_port",
    "generated_world",
    "npcsim_in_process",
    "popen_npcsim",
    "read_until",
    "require_mosquitto",
    "run_npcsim",
    "small_world",
    "start_npcsim",
    "terminate",
]

T = TypeVar("T")

REPO = Path(__file__).resolve().parent.parent
BROKER_CONFIG = REPO / "broker-config"
VILLAGE = str(REPO / "scenarios" / "village.toml")
TOWN = str(REPO / "scenarios" / "town-day.toml")
IN_CI = os.environ.get("CI", "").lower() == "true"

# Generous by default: the machine that runs the tests is shared, and a condition that holds
# returns at once however long the limit is.
WITHIN_S = 30.0


# --- waiting for a condition --------------------------------------------------------------


def _failure(what: str, within: float, last: object) -> AssertionError:
    shown = repr(last)
    return AssertionError(f"{what}: not within {within:g} s (last seen: {shown[:300]})")


async def eventually(
    condition: Callable[[], T] | Callable[[], Awaitable[T]],
    *,
    what: str,
    within: float = WITHIN_S,
    every: float = 0.01,
) -> T:
    """Until `condition()` (or the awaitable it returns) gives something truthy; that value.

    It is looked at first at once and then every `every` seconds; after `within` seconds
    without it the test fails, naming `what` and the last value seen.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while True:
        value = condition()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if loop.time() >= deadline:
            raise _failure(what, within, value)
        await asyncio.sleep(every)  # the poll's interval, not a wait for anything


def eventually_sync(condition: Callable[[], T], *, what: str, within: float = WITHIN_S, every: float = 0.05) -> T:
    """`eventually` for code without an event loop (a thread, a fixture): blocks between looks."""
    deadline = time.monotonic() + within
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise _failure(what, within, value)
        time.sleep(every)  # the poll's interval, not a wait for anything


async def elapse(seconds: float) -> None:
    """Let `seconds` of real time pass, where the time itself is the test's subject (a broker
    away longer than a timeout, a batch's linger, a flood spread out): never in place of a
    condition, which `eventually` waits for. The caller says why in a comment."""
    await asyncio.sleep(seconds)


def elapse_sync(seconds: float) -> None:
    """`elapse` for code without an event loop: blocks."""
    time.sleep(seconds)


# --- files --------------------------------------------------------------------------------


def committed_tick(db: Path) -> int:
    """The last tick a store file holds committed, read while its writer runs (-1: none yet)."""
    if not db.exists():
        return -1
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1) as conn:
            row = conn.execute("SELECT value FROM meta WHERE key = 'last_tick'").fetchone()
    except sqlite3.Error:
        return -1
    return -1 if row is None else int(row[0])


def fingerprint(path: Path) -> tuple[bytes, list[str]]:
    """A file's digest and the names beside it: what a read-only command must leave as it was."""
    return hashlib.sha256(path.read_bytes()).digest(), sorted(p.name for p in path.parent.iterdir())


def audit(db: Path) -> set[tuple[str, str, str]]:
    """A store's audit as (id, prompt digest, line): equal for two runs that said the same."""
    with open_reader(db) as reader:
        return {(r.id, r.prompt_sha256, r.line) for r in reader.audit_records()}


# --- a private Mosquitto ------------------------------------------------------------------


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def require_mosquitto() -> str:
    """The mosquitto binary; skipped locally without it, a failure in CI."""
    path = shutil.which("mosquitto") or next(
        (p for p in ("/usr/sbin/mosquitto", "/usr/local/sbin/mosquitto") if os.access(p, os.X_OK)), None
    )
    if path is None:
        if IN_CI:
            pytest.fail("mosquitto is not installed, and CI=true: tests that need it must run")
        pytest.skip("mosquitto is not installed")
    return path


def terminate(proc: subprocess.Popen[bytes], within: float = 5.0) -> None:
    """SIGTERM a child that still runs, and SIGKILL it when it has not ended within `within` seconds."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=within)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=within)


class MosquittoProcess:
    """A private Mosquitto from broker-config/ that a test can stop and start again; it also
    speaks MQTT over WebSockets on `ws_port`, for browser clients."""

    def __init__(self, binary: str, workdir: Path, config: str = "dev.conf") -> None:
        self.binary = binary
        self.port = free_port()
        self.ws_port = free_port()
        self.config_path = workdir / f"mosquitto-{self.port}.conf"
        body = (BROKER_CONFIG / config).read_text()
        self.config_path.write_text(
            f"listener {self.port} 127.0.0.1\n"
            f"listener {self.ws_port} {loopback_interface()}\nprotocol websockets\n{body}"
        )
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"mqtt://127.0.0.1:{self.port}"

    @property
    def address(self) -> BrokerAddress:
        return BrokerAddress(host="127.0.0.1", port=self.port)

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.ws_port}"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [self.binary, "-c", str(self.config_path)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        try:
            eventually_sync(self._listening, what=f"mosquitto listening on port {self.port}", within=10)
        except BaseException:
            self.stop()
            raise

    def _listening(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            err = self.proc.stderr.read().decode() if self.proc.stderr else ""
            raise RuntimeError(f"mosquitto exited at start: {err}")
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                return True
        except OSError:
            return False

    def kill(self) -> None:
        """kill -9: the broker dies as in a crash (nothing flushed, every session lost)."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(timeout=5)
            if self.proc.stderr:
                self.proc.stderr.close()
        self.proc = None

    def stop(self) -> None:
        if self.proc is not None:
            terminate(self.proc)
        if self.proc is not None and self.proc.stderr:
            self.proc.stderr.close()
        self.proc = None


# --- worlds -------------------------------------------------------------------------------


@dataclass(frozen=True)
class SmallNpc:
    """One NPC of a small world: named after its id (`a` is "A", "You are A.")."""

    id: str
    ambient_chance: float = 0.0


def small_world(
    name: str,
    npcs: Sequence[SmallNpc],
    *,
    seed: int | None = None,
    scripts: Mapping[str, Sequence[tuple[int, str, str]]] | None = None,
    location: str = "square",
) -> str:
    """A scenario's TOML: `npcs` on one `location`, and players' scripts as {player: [(tick, to, text)]}."""
    toml = ["[scenario]", f"name = {json.dumps(name)}"]
    if seed is not None:
        toml.append(f"seed = {seed}")
    toml += ["[[locations]]", f"id = {json.dumps(location)}"]
    for npc in npcs:
        display = npc.id.upper()
        toml += [
            "[[npcs]]",
            f"id = {json.dumps(npc.id)}",
            f"name = {json.dumps(display)}",
            f"location = {json.dumps(location)}",
            f"system_prompt = {json.dumps(f'You are {display}.')}",
            f"ambient_chance = {npc.ambient_chance!r}",
        ]
    for player, lines in (scripts or {}).items():
        said = ", ".join(
            f"{{ tick = {tick}, to = {json.dumps(to)}, text = {json.dumps(text)} }}" for tick, to, text in lines
        )
        toml += ["[[players]]", f"id = {json.dumps(player)}", f"script = [ {said} ]"]
    return "\n".join(toml) + "\n"


def generated_world(directory: Path) -> str:
    """The generated world the determinism tests run: 200 NPCs on 12 places, seed 5; its path."""
    return str(write_scenario(directory / "generated.toml", npcs=200, locations=12, seed=5))


RECALL_SECRETS = (
    # (tick told, npc, what the player said, tick asked, the question)
    (3, "n0", "Keep this secret: I buried the silver relic under the old oak by the mill.", 60,
     "Where did I say I buried the silver relic?"),
    (4, "n1", "Tell no one: the smuggler's boat hides in the reeds below the weir.", 62,
     "Where does the smuggler's boat hide?"),
    (5, "n2", "Between us: the mayor's ledger is behind the chapel organ.", 64, "Where is the mayor's ledger?"),
)


def recall_world(directory: Path) -> str:
    """A busy world whose NPCs recall (scored selection, `recall = 8`): 24 NPCs on 3 places,
    chatting often, so that places fold their talk into summaries within a few dozen ticks;
    a player at each of l0, l1, l2 tells an NPC a secret early and asks about it late. Its path."""
    text = generate_scenario(npcs=24, locations=3, seed=11, ambient_chance=0.3)
    players = []
    for n, (told, npc, secret, asked, question) in enumerate(RECALL_SECRETS):
        place = f"l{int(npc[1:]) % 3}"
        players.append(
            f'\n[[players]]\nid = "p{n}"\nlocation = "{place}"\nscript = [\n'
            f'  {{ tick = {told}, to = "{npc}", text = "{secret}" }},\n'
            f'  {{ tick = {asked}, to = "{npc}", text = "{question}" }},\n]\n'
        )
    memory = '\n[memory]\nselection = "scored"\n\n[memory.scored]\nrecall = 8\n'
    path = directory / "recall.toml"
    path.write_text(text + memory + "".join(players))
    return str(path)


LISTED_INTENTS = ('intents = { give_item = { item = ["lantern", "ale"] }, call_guards = {}, '
                  'tip = { coins = "integer" } }')
"""The innkeeper's allow-list in `listed_village`: `item` limited to listed values."""


def listed_village(directory: Path) -> str:
    """The village with the innkeeper's intents as LISTED_INTENTS; its path."""
    typed = 'intents = { give_item = { item = "string" }, call_guards = {} }'
    text = Path(VILLAGE).read_text()
    assert typed in text, "the village's innkeeper changed its intents"
    path = directory / "listed.toml"
    path.write_text(text.replace(typed, LISTED_INTENTS))
    return str(path)


# --- running npcsim -----------------------------------------------------------------------


NPCSIM = str(Path(sys.executable).parent / "npcsim")
"""The package's console script in this interpreter's environment: what a user's shell runs."""


def env_for(tmp_path: Path) -> dict[str, str]:
    """A child's environment with the test's own run directory (sim.attach), so that no other
    run on the machine is found, and an 80-column terminal width that a pipe must not wrap at."""
    runs = tmp_path / "xdg"
    runs.mkdir(mode=0o700, exist_ok=True)
    return {**os.environ, "XDG_RUNTIME_DIR": str(runs), "COLUMNS": "80"}


@dataclass(frozen=True)
class Ran:
    """How a command ended: its exit code and what it wrote."""

    code: int
    out: str
    err: str


_MAIN = "import sys; from sim.cli import main; sys.exit(main(sys.argv[1:]))"


def _npcsim_argv(*args: str) -> list[str]:
    """`npcsim ARGS` as a child process: this interpreter on `sim.cli.main` (this worktree's code)."""
    return [sys.executable, "-c", _MAIN, *args]


def _npcsim_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The child's environment: ours, a wide terminal (lines are not wrapped), and `env`."""
    return {**os.environ, "COLUMNS": "200", **(env or {})}


async def start_npcsim(
    *args: str,
    env: Mapping[str, str] | None = None,
    stdout: int | IO[bytes] = asyncio.subprocess.PIPE,
    stderr: int | IO[bytes] = asyncio.subprocess.PIPE,
    wrap: Sequence[str] = (),
) -> asyncio.subprocess.Process:
    """`npcsim ARGS` started as an asyncio child process, in the repository; the caller ends it.

    `wrap` is a command the child runs under (`ip netns exec NAME`: it execs, so the pid is npcsim's)."""
    return await asyncio.create_subprocess_exec(
        *wrap, *_npcsim_argv(*args), stdout=stdout, stderr=stderr, cwd=REPO, env=_npcsim_env(env)
    )


async def ended(proc: asyncio.subprocess.Process, *, within: float = 60.0, terminate: bool = False) -> Ran:
    """How a child ended (SIGTERM first when `terminate`), waited for at most `within` seconds.

    A child still running then, or when the test fails meanwhile, is killed: none outlives its test.
    """
    try:
        if terminate and proc.returncode is None:
            proc.terminate()
        try:
            async with asyncio.timeout(within):
                out, err = await proc.communicate()
        except TimeoutError:
            raise AssertionError(f"the child process {proc.pid} did not end within {within:g} s") from None
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode is not None
    text = [(b or b"").decode(errors="replace") for b in (out, err)]
    return Ran(proc.returncode, text[0], text[1])


async def read_until(stream: asyncio.StreamReader, needle: bytes, *, within: float = 30.0) -> bytes:
    """A child's output read line by line until a line holds `needle`; all it read."""
    seen = b""
    async with asyncio.timeout(within):
        while needle not in seen:
            line = await stream.readline()
            assert line, f"the stream ended before {needle!r}: {seen[-2000:]!r}"
            seen += line
    return seen


def popen_npcsim(*args: str) -> subprocess.Popen[str]:
    """`npcsim ARGS` started as a blocking child process (text pipes), in the repository."""
    return subprocess.Popen(
        _npcsim_argv(*args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO, env=_npcsim_env()
    )


def run_npcsim(*args: str, within: float = 120.0) -> Ran:
    """`npcsim ARGS` run to its end as a blocking child process, in the repository; from a
    test's event loop, through `asyncio.to_thread`."""
    done = subprocess.run(
        _npcsim_argv(*args), capture_output=True, text=True, cwd=REPO, env=_npcsim_env(), timeout=within, check=False
    )
    return Ran(done.returncode, done.stdout, done.stderr)


def npcsim_in_process(capsys: pytest.CaptureFixture[str], *args: str) -> Ran:
    """`npcsim ARGS` through `sim.cli.main` in this process; argparse's exits become the code."""
    capsys.readouterr()  # what the test printed before is not the command's
    try:
        code = main(list(args))
    except SystemExit as exit_:
        code = 0 if exit_.code is None else exit_.code if isinstance(exit_.code, int) else 1
    out, err = capsys.readouterr()
    return Ran(code, out, err)
