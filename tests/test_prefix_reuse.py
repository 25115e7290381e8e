"""`prefix_reuse` where prompts are recorded: the run's summary and `npcsim audit export`/`show`,
with `stable_prefix` set by the run (`--stable-prefix`); a real village run over Mosquitto."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sim.cli.run import summary_rows
from sim.errors import ConfigError
from sim.memory import prefix_reuse
from sim.shard import BrokerConfig, RecordConfig, RunConfig, RunStats, run
from sim.shard._prefix import PrefixSketches
from sim.store import open_reader
from tests.helpers import VILLAGE, MosquittoProcess, npcsim_in_process, require_mosquitto, run_npcsim


def test_a_bad_stable_prefix_override_is_refused_in_one_line() -> None:
    with pytest.raises(ConfigError, match=r"^--set memory.stable_prefix=yes: Expected `bool`, got `str`$"):
        RunConfig(scenario=VILLAGE, memory={"stable_prefix": "yes"})


@given(st.text(max_size=3000), st.text(max_size=600), st.integers(min_value=0, max_value=3000))
def test_a_prompt_sketch_gives_the_shared_prefix_to_a_block(previous: str, tail: str, cut: int) -> None:
    """Exact when the previous prompt is a prefix of the new one; otherwise at most one block
    (1/32 of the previous prompt, at least 16 characters) short, never more than shared."""
    for prompt in (previous + tail, previous[:cut] + tail, previous[:cut]):
        sketches = PrefixSketches()
        assert sketches.reuse("a", previous) is None
        shared = sketches.reuse("a", prompt)
        exact = prefix_reuse(previous, prompt).chars
        assert shared is not None and shared <= exact < shared + max(16, -(-len(previous) // 32))
        if prompt.startswith(previous):
            assert shared == exact == len(previous)


def test_no_prefix_rows_before_an_npc_spoke_twice() -> None:
    assert not any(name.startswith("prompt prefix") for name, _ in summary_rows(RunStats()))


@pytest.mark.mosquitto
async def test_the_run_and_the_audit_say_how_much_of_each_prompt_the_previous_one_holds(
    mosquitto: MosquittoProcess, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "stable.db"
    config = RunConfig(scenario=VILLAGE, run_id="stable", ticks=60, broker=BrokerConfig(url=mosquitto.url),
                       record=RecordConfig(db=str(db)), memory={"max_context_chars": 900, "stable_prefix": True})
    stats = RunStats()
    await run(config, stats=stats)
    with open_reader(db) as reader:
        records = list(reader.audit_records())
    assert records and all(r.config.stable_prefix for r in records)
    assert stats.stable_cost_chars == sum(r.report.stable_cost_chars for r in records) > 0
    agents = {r.agent_id for r in records}
    assert stats.prefix_reuse_pairs == len(records) - len(agents) > 0
    rows = dict(summary_rows(stats))
    assert rows["prompt prefix reuse (chars)"] == f"{100 * stats.prefix_reuse_share / stats.prefix_reuse_pairs:.1f}%"
    assert rows["kept chars given up (stable prefix)"] == f"{stats.stable_cost_chars:,}"

    export = npcsim_in_process(capsys, "audit", "export", "--db", str(db))
    assert export.code == 0, export.err
    exported = [json.loads(line) for line in export.out.splitlines()]
    previous: dict[str, str] = {}
    for record, row in zip(records, exported, strict=True):
        prompt = record.attempts[0].prompt
        before = previous.get(record.agent_id)
        if before is None:
            assert row["prefix_reuse"] is None
        else:
            reuse = prefix_reuse(before, prompt)
            assert row["prefix_reuse"] == {"chars": reuse.chars, "prompt_chars": len(prompt), "tokens": None,
                                           "prompt_tokens": None, "share": round(reuse.share, 4)}
        previous[record.agent_id] = prompt
    given_up = [d for row in exported for d in row["dropped"] if d["reason"] == "stable_prefix"]
    assert given_up

    later = next(r for r, row in zip(records, exported, strict=True) if row["prefix_reuse"] is not None)
    show = npcsim_in_process(capsys, "audit", "show", "--db", str(db), later.id)
    assert show.code == 0, show.err
    reuse = next(row["prefix_reuse"] for r, row in zip(records, exported, strict=True) if r.id == later.id)
    share = 100 * reuse["chars"] / reuse["prompt_chars"]
    assert f"{reuse['chars']:,} of {reuse['prompt_chars']:,} chars ({share:.1f}%)" in show.out
    first = npcsim_in_process(capsys, "audit", "show", "--db", str(db), records[0].id)
    assert "(the agent's first record)" in first.out


@pytest.mark.mosquitto
def test_npcsim_run_takes_stable_prefix_from_its_flag(tmp_path: Path) -> None:
    require_mosquitto()
    db = tmp_path / "flag.db"
    ran = run_npcsim("run", "village", "--db", str(db), "--ticks", "40", "--stable-prefix")
    assert ran.code == 0, ran.err
    summary = dict(line.split("\t") for line in ran.out.splitlines() if line.count("\t") == 1)
    assert summary["prompt prefix reuse (chars)"].endswith("%")
    with open_reader(db) as reader:
        assert all(r.config.stable_prefix for r in reader.audit_records())
