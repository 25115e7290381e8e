"""`npcsim replay --set`: the what-if with recorded replies, on a real village run's store.

What a variant lost and gained is checked here independently of sim.replay: both working
memories of every record are built with `build_working_memory` and their items compared.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.audit import AuditRecord
from sim.cli import main
from sim.memory import SELECTIONS, WorkingMemoryConfig, build_working_memory
from sim.output import OutputPolicy
from sim.replay import CATEGORIES, parse_overrides, what_if
from sim.shard import BrokerConfig, RecordConfig, RunConfig, run
from sim.store import open_reader
from tests.audit_records import random_record
from tests.helpers import VILLAGE, MosquittoProcess

BUDGETS = (600, 900)


@pytest.fixture
async def village_db(mosquitto: MosquittoProcess, tmp_path: Path) -> Path:
    db = tmp_path / "village.db"
    await run(RunConfig(
        scenario=VILLAGE, run_id="wi", ticks=30, broker=BrokerConfig(url=mosquitto.url),
        record=RecordConfig(db=str(db)),
    ))
    return db


def records(db: Path) -> list[AuditRecord]:
    with open_reader(db) as reader:
        return list(reader.audit_records())


def expected_changes(record: AuditRecord, **settings: Any) -> list[tuple[str, str, str, str]]:
    """(record, category, lost|gained, item as JSON) for one record, built here, not by sim.replay;
    none when the prompt is the same (two items of the same text kept in each other's place)."""
    before = build_working_memory(record.state, record.player_input, record.config)
    config = msgspec.structs.replace(record.config, **settings)
    after = build_working_memory(record.state, record.player_input, config)
    if after.prompt == before.prompt:
        return []
    changes = []
    for category in CATEGORIES:
        old = [json.dumps(msgspec.to_builtins(i), sort_keys=True) for i in getattr(before, category)]
        new = [json.dumps(msgspec.to_builtins(i), sort_keys=True) for i in getattr(after, category)]
        changes += [(record.id, category, "lost", i) for i in old if i not in new]
        changes += [(record.id, category, "gained", i) for i in new if i not in old]
    return changes


def reported_changes(variant: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    return [(c["record"], c["category"], c["change"], json.dumps(c["item"], sort_keys=True))
            for c in variant["examples"]]


@pytest.mark.mosquitto
async def test_a_lower_budget_reports_exactly_what_the_builder_drops(
    village_db: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "what-if.json"
    sweep = ",".join(map(str, BUDGETS))
    assert main(["replay", "--db", str(village_db), "--set", f"memory.max_context_chars={sweep}",
                 "--examples", "1000000", "--json", str(out), "--jobs", "2"]) == 0
    table = capsys.readouterr().out
    report = json.loads(out.read_text())
    recorded = records(village_db)
    assert report["records"] == len(recorded) > 0
    for budget, variant in zip(BUDGETS, report["variants"], strict=True):
        assert variant["label"] == f"memory.max_context_chars={budget}"
        assert f"memory.max_context_chars={budget}\trecency (recency)\t{len(recorded)}\t" in table
        expected = [c for r in recorded for c in expected_changes(r, max_context_chars=budget)]
        assert any(kind == "lost" for _, _, kind, _ in expected), "the lower budget drops nothing: no test"
        assert sorted(reported_changes(variant)) == sorted(expected)
        for category in CATEGORIES:
            assert variant["lost"][category] == sum(1 for c in expected if c[1:3] == (category, "lost"))
            assert variant["gained"][category] == sum(1 for c in expected if c[1:3] == (category, "gained"))
        by_npc: dict[str, dict[str, int]] = {}
        agent_of = {r.id: r.agent_id for r in recorded}
        for record_id, _, kind, _ in expected:
            counts = by_npc.setdefault(agent_of[record_id], {"lost": 0, "gained": 0})
            counts[kind] += 1
        assert variant["npcs"] == by_npc
        rebuilt = [build_working_memory(r.state, r.player_input,
                                        msgspec.structs.replace(r.config, max_context_chars=budget))
                   for r in recorded]
        assert variant["prompts_changed"] == sum(m.prompt != r.memory().prompt
                                                 for m, r in zip(rebuilt, recorded, strict=True))
        assert variant["over_budget"] == sum(m.report.over_budget for m in rebuilt)
        assert variant["prompt_chars_max"] == max(m.report.prompt_chars for m in rebuilt)
        assert variant["canonical_facts_present_percent"] == variant["world_state_present_percent"] == 100.0


@pytest.mark.mosquitto
async def test_a_scored_selection_reports_the_items_gained_and_lost(
    village_db: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--set selection=scored` against a recency run: the kept sets differ, not only their sizes."""
    out = tmp_path / "scored.json"
    assert main(["replay", "--db", str(village_db), "--set", "memory.selection=scored",
                 "--set", "memory.max_context_chars=900",
                 "--examples", "1000000", "--json", str(out), "--jobs", "2"]) == 0
    table = capsys.readouterr().out
    recorded = records(village_db)
    [variant] = json.loads(out.read_text())["variants"]
    assert f"memory.selection=scored memory.max_context_chars=900\tscored (recency)\t{len(recorded)}\t" in table
    assert variant["selections"] == {"recency": 0, "scored": len(recorded)}
    assert variant["recorded_selections"] == {"recency": len(recorded), "scored": 0}
    expected = [c for r in recorded for c in expected_changes(r, selection="scored", max_context_chars=900)]
    assert sorted(reported_changes(variant)) == sorted(expected)
    assert {kind for _, _, kind, _ in expected} == {"lost", "gained"}, "no item moved both ways: no test"


@pytest.mark.mosquitto
async def test_one_process_and_two_report_the_same(village_db: Path, tmp_path: Path) -> None:
    reports = []
    for jobs in ("1", "2"):
        out = tmp_path / f"jobs{jobs}.json"
        assert main(["replay", "--db", str(village_db), "--set", "memory.max_context_chars=700,1200",
                     "--set", "npc.innkeeper.memory.max_dialogue_lines=1", "--set", "intents=call_guards",
                     "--examples", "3",
                     "--json", str(out), "--jobs", jobs]) == 0
        reports.append(out.read_bytes())
    assert reports[0] == reports[1]
    variants = json.loads(reports[0])["variants"]
    assert [v["label"] for v in variants] == [
        "memory.max_context_chars=700 npc.innkeeper.memory.max_dialogue_lines=1 intents=call_guards",
        "memory.max_context_chars=1200 npc.innkeeper.memory.max_dialogue_lines=1 intents=call_guards",
    ]
    assert all(v["gates"]["flips"] for v in variants)


@pytest.mark.mosquitto
async def test_a_recorded_budget_changes_nothing(village_db: Path, tmp_path: Path) -> None:
    recorded = records(village_db)
    budget = recorded[0].config.max_context_chars
    assert {r.config.max_context_chars for r in recorded} == {budget}
    out = tmp_path / "same.json"
    assert main(["replay", "--db", str(village_db), "--set", f"memory.max_context_chars={budget}",
                 "--json", str(out)]) == 0
    variant = json.loads(out.read_text())["variants"][0]
    assert variant["prompts_changed"] == 0 and variant["npcs"] == {}
    assert variant["prompt_chars_mean"] == variant["recorded_prompt_chars_mean"]


@pytest.mark.mosquitto
@pytest.mark.parametrize(("setting", "message"), [
    ("memory.max_budget=3", "--set memory.max_budget: no setting 'max_budget'"),
    ("memory.max_context_chars=lots", "--set memory.max_context_chars=lots: Expected `int`, got `str`"),
    ("memory.belief_share=1.5", "--set memory.belief_share=1.5: belief_share must be a number from 0 to 1, got 1.5"),
    ("memory.redistribute_unused=maybe", "--set memory.redistribute_unused=maybe: Expected `bool`, got `str`"),
    ("memory.stable_prefix=maybe", "--set memory.stable_prefix=maybe: Expected `bool`, got `str`"),
    ("memory.selection=bm25", "--set memory.selection=bm25: Invalid enum value 'bm25'"),
    ("memory.scored.relevance_weight=-1",
     "--set memory.scored.relevance_weight=-1.0: relevance_weight must be a number >= 0, got -1.0"),
    ("memory.scored.half_life_ticks=0",
     "--set memory.scored.half_life_ticks=0.0: half_life_ticks must be a number > 0"),
    ("npc.nobody.memory.max_beliefs=1", "no NPC 'nobody' in the store's records"),
    ("memory.dialogue_share=0.9", "dialogue_share + episodic_share + belief_share must be <= 1"),
    ("max_context_chars", "expected KEY=VALUE"),
    ("npc.innkeeper.forbidden=cellar;;key", 'forbidden must be phrases separated by ";" (none empty), or none'),
    ("intents=give item", 'intents must be intent names separated by ";"'),
    ("npc.nobody.intents=none", "no NPC 'nobody' in the store's records"),
])
async def test_a_bad_setting_is_one_line_and_exit_2(
    village_db: Path, setting: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["replay", "--db", str(village_db), "--set", setting]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


@pytest.mark.mosquitto
async def test_a_store_given_twice_is_refused(village_db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", "--db", str(village_db), "--db", str(village_db), "--set", "memory.max_beliefs=1"]) == 2
    assert "given twice (its records would count twice)" in capsys.readouterr().err


def recorded_verdicts(db: Path, agent: str) -> list[tuple[str, int, str, str, str, dict[str, Any]]]:
    """(record, attempt, kind, text, verdict, args) of every part of every reply of `agent` the run judged."""
    return [(r.id, n, p.kind, p.text, p.verdict, dict(p.args)) for r in records(db) if r.agent_id == agent
            for n, a in enumerate(r.attempts, 1) if a.raw_response is not None for p in a.proposals]


@pytest.mark.mosquitto
async def test_an_allow_list_without_an_intent_flips_it_to_rejected(
    village_db: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The scripted player asks the innkeeper for a lantern: `give_item`, accepted in the run,
    is refused (`intent`) when only `call_guards` is allowed; the recorded rules change nothing."""
    out = tmp_path / "intents.json"
    assert main(["replay", "--db", str(village_db), "--set", "npc.innkeeper.intents=call_guards,give_item;call_guards",
                 "--examples", "100", "--json", str(out)]) == 0
    table = capsys.readouterr().out
    narrowed, same = json.loads(out.read_text())["variants"]
    verdicts = recorded_verdicts(village_db, "innkeeper")
    given = [(record, n) for record, n, kind, text, verdict, _ in verdicts
             if (kind, text, verdict) == ("intent", "give_item", "accepted")]
    assert given, "the innkeeper gave nothing in the run: no test"
    assert [(f["record"], f["attempt"], f["kind"], f["text"], f["was"], f["was_code"], f["now"], f["now_code"])
            for f in narrowed["gates"]["flips"]] == [
        (record, n, "intent", "give_item", "accepted", "ok", "rejected", "intent") for record, n in given]
    assert narrowed["gates"]["to_rejected"] == len(given) and narrowed["gates"]["to_accepted"] == 0
    assert narrowed["gates"]["attempts_judged"] == len({(record, n) for record, n, *_ in verdicts})
    assert narrowed["prompts_changed"] == 0  # the rules change what passes, not what the NPC saw
    assert same["gates"] == {"attempts_judged": 0, "to_rejected": 0, "to_accepted": 0, "flips": []}
    assert f"npc.innkeeper.intents=call_guards\t{narrowed['gates']['attempts_judged']}\t{len(given)}\t0\n" in table
    assert "\tintent\tgive_item\taccepted (ok)\trejected (intent)\n" in table


@pytest.mark.mosquitto
async def test_a_forbidden_phrase_flips_what_reveals_it(village_db: Path, tmp_path: Path) -> None:
    """Every part of the innkeeper's replies that was accepted and says "lantern" (in its
    text or its arguments) is refused as `forbidden`, combined with a memory setting; the
    other NPCs have no output policy, so nothing of theirs is judged."""
    out = tmp_path / "forbidden.json"
    assert main(["replay", "--db", str(village_db), "--set", "memory.max_context_chars=700",
                 "--set", "npc.innkeeper.forbidden=cellar key;Lantern", "--examples", "100", "--json", str(out)]) == 0
    [variant] = json.loads(out.read_text())["variants"]
    assert variant["label"] == "memory.max_context_chars=700 npc.innkeeper.forbidden=cellar key;Lantern"
    assert variant["npc_settings"] == {"innkeeper": {"forbidden": ["cellar key", "Lantern"]}}
    assert variant["prompts_changed"] > 0
    revealing = [(record, n, kind, text) for record, n, kind, text, verdict, args in recorded_verdicts(
        village_db, "innkeeper") if verdict == "accepted" and "lantern" in f"{text} {args}".lower()]
    assert revealing, "the innkeeper never mentioned the lantern: no test"
    flips = variant["gates"]["flips"]
    assert [(f["record"], f["attempt"], f["kind"], f["text"]) for f in flips] == revealing
    assert {(f["was"], f["now"], f["now_code"]) for f in flips} == {("accepted", "rejected", "forbidden")}
    assert {f["agent"] for f in flips} == {"innkeeper"}


@pytest.mark.mosquitto
async def test_a_phrase_no_longer_forbidden_flips_to_accepted(village_db: Path) -> None:
    """The run's records as a run with "lantern" forbidden would have them (the innkeeper's
    `give_item` of a lantern refused, `forbidden`): lifting it flips each back to accepted."""
    narrow = OutputPolicy(structured=True, forbidden=("cellar key", "lantern"),
                          intents={"give_item": {"item": "string"}, "call_guards": {}})

    def refused(record: AuditRecord) -> AuditRecord:
        if record.output is None:
            return record
        attempts = tuple(msgspec.structs.replace(a, proposals=tuple(
            msgspec.structs.replace(p, verdict="rejected", code="forbidden", detail="reveals forbidden phrase #2")
            if (p.kind, p.text) == ("intent", "give_item") else p for p in a.proposals)) for a in record.attempts)
        return msgspec.structs.replace(record, output=narrow, attempts=attempts)

    recorded = [refused(r) for r in records(village_db)]
    [variant] = parse_overrides(["npc.innkeeper.forbidden=cellar key"])
    [tally] = what_if(recorded, [variant], examples=100)
    expected = [(r.id, n) for r in recorded for n, a in enumerate(r.attempts, 1) if a.raw_response is not None
                for p in a.proposals if p.code == "forbidden"]
    assert expected, "nothing refused: no test"
    assert tally.to_accepted == len(expected) and tally.to_rejected == 0
    assert [(f.record, f.attempt, f.was_code, f.now, f.now_code) for f in tally.flips] == [
        (record, n, "forbidden", "accepted", "ok") for record, n in expected]


def test_a_variant_keeps_the_recorded_argument_types_and_values_of_an_intent() -> None:
    recorded = OutputPolicy(structured=True, forbidden=("cellar key",),
                            intents={"give_item": {"item": "string"}, "call_guards": {}})
    [variant] = parse_overrides(["npc.innkeeper.intents=give_item;open_door"])
    assert variant.policy(recorded, "innkeeper") == OutputPolicy(
        structured=True, forbidden=("cellar key",), intents={"give_item": {"item": "string"}, "open_door": {}})
    assert variant.policy(recorded, "blacksmith") == recorded
    listed = msgspec.structs.replace(recorded, intents={"give_item": {"item": ("lantern", "ale")}})
    kept = variant.policy(msgspec.msgpack.decode(msgspec.msgpack.encode(listed), type=OutputPolicy), "innkeeper")
    assert kept.intents == {"give_item": {"item": ("lantern", "ale")}, "open_door": {}}  # as a record keeps them
    [none] = parse_overrides(["forbidden=none"])
    assert none.policy(recorded, "innkeeper").forbidden == ()
    assert none.config(WorkingMemoryConfig(), "innkeeper") == WorkingMemoryConfig(on_overflow="keep")


def test_a_fork_refuses_the_gates_rules(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", "--db", str(tmp_path / "none.db"), "--fork-at", "3", "--backend", "scripted",
                 "--set", "forbidden=lantern"]) == 2
    assert "a fork changes working-memory settings only" in capsys.readouterr().err


def test_what_if_report_options_without_set_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", "--db", str(tmp_path / "none.db"), "--examples", "3"]) == 2
    assert "--examples, --json and --plot report a what-if: give --set KEY=VALUE" in capsys.readouterr().err


def test_several_swept_keys_are_every_combination() -> None:
    variants = parse_overrides(["memory.max_context_chars=700,1000", "memory.redistribute_unused=true,false",
                                "memory.max_beliefs=1"])
    assert [v.label for v in variants] == [
        "memory.max_context_chars=700 memory.redistribute_unused=true memory.max_beliefs=1",
        "memory.max_context_chars=700 memory.redistribute_unused=false memory.max_beliefs=1",
        "memory.max_context_chars=1000 memory.redistribute_unused=true memory.max_beliefs=1",
        "memory.max_context_chars=1000 memory.redistribute_unused=false memory.max_beliefs=1",
    ]
    assert variants[3].settings == {"memory.max_context_chars": 1000, "memory.redistribute_unused": False,
                                    "memory.max_beliefs": 1}


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), budget=st.integers(0, 4000), redistribute=st.booleans(),
       selection=st.sampled_from(SELECTIONS))
def test_what_if_counts_the_items_the_two_builds_keep_apart(
    seed: int, budget: int, redistribute: bool, selection: str
) -> None:
    """On random records (either selection): the tally's counts are the items the two builds
    keep apart, and sizes add up."""
    rng = random.Random(seed)
    batch = [random_record(rng, n) for n in range(8)]
    [variant] = parse_overrides([f"memory.max_context_chars={budget}",
                                 f"memory.redistribute_unused={str(redistribute).lower()}",
                                 f"memory.selection={selection}"])
    [tally] = what_if(batch, [variant], examples=1000)
    expected = [c for r in batch for c in expected_changes(r, max_context_chars=budget,
                                                             redistribute_unused=redistribute, on_overflow="keep",
                                                             selection=selection)]
    assert sorted(reported_changes({"examples": msgspec.to_builtins(tally.examples)})) == sorted(expected)
    assert tally.inferences == len(batch)
    rebuilt = [build_working_memory(r.state, r.player_input, msgspec.structs.replace(
        r.config, max_context_chars=budget, redistribute_unused=redistribute, on_overflow="keep",
        selection=selection)) for r in batch]
    assert tally.selections == {"recency": 0, "scored": 0, selection: len(batch)}
    assert tally.recorded_selections == {s: sum(r.config.selection == s for r in batch) for s in SELECTIONS}
    assert tally.facts == sum(len(r.state.canonical_facts) for r in batch)
    assert tally.facts_present == sum(len(m.canonical_facts) for m in rebuilt)
    assert tally.world_present == sum(len(m.world_state) for m in rebuilt)
    assert tally.over_budget == sum(m.report.over_budget for m in rebuilt)
    halves = what_if(batch[:3], [variant], examples=1000)[0]
    halves.add(what_if(batch[3:], [variant], examples=1000)[0], 1000)
    assert halves == tally  # tallies of consecutive runs add up to the whole's
