"""What the command line prints: run data escaped, one plain record per line in a pipe,
JSON Lines on request, nothing but errors with --quiet, and a closed pipe ends every command
quietly with exit status 0. Real pipes: the package's console script as a subprocess."""

from __future__ import annotations

import io
import json
import subprocess
from pathlib import Path

import pytest

from sim.audit import Attempt, Response, make_record
from sim.cli import main
from sim.cli._terminal import Out, json_line, printable
from sim.cli._truncation import print_truncation
from sim.cli.subscribe import say_record
from sim.memory import Episode, Fact, NpcState, WorkingMemoryConfig, build_working_memory, explain_truncation
from sim.store import Writer, open_store
from sim.wire.events import SayMessage
from tests.helpers import NPCSIM, VILLAGE, env_for

HOSTILE = "clear\x1b[2J\x1b]0;owned\x07 \u202eevil\u2066 hid\u200bden \x9b31m \ufeff end"
RAW = ("\x1b", "\x07", "\u202e", "\u2066", "\u200b", "\x9b", "\ufeff")

# An NPC whose first line repeats its one canonical fact, which carries control characters
# (the line said is cleaned of them, sim.text) and is longer than a terminal's 80 columns.
LONG_FACT = HOSTILE + " and the rest of a fact long enough to run past the eighty columns of a terminal"
ECHO_WORLD = f"""
[scenario]
name = "echo"
seed = 1
ticks = 4

[[locations]]
id = "room"

[[npcs]]
id = "echo"
name = "Echo"
location = "room"
system_prompt = "You repeat what you know."
facts = [ {{ id = "f1", text = {json.dumps(LONG_FACT)} }} ]

[[players]]
id = "p"
location = "room"
script = [ {{ tick = 0, to = "echo", text = "Say it again, and again, and again, at length, so the line is long." }},
           {{ tick = 2, to = "echo", text = "Once more." }} ]
"""


