"""The rules a reply is judged under are one value (sim.output.Rules), defined once with its
defaults, kept in each audit record, and what a replay judges with."""

from __future__ import annotations

import asyncio
from pathlib import Path

import msgspec

from sim.audit import Attempt, AuditRecord, Response, decode_record, encode_record, make_record, replay
from sim.inference import PoolConfig, WorkerConfig
from sim.memory import Fact, NpcState, WorkingMemoryConfig, build_working_memory
from sim.output import MAX_LINE_CHARS, OutputPolicy, Rules, gate_difference, judge_reply, record_rules
from sim.scenario import load_scenario
from sim.shard import InferenceConfig, RunConfig, RunStats, VirtualClock
from sim.store import open_reader, read_arrivals
from sim.wire import topics
from tests.helpers import VILLAGE, eventually
from tests.memory_broker import MemoryBroker
from tests.memory_shard import memory_shard

POLICY = OutputPolicy(structured=False, forbidden=("moonstone",))
LONG = "The road north is long and the bridge is out, so go by the ford at dawn and keep to the path."
STATE = NpcState(agent_id="mara", system_prompt="You are Mara.",
                 canonical_facts=(Fact(id="f1", text="The king is dead."),))


def _record(rules: Rules) -> AuditRecord:
    """A record whose one attempt was judged under `rules` (a line limit of 40, say)."""
    config = WorkingMemoryConfig()
    memory = build_working_memory(STATE, "player: which way?", config)
    verdict = judge_reply(LONG, memory, msgspec.structs.replace(rules, output=POLICY))
    attempt = Attempt(prompt=memory.prompt, raw_response=LONG, problem=verdict.problem, proposals=verdict.proposals)
    response = Response(backend="scripted", model="scripted", line=verdict.line, attempts=(attempt,))
    return make_record(memory, id="r1", run_id="run", tick=1, state=STATE, config=config, response=response,
                       output=POLICY, rules=rules)


def test_the_rules_are_defined_once() -> None:
    assert Rules() == Rules(max_line_chars=MAX_LINE_CHARS, fact_guard="", output=None)
    assert PoolConfig().rules == WorkerConfig(broker=PoolConfig().broker, run_id="r").rules == Rules()
    assert PoolConfig(max_line_chars=40, fact_guard="m:g").rules == Rules(max_line_chars=40, fact_guard="m:g")


def test_a_record_is_judged_again_under_the_rules_it_keeps() -> None:
    short = _record(Rules(max_line_chars=40))
    assert len(short.line) <= 40
    assert decode_record(encode_record(short)) == short
    assert record_rules(short) == Rules(max_line_chars=40, output=POLICY)
    memory = short.memory()
    assert gate_difference(short, memory) == ""
    assert replay(short, gate_difference).ok
    # judged under the default limit instead, the same reply gives another line
    assert gate_difference(msgspec.structs.replace(short, rules=Rules()), memory).startswith("gates: attempt 1")


async def test_a_run_records_the_rules_its_pool_judged_with(tmp_path: Path) -> None:
    clock = VirtualClock(autojump=0.005)
    broker = MemoryBroker(1, clock, max_delay=0.0)
    scenario = load_scenario(VILLAGE)
    db = tmp_path / "tw.db"
    guard = "sim.output:contradicted_fact"
    config = RunConfig(scenario=VILLAGE, run_id="mem", until_tick=6, inference=InferenceConfig(fact_guard=guard))
    async with asyncio.TaskGroup() as group:
        server = group.create_task(broker.serve())
        async with memory_shard(broker, scenario, config, db, RunStats(), asyncio.Event()) as shard:
            await shard.start()
            assert await shard.step(0)
            broker.accept(topics.player_input("mem", "visitor"), b'{"to": "innkeeper", "text": "A room, please."}')
            await eventually(lambda: read_arrivals(db, None), what="the input in the journal")
            for tick in range(1, 6):
                assert await shard.step(tick)
        server.cancel()
    with open_reader(db) as reader:
        records = list(reader.audit_records())
    assert {r.rules for r in records} == {Rules(fact_guard=guard)}
    assert any(r.output is not None and r.attempts for r in records)  # the innkeeper's gates were replayed
    assert all(replay(r, gate_difference).ok for r in records)
