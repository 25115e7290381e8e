"""The fact guard: the built-in one right both ways, and a stronger one plugged into the output check."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sim.errors import ConfigError
from sim.inference import PoolConfig, RemoteWorker, WorkerConfig, open_pool
from sim.memory import Fact, NpcState, WorkingMemoryConfig, build_working_memory
from sim.output import Rules, contradicted_fact, judge_reply, load_fact_guard
from sim.scenario import load_scenario
from tests.guard_cases import CASES
from tests.helpers import MosquittoProcess
from tests.inference_helpers import ScriptBackend, make_request, running


def denies(line: str, fact: str) -> bool:
    return contradicted_fact(line, [Fact(id="f", text=fact)]) is not None


def test_the_table_has_enough_cases_of_each_kind() -> None:
    assert len(CASES) >= 60
    assert sum(expected for _, _, expected in CASES) >= 25 and sum(not e for _, _, e in CASES) >= 25
    negative_facts = [f for f, _, _ in CASES if f.split()[0].lower() in ("no", "nothing", "never", "nobody")]
    assert len(negative_facts) >= 15


@pytest.mark.parametrize(("fact", "line", "expected"), CASES)
def test_hand_written_restatements_and_contradictions(fact: str, line: str, expected: bool) -> None:
    assert denies(line, fact) is expected


# --- a generator of simple clauses: subject, copula or verb, complement ------------------------

SUBJECTS = ["the king", "the old bridge", "the player", "Mara", "the innkeeper", "Brenna", "the guard captain",
            "the east gate"]
COMPLEMENTS = ["dead", "broken", "open", "free", "guilty", "the mayor", "a hero", "in the cellar",
               "a capitalist snack machine", "sworn to keep the peace", "locked"]
VERBS = [("kill", "killed", "kills"), ("save", "saved", "saves"), ("trust", "trusted", "trusts"),
         ("sell", "sold", "sells"), ("owe", "owed", "owes"), ("guard", "guarded", "guards"),
         ("forge", "forged", "forges"), ("find", "found", "finds"), ("pay", "paid", "pays"),
         ("steal", "stole", "steals"), ("hide", "hid", "hides")]
OBJECTS = ["the mayor", "Mayor Aldric", "the village", "honey cakes", "the east gate", "money", "the sword",
           "three silver"]
NOUNS = ["snack", "guard", "child", "traveller", "soldier", "merchant"]
PREFIXES = ["As everyone knows, ", "As everyone here knows, ", "Aye, ", "Listen: ", "Of course, ",
            "Everyone knows that ", "I heard that ", "It is true that ", "Mark my words: ", "No doubt ",
            "Well, ", "Remember, ", "Friend, ", "Don't forget: "]


@dataclass(frozen=True)
class Clause:
    """A clause in both polarities, each in several surface forms (the first is the plain one)."""

    positive: tuple[str, ...]
    negative: tuple[str, ...]


def _sentence(text: str) -> str:
    return text[:1].upper() + text[1:] + "."


def _false_that(text: str) -> list[str]:
    return [f"It is false that {text}", f"It is not true that {text}", f"It's a lie that {text}"]


@st.composite
def clauses(draw: st.DrawFn) -> Clause:
    kind = draw(st.sampled_from(["copula", "past", "present", "no-noun", "nothing", "nobody", "never"]))
    subject = draw(st.sampled_from(SUBJECTS))
    complement = draw(st.sampled_from(COMPLEMENTS))
    base, past, third = draw(st.sampled_from(VERBS))
    obj = draw(st.sampled_from(OBJECTS))
    noun = draw(st.sampled_from(NOUNS))
    be = draw(st.sampled_from(["is", "was"]))
    if kind == "copula":
        plain = f"{subject} {be} {complement}"
        positive = [plain]
        negative = [f"{subject} {be} not {complement}", f"{subject} {be}n't {complement}",
                    f"{subject} {be} never {complement}", f"{subject} {be} no longer {complement}", *_false_that(plain)]
    elif kind == "past":
        plain = f"{subject} {past} {obj}"
        positive = [plain]
        negative = [f"{subject} did not {base} {obj}", f"{subject} didn't {base} {obj}",
                    f"{subject} never {past} {obj}", *_false_that(plain)]
    elif kind == "present":
        plain = f"{subject} {third} {obj}"
        positive = [plain]
        negative = [f"{subject} does not {base} {obj}", f"{subject} doesn't {base} {obj}",
                    f"{subject} never {third} {obj}", *_false_that(plain)]
    elif kind == "no-noun":
        predicate = draw(st.sampled_from([f"is {complement}", f"{third} {obj}"]))
        negative = [f"no {noun} {predicate}"]
        positive = [f"a {noun} {predicate}", f"some {noun} {predicate}", f"the {noun} {predicate}",
                    f"every {noun} {predicate}"]
    elif kind == "nothing":
        negative = [f"nothing is ever {complement}", f"nothing is {complement}"]
        positive = [f"everything is {complement}", f"something is {complement}"]
    elif kind == "nobody":
        negative = [f"nobody {third} {obj}", f"no one {third} {obj}"]
        positive = [f"somebody {third} {obj}", f"everyone {third} {obj}", f"{subject} {third} {obj}"]
    else:
        negative = [f"never {base} {obj}", f"do not {base} {obj}", f"don't {base} {obj}"]
        positive = [f"{base} {obj}", f"always {base} {obj}"]
    return Clause(positive=tuple(map(_sentence, positive)), negative=tuple(map(_sentence, negative)))


@given(clauses(), st.booleans(), st.data())
def test_a_fact_and_its_restatements_pass_and_its_flipped_negation_fails(clause: Clause, negative: bool,
                                                                        data: st.DataObject) -> None:
    same, other = (clause.negative, clause.positive) if negative else (clause.positive, clause.negative)
    fact = same[0]
    prefix = data.draw(st.sampled_from(PREFIXES), label="prefix")
    assert not denies(fact, fact)
    assert not denies(prefix + fact, fact)
    assert not denies((prefix + fact).upper(), fact)
    restated = data.draw(st.sampled_from(same), label="restated")
    assert not denies(restated, fact)
    flipped = data.draw(st.sampled_from(other), label="flipped")
    assert denies(flipped, fact)
    assert denies(prefix + flipped, fact)


# --- the guard is the output check's parameter ------------------------------------------------


def test_the_record_the_issue_found_is_no_longer_rejected() -> None:
    """village-7:snack_machine:2:2 said the fact word for word and got the fallback line."""
    state = load_scenario("village").initial_state("snack_machine")
    memory = build_working_memory(state, "player: Comrade machine, the snacks belong to the people.",
                                  WorkingMemoryConfig())
    verdict = judge_reply("As everyone here knows, Every snack costs money; nothing is ever free.", memory, Rules())
    assert verdict.problem is None
    rejected = judge_reply("Everything is free today, comrade!", memory, Rules())
    assert rejected.problem == "negates canonical fact 'f-prices'"
    assert rejected.prohibition == "Never deny or contradict this fact: Every snack costs money; nothing is ever free."


def every_fact_guard(line: str, facts: Sequence[Fact]) -> Fact | None:
    """A stand-in for a stronger guard: it rejects whatever mentions a fact's first word."""
    return next((f for f in facts if f.text.split()[0].lower() in line.lower()), None)


