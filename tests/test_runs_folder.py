"""A black box for every run: `npcsim run` without `--db` keeps its store in ./runs, prints
where, never clobbers an earlier run of the same id, `--resume` continues the newest, and
retention deletes the oldest stores there, never one a writer holds nor a file that is not
an npcsim store. `npcsim audit` and `npcsim memory show --db` read it after the run."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
from pathlib import Path

import pytest

from sim.cli.run import RUNS_ENV
from sim.store import RunIdentity, new_store, newest_store, open_reader, open_store, prune_stores
from tests.helpers import NPCSIM

pytestmark = pytest.mark.mosquitto  # `--broker auto` starts Mosquitto when it is on PATH


def npcsim(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The console script in `cwd`, with no folder for the stores set: the default, ./runs."""
    env = {k: v for k, v in os.environ.items() if k != RUNS_ENV}
    env["XDG_RUNTIME_DIR"] = str(cwd)  # its run file (sim.attach) too, apart from other runs
    return subprocess.run([NPCSIM, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120,
                          check=False)


def printed_store(err: str) -> str:
    found = re.findall(r"^store: (\S+)  \(npcsim audit list --db ", err, re.MULTILINE)
    assert len(found) == 1, err
    return str(found[0])


def identity(run_id: str, shard: str = "0/1") -> RunIdentity:
    return RunIdentity(run_id=run_id, seed=7, scenario="village", scenario_sha256="0" * 64, shard=shard, nonce="00")


async def make_store(path: Path, run_id: str | None = None, *, written: float) -> None:
    """A store (with the identity of `run_id`, when given) last written at time `written`."""
    async with open_store(path) as store:
        if run_id is not None:
            await store.keep_identity(identity(run_id))
    os.utime(path, (written, written))


def test_a_run_without_db_keeps_its_store_in_runs_and_prints_it(tmp_path: Path) -> None:
    first = npcsim(tmp_path, "run", "village", "--ticks", "12")
    assert first.returncode == 0, first.stderr
    assert printed_store(first.stderr) == "runs/village-7.db"
    assert stat.S_IMODE((tmp_path / "runs").stat().st_mode) == 0o700

    listed = npcsim(tmp_path, "audit", "list", "--db", "runs/village-7.db", "--agent", "snack_machine", "--json")
    assert listed.returncode == 0, listed.stderr
    records = [json.loads(line) for line in listed.stdout.splitlines()]
    assert records and all(r["agent"] == "snack_machine" for r in records)
    shown = npcsim(tmp_path, "audit", "show", "--db", "runs/village-7.db", records[-1]["id"])
    assert shown.returncode == 0 and records[-1]["line"] in shown.stdout, shown.stderr
    memory = npcsim(tmp_path, "memory", "show", "--db", "runs/village-7.db", "--npc", "snack_machine")
    assert memory.returncode == 0, memory.stderr
    assert memory.stdout.startswith(f"snack_machine: record {records[-1]['id']}, tick {records[-1]['tick']} (")
    assert "## Canonical facts" in memory.stdout

    second = npcsim(tmp_path, "run", "village", "--ticks", "5", "--quiet")  # the same run id: a file of its own
    assert second.returncode == 0, second.stderr
    resumed = npcsim(tmp_path, "run", "village", "--resume", "--until-tick", "8")
    assert resumed.returncode == 0, resumed.stderr
    assert printed_store(resumed.stderr) == "runs/village-7.2.db"  # the newest of the run
    for name, last in (("village-7.db", 11), ("village-7.2.db", 7)):
        with open_reader(tmp_path / "runs" / name) as reader:
            assert reader.last_tick() == last

    kept = npcsim(tmp_path, "run", "village", "--ticks", "2", "--set", "record.runs_kept=2")
    assert kept.returncode == 0, kept.stderr
    assert printed_store(kept.stderr) == "runs/village-7.3.db"
    assert "runs: deleted village-7.db (record.runs_kept=2: the newest stores stay)\n" in kept.stderr
    assert sorted(p.name for p in (tmp_path / "runs").glob("*.db")) == ["village-7.2.db", "village-7.3.db"]
    assert not list((tmp_path / "runs").glob("village-7.db*"))  # the files beside it went too


def test_resume_without_db_and_no_store_of_the_run_is_one_line(tmp_path: Path) -> None:
    ran = npcsim(tmp_path, "run", "village", "--resume", "--ticks", "2")
    assert ran.returncode == 2
    assert ran.stderr == "npcsim: error: --resume: no store of run village-7 in runs: give its --db\n"
    assert not (tmp_path / "runs").exists()


def test_a_new_store_takes_the_first_free_name_in_a_folder_made_private(tmp_path: Path) -> None:
    runs = tmp_path / "a" / "runs"
    assert new_store(runs, "v-7") == runs / "v-7.db"
    assert stat.S_IMODE(runs.stat().st_mode) == 0o700
    (runs / "v-7.db").write_bytes(b"")
    (runs / "v-7.2.db").symlink_to(tmp_path / "nowhere")  # a dangling link holds its name too
    assert new_store(runs, "v-7") == runs / "v-7.3.db"
    assert new_store(runs, "v-7.shard1") == runs / "v-7.shard1.db"


async def test_resume_finds_the_newest_store_of_the_run_and_shard(tmp_path: Path) -> None:
    await make_store(tmp_path / "a.db", "a", written=1_000)
    await make_store(tmp_path / "a.2.db", "a", written=3_000)
    await make_store(tmp_path / "a.3.db", "a.3", written=5_000)  # another run whose file looks like a's
    await make_store(tmp_path / "b.db", "a", written=4_000)
    (tmp_path / "a.4.db").write_text("not a store")
    assert newest_store(tmp_path, "a", "0/1") == tmp_path / "b.db"
    assert newest_store(tmp_path, "a", "1/2") is None
    assert newest_store(tmp_path / "missing", "a", "0/1") is None


async def test_retention_deletes_the_oldest_stores_never_a_held_one_nor_another_file(tmp_path: Path) -> None:
    for n in range(5):
        await make_store(tmp_path / f"s{n}.db", written=1_000 + n)  # s4 newest
    for beside in ("-arrivals", ".key"):
        (tmp_path / f"s0.db{beside}").write_bytes(b"")
    (tmp_path / "notes.db").write_text("my notes, not a store")
    os.utime(tmp_path / "notes.db", (1, 1))
    (tmp_path / "link.db").symlink_to(tmp_path / "s1.db")
    (tmp_path / "s0.txt").write_text("kept")

    held = tmp_path / "s1.db"
    async with open_store(held):  # a writer holds s1, the second oldest
        for file in (held, held.with_name("s1.db-wal")):
            os.utime(file, (1_001, 1_001))
        deleted = prune_stores(tmp_path, 2)
    assert deleted == [tmp_path / "s0.db", tmp_path / "s2.db"]
    left = set(os.listdir(tmp_path))
    assert {"link.db", "notes.db", "s0.txt", "s1.db", "s3.db", "s4.db"} <= left  # the rest, and what is no store
    assert not {name for name in left if name.startswith(("s0.db", "s2.db"))}  # with the files beside them
    os.utime(held, (1_001, 1_001))
    assert prune_stores(tmp_path, 2) == [held]  # no longer held
    assert prune_stores(tmp_path / "missing", 1) == []
