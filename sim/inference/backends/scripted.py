"""The `scripted` backend: deterministic, no model, built from the memory it received.

Its reply is one remark drawn from the kept context (a canonical fact, a belief or a
memory, chosen by the prompt's SHA-256; the last line of dialogue when there is none of
those), so a test can prove the context reached the worker and a scripted run still
varies like a conversation. `delay_ms` makes it
answer after a fixed delay (benchmarks); `script` replaces the reply by fixed texts used
in turn (tests of output handling).
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
from collections.abc import Mapping
from typing import Any

import msgspec

from sim.inference.backends._base import Reply, convert_options
from sim.memory import WorkingMemory

__all__ = ["ScriptedBackend", "ScriptedOptions", "scripted_reply"]


class ScriptedOptions(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    delay_ms: float = 0.0
    script: tuple[str, ...] = ()


def scripted_reply(memory: WorkingMemory) -> str:
    """The reply built from the working memory; the same memory gives the same reply."""
    remarks = [f"as everyone here knows, {f.text}" for f in memory.canonical_facts]
    remarks += [f"I believe {b.text[:1].lower()}{b.text[1:]}" for b in memory.beliefs]
    remarks += [f"I remember this: {e.text}" for e in memory.episodic]
    if not remarks and memory.dialogue:
        remarks = [f"{memory.dialogue[-1].speaker} said: {memory.dialogue[-1].text}"]
    if not remarks:
        return "Good day to you."
    digest = hashlib.sha256(memory.prompt.encode()).digest()
    remark = remarks[int.from_bytes(digest[:4], "big") % len(remarks)].rstrip(".!? ")
    return f"{remark[:1].upper()}{remark[1:]}."


class ScriptedBackend:
    name = "scripted"
    model = "scripted"
    prompt_form = "text"
    prompt_prefix = ""

    def __init__(self, options: Mapping[str, Any]) -> None:
        self._options = convert_options(self.name, options, ScriptedOptions)
        self._script = itertools.cycle(self._options.script) if self._options.script else None
        self._params: dict[str, Any] = {"delay_ms": self._options.delay_ms}

    async def generate(self, memory: WorkingMemory) -> Reply:
        if self._options.delay_ms > 0:
            await asyncio.sleep(self._options.delay_ms / 1000)
        text = next(self._script) if self._script is not None else scripted_reply(memory)
        return Reply(text=text, model=self.model, params=self._params, tokens=len(text.split()))
