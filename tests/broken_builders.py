"""Builders of working memories that break an invariant on purpose: the checker must catch them.

Shared by the load test's tests; its sweep processes (spawned) import them from here by name.
"""

from __future__ import annotations

import msgspec

from sim.memory import NpcState, WorkingMemory, WorkingMemoryConfig, build_working_memory

__all__ = ["drop_first_fact", "ignore_budget", "refuse_to_build", "say_twice"]


def drop_first_fact(state: NpcState, player_input: str, config: WorkingMemoryConfig) -> WorkingMemory:
    """A broken builder: builds without the first canonical fact (I1 must catch it)."""
    if state.canonical_facts:
        state = msgspec.structs.replace(state, canonical_facts=state.canonical_facts[1:])
    return build_working_memory(state, player_input, config)


def ignore_budget(state: NpcState, player_input: str, config: WorkingMemoryConfig) -> WorkingMemory:
    """A broken builder: fills to ten times the limit (I2 must catch it)."""
    loose = msgspec.structs.replace(config, max_context_chars=config.max_context_chars * 10)
    return build_working_memory(state, player_input, loose)


def say_twice(state: NpcState, player_input: str, config: WorkingMemoryConfig) -> WorkingMemory:
    """A broken builder: blind to the events, it keeps the memory of a kept line (I8 must catch it)."""
    blind = msgspec.structs.replace(state, dialogue=tuple(msgspec.structs.replace(line, event=None)
                                                          for line in state.dialogue))
    memory = build_working_memory(blind, player_input, config)
    lines = state.dialogue[len(state.dialogue) - len(memory.dialogue) :] if memory.dialogue else ()
    return msgspec.structs.replace(memory, dialogue=lines)


def refuse_to_build(state: NpcState, player_input: str, config: WorkingMemoryConfig) -> WorkingMemory:
    """A builder that raises: the sweep process must report it, not vanish."""
    raise RuntimeError(f"no working memory for {state.agent_id}")