def npcsim(args: list[str], tmp_path: Path, **kwargs: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([NPCSIM, *args], cwd=tmp_path, env=env_for(tmp_path), capture_output=True, text=True,
                          timeout=120, check=False, **kwargs)  # type: ignore[call-overload]


def no_raw_controls(text: str) -> bool:
    return not any(c in text for c in RAW)


# --- the one escape ---------------------------------------------------------------------------


def test_printable_shows_controls_bidi_and_invisible_characters_as_escapes() -> None:
    shown = printable(HOSTILE)
    assert no_raw_controls(shown)
    assert shown == ("clear\\x1b[2J\\x1b]0;owned\\x07 \\u202eevil\\u2066 hid\\u200bden \\x9b31m \\ufeff end")
    assert printable("one\ntwo\tthree\r") == "one\\ntwo\\tthree\\r"
    assert printable("one\ntwo\x1b", lines=True) == "one\ntwo\\x1b"
    family = "\U0001f468\u200d\U0001f469\u200d\U0001f467"  # an emoji sequence keeps its joiners
    assert printable(family) == family and printable("a\u200db") == "a\\u200db"
    plain = "Brenna's forge: 10 ¢, ümlaut, 漢字, שלום"
    assert printable(plain) == plain


def test_json_lines_are_exact_and_inert() -> None:
    line = json_line({"text": HOSTILE, "tag": "\U000e0041"})
    assert no_raw_controls(line) and "\U000e0041" not in line and "\n" not in line
    assert json.loads(line) == {"text": HOSTILE, "tag": "\U000e0041"}


def test_a_line_said_on_a_terminal_and_in_a_pipe() -> None:
    say = SayMessage(run="r", agent="echo", tick=3, to="p", text=HOSTILE + " " + "long " * 40, inference_id="i")
    piped = io.StringIO()
    Out(piped, terminal=False).record(*say_record(say))
    text = piped.getvalue()
    assert text.count("\n") == 1 and text.startswith("r t   3 echo to p: clear\\x1b[2J")  # no wrap, no style
    assert no_raw_controls(text)
    shown = io.StringIO()
    Out(shown, terminal=True).record(*say_record(say))
    # rich styles it (its own escape sequences start with ESC [ and a digit); the run's ESC is shown as text
    assert "\\x1b[2J" in shown.getvalue() and "\x1b[2J" not in shown.getvalue()
    assert not any(c in shown.getvalue() for c in RAW[1:])


def test_a_dropped_item_is_printed_escaped_on_a_terminal_and_in_a_pipe() -> None:
    memories = tuple(Episode(id=f"e{i}", tick=i, text=f"{HOSTILE} {i} " + "filler " * 20) for i in range(6))
    state = NpcState(agent_id="echo", system_prompt="You repeat.", episodic=memories)
    config = WorkingMemoryConfig(max_context_chars=400)
    memory = build_working_memory(state, "p: hello", config)
    explanation = explain_truncation(state, "p: hello", config, memory)
    assert explanation.episodic.dropped  # the test's subject: dropped items carrying control characters
    piped = io.StringIO()
    print_truncation(Out(piped, terminal=False), memory.report, explanation)
    lines = piped.getvalue().splitlines()
    item = explanation.episodic.dropped[0]
    assert f"episodic\t{item.tick}\t{item.reason}\t{printable(item.text)}" in lines
    assert no_raw_controls(piped.getvalue())
    shown = io.StringIO()
    print_truncation(Out(shown, terminal=True), memory.report, explanation)
    assert "\\x1b[2J" in shown.getvalue() and "\x1b[2J" not in shown.getvalue()
    assert not any(c in shown.getvalue() for c in RAW[1:])


# --- piped commands ---------------------------------------------------------------------------


@pytest.mark.mosquitto
def test_run_follow_and_dialogue_in_a_pipe_one_line_each_escaped(tmp_path: Path) -> None:
    (tmp_path / "echo.toml").write_text(ECHO_WORLD)
    for mode in ("--follow", "--dialogue"):
        done = npcsim(["run", "echo.toml", "--broker", "auto", mode], tmp_path)
        assert done.returncode == 0, done.stderr
        lines = done.stdout.splitlines()
        said = [line for line in lines if line.startswith("echo-1 t")]
        assert len(said) == 2 and max(len(line) for line in said) > 80, lines  # not wrapped at 80 columns
        assert no_raw_controls(done.stdout) and no_raw_controls(done.stderr)
        assert "agents\t1" in lines and "lines said\t2" in lines  # the summary: measure<TAB>value
        assert not any(c in done.stdout for c in "┃│━─"), done.stdout  # nothing drawn


@pytest.mark.mosquitto
def test_quiet_prints_nothing_but_errors(tmp_path: Path) -> None:
    done = npcsim(["run", VILLAGE, "--broker", "auto", "--ticks", "3", "--dialogue", "--quiet"], tmp_path)
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")
    failed = npcsim(["run", "no-such-world.toml", "--quiet"], tmp_path)
    assert failed.returncode == 2 and failed.stdout == ""
    assert failed.stderr.startswith("npcsim: error: no-such-world.toml") and len(failed.stderr.splitlines()) == 1


async def _stored_run(db: Path) -> str:
    """A store with one record whose line, reply and prompt carry control characters; returns its id."""
    state = NpcState(agent_id="echo", system_prompt="You repeat.", canonical_facts=(Fact(id="f", text=HOSTILE),))
    config = WorkingMemoryConfig()
    memory = build_working_memory(state, f"p: {HOSTILE}", config)
    record = make_record(memory, id="r:echo:0:1", run_id="r", state=state, config=config, tick=0,
                         response=Response(backend="scripted", model="scripted",
                                           attempts=(Attempt(prompt=memory.prompt, raw_response=HOSTILE),),
                                           line=HOSTILE + " and a line far longer than a preview of sixty characters"))
    async with open_store(db) as store:
        await store.ensure_agent(state, writer=Writer.SCENARIO)
        await store.record(record)
        await store.end_tick(0)
    return record.id


async def test_audit_list_and_show_in_a_pipe_are_full_and_escaped(tmp_path: Path) -> None:
    db = tmp_path / "a.db"
    record_id = await _stored_run(db)
    listed = npcsim(["audit", "list", "--db", str(db)], tmp_path)
    assert listed.returncode == 0 and listed.stderr == "1 records, 0 over budget\n"
    (row,) = listed.stdout.splitlines()
    fields = row.split("\t")
    assert fields[:5] == [record_id, "echo", "0", "scripted/scripted", "1"]  # one attempt
    assert fields[-1] == printable(HOSTILE) + " and a line far longer than a preview of sixty characters"
    shown = npcsim(["audit", "show", "--db", str(db), record_id], tmp_path)
    assert shown.returncode == 0 and no_raw_controls(shown.stdout)
    assert printable(HOSTILE) in shown.stdout and "replay identical" in shown.stdout
    assert not any(c in shown.stdout for c in "┃│━─╭╮")
    as_json = npcsim(["audit", "list", "--db", str(db), "--json"], tmp_path)
    (entry,) = [json.loads(line) for line in as_json.stdout.splitlines()]
    assert entry["id"] == record_id and entry["line"].startswith(HOSTILE) and no_raw_controls(as_json.stdout)
    assert set(entry) == {"id", "agent", "tick", "backend", "model", "tries", "over_budget", "fallback",
                          "fallback_reason", "line"}
    exported = npcsim(["audit", "export", "--db", str(db)], tmp_path)
    assert no_raw_controls(exported.stdout) and json.loads(exported.stdout)["attempts"][-1]["raw_response"] == HOSTILE


def test_scenario_list_and_memory_show_as_json_lines(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["scenario", "list", "--json"]) == 0
    listed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(row["name"], row["npcs"]) for row in listed] == [("gate", 1), ("town-day", 8), ("village", 4)]
    assert all(row["description"] for row in listed)
    assert main(["scenario", "list"]) == 0
    rows = capsys.readouterr().out.splitlines()
    assert [row.split("\t")[:2] for row in rows] == [["gate", "1"], ["town-day", "8"], ["village", "4"]]
    assert main(["memory", "show", VILLAGE, "--npc", "snack_machine", "--json"]) == 0
    shown = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(s["npc"], s["budget"], s["max_context_chars"]) for s in shown] == [
        ("snack_machine", "default", 2000), ("snack_machine", "tight", 600)]
    assert all("capitalist snack machine" in s["prompt"] and s["report"]["limit_chars"] for s in shown)