def test_judge_takes_a_guard() -> None:
    state = NpcState(agent_id="mara", system_prompt="You are Mara.",
                     canonical_facts=(Fact(id="f1", text="Dragons exist."),))
    memory = build_working_memory(state, "hi", WorkingMemoryConfig())
    assert judge_reply("Dragons are a myth.", memory, Rules()).problem is None  # the built-in guard cannot see it
    given = judge_reply("Dragons are a myth.", memory, Rules(), every_fact_guard)
    assert given.problem == "negates canonical fact 'f1'"
    named = Rules(fact_guard=f"{__name__}:every_fact_guard")  # the guard the rules name
    assert judge_reply("Dragons are a myth.", memory, named).problem == "negates canonical fact 'f1'"


async def test_the_pool_uses_the_guard_it_is_given_by_name_or_by_value() -> None:
    name = f"{__name__}:every_fact_guard"
    assert load_fact_guard(name) is every_fact_guard and load_fact_guard("") is contradicted_fact
    for config, guard in ((PoolConfig(fact_guard=name), None), (PoolConfig(), every_fact_guard)):
        backend = ScriptBackend(["The old bridge holds.", "Mind the bridge, it's broken."])
        async with open_pool(config, backend=backend, fact_guard=guard) as pool:
            result = await pool.infer(make_request())
        assert [a.problem for a in result.attempts] == ["negates canonical fact 'f1'", "negates canonical fact 'f1'"]
        assert result.fallback and result.fallback_reason == "rejected"


@pytest.mark.parametrize(("spec", "message"), [
    ("no_colon", "expected module:attribute"),
    ("no.such.module:guard", "cannot import 'no.such.module'"),
    ("sim.inference:no_such_guard", "has no callable 'no_such_guard'"),
    ("sim.inference:BACKENDS", "has no callable 'BACKENDS'"),
])
def test_a_guard_that_cannot_be_loaded_is_one_config_error(spec: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_fact_guard(spec)


@pytest.mark.mosquitto
async def test_a_remote_worker_and_its_pool_share_the_guard(mosquitto: MosquittoProcess) -> None:
    """The pool judges a worker's replies again: with the worker's guard it accepts its verdicts."""
    name = f"{__name__}:every_fact_guard"
    for run, pool_guard, refused in (("same-guard", name, False), ("other-guard", "", True)):
        backend = ScriptBackend(["The old bridge holds.", "All is well."])
        worker = RemoteWorker(WorkerConfig(broker=mosquitto.address, run_id=run, fact_guard=name), backend=backend)
        config = PoolConfig(transport="mqtt", broker=mosquitto.address, run_id=run, fact_guard=pool_guard)
        async with running(worker), open_pool(config) as pool:
            result = await pool.infer(make_request())
            stats = pool.statistics()
        assert worker.guard is every_fact_guard
        if refused:  # the built-in guard would not have rejected the first reply: not a verdict it can give
            assert result.fallback and result.attempts == () and stats.rejected_outputs == 1
        else:
            assert not result.fallback and result.line == "All is well."
            assert [a.problem for a in result.attempts] == ["negates canonical fact 'f1'", None]
