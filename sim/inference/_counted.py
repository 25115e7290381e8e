"""Building a working memory whose token budget is counted by a server (`tokenizer = "server"`).

The build is pure (`sim.memory`): it takes the counts it may use and names the texts they
lack (`CountsMissing`). `counted_memory` is the shell around it: it fetches those counts
from a `Tokenizer` (`sim.inference.backends`; awaiting, so the shard's loop goes on) and builds again, until nothing
is missing; the counts the build used come back with the memory, for its audit record, so
that a replay rebuilds the prompt byte for byte with no server.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

from sim.errors import ConfigError
from sim.inference.backends import Tokenizer
from sim.memory import (
    CountsMissing,
    NpcState,
    WorkingMemory,
    WorkingMemoryConfig,
    build_working_memory,
    counted_by_server,
    token_counter,
)

__all__ = ["KeptCounts", "counted_memory"]


class KeptCounts:
    """A `Tokenizer` with no server: the counts an audit kept (a re-execution's). A text they
    lack is refused in one line: it would take the server to count it."""

    def __init__(self, counts: Mapping[str, int]) -> None:
        self._counts = counts

    def known(self, text: str) -> int | None:
        return self._counts.get(text)

    async def fetch(self, texts: Sequence[str]) -> dict[str, int]:
        lacking = [text for text in texts if text not in self._counts]
        if lacking:
            raise ConfigError(
                f"tokenizer 'server': the record keeps no count for {len(lacking)} texts this build needs, "
                "and no server is open to count them"
            )
        return {text: self._counts[text] for text in texts}


class _Used(Mapping[str, int]):
    """The counts a build may use: those fetched for it, then the tokenizer's; each one it
    reads is kept in `used`."""

    def __init__(self, fetched: Mapping[str, int], tokenizer: Tokenizer | None) -> None:
        self._fetched, self._tokenizer = fetched, tokenizer
        self.used: dict[str, int] = {}

    def __getitem__(self, text: str) -> int:
        count = self._fetched.get(text)
        if count is None and self._tokenizer is not None:
            count = self._tokenizer.known(text)
        if count is None:
            raise KeyError(text)
        self.used[text] = count
        return count

    def __iter__(self) -> Iterator[str]:
        return iter(self._fetched)

    def __len__(self) -> int:
        return len(self._fetched)


async def counted_memory(
    state: NpcState,
    player_input: str,
    config: WorkingMemoryConfig,
    tokenizer: Tokenizer | None,
    *,
    prohibition: str | None = None,
    given: Mapping[str, int] | None = None,
) -> tuple[WorkingMemory, dict[str, int]]:
    """A working memory and the server's counts it was cut with (empty for another tokenizer).

    With `tokenizer = "server"` the counts come from `given` (a record's) and `tokenizer`,
    fetched between builds, never during one. Without a tokenizer only `given` counts: a
    text it lacks is refused in one line, as a build with no server is.
    """
    if not counted_by_server(config):
        return build_working_memory(state, player_input, config, prohibition=prohibition), {}
    fetched: dict[str, int] = dict(given or {})
    while True:
        counts = _Used(fetched, tokenizer)
        try:
            memory = build_working_memory(state, player_input, config, prohibition=prohibition, counts=counts)
        except CountsMissing as missing:
            if tokenizer is None:
                token_counter(config.tokenizer)  # the one-line refusal
                raise
            fetched.update(await tokenizer.fetch(missing.texts))
            continue
        return memory, counts.used
