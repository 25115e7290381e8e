"""The scenario parser's process (`sim.shard._startup`): `python -m sim.shard._parse_child`.

Given the bytes of a scenario file (`sim.wire.local.ParseScenario`) it says it has them,
parses them, and hands the scenario back in parts: its head, its NPCs in chunks that the
parent decodes between two turns of its loop, then `ParseDone`; or the parser's error, word
for word (`ParseFailed`). It ends when it has said it all (`sim.helper`).
"""

from __future__ import annotations

import asyncio
import gc

import msgspec

from sim.errors import ScenarioError
from sim.helper import FrameWriter, helper_main
from sim.scenario import parse_scenario
from sim.wire.local import Hello, ParsedHead, ParsedNpcs, ParseDone, ParseFailed, decode_parse, encode

NPCS_PER_PART = 5_000

_encode = msgspec.msgpack.Encoder().encode


async def _parse(body: bytes, reader: asyncio.StreamReader, write: FrameWriter) -> str | None:
    """Parse the scenario given and write it back, part by part."""
    gc.disable()  # millions of objects, none of them garbage: collections would scan them over and over
    given = decode_parse(body)
    write(encode(Hello()))
    try:
        scenario = parse_scenario(given.data, source=given.source)
    except ScenarioError as exc:
        write(encode(ParseFailed(error=str(exc))))
        return None
    except Exception as exc:  # noqa: BLE001 - handed to the parent, which raises it as a ScenarioError
        write(encode(ParseFailed(error=f"{given.source}: parsing failed: {exc!r}")))
        return None
    write(encode(ParsedHead(scenario=msgspec.Raw(_encode(msgspec.structs.replace(scenario, npcs=[]))))))
    for start in range(0, len(scenario.npcs), NPCS_PER_PART):
        write(encode(ParsedNpcs(npcs=msgspec.Raw(_encode(scenario.npcs[start : start + NPCS_PER_PART])))))
        await write.drain()
    write(encode(ParseDone()))
    return None


if __name__ == "__main__":
    helper_main(_parse)
