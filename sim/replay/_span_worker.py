"""A worker process of a pass over the audit (`sim.replay._parallel`): `python -m sim.replay._span_worker`.

Given the work (pickled: a module-level function, or a functools.partial of one) it says it
is ready, then for each span that comes it reads the span's records and sends back what the
work made of them, or the error it raised, pickled: its parent raises it as its own. It
keeps each store it reads open for its whole life, so the reader's item cache is filled once
per process, not once per span. The end of its input ends it (`sim.helper`).
"""

from __future__ import annotations

import asyncio
import pickle

from sim.helper import FrameWriter, helper_main, read_frame
from sim.replay._parallel import Readers, Work, decode_span
from sim.wire.local import Hello, encode


async def _serve(body: bytes, reader: asyncio.StreamReader, write: FrameWriter) -> str | None:
    work: Work[object] = pickle.loads(body)  # from its parent: the same program
    write(encode(Hello()))
    readers = Readers()
    with readers.stack:
        while (span := await read_frame(reader)) is not None:
            try:
                done: tuple[bool, object] = (True, work(readers.records(decode_span(span))))
            except Exception as exc:  # noqa: BLE001 - handed to the parent, which raises it
                done = (False, exc)
            write(pickle.dumps(done))
            await write.drain()
    return None


if __name__ == "__main__":
    helper_main(_serve)
