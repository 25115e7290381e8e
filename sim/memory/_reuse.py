"""`prefix_reuse`: how much of a prompt a model server could take from its cache.

llama.cpp's slots and vLLM's prefix caching reuse the longest prefix a prompt shares with
one the server evaluated before; for an NPC served by one slot, that is its previous
prompt. The builder knows no previous prompt (it is pure and remembers nothing), so this is
computed where prompts are recorded: the run's recorder and `npcsim audit`.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from sim.memory._budget import WorkingMemoryConfig, counted_by_server
from sim.memory._tokens import token_counter

__all__ = ["PrefixReuse", "common_prefix", "prefix_reuse"]


class PrefixReuse(msgspec.Struct, frozen=True, kw_only=True):
    """The prefix a prompt shares with the previous one: `chars` of its `prompt_chars`, and
    in tokens (`tokens` of `prompt_tokens`) when the config counts tokens, None otherwise."""

    chars: int
    prompt_chars: int
    tokens: int | None = None
    prompt_tokens: int | None = None

    @property
    def share(self) -> float:
        """The reused part of the prompt, in characters (0 for an empty prompt)."""
        return self.chars / self.prompt_chars if self.prompt_chars else 0.0


def common_prefix(a: Sequence[object], b: Sequence[object]) -> int:
    """The length of the longest common prefix of two strings or lists: a bisection over
    slice comparisons, which run in C."""
    low, high = 0, min(len(a), len(b))
    while low < high:
        middle = (low + high + 1) // 2
        if a[:middle] == b[:middle]:
            low = middle
        else:
            high = middle - 1
    return low


def prefix_reuse(previous: str, prompt: str, config: WorkingMemoryConfig | None = None) -> PrefixReuse:
    """How much of `prompt` is a prefix of `previous`; in tokens too when `config` has a token
    limit (its tokenizer's count of the shared text: a token merging across the boundary may
    make it one more than a server reuses). A "server" tokenizer's counts are the server's,
    asked by the I/O layer for what a build needs: the shared text is not among them, so its
    reuse is in characters only."""
    chars = common_prefix(previous, prompt)
    if config is None or config.max_context_tokens is None or counted_by_server(config):
        return PrefixReuse(chars=chars, prompt_chars=len(prompt))
    count = token_counter(config.tokenizer)
    return PrefixReuse(chars=chars, prompt_chars=len(prompt), tokens=count(prompt[:chars]),
                       prompt_tokens=count(prompt))
