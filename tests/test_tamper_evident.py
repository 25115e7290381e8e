"""The black box is tamper-evident: a store edited outside npcsim, as one was with sqlite3, is
caught (issue 48, item 9).

The run: the village on a real Mosquitto with `--run-key-file`, an outside player's input, a
world-state change and a fact published while it goes; its key is then put beside the store,
as docs/store.md says to for a run started with a key file (`--broker auto` keeps it there:
the last tests). Each test edits a copy: `npcsim audit verify` and `npcsim audit replay` name
the first tick and record or input that breaks the chain, in one line; `--resume` refuses an
edited belief, an injected fact and an edited, reordered or added arrivals record, in one line.
"""

from __future__ import annotations

import asyncio
import os
import random
import shutil
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import aiomqtt
import msgspec
import pytest

from sim.protocol.outside import InputArrival
from sim.protocol.seal import RunKey
from sim.shard import BrokerConfig, RecordConfig, RunConfig, RunStats, run
from sim.store import StoreError, TamperError, arrivals_path, open_reader, open_store
from sim.wire import topics
from sim.wire.inputs import OutsideInput
from tests.audit_records import random_record
from tests.helpers import VILLAGE, MosquittoProcess, Ran, eventually, npcsim_in_process, require_mosquitto
from tests.tampering import edit, redigest, reseal

pytestmark = [pytest.mark.mosquitto, pytest.mark.timeout(300)]

RUN = "sealed"
END = 14
KEY = b"the key of the sealed village run\n"
VISITOR = b'{"to": "innkeeper", "text": "Is the ale any good tonight?"}'
WORLD = b'{"state": {"weather": "a storm from the north"}}'
FACT = b'{"npc": "innkeeper", "id": "cellar", "text": "The cellar flooded in the storm."}'


