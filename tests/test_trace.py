"""The per-inference trace topic and the retained roster, as a viewer on another machine reads them."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiomqtt
import pytest

from sim.shard import BrokerConfig, RecordConfig, RunConfig, run
from sim.store import open_reader
from sim.wire import topics
from sim.wire.trace import TRACE_DROPPED, TraceMessage, decode_roster, decode_traces
from tests.helpers import VILLAGE, MosquittoProcess, eventually

pytestmark = pytest.mark.mosquitto


@pytest.mark.parametrize("prompts", [True, False])
async def test_every_inference_is_traced_like_its_audit_record(
    mosquitto: MosquittoProcess, tmp_path: Path, prompts: bool
) -> None:
    db = tmp_path / "t.db"
    traces: list[TraceMessage] = []
    ready = asyncio.Event()

    async def listen() -> None:
        async with aiomqtt.Client("127.0.0.1", mosquitto.port) as client:
            await client.subscribe(f"{topics.run_root('tr')}/trace/+", qos=1)
            ready.set()
            async for message in client.messages:
                traces.extend(decode_traces(bytes(message.payload)))  # type: ignore[arg-type]

    async with asyncio.TaskGroup() as group:
        listener = group.create_task(listen())
        await ready.wait()
        config = RunConfig(
            scenario=VILLAGE, run_id="tr", ticks=14, broker=BrokerConfig(url=mosquitto.url),
            record=RecordConfig(db=str(db), trace_prompts=prompts),
        )
        stats = await run(config)
        await eventually(lambda: len(traces) >= stats.inferences, what=f"the {stats.inferences} traces, heard")
        listener.cancel()
    with open_reader(db) as reader:
        records = {r.id: r for r in reader.audit_records()}
    assert {t.inference_id for t in traces} == set(records)
    for trace in traces:
        record = records[trace.inference_id]
        assert (trace.report, trace.prompt_sha256, trace.line, trace.fallback) == (
            record.report, record.prompt_sha256, record.line, record.fallback)
        assert trace.prompt == (record.memory().prompt if prompts else None)
        assert trace.location is not None and trace.shard == "0"
        assert [(a.prompt_chars, a.problem, a.raw_response, a.proposals) for a in trace.attempts] == [
            (len(a.prompt), a.problem, a.raw_response, a.proposals) for a in record.attempts]
        assert trace.attempts  # every answered inference made at least one call
        explained, expected = trace.explanation, record.explanation()
        assert explained is not None
        for name in ("canonical_facts", "world_state", "dialogue", "episodic", "beliefs"):
            got, want = getattr(explained, name), getattr(expected, name)
            assert (got.split, got.final, got.reason) == (want.split, want.final, want.reason)
            assert got.dropped == (want.dropped[:TRACE_DROPPED] if prompts else ())
            assert got.kept_items == (want.kept_items if prompts else ())

    async with aiomqtt.Client("127.0.0.1", mosquitto.port) as client:  # the roster is retained
        await client.subscribe(topics.roster("tr", "0"), qos=1)
        async with asyncio.timeout(10):
            message = await anext(aiter(client.messages))
    # the innkeeper answers with structured replies (tick 11): its traces carry the gates' verdicts
    assert any(a.proposals for t in traces if t.agent == "innkeeper" for a in t.attempts)
    roster = decode_roster(bytes(message.payload))  # type: ignore[arg-type]
    assert {(n.id, n.location) for n in roster.npcs} >= {("blacksmith", "forge"), ("innkeeper", "inn")}
