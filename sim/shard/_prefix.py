"""`PrefixSketches`: how much of an NPC's prompt its previous one holds, from a sketch of fixed size.

The run's summary says how much of each prompt is a prefix of the same NPC's previous one
(what a model server's prefix cache could reuse). Keeping each NPC's last prompt for that
would hold one prompt per NPC for the whole run (gigabytes at a million NPCs), so the
recorder keeps a sketch of it instead: its length, a hash of the whole, and a hash of each
of its whole blocks (the blocks split it into 32 equal parts, at least 16 characters long),
under 300 bytes whatever the prompt's size. The shared prefix is then exact when the previous
prompt is a prefix of the new one (what `stable_prefix` aims at), and otherwise the blocks
both begin with, rounded down to a block; `npcsim audit export` computes it exactly from the
records (sim.memory.prefix_reuse). The hashes are the process's own (`hash`): a sketch is
never kept beyond the run.
"""

from __future__ import annotations

import struct
from array import array

__all__ = ["PrefixSketches"]

_BLOCKS = 32
_MIN_BLOCK = 16  # characters
_HEAD = struct.Struct("<qqq")  # length, block, hash of the whole


def _blocks(prompt: str, block: int, length: int) -> list[int]:
    """The hash of each whole block of `block` characters in the first `length` of `prompt`."""
    return [hash(prompt[start:start + block]) for start in range(0, length // block * block, block)]


def _sketch(prompt: str) -> bytes:
    length = len(prompt)
    block = max(_MIN_BLOCK, -(-length // _BLOCKS))
    return _HEAD.pack(length, block, hash(prompt)) + array("q", _blocks(prompt, block, length)).tobytes()


def _shared(sketch: bytes, prompt: str) -> int:
    """The characters `prompt` shares, as a prefix, with the sketched one."""
    previous: int
    block: int
    whole: int
    previous, block, whole = _HEAD.unpack_from(sketch)
    if len(prompt) >= previous and hash(prompt[:previous]) == whole:
        return previous
    theirs = array("q", sketch[_HEAD.size:])
    end = min(len(prompt), previous) // block * block
    same = 0
    for start, recorded in zip(range(0, end, block), theirs, strict=False):  # block by block, to the first change
        if hash(prompt[start:start + block]) != recorded:
            break
        same += 1
    return same * block


class PrefixSketches:
    """Each NPC's last prompt, sketched: `reuse(npc, prompt)` gives the characters of `prompt`
    its previous one shares as a prefix (None for its first), and keeps `prompt`'s sketch."""

    def __init__(self) -> None:
        self._sketches: dict[str, bytes] = {}

    def reuse(self, npc: str, prompt: str) -> int | None:
        previous = self._sketches.get(npc)
        self._sketches[npc] = _sketch(prompt)
        return None if previous is None else _shared(previous, prompt)
