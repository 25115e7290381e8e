"""Files npcsim ships inside its package: the Mosquitto configs and the bundled scenarios.

They are read through `importlib.resources`, so they are found the same way in a clone
(editable install), an installed wheel or a zipped package, whatever the working directory.

One source of truth: `broker-config/` and `scenarios/` at the top of the repository are the
operator-facing files, and `sim/data/broker-config` and `sim/data/scenarios` are symlinks
to them. An editable install reads through the links; hatchling follows them when it builds
a wheel, and pyproject.toml's sdist settings put the real files into the sdist, so both hold
them (tests/test_wheel.py checks it). Every other non-Python file under `sim/` or `agents/`
ships in the wheel as it is (the view's static files, say): read those with
`importlib.resources.files("<their package>")`.

What these functions return are `Traversable`s: use `/`, `.read_text()`, `.iterdir()`.
Where a program needs a real file path (Mosquitto's `acl_file`), write the text into the
run's own directory, or use `importlib.resources.as_file`.
"""

from __future__ import annotations

from importlib.resources import files
from importlib.resources.abc import Traversable

from sim.errors import ScenarioError

__all__ = ["broker_config_dir", "bundled_scenario", "scenario_names"]

_SUFFIX = ".toml"


def _data() -> Traversable:
    return files("sim").joinpath("data")


def broker_config_dir() -> Traversable:
    """The bundled Mosquitto configuration: `dev.conf`, `auth.conf`, `acl`, `passwords`."""
    return _data().joinpath("broker-config")


def scenario_names() -> list[str]:
    """The bundled scenarios' names (the file names without `.toml`), sorted."""
    return sorted(
        entry.name.removesuffix(_SUFFIX)
        for entry in _data().joinpath("scenarios").iterdir()
        if entry.is_file() and entry.name.endswith(_SUFFIX)
    )


def bundled_scenario(name: str) -> str:
    """The text of the bundled scenario `name`, comments included: a starting point to copy."""
    names = scenario_names()
    if name not in names:
        raise ScenarioError(f"no bundled scenario named {name!r}; bundled: {', '.join(names)}")
    return _data().joinpath("scenarios", name + _SUFFIX).read_text(encoding="utf-8")
