"""The files beside a store are opened without following links and only when they are this user's.

Planted in a shared directory: a lock link made a run write its pid and command line into the
victim; a key link handed the run a key the planter knows; a dangling key link was a traceback;
a store anyone could write was used without a word.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sim.broker import BrokerInfo
from sim.errors import NpcsimError, StoreError
from sim.mqtt import BrokerAddress
from sim.protocol.seal import MIN_KEY_BYTES
from sim.shard._trust import run_key_for
from sim.store import arrivals_path, open_store, read_arrivals
from tests.helpers import VILLAGE, npcsim_in_process

AUTO = BrokerInfo(address=BrokerAddress(host="127.0.0.1", port=1), worker=BrokerAddress(host="127.0.0.1", port=1),
                  protocol=5, kind="mosquitto")
NOBODY = 65534


def key_path(db: Path) -> Path:
    return db.with_name(db.name + ".key")


async def test_a_planted_lock_link_is_refused_and_its_target_untouched(tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    db = tmp_path / "run.db"
    db.with_name("run.db.lock").symlink_to(victim)
    with pytest.raises(StoreError, match="writer lock is a symbolic link"):
        async with open_store(db):
            pass
    assert victim.read_text() == "precious\n"


async def test_a_dangling_lock_link_is_refused_and_nothing_is_created(tmp_path: Path) -> None:
    db = tmp_path / "run.db"
    db.with_name("run.db.lock").symlink_to(tmp_path / "made-by-the-run")
    with pytest.raises(StoreError, match="symbolic link"):
        async with open_store(db):
            pass
    assert not (tmp_path / "made-by-the-run").exists()


def test_a_planted_key_link_is_refused(tmp_path: Path) -> None:
    attacker = tmp_path / "attacker.key"
    attacker.write_bytes(b"k" * MIN_KEY_BYTES)
    attacker.chmod(0o600)
    db = tmp_path / "run.db"
    key_path(db).symlink_to(attacker)
    with pytest.raises(StoreError, match="run key kept with the store is a symbolic link"):
        run_key_for(None, AUTO, db)


def test_a_dangling_key_link_is_one_error_not_a_traceback(tmp_path: Path) -> None:
    db = tmp_path / "run.db"
    key_path(db).symlink_to(tmp_path / "nowhere.key")
    with pytest.raises(StoreError, match="symbolic link"):
        run_key_for(None, AUTO, db)


def test_the_kept_key_is_made_then_read_back_and_refused_when_others_may_read_it(tmp_path: Path) -> None:
    db = tmp_path / "run.db"
    made, again = run_key_for(None, AUTO, db), run_key_for(None, AUTO, db)
    assert made is not None and again is not None and again.secret == made.secret
    key_path(db).chmod(0o644)
    with pytest.raises(NpcsimError, match="readable by others"):
        run_key_for(None, AUTO, db)


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")
def test_a_key_of_another_user_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "run.db"
    run_key_for(None, AUTO, db)
    os.chown(key_path(db), NOBODY, NOBODY)
    with pytest.raises(StoreError, match=f"belongs to uid {NOBODY}"):
        run_key_for(None, AUTO, db)


@pytest.mark.parametrize("mode", [0o666, 0o664, 0o646])
async def test_a_store_others_may_write_is_refused(tmp_path: Path, mode: int) -> None:
    db = tmp_path / "run.db"
    async with open_store(db):
        pass
    db.chmod(mode)
    with pytest.raises(StoreError, match=r"writable by .*chmod go-w"):
        async with open_store(db):
            pass


async def test_a_store_that_is_a_link_is_refused(tmp_path: Path) -> None:
    real = tmp_path / "real.db"
    async with open_store(real):
        pass
    (tmp_path / "link.db").symlink_to(real)
    with pytest.raises(StoreError, match="store is a symbolic link"):
        async with open_store(tmp_path / "link.db"):
            pass


async def test_a_planted_arrivals_link_is_refused(tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    db = tmp_path / "run.db"
    arrivals_path(db).symlink_to(victim)
    with pytest.raises(StoreError, match="arrivals journal is a symbolic link"):
        read_arrivals(db, None)
    with pytest.raises(StoreError, match="symbolic link"):
        async with open_store(db):
            pass
    assert victim.read_text() == "precious\n"


def test_the_command_line_says_it_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "run.db"
    key_path(db).symlink_to(tmp_path / "nowhere.key")
    ran = npcsim_in_process(capsys, "run", str(VILLAGE), "--ticks", "1", "--broker", "auto", "--db", str(db))
    assert ran.code != 0
    assert "Traceback" not in ran.err and "symbolic link" in ran.err, ran.err
    assert len([line for line in ran.err.splitlines() if "symbolic link" in line]) == 1
