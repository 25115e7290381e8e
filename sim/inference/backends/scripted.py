"""The `scripted` backend: deterministic, no model, built from the memory it received.

Its reply names the newest kept canonical fact, else the newest belief, else the last
line of dialogue, so a test can prove the context reached the worker. `delay_ms` makes it
answer after a fixed delay (benchmarks); `script` replaces the reply by fixed texts used
in turn (tests of output handling).
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Mapping
from typing import Any

import msgspec

from sim.inference._types import Reply
from sim.inference.backends import convert_options
from sim.memory import WorkingMemory

__all__ = ["ScriptedBackend", "ScriptedOptions", "scripted_reply"]


class ScriptedOptions(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    delay_ms: float = 0.0
    script: tuple[str, ...] = ()


def scripted_reply(memory: WorkingMemory) -> str:
    """The reply built from the working memory; the same memory gives the same reply."""
    if memory.canonical_facts:
        return f"As everyone here knows, {memory.canonical_facts[-1].text.rstrip('.')}."
    if memory.beliefs:
        return f"I believe {memory.beliefs[-1].text.rstrip('.')}."
    if memory.dialogue:
        last = memory.dialogue[-1]
        return f"{last.speaker} said: {last.text.rstrip('.')}."
    return "Good day to you."


class ScriptedBackend:
    name = "scripted"
    model = "scripted"

    def __init__(self, options: Mapping[str, Any]) -> None:
        self._options = convert_options(self.name, options, ScriptedOptions)
        self._script = itertools.cycle(self._options.script) if self._options.script else None
        self._params: dict[str, Any] = {"delay_ms": self._options.delay_ms}

    async def generate(self, memory: WorkingMemory, prohibition: str | None) -> Reply:
        if self._options.delay_ms > 0:
            await asyncio.sleep(self._options.delay_ms / 1000)
        text = next(self._script) if self._script is not None else scripted_reply(memory)
        return Reply(text=text, model=self.model, params=self._params, tokens=len(text.split()))
