"""The audit of a whole run, pinned: the same seed gives the same audit, byte for byte.

A run of the village (120 ticks, one shard) and of a generated 200-NPC world (16 ticks,
three shards) on a real Mosquitto with the scripted backend. Each audit record becomes one
line (tests/golden.py): its id, the SHA-256 of its prompt, of the working memory's
encoding, of the state snapshot and of every attempt, the fallback reason and the line
said. Everything a model saw or said is in those digests; only the timings are left out
(they are wall-clock).

The files in tests/golden were written by the engine as it was before the tick path was
rebuilt; a change that means to change what NPCs say regenerates them in its own commit:

    NPCSIM_REGENERATE_GOLDEN=1 .venv/bin/python -m pytest tests/test_golden_audit.py
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from sim.generate import write_scenario
from sim.shard import BrokerConfig, RecordConfig, RunConfig, RunStats, run
from tests.golden import GOLDEN, REGENERATE, audit_lines
from tests.helpers import REPO, MosquittoProcess

pytestmark = [pytest.mark.mosquitto, pytest.mark.timeout(300)]

async def run_world(scenario: str, tmp_path: Path, broker: str, shards: int, until: int) -> list[Path]:
    dbs = [tmp_path / f"golden-{i}of{shards}.db" for i in range(shards)]
    configs = [
        RunConfig(
            scenario=scenario, run_id="golden", until_tick=until, shard=f"{i}/{shards}",
            broker=BrokerConfig(url=broker), record=RecordConfig(db=str(db)),
        )
        for i, db in enumerate(dbs)
    ]
    stats = [RunStats() for _ in configs]
    async with asyncio.timeout(240):
        await asyncio.gather(*(run(c, stats=s) for c, s in zip(configs, stats, strict=True)))
    assert all(s.tick == until - 1 for s in stats)
    return dbs


def check_golden(name: str, lines: list[str]) -> None:
    path = GOLDEN / f"audit-{name}.tsv"
    text = "\n".join(lines) + "\n"
    if REGENERATE:
        path.write_text(text, encoding="utf-8")
    expected = path.read_text(encoding="utf-8")
    if text != expected:
        want, got = expected.splitlines(), lines
        first = next((i for i, (a, b) in enumerate(zip(want, got, strict=False)) if a != b), min(len(want), len(got)))
        pytest.fail(
            f"audit-{name}: {len(got)} records against {len(want)} golden; first difference at record {first}:\n"
            f"  golden: {want[first] if first < len(want) else '(none)'}\n"
            f"  now:    {got[first] if first < len(got) else '(none)'}"
        )


async def test_the_village_says_what_it_always_said(mosquitto: MosquittoProcess, tmp_path: Path) -> None:
    dbs = await run_world(str(REPO / "scenarios" / "village.toml"), tmp_path, mosquitto.url, 1, 120)
    lines = audit_lines(dbs)
    assert len(lines) > 40
    check_golden("village", lines)


async def test_a_generated_world_on_three_shards_says_what_it_always_said(
    mosquitto: MosquittoProcess, tmp_path: Path
) -> None:
    scenario = str(write_scenario(tmp_path / "generated.toml", npcs=200, locations=12, seed=5))
    dbs = await run_world(scenario, tmp_path, mosquitto.url, 3, 16)
    lines = audit_lines(dbs)
    assert len(lines) > 50
    check_golden("generated-200", lines)
