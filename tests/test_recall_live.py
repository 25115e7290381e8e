"""The busy-place secret, live: 12 NPCs chattering at one place (ambient_chance 0.2), and a player
there who tells n0 a secret at tick 5 and asks it where the thing is at tick 505.

The hot window (the newest 32 items of each category) holds a few ticks of such chatter, so
recency and scored selection without recall have lost the secret by then; with `recall = 8`
(`[memory.scored]`) n0's answer is built with it. One `npcsim run` per selection in a child
process on the test's Mosquitto; the world, the script and what counts as recalled are
benchmarks/recall_live.py's, which `benchmarks/bench_recall.py --live` measures over more ages.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.recall_live import plan, read_outcome, run, scenario_toml
from tests.helpers import MosquittoProcess

pytestmark = [pytest.mark.mosquitto, pytest.mark.slow]

AGE = 500
SCRIPT = plan([AGE], start=5)
CHATTER = 0.2


def test_the_script_tells_at_5_and_asks_at_505() -> None:
    (told,) = SCRIPT.told
    assert (told.told_at, told.asked_at) == (5, 5 + AGE)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("selection", "recalled"), [("recency", False), ("scored", False), ("scored+recall", True)])
def test_only_long_term_recall_brings_back_a_secret_told_500_ticks_ago(
    tmp_path: Path, mosquitto: MosquittoProcess, selection: str, recalled: bool
) -> None:
    world, db = tmp_path / "busy.toml", tmp_path / "busy.db"
    world.write_text(scenario_toml(SCRIPT, CHATTER))
    ran = run(world, db, SCRIPT.ticks, selection, broker=mosquitto.url)
    assert ran is not None, "npcsim refuses --set memory.scored.recall=8: this npcsim has no long-term recall"
    assert read_outcome(db, SCRIPT).recalled[AGE] is recalled
