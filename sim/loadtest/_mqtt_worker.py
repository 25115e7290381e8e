"""The load test's MQTT worker (`sim.loadtest._inference`): `python -m sim.loadtest._mqtt_worker`.

Given a `sim.inference.WorkerConfig` (msgpack) it runs one `RemoteWorker`, says it is ready
once the worker is subscribed (or why the worker ended before), and serves until the end of
its input, as a remote worker in a process of its own would (`sim.helper`).
"""

from __future__ import annotations

import asyncio

import msgspec

from sim.helper import FrameWriter, helper_main, read_frame
from sim.inference import RemoteWorker, WorkerConfig
from sim.wire.local import Hello, encode

_config = msgspec.msgpack.Decoder(WorkerConfig)


async def _end_of(reader: asyncio.StreamReader) -> None:
    while await read_frame(reader) is not None:
        pass


async def _serve(body: bytes, reader: asyncio.StreamReader, write: FrameWriter) -> str | None:
    """Serve until the end of the input; why the worker ended, when it did before it was subscribed."""
    worker = RemoteWorker(_config.decode(body))
    serving = asyncio.create_task(worker.run())
    ready = asyncio.create_task(worker.ready.wait())
    ended = asyncio.create_task(_end_of(reader))
    try:
        await asyncio.wait([serving, ready], return_when=asyncio.FIRST_COMPLETED)
        if not ready.done():
            error = serving.exception()
            return f"the worker ended: {error}" if error is not None else "the worker ended"
        write(encode(Hello()))
        await asyncio.wait([serving, ended], return_when=asyncio.FIRST_COMPLETED)
        if serving.done():
            serving.result()  # an error of the worker ends the process with it
    finally:
        for task in (serving, ready, ended):
            task.cancel()
        await asyncio.gather(serving, ready, ended, return_exceptions=True)
    return None


if __name__ == "__main__":
    helper_main(_serve)
