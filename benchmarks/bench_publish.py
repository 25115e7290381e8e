"""What one QoS 1 publish costs the shard's process: the bus to a private Mosquitto, nothing else.

A shard publishes two messages per inference (`say` and `trace`); this measures one of them,
from `Bus.publish` to the broker's acknowledgement, as wall and CPU time per message, for
each publish window asked for. The CPU time is this process's only (Mosquitto is another).

    python benchmarks/bench_publish.py --messages 20000 --windows 8,16,32,64
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: the repository is the import root
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sim.broker import open_broker
from sim.bus import BusConfig, open_bus

PAYLOAD = b"x" * 600  # about a `say` line's JSON


async def measure(messages: int, window: int, repeats: int) -> list[tuple[float, float]]:
    """(wall µs, CPU µs) per message, one pair per repeat."""
    async with open_broker("auto") as broker:
        config = BusConfig(broker=broker.address, run="bench", publish_window=window)
        async with open_bus(config) as bus:
            figures = []
            for _ in range(repeats):
                wall, cpu = time.perf_counter(), time.process_time()
                for i in range(messages):
                    await bus.publish(f"npcsim/bench/agent/a{i % 100}/say", PAYLOAD)
                await bus.wait_sent()
                figures.append((1e6 * (time.perf_counter() - wall) / messages,
                                1e6 * (time.process_time() - cpu) / messages))
            return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--windows", default="64", help="comma-separated publish windows (default 64)")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    for window in (int(w) for w in args.windows.split(",")):
        figures = asyncio.run(measure(args.messages, window, args.repeats))
        shown = ", ".join(f"{wall:.1f} µs wall / {cpu:.1f} µs CPU" for wall, cpu in figures)
        print(f"window {window}: {args.messages:,} publishes, per message: {shown}")


if __name__ == "__main__":
    main()
