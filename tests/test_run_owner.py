"""A run's store is its own: one writer, one run, and `--resume` with `--broker auto` keeps its key.

Whole runs, as an operator starts them: `npcsim run` processes and in-process runs on a real
Mosquitto.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import stat
import time
from pathlib import Path

import pytest

from sim.cli import main
from sim.errors import ConfigError
from sim.shard import BrokerConfig, RecordConfig, RunConfig, run
from sim.store import open_reader
from tests.helpers import (
    VILLAGE,
    MosquittoProcess,
    audit,
    committed_tick,
    eventually,
    require_mosquitto,
    run_npcsim,
    start_npcsim,
)

pytestmark = pytest.mark.mosquitto


def test_resume_with_the_default_broker_continues_the_run(tmp_path: Path) -> None:
    require_mosquitto()
    db = tmp_path / "v.db"
    first = run_npcsim("run", "village", "--db", str(db), "--ticks", "10", "--quiet")
    assert first.code == 0, first.err
    key = tmp_path / "v.db.key"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600  # the run key, kept with the store, for its owner only
    second = run_npcsim("run", "village", "--db", str(db), "--resume", "--until-tick", "20", "--quiet")
    assert second.code == 0, second.err
    assert "refused" not in second.err and "waiting for shard" not in second.err
    with open_reader(db) as reader:
        assert reader.last_tick() == 19
    reference = tmp_path / "reference.db"
    assert run_npcsim("run", "village", "--db", str(reference), "--ticks", "20", "--quiet").code == 0
    assert audit(db) == audit(reference)  # ticks 10-19 ran as if the run had never stopped


def test_a_shard_that_cannot_open_its_own_messages_is_one_error_naming_the_key(tmp_path: Path) -> None:
    require_mosquitto()
    db = tmp_path / "k.db"
    assert run_npcsim("run", "village", "--db", str(db), "--ticks", "3", "--quiet").code == 0
    other = tmp_path / "other.key"
    other.write_text("another key of the right length\n")
    started = time.monotonic()
    again = run_npcsim("run", "village", "--db", str(db), "--resume", "--ticks", "3", "--run-key-file", str(other))
    assert again.code == 2 and time.monotonic() - started < 30
    assert again.err.count("\n") == 1, again.err
    assert f"sealed with another run key than --run-key-file {other}" in again.err
    assert "wait for itself" in again.err


async def test_a_second_writer_is_refused_at_once_and_the_first_run_is_whole(
    mosquitto: MosquittoProcess, tmp_path: Path
) -> None:
    db, reference = tmp_path / "tw.db", tmp_path / "reference.db"
    base = ["run", VILLAGE, "--broker", mosquitto.url, "--run-id", "tw", "--quiet"]
    assert (await asyncio.to_thread(run_npcsim, *base, "--db", str(db), "--ticks", "5")).code == 0
    first = await start_npcsim(
        *base, "--db", str(db), "--resume", "--until-tick", "40", "--tick-ms", "100", stdout=asyncio.subprocess.DEVNULL
    )
    try:
        await eventually(lambda: committed_tick(db) >= 8, what="the first run never reached tick 8")
        assert first.returncode is None
        started = time.monotonic()
        second = await asyncio.to_thread(run_npcsim, *base, "--db", str(db), "--resume", "--until-tick", "40")
        assert second.code == 2 and time.monotonic() - started < 20
        assert second.err.count("\n") == 1, second.err
        assert f"is in use by another writer (pid {first.pid}: " in second.err
        assert "--resume --until-tick 40 --tick-ms 100" in second.err  # the holder's command line
        async with asyncio.timeout(60):
            _, err = await first.communicate()
        assert first.returncode == 0, err.decode()[-2000:]
    finally:
        if first.returncode is None:
            first.kill()
            await first.wait()
    assert (await asyncio.to_thread(run_npcsim, *base, "--db", str(reference), "--until-tick", "40")).code == 0
    assert audit(db) == audit(reference)  # every record of the first run, none of the second's
    assert main(["audit", "replay", "--db", str(db)]) == 0


OWNER = "--resume: {db} belongs to run village-7 seed 7 (shard 0/1)"
EDITED = Path(VILLAGE).read_text().replace("capitalist", "socialist", 1)  # the same world, one word changed


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"seed": 8}, OWNER + ", not run village-8 seed 8 (shard 0/1)"),
        ({"run_id": "zzz"}, OWNER + ", not run zzz seed 7 (shard 0/1)"),
        ({"shard": "0/2"}, OWNER + ", not run village-7 seed 7 (shard 0/2)"),
        ({"scenario": "edited"},
         OWNER + " of scenario village (sha256 {village}), not run village-7 seed 7 (shard 0/1) of scenario village "),
    ],
    ids=["seed", "run id", "shard layout", "scenario"],
)
async def test_a_resume_of_another_run_is_refused_naming_both(
    mosquitto: MosquittoProcess, tmp_path: Path, change: dict[str, object], expected: str
) -> None:
    db = tmp_path / "v.db"
    await run(RunConfig(
        scenario=VILLAGE, ticks=3, broker=BrokerConfig(url=mosquitto.url), record=RecordConfig(db=str(db)),
    ))
    before = audit(db)
    if change.get("scenario") == "edited":
        edited = tmp_path / "village.toml"
        edited.write_text(EDITED)
        change = {"scenario": str(edited)}
    config = RunConfig(**{"scenario": VILLAGE, "ticks": 3, **change}, broker=BrokerConfig(url=mosquitto.url),
                       record=RecordConfig(db=str(db), resume=True))
    with pytest.raises(ConfigError) as refused:
        await run(config)
    with open_reader(db) as reader:
        identity = reader.run_identity()
    assert identity is not None
    assert str(refused.value).startswith(expected.format(db=db, village=identity.scenario_sha256[:12]))
    assert audit(db) == before  # nothing was run


async def test_a_store_from_before_identities_is_resumed_and_claimed(
    mosquitto: MosquittoProcess, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    db = tmp_path / "old.db"
    await run(RunConfig(
        scenario=VILLAGE, run_id="old", ticks=3, broker=BrokerConfig(url=mosquitto.url),
        record=RecordConfig(db=str(db)),
    ))
    with sqlite3.connect(db) as conn:
        conn.execute("DELETE FROM run")
    conn.close()
    caplog.set_level(logging.WARNING)
    again = await run(RunConfig(
        scenario=VILLAGE, run_id="old", ticks=3, broker=BrokerConfig(url=mosquitto.url),
        record=RecordConfig(db=str(db), resume=True),
    ))
    assert (again.first_tick, again.tick) == (3, 5)
    assert "holds ticks but no run identity: it now belongs to run old seed 7" in caplog.text
    with open_reader(db) as reader:
        identity = reader.run_identity()
    assert identity is not None and (identity.run_id, identity.seed, identity.shard) == ("old", 7, "0/1")
