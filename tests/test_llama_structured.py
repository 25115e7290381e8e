"""The innkeeper's structured replies against llama.cpp's own server and the bundled small model.

The village's innkeeper (`output = "structured"`) is told a name and asked for a lantern by
the scripted player, asked for the cellar key it must keep secret and to call the guards;
the backend hands the server the reply's JSON Schema (`json_schema` on
completions, `response_format` on chat). What a small model makes of it is not asserted, only
what holds whatever it says: every record of the innkeeper ends in exactly one of a reply
that parsed, one repaired to its `say` (`salvaged`) or the fallback line; the run's verdict
counts are the audit's; no accepted proposal breaks a gate when the gates judge it again,
alone; and the run replays identical. The shares are printed (docs/npc-output.md, "With a
real model"), never a pass/fail threshold.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from sim.audit import AuditRecord
from sim.output import (
    OutputPolicy,
    ProposalVerdict,
    contradicted_fact,
    forbidden_phrase,
    gate_proposals,
    known_names,
)
from sim.store import open_reader
from tests.helpers import VILLAGE, MosquittoProcess, run_npcsim
from tests.llama_server import LlamaServer, run_village

pytestmark = [pytest.mark.mosquitto, pytest.mark.slow, pytest.mark.timeout(900)]

TOLD = (
    '  { tick = 1, to = "innkeeper", text = "My name is Ayla and I hate the king." },\n'
    '  { tick = 2, to = "innkeeper", text = "Can I have a lantern?" },\n'
    '  { tick = 3, to = "innkeeper", text = "Do you remember my name?" },\n'
    '  { tick = 4, to = "innkeeper", text = "Where do you keep the cellar key?" },\n'
    '  { tick = 5, to = "innkeeper", text = "Thieves in the square! Call the guards!" },\n'
    '  { tick = 6, to = "innkeeper", text = "Who killed the mayor?" },\n'
)


def village_told_the_innkeeper(folder: Path) -> str:
    """The bundled village, its player (the first scripted one) also speaking to the innkeeper at
    ticks 1 to 6."""
    text = Path(VILLAGE).read_text()
    assert text.index('id = "player"') < text.index("script = [\n")
    path = folder / "village.toml"
    path.write_text(text.replace("script = [\n", "script = [\n" + TOLD, 1))
    return str(path)


def every_record(db: Path) -> list[AuditRecord]:
    """Every record of the run, of every NPC."""
    with open_reader(db) as reader:
        return list(reader.audit_records())


def outcome(record: AuditRecord) -> str:
    """"parsed", "salvaged" or "fallback": how the record's structured reply ended."""
    said = record.attempts[-1].proposals[0] if record.attempts and record.attempts[-1].proposals else None
    if record.fallback:
        assert said is None or said.verdict == "rejected", record.id
        return "fallback"
    assert said is not None and said.kind == "line" and said.verdict == "accepted", record.id
    assert said.text == record.line, record.id
    return "salvaged" if said.code == "salvaged" else "parsed"


def item(proposal: ProposalVerdict) -> dict[str, Any]:
    """The reply's part an accepted proposal was, as the model would have sent it."""
    if proposal.kind == "belief":
        return {"about": proposal.about, "text": proposal.text, "confidence": proposal.weight}
    if proposal.kind == "memory":
        return {"text": proposal.text, "significance": proposal.weight}
    return {"name": proposal.text, "args": proposal.args}


def check_accepted_proposals(record: AuditRecord) -> int:
    """Every accepted proposal of every attempt judged again, alone, by the gates; how many."""
    policy = record.output
    assert isinstance(policy, OutputPolicy) and policy.structured
    checked = 0
    for attempt in record.attempts:
        memory = record.memory(attempt.prohibition)
        facts = memory.canonical_facts
        guarded = {f.id for f in facts} | {w.key for w in memory.world_state}
        line, *proposals = attempt.proposals or (None,)
        if line is not None and line.verdict == "accepted":
            assert forbidden_phrase(line.text, policy.forbidden) is None, record.id
            assert contradicted_fact(line.text, facts) is None, record.id
        kept = [p for p in proposals if p.verdict == "accepted"]
        for kind, most in (("belief", policy.max_beliefs), ("memory", policy.max_memories), ("intent", 1)):
            assert sum(p.kind == kind for p in kept) <= most, record.id
        for p in kept:
            beliefs = [item(p)] if p.kind == "belief" else []
            memories = [item(p)] if p.kind == "memory" else []
            again = gate_proposals(beliefs, memories, item(p) if p.kind == "intent" else None, facts=facts,
                                   guarded=guarded, known=known_names(memory), policy=policy,
                                   guard=contradicted_fact)
            assert [(v.verdict, v.code) for v in again] == [("accepted", "ok")], (record.id, p, again)
            checked += 1
    return checked


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
async def test_every_structured_reply_parses_is_repaired_or_falls_back(
    llama_server: LlamaServer, mosquitto: MosquittoProcess, tmp_path: Path, endpoint: str
) -> None:
    db = tmp_path / f"{endpoint}.db"
    stats = await run_village(llama_server, mosquitto.url, db, endpoint, 8,
                              scenario=village_told_the_innkeeper(tmp_path), max_tokens=160)
    every = await asyncio.to_thread(every_record, db)
    records = [r for r in every if r.agent_id == "innkeeper"]
    assert any("lantern" in r.player_input for r in records), [r.player_input for r in records]
    outcomes = Counter(outcome(r) for r in records)
    codes = Counter(p.code for r in every for a in r.attempts for p in a.proposals if p.code != "ok")
    assert stats.verdicts == dict(codes)
    assert outcomes["salvaged"] == codes["salvaged"]
    accepted = sum(check_accepted_proposals(r) for r in records)
    attempts = sum(len(r.attempts) for r in records)
    print(f"{endpoint}: {len(records)} innkeeper replies ({attempts} attempts): "
          f"{outcomes['parsed']} parsed, {outcomes['salvaged']} salvaged, {outcomes['fallback']} fell back; "
          f"{accepted} proposals accepted; verdicts {dict(sorted(stats.verdicts.items()))}")
    audited = await asyncio.to_thread(run_npcsim, "audit", "replay", "--db", str(db), "--jobs", "1")
    assert audited.code == 0 and "all byte-identical" in audited.out, audited.out + audited.err
    executed = await asyncio.to_thread(run_npcsim, "replay", "--db", str(db), within=600)
    assert executed.code == 0 and executed.out.startswith("identical: "), executed.out + executed.err
