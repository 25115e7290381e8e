"""`--set KEY=VALUE[,VALUE...]`: the settings a what-if changes, and their sweep.

KEY is a field of `WorkingMemoryConfig` a what-if may change, or a rule of the output
policy (`POLICY_KEYS`: `forbidden`, `intents`, whose value is a list separated by ";",
or `none`), both in `SETTABLE`; `npc.ID.KEY` sets one for one NPC only (applied after the
run-wide ones). A comma list sweeps
values; with several swept keys every combination is one variant (a cartesian product,
at most `MAX_VARIANTS` of them). A bad key or value is a ConfigError of one line; whether
the combined config is valid (shares summing to at most 1) is checked against each
record's own config, when it is built.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence

import msgspec

from sim.errors import ConfigError
from sim.memory import SELECTIONS, WorkingMemoryConfig
from sim.output import OutputPolicy
from sim.wire.events import is_name

__all__ = ["MAX_VARIANTS", "POLICY_KEYS", "SETTABLE", "Override", "Variant", "parse_overrides"]

Value = int | float | bool | str | tuple[str, ...] | None

MAX_VARIANTS = 64

_TRUE = {"true", "yes", "on", "1"}
_FALSE = {"false", "no", "off", "0"}


def _count(text: str) -> Value:
    if not text.isdigit():
        raise ValueError("a whole number >= 0")
    return int(text)


def _count_or_none(text: str) -> Value:
    return None if text.lower() == "none" else _count(text)


def _number(wanted: str, holds: Callable[[float], bool]) -> Callable[[str], Value]:
    """A parser of a finite number for which `holds`; `wanted` says which, when it is not."""

    def parse(text: str) -> Value:
        try:
            number = float(text)
        except ValueError:
            raise ValueError(wanted) from None
        if not math.isfinite(number) or not holds(number):
            raise ValueError(wanted)
        return number

    return parse


_share = _number("a number from 0 to 1", lambda x: 0.0 <= x <= 1.0)
_weight = _number("a number >= 0", lambda x: x >= 0.0)
_half_life = _number("a number > 0", lambda x: x > 0.0)


def _selection(text: str) -> Value:
    if text not in SELECTIONS:
        raise ValueError(" or ".join(repr(s) for s in SELECTIONS))
    return text


def _flag(text: str) -> Value:
    if text.lower() in _TRUE:
        return True
    if text.lower() in _FALSE:
        return False
    raise ValueError("true or false")


def _phrases(text: str) -> Value:
    """Phrases an NPC must never reveal, separated by ";" (`none`: no phrase)."""
    if text.lower() == "none":
        return ()
    phrases = tuple(dict.fromkeys(p.strip() for p in text.split(";")))
    if not all(phrases):
        raise ValueError('phrases separated by ";" (none empty), or none')
    return phrases


def _intents(text: str) -> Value:
    """Intent names an NPC may propose, separated by ";" (`none`: no intent)."""
    if text.lower() == "none":
        return ()
    names = tuple(dict.fromkeys(n.strip() for n in text.split(";")))
    if not all(is_name(n) for n in names):
        raise ValueError('intent names separated by ";" (letters, digits, _ and -), or none')
    return names


SETTABLE: dict[str, Callable[[str], Value]] = {
    "max_context_chars": _count,
    "max_context_tokens": _count_or_none,  # "none": no token limit
    "max_episodic_memories": _count,
    "max_beliefs": _count,
    "max_dialogue_lines": _count,
    "dialogue_share": _share,
    "episodic_share": _share,
    "belief_share": _share,
    "redistribute_unused": _flag,
    "stable_prefix": _flag,
    "selection": _selection,
    "half_life_ticks": _half_life,
    "recency_weight": _weight,
    "importance_weight": _weight,
    "relevance_weight": _weight,
    "dialogue_importance": _share,
    "forbidden": _phrases,
    "intents": _intents,
}

POLICY_KEYS = frozenset({"forbidden", "intents"})
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
        fields = msgspec.structs.asdict(recorded)
        fields.update((k, v) for k, v in self.settings.items() if k not in POLICY_KEYS)
        fields.update((k, v) for k, v in self.npcs.get(agent, {}).items() if k not in POLICY_KEYS)
        fields["on_overflow"] = "keep"
        try:
            return WorkingMemoryConfig(**fields)
        except ConfigError as exc:
            raise ConfigError(f"--set {self.label}: {exc}") from None


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
        npc, _, key = key[4:].rpartition(".")
        if not npc:
            raise ConfigError(f"--set {text!r}: expected npc.ID.KEY=VALUE")
    parse = SETTABLE.get(key)
    if parse is None:
        raise ConfigError(f"--set {text!r}: unknown key {key!r}; known: {', '.join(SETTABLE)}")
    parsed: list[Value] = []
    for value in values.split(","):
        try:
            parsed.append(parse(value.strip()))
        except ValueError as exc:
            raise ConfigError(f"--set {text!r}: {key} must be {exc}, got {value.strip()!r}") from None
    return Override(npc, key, tuple(dict.fromkeys(parsed)))


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
