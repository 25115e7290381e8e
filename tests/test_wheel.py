"""The built wheel, installed into a fresh venv outside the repository, runs every command
from an empty folder: what a user who ran `pip install npcsim-*.whl` gets.

The wheel is built the standard ways (`python -m build` and `pip wheel`, hatchling in an
isolated build env) and installed with its dependencies from the package index (pip's
cache serves repeats).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import zipfile
from importlib.metadata import version
from pathlib import Path

import pytest

from tests.helpers import REPO, require_mosquitto

pytestmark = [pytest.mark.slow, pytest.mark.mosquitto, pytest.mark.timeout(1200)]

# Generous: two cores shared with other test runs; a cold pip cache downloads the deps.
STEP_TIMEOUT = 600


def _run(args: list[str | Path], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=STEP_TIMEOUT, check=False
    )
    assert proc.returncode == 0, f"{args} exited {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    return proc


def _package_files() -> set[str]:
    """Every file under the packages in the clone, symlinked data included, as wheel paths."""
    found = set()
    for package in ("sim", "agents"):
        for root, dirs, names in os.walk(REPO / package, followlinks=True):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            found |= {(Path(root) / n).relative_to(REPO).as_posix() for n in names if not n.endswith(".pyc")}
    return found


def test_wheel_installs_and_runs_from_an_empty_folder(tmp_path: Path) -> None:
    require_mosquitto()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}

    # `python -m build`: the sdist, then the wheel from the sdist (where symlinked data gets lost
    # most easily); `pip wheel`: the wheel straight from the clone, as `pip install .` makes it.
    dist, direct = tmp_path / "dist", tmp_path / "direct"
    _run([sys.executable, "-m", "build", "--outdir", dist, REPO], tmp_path, env)
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--wheel-dir", direct, REPO], tmp_path, env)
    (sdist,) = dist.glob("npcsim-*.tar.gz")
    with tarfile.open(sdist) as archive:
        assert {"sim/data/broker-config/dev.conf", "sim/data/scenarios/village.toml"} <= {
            name.partition("/")[2] for name in archive.getnames()
        }
    (wheel,) = dist.glob("npcsim-*.whl")
    (direct_wheel,) = direct.glob("npcsim-*.whl")
    with zipfile.ZipFile(wheel) as archive, zipfile.ZipFile(direct_wheel) as other:
        contents = set(archive.namelist())
        assert contents == set(other.namelist())
    assert {"sim/data/broker-config/dev.conf", "sim/data/scenarios/village.toml"} <= contents
    assert _package_files() <= contents, sorted(_package_files() - contents)

    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", venv], tmp_path, env)
    _run([venv / "bin" / "python", "-m", "pip", "install", "--quiet", wheel], tmp_path, env)
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    npcsim = venv / "bin" / "npcsim"

    work = tmp_path / "work"
    work.mkdir()
    where = _run([venv / "bin" / "python", "-c", "import sim; print(sim.__file__)"], work, env).stdout
    assert Path(where.strip()).is_relative_to(venv), where
    assert _run([npcsim, "--version"], work, env).stdout.strip() == f"npcsim {version('npcsim')}"

    run = _run([npcsim, "run", "village", "--ticks", "3", "--broker", "auto", "--db", "run.db"], work, env)
    assert "inferences\t" in run.stdout and "attach: npcsim subscribe --run village-7" in run.stderr
    assert _run([npcsim, "run", "village", "--ticks", "1", "--quiet"], work, env).stdout == ""
    assert "byte-identical" in _run([npcsim, "audit", "replay", "--db", "run.db"], work, env).stdout
    assert "snack_machine" in _run([npcsim, "memory", "show", "village"], work, env).stdout
    _run([npcsim, "loadtest", "--requests", "100", "--json", "load.json"], work, env)
    figures = json.loads((work / "load.json").read_text())
    assert (figures["inferences"], figures["violations"]) == (100, 0), figures

    # The written-out village is a runnable starting point, by path.
    shown = _run([npcsim, "scenario", "show", "village"], work, env).stdout
    (work / "my.toml").write_text(shown)
    _run([npcsim, "run", "my.toml", "--ticks", "1", "--broker", "auto", "--quiet"], work, env)
    assert "village" in _run([npcsim, "scenario", "list"], work, env).stdout
