"""`--set KEY=VALUE[,VALUE...]`: the settings a what-if changes, and their sweep.

KEY is `memory.PATH`, a field of the recorded `WorkingMemoryConfig` (sim.settings: its type
converts and checks the value, `memory.scored.half_life_ticks` reaches a nested one), or a rule
of the output policy (`POLICY_KEYS`: `forbidden`, `intents`, whose value is a list separated
by ";", or `none`); `npc.ID.KEY` sets one for one NPC only (applied after the run-wide ones).
A comma list sweeps values; with several swept keys every combination is one variant (a
cartesian product, at most `MAX_VARIANTS` of them). A bad key or value is a ConfigError of
one line; whether the combined config is valid (shares summing to at most 1) is checked
against each record's own config, when it is built.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any

import msgspec

from sim.errors import ConfigError
from sim.memory import WorkingMemoryConfig
from sim.output import OutputPolicy
from sim.settings import check_settings, with_settings
from sim.wire.events import is_name

__all__ = ["MAX_VARIANTS", "MEMORY", "POLICY_KEYS", "Override", "Variant", "parse_overrides"]

Value = Any

MAX_VARIANTS = 64

MEMORY = "memory."
"""The keys that change a working memory start with it; the rest is a path into its config."""


def _phrases(text: str) -> tuple[str, ...]:
    """Phrases an NPC must never reveal, separated by ";" (`none`: no phrase)."""
    if text.lower() == "none":
        return ()
    phrases = tuple(dict.fromkeys(p.strip() for p in text.split(";")))
    if not all(phrases):
        raise ValueError('phrases separated by ";" (none empty), or none')
    return phrases


def _intents(text: str) -> tuple[str, ...]:
    """Intent names an NPC may propose, separated by ";" (`none`: no intent)."""
    if text.lower() == "none":
        return ()
    names = tuple(dict.fromkeys(n.strip() for n in text.split(";")))
    if not all(is_name(n) for n in names):
        raise ValueError('intent names separated by ";" (letters, digits, _ and -), or none')
    return names


_POLICY: dict[str, Callable[[str], tuple[str, ...]]] = {"forbidden": _phrases, "intents": _intents}

POLICY_KEYS = frozenset(_POLICY)
"""The keys that change an NPC's output policy (the gates' rules), not its working memory."""


class Override(msgspec.Struct, frozen=True):
    """One `--set`: `key` for every NPC (`npc` None) or for one, with the values swept."""

    npc: str | None
    key: str
    values: tuple[Value, ...]

    @property
    def name(self) -> str:
        return self.key if self.npc is None else f"npc.{self.npc}.{self.key}"


class Variant(msgspec.Struct, frozen=True, kw_only=True):
    """One combination of the swept values: the run-wide settings and each NPC's own."""

    label: str
    settings: dict[str, Value]
    npcs: dict[str, dict[str, Value]] = {}

    def config(self, recorded: WorkingMemoryConfig, agent: str) -> WorkingMemoryConfig:
        """`recorded` with this variant's settings for `agent`; over budget is kept, never raised.

        A what-if counts the snapshots that go over budget, so a recorded `on_overflow =
        "raise"` is read as "keep" here.
        """
        settings = {k.removeprefix(MEMORY): v for k, v in (*self.settings.items(), *self.npcs.get(agent, {}).items())
                    if k.startswith(MEMORY)}
        return with_settings(msgspec.structs.replace(recorded, on_overflow="keep"), settings, MEMORY)


    @property
    def sets_policy(self) -> bool:
        """Whether this variant changes an output policy (the gates' rules) of some NPC."""
        return any(k in POLICY_KEYS for k in (*self.settings, *(k for n in self.npcs.values() for k in n)))

    def policy(self, recorded: OutputPolicy, agent: str) -> OutputPolicy:
        """`recorded` with this variant's rules for `agent`: its `forbidden` phrases, and its
        `intents` allowed with the arguments `recorded` gave them (none for a new one)."""
        rules = {k: v for k, v in (*self.settings.items(), *self.npcs.get(agent, {}).items()) if k in POLICY_KEYS}
        phrases, names = rules.get("forbidden"), rules.get("intents")
        return msgspec.structs.replace(
            recorded,
            forbidden=phrases if isinstance(phrases, tuple) else recorded.forbidden,
            intents={n: recorded.intents.get(n, {}) for n in names} if isinstance(names, tuple) else recorded.intents,
        )


def _one(text: str) -> Override:
    key, sep, values = text.partition("=")
    if not sep or not key or not values:
        raise ConfigError(f"--set {text!r}: expected KEY=VALUE[,VALUE...]")
    npc: str | None = None
    if key.startswith("npc."):
        npc, key = _npc_key(key[4:])
        if not npc:
            raise ConfigError(f"--set {text!r}: expected npc.ID.KEY=VALUE")
    parsed = [_parsed(text, key, value.strip()) for value in values.split(",")]
    return Override(npc, key, tuple(dict.fromkeys(parsed)))


def _npc_key(rest: str) -> tuple[str, str]:
    """`ID.memory.PATH` or `ID.RULE` as (ID, key): an id may hold dots, so the key is found
    from its own shape."""
    at = rest.find("." + MEMORY)
    if at >= 0:
        return rest[:at], rest[at + 1 :]
    npc, _, key = rest.rpartition(".")
    return npc, key


def _parsed(text: str, key: str, value: str) -> Value:
    """One value of `key`: a policy rule's list, or converted by the config's type."""
    policy = _POLICY.get(key)
    if policy is not None:
        try:
            return policy(value)
        except ValueError as exc:
            raise ConfigError(f"--set {text!r}: {key} must be {exc}, got {value!r}") from None
    if not key.startswith(MEMORY):
        raise ConfigError(f"--set {text!r}: unknown key {key!r}; a what-if sets memory.KEY (a field of the "
                          f"working memory's config) or {' or '.join(sorted(_POLICY))}")
    path = key.removeprefix(MEMORY)
    return check_settings(WorkingMemoryConfig, {path: value}, MEMORY)[path]


def parse_overrides(texts: Sequence[str], agents: frozenset[str] | None = None) -> list[Variant]:
    """The variants `--set` asks for; `agents` (the store's NPCs) refuses an unknown `npc.ID`."""
    if not texts:
        raise ConfigError("--set: give at least one KEY=VALUE")
    overrides = [_one(text) for text in texts]
    seen: set[str] = set()
    for override in overrides:
        if override.name in seen:
            raise ConfigError(f"--set {override.name}: given twice (sweep its values with a comma list)")
        seen.add(override.name)
        if agents is not None and override.npc is not None and override.npc not in agents:
            raise ConfigError(f"--set {override.name}: no NPC {override.npc!r} in the store's records")
    count = 1
    for override in overrides:
        count *= len(override.values)
    if count > MAX_VARIANTS:
        raise ConfigError(f"--set: {count} combinations of the swept values, more than {MAX_VARIANTS}")
    variants = []
    for combination in itertools.product(*(o.values for o in overrides)):
        settings: dict[str, Value] = {}
        npcs: dict[str, dict[str, Value]] = {}
        for override, value in zip(overrides, combination, strict=True):
            target = settings if override.npc is None else npcs.setdefault(override.npc, {})
            target[override.key] = value
        label = " ".join(f"{o.name}={_show(v)}" for o, v in zip(overrides, combination, strict=True))
        variants.append(Variant(label=label, settings=settings, npcs=npcs))
    return variants


def _show(value: Value) -> str:
    if isinstance(value, tuple):
        return ";".join(value) or "none"
    return "none" if value is None else str(value).lower() if isinstance(value, bool) else str(value)
