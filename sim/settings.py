"""`--set KEY=VALUE`: a setting named by its dotted path into a config Struct, converted by
that Struct's own types.

A config Struct is the one declaration of its settings: its fields' types (with their
`Meta` constraints) say which values a key takes, its `__post_init__` which combinations
are refused. A scenario's TOML table, the few daily flags and `--set` all read it, so a
new field is settable everywhere without another list. KEY walks the fields
(`memory.scored.half_life_ticks`; past a `dict[str, ...]` field any name, checked by whoever
reads the dict); VALUE is text converted as msgspec does with `strict=False` ("0.5" a float,
"true" a bool), "none" for a field that may be None, a JSON array or object for a list or
table. A bad key or value is a ConfigError of one line naming both.
"""

from __future__ import annotations

import re
import types
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal, TypeVar, Union, get_args, get_origin, get_type_hints

import msgspec

from sim.errors import ConfigError
from sim.wire.decoding import read_any_json

__all__ = ["check_settings", "parse_settings", "setting_value", "with_settings"]

S = TypeVar("S", bound=msgspec.Struct)

_NONE = frozenset({"none", "null"})
_PATH = re.compile(r" - at `\$[^`]*`$")  # msgspec's path of the field at fault: the key names it


def parse_settings(texts: Sequence[str]) -> dict[str, str]:
    """`KEY=VALUE` texts as {dotted key: value text}; a malformed one or a key given twice is
    refused."""
    settings: dict[str, str] = {}
    for text in texts:
        key, sep, value = text.partition("=")
        key = key.strip()
        if not sep or not key or any(not part for part in key.split(".")):
            raise ConfigError(f"--set {text!r}: expected KEY=VALUE, KEY a dotted name such as memory.selection")
        if key in settings:
            raise ConfigError(f"--set {key}: given twice")
        settings[key] = value.strip()
    return settings


def setting_value(kind: type[msgspec.Struct], key: str, value: object) -> Any:
    """`value` (text, or already a value) as the type `key` has in `kind`; a ConfigError names
    the key when `kind` has no such setting or the value is not of its type."""
    hint = _hint(kind, key)
    if not isinstance(value, str):
        return _converted(key, value, hint, value)
    if value.lower() in _NONE and _takes_none(hint):
        return None
    if value[:1] in ("[", "{"):
        try:
            return _converted(key, read_any_json(value.encode()), hint, value)
        except msgspec.DecodeError:
            pass
    return _converted(key, value, hint, value)


def check_settings(kind: type[msgspec.Struct], settings: Mapping[str, object], prefix: str = "") -> dict[str, Any]:
    """Each setting converted to its type in `kind` (the combination is `with_settings`'s to check);
    `prefix` is how the keys are shown (`memory.`)."""
    checked = {}
    for key, value in settings.items():
        try:
            checked[key] = setting_value(kind, key, value)
        except ConfigError as exc:
            raise ConfigError(f"--set {prefix}{exc.args[0].removeprefix('--set ')}") from None
    return checked


def with_settings(base: S, settings: Mapping[str, object], prefix: str = "") -> S:
    """`base` with each dotted setting changed, converted by its type and checked by the Struct
    as a whole (its `__post_init__`, every nested one's too)."""
    if not settings:
        return base
    kind = type(base)
    tree = msgspec.to_builtins(base)
    for key, value in check_settings(kind, settings, prefix).items():
        *parents, last = key.split(".")
        place = tree
        for part in parents:
            place = place.setdefault(part, {})
        place[last] = msgspec.to_builtins(value)
    try:
        return msgspec.convert(tree, kind, strict=False)
    except (msgspec.ValidationError, ConfigError) as exc:
        shown = " ".join(f"{prefix}{key}={_shown(value)}" for key, value in settings.items())
        raise ConfigError(f"--set {shown}: {_PATH.sub('', str(exc))}") from None


def _shown(value: object) -> str:
    return value if isinstance(value, str) else msgspec.json.encode(value).decode()


def _hint(kind: type[msgspec.Struct], key: str) -> Any:
    """The declared type of the field `key` names, walking nested Structs and dict fields."""
    current: Any = kind
    walked: list[str] = []
    for part in key.split("."):
        struct = _struct_in(current)
        if struct is not None:
            names = [field.name for field in msgspec.structs.fields(struct)]
            if part not in names:
                where = f" in {'.'.join(walked)}" if walked else ""
                raise ConfigError(f"--set {key}: no setting {part!r}{where}; known: {', '.join(names)}")
            current = get_type_hints(struct, include_extras=True)[part]
        else:
            values = _dict_values(current)
            if values is None:
                raise ConfigError(f"--set {key}: {'.'.join(walked)} is one value, with no settings inside it")
            current = values
        walked.append(part)
    return current


def _members(hint: Any) -> tuple[Any, ...]:
    """The types a hint stands for: itself, or each member of a union; Annotated unwrapped."""
    if get_origin(hint) is Annotated:
        hint = get_args(hint)[0]
    if get_origin(hint) in (Union, types.UnionType):
        return tuple(m for member in get_args(hint) for m in _members(member))
    return (hint,)


def _struct_in(hint: Any) -> type[msgspec.Struct] | None:
    for member in _members(hint):
        if isinstance(member, type) and issubclass(member, msgspec.Struct):
            return member
    return None


def _dict_values(hint: Any) -> Any:
    for member in _members(hint):
        if get_origin(member) is dict:
            return get_args(member)[1]
    return None


def _takes_none(hint: Any) -> bool:
    return any(member is None or member is type(None) for member in _members(hint))


def _converted(key: str, value: object, hint: Any, shown: object) -> Any:
    try:
        return msgspec.convert(value, hint, strict=False)
    except msgspec.ValidationError as exc:
        choices = _choices(hint)
        known = f" (one of: {', '.join(map(str, choices))})" if choices else ""
        raise ConfigError(f"--set {key}={_shown(shown)}: {exc}{known}") from None


def _choices(hint: Any) -> tuple[Any, ...]:
    """The values a `Literal` setting takes (through `Annotated` and `| None`), else ()."""
    while get_origin(hint) is Annotated:
        hint = get_args(hint)[0]
    if get_origin(hint) in (Union, types.UnionType):
        return tuple(c for arg in get_args(hint) if arg is not type(None) for c in _choices(arg))
    return get_args(hint) if get_origin(hint) is Literal else ()
