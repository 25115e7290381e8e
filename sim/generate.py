"""A generated world for scale runs: N NPCs spread over L locations, reproducible by seed.

With a day, each NPC also works at a place (its own home for about half of them) from 8 to 18
and is home the rest of the day: a world whose NPCs move, at scale.
"""

from __future__ import annotations

import random
from pathlib import Path

__all__ = ["generate_scenario", "write_scenario"]

_TRADES = ("baker", "smith", "guard", "farmer", "merchant", "healer", "miner", "bard", "fisher", "weaver")


def _q(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def generate_scenario(*, npcs: int, locations: int, seed: int = 0, ambient_chance: float = 0.02,
                      day: bool = False) -> str:
    """The scenario as TOML text; NPC `n{i}` lives at location `l{i % L}`."""
    if npcs < 1 or locations < 1:
        raise ValueError(f"need at least one NPC and one location, got npcs={npcs} locations={locations}")
    rng = random.Random(seed)
    out = [
        "[scenario]",
        f'name = "generated-{npcs}x{locations}"',
        f"seed = {seed}",
        "ticks = 20",
        *(["ticks_per_day = 24"] if day else []),
        "",
        "[[world]]",
        'key = "season"',
        'value = "spring"',
    ]
    for j in range(locations):
        out += ["", "[[locations]]", f'id = "l{j}"']
    for i in range(npcs):
        trade = rng.choice(_TRADES)
        out += [
            "",
            "[[npcs]]",
            f'id = "n{i}"',
            f'name = "N{i} the {trade}"',
            f'location = "l{i % locations}"',
            f"system_prompt = {_q(f'You are N{i}, a {trade}. Answer in one short line.')}",
            f"ambient_chance = {ambient_chance}",
            f'facts = [ {{ id = "f-trade", text = {_q(f"You are a {trade}.")} }} ]',
        ]
        if day:
            home = i % locations
            away = rng.randrange(locations - 1) if locations > 1 and rng.random() < 0.5 else None
            work = home if away is None else away + (away >= home)  # any place but home
            out.append(f'schedule = [ {{ hour = 8, location = "l{work}", activity = "working as a {trade}" }}, '
                       f'{{ hour = 18, location = "l{home}", activity = "resting at home" }} ]')
    return "\n".join(out) + "\n"


def write_scenario(path: Path, *, npcs: int, locations: int, seed: int = 0, day: bool = False) -> Path:
    path.write_text(generate_scenario(npcs=npcs, locations=locations, seed=seed, day=day))
    return path
