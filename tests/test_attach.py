"""Attaching to a run: the attach lines, the run file of a private broker, `subscribe` and
`view` without `--broker`, `subscribe --all`, and the shard error."""

from __future__ import annotations

import asyncio
import io
import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import aiomqtt
import pytest

from sim.attach import RunFile, find_runs, local_runs, password_file, published
from sim.cli import main
from sim.mqtt import BrokerAddress
from sim.shard import BrokerConfig, RunConfig, run
from tests.helpers import NPCSIM, VILLAGE, MosquittoProcess, env_for

pytestmark = pytest.mark.mosquitto


def _read_until(stream: object, pattern: str, deadline_s: float = 60.0) -> tuple[re.Match[str], list[str]]:
    lines: list[str] = []
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        line = stream.readline()  # type: ignore[attr-defined]
        if not line:
            break
        lines.append(line)
        if match := re.search(pattern, line):
            return match, lines
    raise AssertionError(f"no line matching {pattern!r} in {lines}")


def test_a_private_run_prints_how_to_attach_and_subscribe_finds_it(tmp_path: Path) -> None:
    """`subscribe --wait` started before the run waits for it, then finds its private broker;
    the run names the file of the viewer's password and never prints the password."""
    env = env_for(tmp_path)
    runs = Path(env["XDG_RUNTIME_DIR"]) / "npcsim"
    with subprocess.Popen([NPCSIM, "subscribe", "--run", "village-7", "--wait"], cwd=tmp_path, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as sub:
        try:
            _read_until(sub.stderr, r"^waiting for run village-7 to start on a private broker of this machine")
            with subprocess.Popen([NPCSIM, "run", VILLAGE, "--ticks", "100000", "--tick-ms", "100"], cwd=tmp_path,
                                  env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) as shard:
                try:
                    found, printed = _read_until(shard.stderr, r"attach: broker (mqtt://127\.0\.0\.1:\d+), "
                                                               r"read-only login viewer, its password in (\S+):")
                    url, secret = found.group(1), Path(found.group(2))
                    game_line, more = _read_until(shard.stderr, r"attach: the game system's login game, its password "
                                                                r"in (\S+) ")
                    printed += more
                    game_secret = Path(game_line.group(1))
                    (entry,) = local_runs(runs)
                    assert (entry.run, entry.url, entry.username) == ("village-7", url, "viewer")
                    assert entry.password and secret.read_text() == entry.password
                    assert secret.parent == runs and f'-P "$(cat {secret})"' in printed[-2]
                    game_password = game_secret.read_text()
                    assert game_secret.parent == runs and f'-P "$(cat {game_secret})"' in printed[-1]
                    assert not any(entry.password in line or game_password in line for line in printed)
                    assert runs.stat().st_mode & 0o777 == 0o700
                    assert all(p.stat().st_mode & 0o777 == 0o600 for p in runs.iterdir())

                    connected, _ = _read_until(sub.stderr, r"^connected to (\S+), waiting for lines")
                    assert connected.group(1) == url.replace("mqtt://", "mqtt://viewer@")
                    assert sub.stdout is not None
                    assert re.match(r"village-7 t +\d+ \w+", sub.stdout.readline())
                    sub.send_signal(signal.SIGINT)
                    sub.wait(timeout=30)
                    assert sub.returncode == 0

                    # the login in the file is read-only: it reads what is said
                    asyncio.run(_said_as_viewer(url, entry.password))
                    # the game system's login publishes its topics and reads its errors
                    asyncio.run(_refused_as_game(url, game_password))
                finally:
                    shard.send_signal(signal.SIGINT)
                    shard.wait(timeout=60)
            assert shard.returncode == 0
            assert find_runs("village-7", runs) == [] and not runs.exists()  # both files removed with the run
        finally:
            sub.kill()


async def _said_as_viewer(url: str, password: str) -> None:
    address = BrokerAddress.parse(url).with_login("viewer", password)
    async with aiomqtt.Client(address.host, address.port, username="viewer", password=password) as c:
        await c.subscribe("npcsim/village-7/agent/+/say", qos=1)
        async with asyncio.timeout(30):
            async for message in c.messages:
                assert json.loads(bytes(message.payload))["run"] == "village-7"  # type: ignore[arg-type]
                return


async def _refused_as_game(url: str, password: str) -> None:
    address = BrokerAddress.parse(url)
    async with aiomqtt.Client(address.host, address.port, username="game", password=password) as c:
        await c.subscribe("npcsim/village-7/game/error", qos=1)
        await c.publish("npcsim/village-7/game/event", b'{"location": "moon", "text": "A comet."}', qos=1)
        async with asyncio.timeout(30):
            async for message in c.messages:
                assert json.loads(bytes(message.payload))["code"] == "unknown_location"  # type: ignore[arg-type]
                return


def test_an_external_broker_run_prints_its_url_to_attach(mosquitto: MosquittoProcess,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", VILLAGE, "--broker", mosquitto.url, "--run-id", "ext", "--ticks", "2"]) == 0
    err = capsys.readouterr().err
    assert f"attach: npcsim subscribe --broker {mosquitto.url} --run ext" in err
    assert f"mosquitto_sub -h 127.0.0.1 -p {mosquitto.port} -v -t npcsim/ext/agent/+/say" in err


def test_stale_and_foreign_run_files_are_ignored(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    stale = RunFile(run="old", shard="0", url="mqtt://127.0.0.1:9", pid=2**22 + 7, started=1.0)
    runs.mkdir(mode=0o700)
    (runs / "1-dead.json").write_bytes(json.dumps({f: getattr(stale, f) for f in stale.__struct_fields__}).encode())
    (runs / "1-dead.password").write_text("old")
    (runs / "2-junk.json").write_text("{not json")
    with published(RunFile(run="live", shard="0", url="mqtt://127.0.0.1:9", username="viewer", password="pw"),
                   runs) as path:
        assert path is not None and path.stat().st_mode & 0o777 == 0o600
        assert password_file(path).read_text() == "pw" and password_file(path).stat().st_mode & 0o777 == 0o600
        assert find_runs("old", runs) == [] and not (runs / "1-dead.json").exists()
        assert not (runs / "1-dead.password").exists()
        (live,) = find_runs("live", runs)
        assert live.pid == os.getpid()
    assert find_runs("live", runs) == [] and not password_file(path).exists()
    open_to_all = tmp_path / "open"
    open_to_all.mkdir(mode=0o755)
    open_to_all.chmod(0o755)
    with published(RunFile(run="x", shard="0", url="mqtt://127.0.0.1:9"), open_to_all) as path:
        assert path is None and list(open_to_all.iterdir()) == []  # nothing kept where others can read it


def test_view_and_subscribe_say_there_is_no_such_run(tmp_path: Path, mosquitto: MosquittoProcess,
                                                    monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    assert main(["view", "--run", "nosuch-run"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("npcsim: error: --run nosuch-run: no such run on a private broker of this machine")
    assert len(err.splitlines()) == 1
    assert main(["run", VILLAGE, "--broker", mosquitto.url, "--run-id", "here", "--ticks", "1", "--quiet"]) == 0
    assert main(["view", "--broker", mosquitto.url, "--run", "nosuch-run"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"npcsim: error: --run nosuch-run: no such run on {mosquitto.url} "
                   "(no shard of it left a status there; runs there: here)")
    assert main(["subscribe", "--broker", mosquitto.url, "--run", "nosuch-run"]) == 2
    assert capsys.readouterr().err.strip() == err


def test_subscribe_to_a_run_that_is_nowhere_ends_saying_so(tmp_path: Path) -> None:
    """No run of that id here, nor on the default broker (running or not): one error line, exit 2."""
    done = subprocess.run([NPCSIM, "subscribe", "--run", "village-8"], cwd=tmp_path, env=env_for(tmp_path),
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2 and done.stdout == ""
    lines = done.stderr.splitlines()
    assert lines[0] == "no run village-8 on a private broker of this machine; trying mqtt://127.0.0.1:1883"
    assert lines[-1].startswith("npcsim: error: ") and "mqtt://127.0.0.1:1883" in lines[-1]


def test_two_runs_of_one_id_are_an_error_listing_both(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """Both are listed with their brokers; --broker of one picks it, with its viewer login."""
    from sim.cli._attach import local_login

    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    twin = [RunFile(run="twin", shard="0", url=f"mqtt://127.0.0.1:{port}", username="viewer", password=f"pw{port}")
            for port in (9, 10)]
    with published(twin[0]), published(twin[1]):
        for command in ("subscribe", "view"):
            assert main([command, "--run", "twin"]) == 2
            err = capsys.readouterr().err
            assert err.startswith("npcsim: error: --run twin: 2 runs of that id on this machine's private brokers: ")
            assert "mqtt://127.0.0.1:9 (pid " in err and "mqtt://127.0.0.1:10 (pid " in err
            assert err.rstrip().endswith("pick one with --broker URL") and len(err.splitlines()) == 1
        picked = local_login(BrokerAddress.parse("mqtt://127.0.0.1:10", env={}), "twin")
        assert (picked.username, picked.password) == ("viewer", "pw10")
        other = local_login(BrokerAddress.parse("mqtt://127.0.0.1:11", env={}), "twin")
        assert other.username is None


def test_shards_of_a_run_on_private_brokers_are_refused_at_once(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "s.db"
    started = time.monotonic()
    assert main(["run", VILLAGE, "--shard", "0/2", "--db", str(db)]) == 2
    assert time.monotonic() - started < 5 and not db.exists()
    assert capsys.readouterr().err == (
        "npcsim: error: --shard 0/2: each shard would start its own private broker: "
        "give every shard the same --broker mqtt://...\n"
    )


async def test_subscribe_all_decodes_every_topic_of_the_run(mosquitto: MosquittoProcess, tmp_path: Path) -> None:
    """On a broker without an ACL it sees the internal topics too: msgpack as JSON, signatures taken off.

    A run of one shard delivers its places' events to its own NPCs and publishes none; the
    internal topic it always publishes is the barrier's (join, then a TickDone a tick).
    """
    key = tmp_path / "run.key"
    key.write_text("k" * 32)
    sub = await asyncio.create_subprocess_exec(
        NPCSIM, "subscribe", "--broker", mosquitto.url, "--run", "all", "--all", "--json", "--wait",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env_for(tmp_path))
    assert sub.stdout is not None and sub.stderr is not None
    try:
        async with asyncio.timeout(30):
            assert (await sub.stderr.readline()).startswith(b"connected to ")
        await run(RunConfig(
            scenario=VILLAGE, run_id="all", ticks=4, broker=BrokerConfig(url=mosquitto.url, run_key_file=str(key)),
        ))
        seen: dict[str, dict[str, object]] = {}
        async with asyncio.timeout(30):
            while not {"barrier", "say"} <= {t.split("/")[2] if "/say" not in t else "say" for t in seen}:
                message = json.loads(await sub.stdout.readline())
                seen[message["topic"]] = message
    finally:
        sub.send_signal(signal.SIGINT)
        await sub.wait()
    barrier = next(m for t, m in seen.items() if t.startswith("npcsim/all/barrier/"))
    assert barrier["signed"] is True and isinstance(barrier["payload"], dict)
    assert barrier["payload"]["type"] in ("join", "done") and barrier["payload"]["shard"] == "0"
    said = next(m for t, m in seen.items() if t.endswith("/say"))
    assert said["signed"] is False and said["payload"]["run"] == "all"  # type: ignore[index]


def test_subscribe_without_a_local_run_says_where_it_tries(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from sim.cli import build_parser
    from sim.cli._terminal import Out
    from sim.cli.subscribe import broker_for

    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    note = io.StringIO()
    address, look = broker_for(build_parser().parse_args(["subscribe", "--run", "nowhere"]), Out(note))
    assert (address.url, look) == ("mqtt://127.0.0.1:1883", True)  # the run is still to be looked for there
    assert note.getvalue() == "no run nowhere on a private broker of this machine; trying mqtt://127.0.0.1:1883\n"


def test_the_viewer_password_is_printed_only_when_asked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    assert main(["run", VILLAGE, "--ticks", "1", "--show-password"]) == 0
    shown = re.search(r"read-only login viewer / (\S+): mosquitto_sub .* -u viewer -P (\S+) ", capsys.readouterr().err)
    assert shown is not None and shown.group(1) == shown.group(2)
    shared = tmp_path / "npcsim"  # a run directory others may enter: no file is kept there, the password unsaid
    shared.mkdir()
    shared.chmod(0o755)
    assert main(["run", VILLAGE, "--ticks", "1"]) == 0
    err = capsys.readouterr().err
    assert "read-only login viewer, its PASSWORD shown by npcsim run --show-password" in err
    assert "-u viewer -P PASSWORD " in err
