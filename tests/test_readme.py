"""The README is a test: its commands (and those of docs/) run in order, as written.

The convention the documents follow:

- A ```console block holds examples to run: each line starting with `$ ` is a command (a
  line ending in `\\` continues it); other lines are what it prints, or comments (`# ...`).
  Commands of one document run in order, in one scratch directory of their own, with the
  package's console script first on PATH (`npcsim` and `.venv/bin/npcsim` are it).
- What a block shows a command print is checked: each line shown must be a line the command
  printed (standard output and error), in the order shown; a line `...` stands for lines
  left out (an abridged output), and other lines may be left out too.
- A command ending in `&` runs in the background: it must be alive and have printed
  something before the next command runs, and be alive at the end of its block; then it
  gets SIGINT.
- HTML comments right before a block change how its commands run; MATCH (optional, in
  quotes) picks the commands that contain it, all of the block's without it:
  `<!-- test: forever "MATCH" -->`: it runs until stopped: it must print within a minute
      and still be alive, and answer on the web address it printed, if any; then SIGINT;
  `<!-- test: replace "A" "B" -->`: run with A replaced by B (a smaller world or shorter
      load test than the reader is shown);
  `<!-- test: skip "MATCH": reason -->`: not run, for the reason given;
  `<!-- test: known-failure "MATCH": reason -->`: must still fail (non-zero or hanging for
      30 s): when it passes, this test fails, so that the marker is removed;
  `<!-- test: varies "MATCH": reason -->`: it runs, but what it prints is not compared with
      what the block shows (figures that depend on timing, said in the reason).
- Any other code block that holds commands (`npcsim`, `make`, `mosquitto_*`, `pip`, ...)
  must carry a skip marker with its reason: no example goes untested by oversight.

What the test changes itself: the ports of the examples (8080, 8081, ... and Prometheus'
9100) become free ports; a broker on 127.0.0.1:1883 (and `mosquitto_pub`/`mosquitto_sub`,
which default to it) becomes the test's own Mosquitto, never the system's; `make TARGET`
runs in the clone with this test's virtualenv and without re-installing it, keeping a run's
store in the scratch directory's `runs/` (as the other commands do there), not the clone's. A command fails
the test when it exits non-zero: so does an example that names an audit id or a file that
the commands before it did not make.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from sim.cli.run import RUNS_ENV
from tests.helpers import REPO, MosquittoProcess, elapse_sync, eventually_sync, free_port

pytestmark = [pytest.mark.slow, pytest.mark.mosquitto, pytest.mark.timeout(1200)]

BIN = Path(sys.executable).parent
VENV = BIN.parent
DOCUMENTS = ["README.md", *sorted(str(p.relative_to(REPO)) for p in (REPO / "docs").glob("*.md"))]
COMMAND_WORDS = ("npcsim", ".venv/bin/npcsim", "make", "mosquitto_pub", "mosquitto_sub", "pip", "python3",
                 "NPCSIM_")
STEP_TIMEOUT = 300.0  # a command that should end (generous: two cores shared with other runs)
READY_TIMEOUT = 60.0  # a background or forever command has printed something
KNOWN_FAILURE_TIMEOUT = 30.0

_FENCE = re.compile(r"^```(\w*)\s*$")
_DIRECTIVE = re.compile(
    r'^<!-- test: (forever|replace|skip|known-failure|varies)((?:\s+"[^"]*")*)\s*(?::\s*(.+?))?\s*-->$'
)
_QUOTED = re.compile(r'"([^"]*)"')
_URL = re.compile(r"http://127\.0\.0\.1:\d+/\S*")


@dataclass
class Directive:
    kind: str
    args: list[str]
    reason: str

    def picks(self, command: str) -> bool:
        return not self.args or self.args[0] in command


@dataclass
class Block:
    document: str
    line: int
    language: str
    lines: list[str]
    directives: list[Directive] = field(default_factory=list)

    def examples(self) -> list[tuple[str, list[str]]]:
        """Each command with the lines the block shows it print (comments left out)."""
        found: list[tuple[str, list[str]]] = []
        pending = ""
        for line in self.lines:
            if pending:
                pending += "\n" + line
            elif line.startswith("$ "):
                pending = line[2:]
            else:
                if found and line.strip() and not line.startswith("#"):
                    found[-1][1].append(line)
                continue
            if not pending.endswith("\\"):
                found.append((pending, []))
                pending = ""
        return found

    def commands(self) -> list[str]:
        return [command for command, _ in self.examples()]

    def has_commands(self) -> bool:
        first = next((ln.strip() for ln in self.lines if ln.strip() and not ln.strip().startswith("#")), "")
        return first.startswith("$ ") or first.startswith(COMMAND_WORDS)

    def where(self) -> str:
        return f"{self.document}:{self.line}"


def blocks(document: str) -> list[Block]:
    """The fenced code blocks of a document, each with the test directives right above it."""
    found: list[Block] = []
    directives: list[Directive] = []
    current: Block | None = None
    for n, line in enumerate((REPO / document).read_text().splitlines(), 1):
        if current is not None:
            if line.startswith("```"):
                found.append(current)
                current = None
            else:
                current.lines.append(line)
            continue
        if fence := _FENCE.match(line):
            current = Block(document, n, fence.group(1), [], directives)
            directives = []
        elif directive := _DIRECTIVE.match(line.strip()):
            kind, quoted, reason = directive.groups()
            directives.append(Directive(kind, _QUOTED.findall(quoted or ""), reason or ""))
        elif line.strip():
            directives = []
    return found


# --- what the test changes in a command ---------------------------------------------------------


class Rewrite:
    """The test's own substitutions: free ports, the test's broker, the console script, make."""

    def __init__(self, broker: MosquittoProcess, scratch: Path) -> None:
        self.broker = broker
        self.scratch = scratch
        self.ports: dict[str, int] = {}

    def _port(self, match: re.Match[str]) -> str:
        number = match.group(2)
        if number not in self.ports:
            self.ports[number] = free_port()
        return f"{match.group(1)}{self.ports[number]}"

    def __call__(self, command: str) -> str:
        port = self.broker.port
        command = command.replace("127.0.0.1:1883", f"127.0.0.1:{port}")
        command = re.sub(r"(--view |--port |--metrics-port |VIEW_PORT=|http://127\.0\.0\.1:)(80\d\d|9100)\b",
                         self._port, command)
        command = re.sub(r"\b(mosquitto_(?:pub|sub)) -p 1883\b", rf"\1 -p {port}", command)
        command = re.sub(r"\b(mosquitto_(?:pub|sub))\b(?! -p)", rf"\1 -p {port}", command)
        command = command.replace(".venv/bin/npcsim", str(BIN / "npcsim"))
        view = "" if "VIEW_PORT=" in command else f"VIEW_PORT={free_port()} "
        return re.sub(r"^make (\w+)", rf"{RUNS_ENV}={self.scratch / 'runs'} make -C {REPO} -o {VENV}/.installed-run "
                                      rf"-o {VENV}/.installed-test VENV={VENV} {view}\1", command)


# --- running ------------------------------------------------------------------------------------


@dataclass
class Running:
    command: str
    proc: subprocess.Popen[bytes]
    out: Path

    def printed(self) -> str:
        return self.out.read_text(errors="replace")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGINT)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)


def _said(text: str) -> bool:
    """Printed something of its own (make's "Entering directory" does not count)."""
    return any(line.strip() and not line.startswith("make") for line in text.splitlines())


class Runner:
    def __init__(self, scratch: Path, rewrite: Rewrite) -> None:
        self.scratch = scratch
        self.rewrite = rewrite
        runs = scratch / ".runs"
        runs.mkdir(mode=0o700)
        self.env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
                    "XDG_RUNTIME_DIR": str(runs), "COLUMNS": "120"}
        self.env.pop(RUNS_ENV, None)  # a run without --db keeps its store in ./runs, as the documents show
        self.count = 0

    def start(self, command: str) -> Running:
        self.count += 1
        out = self.scratch / ".out" / f"{self.count}.txt"
        out.parent.mkdir(exist_ok=True)
        with out.open("wb") as sink:
            proc = subprocess.Popen(["bash", "-c", command], cwd=self.scratch, env=self.env, stdout=sink,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        return Running(command, proc, out)

    def run(self, command: str, where: str) -> str:
        """Run `command` to its end (exit 0); what it printed."""
        running = self.start(command)
        try:
            code = running.proc.wait(timeout=STEP_TIMEOUT)
        except subprocess.TimeoutExpired:
            running.stop()
            pytest.fail(f"{where}: `{command}` did not end within {STEP_TIMEOUT:.0f} s:\n{running.printed()}")
        assert code == 0, f"{where}: `{command}` exited {code}:\n{running.printed()}"
        return running.printed()

    def ready(self, running: Running, where: str) -> None:
        """Alive and printing (and answering on the web address it printed)."""
        with contextlib.suppress(AssertionError):  # said below, with what it printed
            eventually_sync(lambda: not running.alive() or _said(running.printed()),
                            what=f"`{running.command}` printing", within=READY_TIMEOUT, every=0.1)
        text = running.printed()
        assert running.alive(), f"{where}: `{running.command}` ended (code {running.proc.returncode}):\n{text}"
        assert _said(text), f"{where}: `{running.command}` printed nothing within {READY_TIMEOUT:.0f} s"
        for url in _URL.findall(text):
            assert httpx.get(url, timeout=30).status_code == 200, f"{where}: {url} does not answer"
        assert "Traceback" not in text, f"{where}: `{running.command}`:\n{text}"

    def known_failure(self, command: str, where: str, reason: str) -> None:
        running = self.start(command)
        try:
            code = running.proc.wait(timeout=KNOWN_FAILURE_TIMEOUT)
        except subprocess.TimeoutExpired:
            running.stop()
            return
        assert code != 0, (f"{where}: `{command}` now works: remove its known-failure marker ({reason})")

    @contextlib.contextmanager
    def background(self) -> Iterator[list[Running]]:
        started: list[Running] = []
        try:
            yield started
            for running in started:
                assert running.alive(), f"`{running.command}` ended before its block did:\n{running.printed()}"
        finally:
            for running in reversed(started):
                running.stop()


def run_document(document: str, scratch: Path, broker: MosquittoProcess) -> int:
    """Run every example of `document` in order; returns how many commands ran."""
    rewrite = Rewrite(broker, scratch)
    runner = Runner(scratch, rewrite)
    ran = 0
    for block in blocks(document):
        if block.language != "console":
            continue
        with runner.background() as started:
            for written, shown in block.examples():
                where = block.where()
                picked = [d for d in block.directives if d.picks(written)]
                if any(d.kind == "skip" for d in picked):
                    continue
                command = written
                for d in picked:
                    if d.kind == "replace":
                        assert d.args[1:] and d.args[0] in command, f"{where}: replace {d.args} matches nothing"
                        command = command.replace(d.args[0], d.args[1])
                command = rewrite(command)
                known = next((d for d in picked if d.kind == "known-failure"), None)
                ran += 1
                if known is not None:
                    runner.known_failure(command, where, known.reason)
                elif re.search(r"\s&\s*(#.*)?$", command):
                    running = runner.start(re.sub(r"\s&\s*(#.*)?$", "", command))
                    started.append(running)
                    runner.ready(running, where)
                elif any(d.kind == "forever" for d in picked):
                    running = runner.start(command)
                    try:
                        runner.ready(running, where)
                        elapse_sync(1.0)  # the subject: it goes on running, a second later still
                        assert running.alive(), f"{where}: `{command}` ended:\n{running.printed()}"
                    finally:
                        running.stop()
                else:
                    printed = runner.run(command, where)
                    if not any(d.kind == "varies" for d in picked):
                        missing = unshown(shown, printed)
                        assert missing is None, (f"{where}: `{written}` does not print the line shown\n  {missing}\n"
                                                 f"it printed:\n{printed}")
    return ran


def unshown(shown: list[str], printed: str) -> str | None:
    """The first line of `shown` that `printed` does not hold in the order shown, or None
    (`...` lines are left out of the comparison)."""
    lines = iter(line.rstrip() for line in printed.splitlines())
    for expected in shown:
        if expected.strip() == "...":
            continue
        if not any(line == expected.rstrip() for line in lines):
            return expected
    return None


# --- the tests ----------------------------------------------------------------------------------


def test_every_block_with_commands_is_run_or_says_why_not() -> None:
    unrun = []
    for document in DOCUMENTS:
        for block in blocks(document):
            if not block.has_commands():
                continue
            whole = [d for d in block.directives if d.kind == "skip" and not d.args]
            if any(not d.reason for d in block.directives if d.kind in ("skip", "known-failure")):
                unrun.append(f"{block.where()}: a skip or known-failure marker without its reason")
            if block.language != "console" and not whole:
                unrun.append(f"{block.where()}: a ```{block.language} block of commands: make it ```console "
                             "(run by this test) or mark it <!-- test: skip: why -->")
            if block.language == "console" and not block.commands():
                unrun.append(f"{block.where()}: a console block without `$ ` commands")
    assert not unrun, "\n".join(unrun)


@pytest.mark.parametrize("document", [d for d in DOCUMENTS if any(b.language == "console" for b in blocks(d))])
def test_the_examples_run_as_written(document: str, tmp_path: Path, mosquitto: MosquittoProcess) -> None:
    if shutil.which("mosquitto_pub") is None:
        pytest.skip("mosquitto_pub (mosquitto-clients) is not installed")
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    assert run_document(document, scratch, mosquitto) > 0


def test_the_convention_is_read_as_documented() -> None:
    """The reader finds commands, continuations, backgrounds and directives (else the tests above prove little)."""
    readme = blocks("README.md")
    assert any(b.language == "console" and b.commands() for b in readme)
    block = Block("x", 1, "console", ["$ npcsim one \\", "    --b", "output", "$ npcsim two &   # note"],
                  [Directive("skip", ["two"], "why")])
    assert block.commands() == ["npcsim one \\\n    --b", "npcsim two &   # note"]
    assert block.examples()[0][1] == ["output"]
    assert unshown(["a", "...", "c"], "a\nb\nc\n") is None and unshown(["c", "a"], "a\nb\nc\n") == "a"
    assert block.directives[0].picks("npcsim two") and not block.directives[0].picks("npcsim one")
    directive = _DIRECTIVE.match('<!-- test: replace "--agents 10000" "--agents 200" -->')
    assert directive is not None and _QUOTED.findall(directive.group(2)) == ["--agents 10000", "--agents 200"]
    assert _DIRECTIVE.match("<!-- test: skip: the suite itself -->") is not None


def test_the_grep_of_the_readme_finds_lines(tmp_path: Path) -> None:
    """The README's `npcsim run ... --follow | grep WORD`, as a shell runs it, finds lines, each with WORD."""
    text = " ".join((REPO / "README.md").read_text().split())
    found = re.search(r"`(npcsim run [^`|]*--follow \| grep ('[^']+'|\S+))`", text)
    assert found is not None, "the README's grep example is gone"
    command, word = found.group(1), found.group(2).strip("'")
    runs = tmp_path / "runs"
    runs.mkdir(mode=0o700)
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "XDG_RUNTIME_DIR": str(runs)}
    done = subprocess.run(["bash", "-c", command], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=STEP_TIMEOUT, check=False)
    lines = done.stdout.splitlines()
    assert done.returncode == 0 and lines, f"`{command}` found nothing:\n{done.stderr}"
    assert all(word in line for line in lines)
