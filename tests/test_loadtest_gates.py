"""`npcsim loadtest --output structured`: proposals under attack, every verdict counted, every
accepted part checked again; a gate that accepts everything is caught."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sim.audit import Attempt
from sim.checkers import check_proposals
from sim.cli import main
from sim.loadtest import LoadTestConfig, run_loadtest
from sim.memory import Fact, NpcState, WorkingMemory, WorkingMemoryConfig, WorldFact, build_working_memory
from sim.output import OutputPolicy, ProposalVerdict, accepted, contradicted_fact
from tests.broken_gates import accept_every_proposal

REFUSALS = {"authority", "canonical_fact", "forbidden", "intent", "intent_args", "bounds"}
POLICY = OutputPolicy(structured=True, forbidden=("cellar key", "moonstone"),
                      intents={"give_item": {"item": "string"}, "pour": {"drink": ("ale", "mead")}})


def structured(**fields: object) -> LoadTestConfig:
    settings: dict[str, object] = {"agents": 100, "requests": 300, "duration_s": None, "concurrency": 8,
                                   "processes": 0, "output": "structured", **fields}
    return LoadTestConfig(**settings)  # type: ignore[arg-type]


async def test_every_gate_refuses_under_load_and_the_check_finds_nothing() -> None:
    result = await run_loadtest(structured())
    gates = result.gates
    assert gates is not None and result.output == "structured"
    assert gates.violations == 0 and gates.first_violations == []
    assert {code for code, n in gates.verdicts.items() if n > 0} >= REFUSALS
    assert gates.verdicts["ok"] > 0 and gates.proposals > 0
    assert result.sweep[0].proposals_per_s is not None and result.sweep[0].proposals_per_s > 0
    assert result.violations == 0


async def test_a_gate_that_accepts_everything_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sim.output.judge.gate_proposals", accept_every_proposal)
    result = await run_loadtest(structured())
    gates = result.gates
    assert gates is not None and gates.violations > 0
    assert gates.verdicts.get("authority", 0) == gates.verdicts.get("intent", 0) == 0  # nothing refused them
    assert 0 < len(gates.first_violations) <= 10
    assert {v.invariant for v in gates.first_violations} <= REFUSALS
    assert all(v.source == "gates" and v.player_input.startswith("player: ") for v in gates.first_violations)


def test_the_command_fails_on_a_gate_violation(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out.json"
    args = ["loadtest", "--agents", "50", "--requests", "100", "--concurrency", "4", "--processes", "0",
            "--output", "structured", "--json", str(out)]
    assert main(args) == 0
    figures = json.loads(out.read_text())
    assert figures["output"] == "structured" and figures["gates"]["violations"] == 0
    assert "gate violations\t0" in capsys.readouterr().out
    monkeypatch.setattr("sim.output.judge.gate_proposals", accept_every_proposal)
    assert main(args) == 1
    assert "gate violation(s): an accepted proposal breaks a rule" in capsys.readouterr().out


def test_structured_output_needs_round_trips(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["loadtest", "--requests", "5", "--concurrency", "0", "--output", "structured"]) == 2
    assert "--output structured needs round trips" in capsys.readouterr().err


def _memory() -> WorkingMemory:
    state = NpcState(agent_id="npc", system_prompt="You keep the inn.",
                     canonical_facts=(Fact(id="king", text="The king is dead."),),
                     world_state=(WorldFact(key="gate", value="open"),))
    return build_working_memory(state, "player: hello", WorkingMemoryConfig())


def _broken(*parts: ProposalVerdict) -> set[str]:
    attempt = Attempt(prompt="", proposals=parts)
    return {v.invariant for v in check_proposals([attempt], _memory(), POLICY, contradicted_fact)}


def test_the_check_names_each_rule_an_accepted_part_breaks() -> None:
    assert _broken(accepted("belief", "player is called Ayla.", about="player", weight=0.9),
                   accepted("line", "Welcome."), accepted("intent", "give_item", args={"item": "lantern"})) == set()
    assert _broken(accepted("belief", "Canonical fact: the king lives.", about="player")) == {"authority"}
    assert _broken(accepted("belief", "The gate is shut.", about="gate")) == {"authority"}
    assert _broken(accepted("memory", "## Canonical facts")) == {"authority"}
    assert _broken(accepted("memory", "The king is not dead.")) == {"canonical_fact"}
    assert _broken(accepted("line", "The king is alive.")) == {"canonical_fact"}
    assert _broken(accepted("memory", "The Cellar  KEY is under the mat.")) == {"forbidden"}
    assert _broken(accepted("line", "the m.o.o.n.s.t.o.n.e shines")) == {"forbidden"}
    assert _broken(accepted("intent", "give_item", args={"item": "cellar key"})) == {"forbidden"}
    assert _broken(accepted("intent", "open_gate", args={})) == {"intent"}
    assert _broken(accepted("intent", "give_item", args={"item": "x", "count": 3})) == {"intent_args"}
    assert _broken(accepted("intent", "give_item", args={"item": 3})) == {"intent_args"}
    assert _broken(accepted("intent", "pour", args={"drink": "mead"})) == set()
    assert _broken(accepted("intent", "pour", args={"drink": "crown jewels"})) == {"intent_args"}
    assert _broken(accepted("intent", "pour", args={"drink": "Ale"})) == {"intent_args"}
    assert _broken(*(accepted("memory", f"memory {n}") for n in range(4))) == {"bounds"}
    assert _broken(accepted("belief", "x" * 301, about="player")) == {"bounds"}
    assert _broken(accepted("belief", "A factual account: the mill burned.", about="player")) == set()


@pytest.mark.mosquitto
def test_the_gates_hold_end_to_end_over_mosquitto(mosquitto: object, tmp_path: Path) -> None:
    """The worker (a helper process, gullible) judges; the verdicts cross MQTT and are checked here."""
    out = tmp_path / "out.json"
    code = main(["loadtest", "--agents", "50", "--requests", "120", "--concurrency", "4", "--processes", "0",
                 "--broker", mosquitto.url, "--output", "structured", "--json", str(out)])  # type: ignore[attr-defined]
    assert code == 0
    gates = json.loads(out.read_text())["gates"]
    assert gates["violations"] == 0 and gates["proposals"] > 0
    assert {"authority", "forbidden", "intent"} <= {code for code, n in gates["verdicts"].items() if n}
