"""Random but seeded audit records, for the audit and store tests: 25 agents (npc0 .. npc24),
a tick every 25 records, states and configs of every shape the store must keep; and
`store_instead`, which puts an altered record in a store file in place of its original."""

from __future__ import annotations

import random
import sqlite3
from pathlib import Path

from sim.audit import Attempt, AuditRecord, Response, make_record
from sim.memory import (
    SELECTIONS,
    Belief,
    Episode,
    Fact,
    Line,
    NpcState,
    WorkingMemoryConfig,
    WorldFact,
    build_working_memory,
)
from sim.store.records import RecordPacker
from tests.tampering import reseal

__all__ = ["AGENTS", "random_config", "random_record", "random_state", "store_instead"]

AGENTS = 25


def random_state(rng: random.Random, agent_id: str, tick: int) -> NpcState:
    words = ["bread", "sword", "river", "king", "rain", "gold", "wolf", "ale", "smoke", "bell", "é", "→"]

    def text() -> str:
        return " ".join(rng.choice(words) for _ in range(rng.randrange(1, 14)))

    return NpcState(
        agent_id=agent_id,
        system_prompt=f"You are {agent_id}. {text()}",
        canonical_facts=tuple(Fact(id=f"f{i}", text=text()) for i in range(rng.randrange(0, 4))),
        world_state=tuple(WorldFact(key=f"k{i}", value=text()) for i in range(rng.randrange(0, 3))),
        episodic=tuple(
            Episode(id=f"e{i}", tick=rng.randrange(tick + 1), text=text(), significance=rng.random())
            for i in range(rng.randrange(0, 12))
        ),
        beliefs=tuple(
            Belief(id=f"b{i}", tick=rng.randrange(tick + 1), text=text(), confidence=rng.random())
            for i in range(rng.randrange(0, 8))
        ),
        dialogue=tuple(
            Line(tick=rng.randrange(tick + 1), seq=rng.randrange(3), speaker=rng.choice(["p", agent_id]), text=text())
            for _ in range(rng.randrange(0, 20))
        ),
    )


def random_config(rng: random.Random) -> WorkingMemoryConfig:
    return WorkingMemoryConfig(
        max_context_chars=rng.choice([250, 400, 800, 2000]),
        max_dialogue_lines=rng.choice([3, 10]),
        redistribute_unused=rng.random() < 0.7,
        always_include_world_state=rng.random() < 0.8,
        selection=rng.choice(SELECTIONS),
    )


def random_record(rng: random.Random, n: int) -> AuditRecord:
    agent_id = f"npc{n % AGENTS}"
    tick = n // AGENTS
    state = random_state(rng, agent_id, tick)
    config = random_config(rng)
    said = f"player: {rng.choice(['hello', 'any news?', 'sell me bread'])}"
    wm = build_working_memory(state, said, config)
    fallback = rng.random() < 0.1
    return make_record(
        wm,
        id=f"inf-{n:05d}",
        run_id="run-1",
        state=state,
        config=config,
        tick=tick,
        response=Response(
            backend="scripted",
            model="scripted-v1",
            params={"temperature": 0.7, "seed": 42, "max_tokens": 64},
            line=f"Good day ({n}).",
            fallback=fallback,
            fallback_reason="timeout" if fallback else None,
            timings={"build": 0.1, "infer": 12.5},
            attempts=(Attempt(prompt=wm.prompt, raw_response=f"{agent_id}: Good day ({n})."),),
        ),
    )


def store_instead(db: Path, record: AuditRecord) -> None:
    """Store `record` in the store file `db` (sealed without a run key) in place of the record
    with its id (packed as the store packs it; the audit row's columns stay the original's),
    and seal the store again: the drift, not a broken chain, is what replay then sees."""
    blob, items = RecordPacker().pack(record)
    conn = sqlite3.connect(db)
    with conn:
        conn.executemany("INSERT OR IGNORE INTO items (k, body) VALUES (?, ?)", [(i.key, i.body) for i in items])
        assert conn.execute("UPDATE audit SET record = ? WHERE id = ?", (blob, record.id)).rowcount == 1
    conn.close()
    reseal(db)