@pytest.fixture(scope="module")
def original(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The village run to END, sealed with KEY, its key then put beside the store."""
    workdir = tmp_path_factory.mktemp("sealed")
    db, key_file = workdir / "tw.db", workdir / "run.key"
    key_file.write_bytes(KEY)
    broker = MosquittoProcess(require_mosquitto(), workdir)
    broker.start()
    try:
        asyncio.run(_original(broker, db, key_file))
    finally:
        broker.stop()
    beside(db)
    return db


async def _original(broker: MosquittoProcess, db: Path, key_file: Path) -> None:
    stats = RunStats()
    config = RunConfig(scenario=VILLAGE, run_id=RUN, until_tick=END, tick_ms=60, record=RecordConfig(db=str(db)),
                       broker=BrokerConfig(url=broker.url, run_key_file=str(key_file)))
    async with asyncio.TaskGroup() as group:
        job = group.create_task(run(config, stats=stats))
        await eventually(lambda: stats.tick >= 4, what="the run under way", within=120)
        async with aiomqtt.Client("127.0.0.1", broker.port) as client:
            for topic, payload in ((topics.player_input(RUN, "visitor"), VISITOR), (topics.world_state(RUN), WORLD),
                                   (topics.game_fact(RUN), FACT)):
                await client.publish(topic, payload, qos=1)
        await job
    assert stats.tick == END - 1, "the original stopped early (a slow machine: lower tick_ms)"


def beside(db: Path, key: bytes = KEY) -> None:
    """The run key beside the store, as `--broker auto` keeps it (mode 0600)."""
    kept = db.with_name(db.name + ".key")
    kept.write_bytes(key)
    kept.chmod(0o600)


@pytest.fixture
def db(original: Path, tmp_path: Path) -> Iterator[Path]:
    """A copy of the original store, with its key beside it, for one test to edit."""
    copy = tmp_path / "tw.db"
    shutil.copyfile(original, copy)
    copy.chmod(0o644)
    beside(copy)
    yield copy


def query(db: Path, sql: str) -> list[tuple[object, ...]]:
    with sqlite3.connect(db) as conn:
        rows = conn.execute(sql).fetchall()
    conn.close()
    return rows


def audit(capsys: pytest.CaptureFixture[str], command: str, db: Path) -> Ran:
    jobs = ("--jobs", "1") if command == "replay" else ()
    return npcsim_in_process(capsys, "audit", command, "--db", str(db), *jobs)


def broken(capsys: pytest.CaptureFixture[str], db: Path) -> str:
    """What `audit verify` and `audit replay` both say of a store that does not verify: one line, exit 1."""
    verified, replayed = audit(capsys, "verify", db), audit(capsys, "replay", db)
    assert verified.code == replayed.code == 1, (verified, replayed)
    assert verified.out == replayed.out and verified.out.count("\n") == 1, (verified, replayed)
    return verified.out.strip()


def first_records(db: Path, n: int) -> list[tuple[str, int, int]]:
    """The first `n` records in the chain's order: (id, tick of their commit, commit)."""
    rows = query(db, "SELECT a.id, c.tick, c.n FROM audit AS a JOIN chain AS c ON c.n = a.link ORDER BY a.link, a.id")
    assert len(rows) >= n
    return [(str(i), int(t), int(n_)) for i, t, n_ in rows[:n]]  # type: ignore[call-overload]


def at(db: Path, tick: int, commit: int) -> str:
    return f"{db}: the chain breaks at tick {tick} (commit {commit})"


def test_an_untouched_run_verifies_and_replays(db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (records,) = query(db, "SELECT count(*) FROM audit")[0]
    assert query(db, "SELECT count(*) FROM inputs")[0][0] >= 2 and query(db, "SELECT count(*) FROM world_changes")
    verified = audit(capsys, "verify", db)
    [(head,)] = query(db, "SELECT hex(head) FROM chain ORDER BY n DESC LIMIT 1")
    assert verified.code == 0 and verified.out.count("\n") == 2, verified
    assert verified.out.splitlines()[1].startswith(f"head of the chain: {str(head).lower()} (kept elsewhere")
    assert verified.out.startswith(f"{db}: verified: ")
    assert f"through tick {END - 1}: {records} records, " in verified.out
    assert "sealed with the run key (tw.db.key)" in verified.out
    replayed = audit(capsys, "replay", db)
    assert replayed.code == 0 and "all byte-identical" in replayed.out, replayed


def test_an_edited_input_is_named(db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    [(tick, seq, link)] = query(db, "SELECT tick, seq, link FROM inputs WHERE input ->> 'player' = 'visitor'")
    [(commit_tick,)] = query(db, f"SELECT tick FROM chain WHERE n = {link}")
    edit(db, "UPDATE inputs SET input = replace(input, 'ale', 'wine') WHERE input ->> 'player' = 'visitor'")
    assert broken(capsys, db) == (f"{at(db, int(commit_tick), int(link))}: inputs row (tick {tick}, seq {seq}) does "  # type: ignore[call-overload]
                                  "not match its seal: it was edited or added outside npcsim")


def test_an_edited_line_is_named(db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    [(record, tick, commit)] = first_records(db, 1)
    edit(db, f"UPDATE audit SET line = 'I never said that.' WHERE id = '{record}'")
    assert broken(capsys, db) == (f"{at(db, tick, commit)}: record {record!r} does not match its digest: it was "
                                  "edited or added outside npcsim")


def test_two_swapped_record_blobs_are_named(db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (first, tick, commit), (second, _, _) = first_records(db, 2)
    edit(db, f"CREATE TEMP TABLE blobs AS SELECT id, record FROM audit WHERE id IN ('{first}', '{second}')",
         f"UPDATE audit SET record = (SELECT record FROM blobs WHERE blobs.id = CASE audit.id WHEN '{first}'"
         f" THEN '{second}' ELSE '{first}' END) WHERE id IN ('{first}', '{second}')")
    assert query(db, f"SELECT count(DISTINCT record) FROM audit WHERE id IN ('{first}', '{second}')") == [(2,)]
    assert broken(capsys, db) == (f"{at(db, tick, commit)}: record {first!r} does not match its digest: it was "
                                  "edited or added outside npcsim")


def test_a_deleted_record_is_named(db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    [(record, tick, commit)] = first_records(db, 1)
    [(wrote,)] = query(db, f"SELECT records FROM chain WHERE n = {commit}")
    edit(db, f"DELETE FROM audit WHERE id = '{record}'")
    noun = "record" if wrote == 1 else "records"
    assert broken(capsys, db) == (f"{at(db, tick, commit)}: 1 of the {wrote} {noun} it wrote is missing: deleted "
                                  "outside npcsim")


def test_a_copied_record_is_named_and_so_is_one_whose_digest_was_computed_again(
    db: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    [(record, tick, commit)] = first_records(db, 1)
    copy = record + ".copy"
    columns = "run_id, agent, tick, backend, model, fallback, line, record, link, digest"
    edit(db, f"INSERT INTO audit (id, {columns}) SELECT '{copy}', {columns} FROM audit WHERE id = '{record}'")
    assert broken(capsys, db) == (f"{at(db, tick, commit)}: record {copy!r} does not match its digest: it was "
                                  "edited or added outside npcsim")
    redigest(db, copy)  # a record's digest takes no key: anyone can compute it; the commit still counts its records
    assert broken(capsys, db) == f"{at(db, tick, commit)}: it holds 1 record more than it wrote: added outside npcsim"


def test_an_edited_world_change_is_named(db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    [(tick, link)] = query(db, "SELECT tick, link FROM world_changes WHERE state ->> 'weather' LIKE '%storm%'")
    [(commit_tick,)] = query(db, f"SELECT tick FROM chain WHERE n = {link}")
    edit(db, f"UPDATE world_changes SET state = '{{\"weather\": \"a calm sea\"}}' WHERE tick = {tick}")
    assert broken(capsys, db) == (f"{at(db, int(commit_tick), int(link))}: world_changes row (tick {tick}) does not "  # type: ignore[call-overload]
                                  "match its seal: it was edited or added outside npcsim")


# --- --resume: what a resumed shard reads is checked against its seals


def resume(capsys: pytest.CaptureFixture[str], broker: MosquittoProcess, db: Path) -> Ran:
    key_file = db.with_name("run.key")
    key_file.write_bytes(KEY)
    return npcsim_in_process(capsys, "run", VILLAGE, "--broker", broker.url, "--run-id", RUN, "--run-key-file",
                             str(key_file), "--db", str(db), "--resume", "--ticks", "2", "--quiet")


def refused(ran: Ran) -> str:
    """The one line a refused start says."""
    assert ran.code == 2 and ran.err.count("\n") == 1, ran
    assert ran.err.startswith("npcsim: error: "), ran
    return ran.err.strip().removeprefix("npcsim: error: ")


async def journal(db: Path, *texts: str) -> list[tuple[int, bytes]]:
    """Outside inputs in the store's arrivals journal for the tick after its last, as a run
    killed before that tick committed leaves them; each record's offset and bytes."""
    async with open_store(db) as store:
        await store.seal_with(RunKey(KEY.strip()))
        tick = (store.last_tick or 0) + 1
        for text in texts:
            store.arrivals.add(InputArrival(tick=tick, input=OutsideInput(player="visitor", to="innkeeper", text=text)))
    data, records, offset = arrivals_path(db).read_bytes(), [], 0
    while offset < len(data):
        size = 4 + int.from_bytes(data[offset : offset + 4], "big") + 16
        records.append((offset, data[offset : offset + size]))
        offset += size
    return records


async def test_a_resume_takes_an_untouched_store_and_its_journal(
    db: Path, mosquitto: MosquittoProcess, capsys: pytest.CaptureFixture[str]
) -> None:
    await journal(db, "A room for the night, please.")
    ran = await asyncio.to_thread(resume, capsys, mosquitto, db)
    assert ran.code == 0, ran
    with open_reader(db) as reader:
        assert (END, "A room for the night, please.") in [(t, getattr(i, "text", None)) for t, i in reader.all_inputs()]
    assert audit(capsys, "verify", db).code == 0


@pytest.mark.parametrize(("change", "named"), [
    ("UPDATE beliefs SET text = 'The player is a coward.' WHERE n = (SELECT min(n) FROM beliefs)",
     "SELECT 'beliefs row (agent ' || quote(agent) || ', id ' || quote(id) || ')' FROM beliefs ORDER BY n LIMIT 1"),
    ("INSERT INTO facts (agent, id, text, writer, mac) VALUES ('innkeeper', 'crown', 'The king is dead.',"
     " 'game', 0)", "SELECT 'facts row (agent ''innkeeper'', id ''crown'')'"),
    ("UPDATE facts SET withdrawn = 1 WHERE id = 'cellar'", "SELECT 'facts row (agent ''innkeeper'', id ''cellar'')'"),
])
async def test_a_resume_refuses_an_edited_or_injected_row_naming_it(
    db: Path, mosquitto: MosquittoProcess, capsys: pytest.CaptureFixture[str], change: str, named: str
) -> None:
    [(row,)] = query(db, named)
    edit(db, change)
    before = query(db, "SELECT value FROM meta WHERE key = 'last_tick'")
    assert refused(await asyncio.to_thread(resume, capsys, mosquitto, db)) == (
        f"{db}: {row} does not match its seal: it was edited or added outside npcsim")
    assert query(db, "SELECT value FROM meta WHERE key = 'last_tick'") == before  # nothing was run


@pytest.mark.parametrize("change", ["edited", "reordered", "added"])
async def test_a_resume_refuses_an_edited_reordered_or_added_arrivals_record(
    db: Path, mosquitto: MosquittoProcess, capsys: pytest.CaptureFixture[str], change: str
) -> None:
    (_, first), (at_second, second) = await journal(db, "Is the ale cold?", "And the bread?")
    path = arrivals_path(db)
    if change == "edited":
        path.write_bytes(first.replace(b"ale", b"rum") + second)
        record, offset = 1, 0
    elif change == "reordered":
        path.write_bytes(second + first)
        record, offset = 1, 0
    else:
        path.write_bytes(first + first + second)
        record, offset = 2, at_second
    assert refused(await asyncio.to_thread(resume, capsys, mosquitto, db)) == (
        f"{path}: record {record} (at byte {offset}) does not match its seal: the journal was edited, reordered or "
        "added to outside npcsim; refusing to take it")


# --- rotation, a store without its key, a forger


def test_a_rotated_store_verifies_and_a_deletion_passed_off_as_a_rotation_does_not(
    db: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (before,) = query(db, "SELECT count(*) FROM audit WHERE tick <= 6")[0]
    exported = npcsim_in_process(capsys, "audit", "export", "--db", str(db), "--to-tick", "6",
                                 "--out", str(tmp_path / "early.jsonl"), "--rotate")
    assert exported.code == 0 and f"deleted {before} exported records" in exported.err, exported
    verified = audit(capsys, "verify", db)
    assert verified.code == 0 and f"({before} rotated out)" in verified.out, verified
    assert audit(capsys, "replay", db).code == 0
    [(record, tick, commit)] = first_records(db, 1)
    edit(db, f"INSERT INTO rotated (id, link, digest, mac) SELECT id, link, digest, 0 FROM audit WHERE id = '{record}'",
         f"DELETE FROM audit WHERE id = '{record}'")
    assert broken(capsys, db) == (f"{at(db, tick, commit)}: rotated row (id {record!r}) does not match its seal: it "
                                  "was edited or added outside npcsim")


def test_without_its_key_a_store_is_rotated_never_and_verified_only_as_far_as_its_digests(
    db: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db.with_name("tw.db.key").unlink()
    (records,) = query(db, "SELECT count(*) FROM audit")[0]
    rotated = npcsim_in_process(capsys, "audit", "export", "--db", str(db), "--out", str(tmp_path / "all.jsonl"),
                                "--rotate")
    assert rotated.code == 2 and "nothing is deleted: the store is sealed with a run key" in rotated.err, rotated
    assert query(db, "SELECT count(*) FROM audit") == [(records,)]
    verified = audit(capsys, "verify", db)
    assert verified.code == 1 and verified.out.startswith(f"{db}: not verified: its digests and its chain hold")
    assert "sealed with a run key that is not beside it (tw.db.key)" in verified.out
    replayed = audit(capsys, "replay", db)
    assert replayed.code == 0 and "the seals are not checked, only the digests" in replayed.err, replayed
    [(record, tick, commit)] = first_records(db, 1)
    edit(db, f"UPDATE audit SET line = 'I never said that.' WHERE id = '{record}'")
    assert broken(capsys, db).startswith(f"{at(db, tick, commit)}: record {record!r} does not match its digest")


def test_a_store_sealed_again_without_its_key_or_with_another_is_refused(
    db: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    edit(db, "UPDATE audit SET line = 'I never said that.' WHERE rowid = (SELECT min(rowid) FROM audit)")
    reseal(db)  # every digest computed again, as anyone can: but the store was sealed with a key
    verified = audit(capsys, "verify", db)
    assert verified.code == 1 and verified.out.strip() == (
        f"{db}: its seals say it was sealed without a run key, yet tw.db.key is at hand: it may have been sealed "
        "again without it"), verified
    reseal(db, RunKey(b"a key the forger made up"))
    verified = audit(capsys, "verify", db)
    assert verified.code == 2 and f"{db} is sealed with another run key than tw.db.key" in verified.err, verified


async def test_a_store_sealed_without_a_key_catches_an_edit_not_a_forger(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """What the docs say of a run with no key at all: digests, which anybody can compute again."""
    db = tmp_path / "open.db"
    async with open_store(db) as store:
        await store.resume.record_input(1, OutsideInput(seq=0, player="p", to="innkeeper", text="hello"))
        await store.end_tick(1)
    verified = audit(capsys, "verify", db)
    assert verified.code == 0 and "sealed without a run key: digests, which catch an accidental edit, not a forger" \
        in verified.out, verified
    edit(db, "UPDATE inputs SET input = replace(input, 'hello', 'farewell')")
    assert broken(capsys, db) == (f"{db}: the chain breaks at tick 1 (commit 1): inputs row (tick 1, seq 0) does not "
                                  "match its seal: it was edited or added outside npcsim")
    reseal(db)
    assert audit(capsys, "verify", db).code == 0


async def test_a_store_sealed_with_a_key_is_used_only_with_it(tmp_path: Path) -> None:
    db = tmp_path / "keyed.db"
    async with open_store(db) as store:
        await store.seal_with(RunKey(KEY.strip()))
        await store.end_tick(0)
    for key, refusal in ((None, "is sealed with a run key, and this start has none"),
                         (RunKey(b"another key of the right length"), "is sealed with another run key than a run key")):
        with pytest.raises(StoreError, match=refusal):
            async with open_store(db) as store:
                await store.seal_with(key)
    with pytest.raises(StoreError, match="the store is sealed with a run key: give it"):
        async with open_store(db) as store:
            await store.end_tick(1)
    async with open_store(db) as store:
        await store.seal_with(RunKey(KEY.strip()))
        await store.end_tick(1)
    edit(db, "UPDATE meta SET value = 7 WHERE key = 'last_tick'")
    with pytest.raises(TamperError, match="meta row \\(key 'last_tick'\\) does not match its seal"):
        async with open_store(db) as store:
            await store.seal_with(RunKey(KEY.strip()))


# --- --broker auto: the key kept beside the store seals it


def test_a_broker_auto_run_verifies_with_its_kept_key_and_refuses_an_edited_belief_on_resume(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    require_mosquitto()
    db = tmp_path / "auto.db"
    ran = npcsim_in_process(capsys, "run", VILLAGE, "--ticks", "4", "--db", str(db), "--broker", "auto", "--quiet")
    assert ran.code == 0 and db.with_name("auto.db.key").exists(), ran
    verified = audit(capsys, "verify", db)
    assert verified.code == 0 and "sealed with the run key (auto.db.key)" in verified.out, verified
    [(agent, belief)] = query(db, "SELECT agent, id FROM beliefs ORDER BY n LIMIT 1")
    edit(db, f"UPDATE beliefs SET confidence = 1.0 - confidence WHERE agent = '{agent}' AND id = '{belief}'")
    again = npcsim_in_process(capsys, "run", VILLAGE, "--ticks", "2", "--db", str(db), "--broker", "auto", "--resume",
                              "--quiet")
    assert refused(again) == (f"{db}: beliefs row (agent {agent!r}, id {belief!r}) does not match its seal: it was "
                              "edited or added outside npcsim")
    assert os.stat(db.with_name("auto.db.key")).st_mode & 0o077 == 0



@pytest.mark.parametrize("line", ["again", "a NUL \x00 goes row by row"])
async def test_a_record_written_again_keeps_the_first_and_the_chain_holds(tmp_path: Path, line: str) -> None:
    db = tmp_path / "again.db"
    first = random_record(random.Random(1), 0)
    again = msgspec.structs.replace(first, line=line)
    async with open_store(db) as store:
        await store.record(first)
        await store.record(again)  # in the same batch
        await store.flush()
        await store.record(again)  # in the same transaction, a later batch
        await store.end_tick(0)
        await store.record(msgspec.structs.replace(first, line="later"))  # in a later commit
        await store.record(msgspec.structs.replace(random_record(random.Random(2), 1), line=line))
        await store.end_tick(1)
    with open_reader(db) as reader:
        verified = reader.verify(None)
        assert (verified.commits, verified.records) == (3, 2)
        assert reader.audit_record(first.id).line == first.line
