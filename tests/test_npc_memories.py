"""The village over 200 ticks, in-process (the in-memory broker, virtual time): the NPCs'
memories are worth keeping and the scripted dialogue shows them at work.

What every prompt of the run holds: no item twice in a category, nothing said twice in
the prompt (the line answered only under `## Now`, a memory of a line kept in the dialogue
left out: the checker's I8, and on the prompt's text), no memory that quotes a quote, and
the scenario author's beliefs only (the NPCs form none of their own to push them out).
What the NPCs say: the first 100 lines are not one line repeated, no line quotes a quote,
and each mentions something its working memory kept and nothing that truncation dropped.
"""

from __future__ import annotations

import asyncio
import collections

import pytest

from sim.audit import AuditRecord
from sim.checkers import check_working_memory
from sim.memory import QUOTE_MARKS, WorkingMemory, inert, quoted
from sim.scenario import load_scenario
from sim.shard import RunConfig, RunStats
from sim.store import open_reader
from tests.helpers import VILLAGE
from tests.memory_broker import MemoryBroker
from tests.memory_shard import PacingClock, memory_shard

TICKS = 200
AUTHORED = "Heroes are excellent customers."  # snack_machine's belief b1 in scenarios/village.toml


@pytest.fixture(scope="module")
def village(tmp_path_factory: pytest.TempPathFactory) -> list[tuple[AuditRecord, WorkingMemory]]:
    """Every audit record of a 200-tick village run, with the working memory it rebuilds."""
    db = tmp_path_factory.mktemp("village") / "village.db"

    async def run() -> None:
        broker = MemoryBroker(7, PacingClock())
        config = RunConfig(scenario=VILLAGE, run_id="mem", ticks=TICKS, shard="0/1", tick_ms=250)
        async with asyncio.TaskGroup() as group:
            server = group.create_task(broker.serve())
            async with (
                asyncio.timeout(240),
                memory_shard(broker, load_scenario(VILLAGE), config, db, RunStats(shard="0"), asyncio.Event()) as shard,
            ):
                await shard.start()
                await shard.run(until=shard.end)
            server.cancel()

    asyncio.run(run())
    with open_reader(db) as reader:
        records = list(reader.audit_records())
    assert records[-1].tick >= TICKS - 20
    return [(r, r.memory()) for r in records]


def marks(text: str) -> int:
    return sum(text.count(mark) for mark in QUOTE_MARKS)


def test_no_prompt_holds_an_item_twice_in_a_category(village: list[tuple[AuditRecord, WorkingMemory]]) -> None:
    for record, memory in village:
        categories = {
            "canonical_facts": [f.text for f in memory.canonical_facts],
            "world_state": [f"{w.key}: {w.value}" for w in memory.world_state],
            "beliefs": [b.text for b in memory.beliefs],
            "episodic": [e.text for e in memory.episodic],
            "dialogue": [f"{line.speaker}: {line.text}" for line in memory.dialogue],
        }
        for category, texts in categories.items():
            twice = [text for text, n in collections.Counter(texts).items() if n > 1]
            assert not twice, f"{record.id}: {category} holds {twice}"
        assert len({b.id for b in record.state.beliefs}) == len(record.state.beliefs), record.id


def test_no_memory_and_no_line_quotes_a_quote(village: list[tuple[AuditRecord, WorkingMemory]]) -> None:
    for record, _ in village:
        for episode in record.state.episodic:
            assert marks(episode.text) <= 2, f"{record.id}: {episode.text}"
        assert marks(record.line) in (0, 2), f"{record.id}: {record.line}"
    said = [e.text for _, m in village for e in m.episodic if " said to " in e.text]
    assert len(said) > 100  # the run's memories of what was said were checked, not a few


def test_the_authors_beliefs_stay_and_only_accepted_proposals_add_any(
    village: list[tuple[AuditRecord, WorkingMemory]],
) -> None:
    """A belief is the author's or one the gates accepted (`about:{subject}#{slot}`: the innkeeper
    learns the player's name); nothing else writes one."""
    authored = {npc.id: npc.beliefs for npc in load_scenario(VILLAGE).npcs}
    for record, _ in village:
        mine = set(authored[record.agent_id])
        assert mine <= set(record.state.beliefs), record.id
        assert all(b.id.startswith("about:") for b in record.state.beliefs if b not in mine), record.id
    learned = {b.text for r, _ in village if r.agent_id == "innkeeper" for b in r.state.beliefs}
    assert "player is called Ayla." in learned
    at_57 = [(r, m) for r, m in village if r.agent_id == "snack_machine" and r.tick == 57]
    assert at_57, "the snack machine speaks at tick 57 of the village"
    for record, _ in at_57:
        assert f"- {AUTHORED}\n" in record.attempts[0].prompt


def test_nothing_is_said_twice_in_a_prompt(village: list[tuple[AuditRecord, WorkingMemory]]) -> None:
    """The checker holds on every record (I8: no memory of a line kept), and the line being
    answered (heard this tick, said the tick before) is the input only: the snapshot holds
    neither it nor its memory. The same words said again in another event are another line."""
    answers = duplicates = 0
    for record, memory in village:
        assert check_working_memory(record.state, record.player_input, record.config, memory) == [], record.id
        duplicates += memory.report.episodic.duplicate
        speaker, _, text = record.player_input.partition(": ")
        if speaker not in NAMES:
            continue  # an ambient prompt
        answers += 1
        heard = [line for line in record.state.dialogue if line.tick == record.tick and line.speaker == speaker]
        assert all(line.text != text for line in heard), record.id
        remembered = f"{speaker} said to me: {quoted(text)}"
        assert all(e.text != remembered for e in record.state.episodic if e.tick >= record.tick - 1), record.id
        assert memory.prompt.count(f"\n{inert(record.player_input)}\n") == 1, record.id
    assert answers > 50 and duplicates > 50  # the run answered lines and left memories of kept lines out


NAMES = {"player", *(npc.id for npc in load_scenario(VILLAGE).npcs)}


def test_the_first_100_lines_are_not_one_line_repeated(village: list[tuple[AuditRecord, WorkingMemory]]) -> None:
    lines = [f"{r.agent_id}: {r.line}" for r, _ in village][:100]
    assert len(lines) == 100
    counts = collections.Counter(lines)
    assert len(counts) >= 70, counts.most_common(5)
    assert counts.most_common(1)[0][1] <= 4, counts.most_common(5)


def test_each_line_mentions_what_its_memory_kept_and_nothing_it_dropped(
    village: list[tuple[AuditRecord, WorkingMemory]],
) -> None:
    mentioned = 0
    for record, memory in village:
        if record.fallback:
            continue
        kept = [i.text for i in (*memory.canonical_facts, *memory.beliefs, *memory.episodic)]
        dropped = [i.text for i in (*record.state.beliefs, *record.state.episodic) if i.text not in kept]
        core = [_core(text) for text in kept]
        mentioned += any(c and c in record.line for c in core)
        for text in dropped:
            if not any(_core(text) in k for k in kept):
                assert _core(text) not in record.line, f"{record.id}: {record.line!r} names the dropped {text!r}"
    assert mentioned >= 0.9 * sum(not r.fallback for r, _ in village)


def _core(text: str) -> str:
    """What a reply citing `text` surely holds: its words up to the first quotation or aside."""
    for stop in ('"', "(", "…"):
        text = text.split(stop)[0]
    return text.strip().rstrip(".!?:").replace("You are ", "I am ")
