"""A helper child that says it is ready and then ignores the end of its input: what a helper
stuck in its work looks like to its parent (tests/test_helper.py)."""

from __future__ import annotations

import asyncio

from sim.helper import FrameWriter, helper_main
from sim.wire.local import Hello, encode


async def _serve(body: bytes, reader: asyncio.StreamReader, write: FrameWriter) -> str | None:
    write(encode(Hello()))
    await asyncio.Event().wait()
    return None


if __name__ == "__main__":
    helper_main(_serve)
