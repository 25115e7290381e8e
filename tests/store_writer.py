"""A process that writes to a store continuously, for the durability tests.

    python tests/store_writer.py DB AGENTS ROWS_PER_AGENT_PER_TICK

Each tick every agent adds ROWS episodes, then prints `queued T`; after `end_tick(T)`
returns it prints `committed T`. SIGTERM cancels the main task (as asyncio.run does for
Ctrl-C), so both go through the store's flush-on-exit; either exits 0.
"""

from __future__ import annotations

import asyncio
import signal
import sys

from sim.memory import Episode, NpcState
from sim.store import Writer, open_store

MAX_TICKS = 100_000  # bounded: a test always stops the process long before


async def run(path: str, agents: int, rows: int) -> None:
    task = asyncio.current_task()
    assert task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    ids = [f"npc{i}" for i in range(agents)]
    async with open_store(path) as store:
        for agent_id in ids:
            await store.ensure_agent(NpcState(agent_id=agent_id, system_prompt="p"), writer=Writer.SCENARIO)
        start = (store.last_tick or 0) + 1
        for tick in range(start, start + MAX_TICKS):
            for agent_id in ids:
                for n in range(rows):
                    episode = Episode(id=f"{tick}-{n}", tick=tick, text=f"{agent_id} saw {n} at {tick}")
                    await store.add_episode(agent_id, episode, writer=Writer.NPC)
            print(f"queued {tick}", flush=True)
            await store.end_tick(tick)
            print(f"committed {tick}", flush=True)


def main() -> int:
    path, agents, rows = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    try:
        asyncio.run(run(path, agents, rows))
    except (KeyboardInterrupt, asyncio.CancelledError):
        print("stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