# --- `| head -1` -------------------------------------------------------------------------------


def _head_1(args: list[str], tmp_path: Path) -> tuple[str, int, str]:
    """Run `npcsim ARGS | head -1`: the first line, npcsim's exit status and its standard error."""
    with subprocess.Popen([NPCSIM, *args], cwd=tmp_path, env=env_for(tmp_path), stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        first = proc.stdout.readline()
        proc.stdout.close()  # the reader goes away, as `head -1` does
        try:
            err = proc.stderr.read()
            code = proc.wait(timeout=60)
        finally:
            proc.kill()
    return first, code, err


@pytest.mark.mosquitto
def test_a_closed_pipe_ends_every_command_quietly_with_0(tmp_path: Path) -> None:
    db = tmp_path / "v.db"
    assert npcsim(["run", VILLAGE, "--ticks", "30", "--db", str(db), "--quiet"], tmp_path).returncode == 0
    commands = [
        ["run", VILLAGE, "--follow", "--ticks", "100000", "--tick-ms", "50"],  # stops in order after the line
        ["run", VILLAGE, "--dialogue", "--ticks", "30"],
        ["audit", "list", "--db", str(db)],
        ["audit", "list", "--db", str(db), "--json"],
        ["audit", "show", "--db", str(db), "village-7:snack_machine:2:2"],
        ["audit", "export", "--db", str(db)],
        ["audit", "replay", "--db", str(db)],
        ["memory", "show", VILLAGE],
        ["memory", "show", VILLAGE, "--json"],
        ["scenario", "list"],
        ["scenario", "show", "village"],
        ["--help"],
    ]
    for args in commands:
        first, code, err = _head_1(args, tmp_path)
        assert first and code == 0 and "Traceback" not in err and "Broken pipe" not in err, (args, code, err)


def test_the_summary_gives_start_up_apart_and_rates_over_the_ticks_time() -> None:
    """A million-NPC run starts up in a minute and then does a few ticks a minute: its
    ticks/s is over the ticks' time and shows three significant digits, not "0.0"; a tick
    that a stop cut short is not counted."""
    import time

    from sim.cli.run import summary_rows
    from sim.shard import RunStats

    now = time.monotonic()
    stats = RunStats(agents=1_000_000, tick=3, ticks_done=3, started=now - 100.0, running_since=now - 60.0)
    rows = dict(summary_rows(stats))
    assert rows["start-up (s)"] == "40.0"
    assert rows["ticks/s"] == "0.05"
    stats = RunStats(agents=10, tick=20, ticks_done=20, started=now - 5.0, running_since=now - 4.0)
    assert dict(summary_rows(stats))["ticks/s"] == "5.0"
    stats.tick = 21  # a stop cut tick 21 short: it is not counted
    assert dict(summary_rows(stats))["ticks"] == "20"
