"""Moving NPCs at the start of a tick: the shard's side of the run's whereabouts.

Every shard moves every NPC (sim.shard._whereabouts), so all agree on who hears each place;
for its own NPCs a shard also moves their hearing: what an NPC heard at the place it leaves
becomes its own memory (the place's log forgets it in time), it hears the new place from
the tick it arrives, and its move goes out on `agent/{id}/location` (retained).

The moves an NPC chose (`go_to`) in tick t travel in its shard's TickDone for t, every shard
takes them from the barrier (`RunWideInputs.moves`) and applies them at t+1 with the game's
moves that shard 0 took for t+1. A commit keeps what a resumed shard needs to find everyone
again: the overrides, the moves announced for the next tick, its NPCs' arrivals.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from sim.bus import Bus
from sim.shard._clock import checkpoint
from sim.shard._context import ShardContext
from sim.shard._perception import EpisodeOf
from sim.shard._whereabouts import ChosenPlace, Moved
from sim.wire.events import LocationMessage

__all__ = ["Movements"]

_MOVE_SLICE = 2_000  # moves applied between two yields


class Movements:
    """The whereabouts of a shard's run, moved tick by tick; `moves` counts its NPCs' moves."""

    def __init__(self, ctx: ShardContext, bus: Bus) -> None:
        self._ctx, self._bus = ctx, bus
        self.whereabouts = ctx.whereabouts
        self.moves = 0
        self.arrivals: dict[str, int] = {}
        """This shard's NPCs whose arrival where they stand is not the one their routine gives
        (`Whereabouts.arrived`: a `go_to`, the game's move), to the tick they arrived: few, and
        kept with each commit, so that a resumed shard's NPCs hear exactly what they heard."""

    async def begin(self, tick: int, overrides: Mapping[str, ChosenPlace], arrivals: Mapping[str, int], *,
                    resumed: bool) -> None:
        """Everyone where they stand at `tick`, the first tick this process steps; on resume
        with the commit's overrides and arrivals (nothing is remembered or announced again)."""
        where = self.whereabouts
        self.arrivals = dict(arrivals)
        moved = where.begin(tick, overrides, resumed=resumed)
        perception, local = self._ctx.perception, self._ctx.layout.local
        for n, move in enumerate(moved, start=1):
            if move.npc in local and move.origin != move.location:
                perception.leave(move.npc, move.origin, self._episode_of(move.npc))
            if n % _MOVE_SLICE == 0:
                await checkpoint()
        if resumed:  # when each NPC came where it stands: what it hears there, as before the stop
            last = tick - 1
            walked = {move.npc for move in moved if move.npc in local and move.origin != move.location}
            for n, npc in enumerate(sorted({*(x for x in where.routines if x in local), *arrivals, *walked}), start=1):
                since = arrivals.get(npc, where.arrived(npc, last))
                if since >= 0 or npc in walked:
                    perception.arrive(npc, where.where[npc], since)
                if n % _MOVE_SLICE == 0:
                    await checkpoint()
        else:
            for move in moved:
                if move.npc in local and move.origin != move.location:
                    perception.arrive(move.npc, move.location, where.arrived(move.npc, tick))
            await self._announce(tick, moved)
        for move in moved:
            if move.npc in local and move.origin != move.location:
                self._counted(move)

    async def advance(self, tick: int, chosen: Iterable[tuple[str, str]]) -> None:
        """The moves at the start of `tick`: those chosen in the last tick and the game's, then the routines'."""
        moved = self.whereabouts.advance(tick, chosen)
        ctx = self._ctx
        perception, store, local = ctx.perception, ctx.store, ctx.layout.local
        for n, move in enumerate(moved, start=1):
            if move.npc in local and move.origin != move.location:
                heard = perception.leave(move.npc, move.origin, self._episode_of(move.npc))
                if heard:
                    await store.add_heard(move.npc, heard)
                perception.arrive(move.npc, move.location, tick)
                self._counted(move)
                if self.whereabouts.arrived(move.npc, tick) == tick:
                    self.arrivals.pop(move.npc, None)
                else:
                    self.arrivals[move.npc] = tick
            if n % _MOVE_SLICE == 0:
                await checkpoint()
        await self._announce(tick, moved)

    async def _announce(self, tick: int, moved: Iterable[Moved]) -> None:
        """Each of this shard's NPCs' moves to another place on its location topic (retained);
        a new activity where it stands is in its prompt, not on the topic."""
        ctx = self._ctx
        for move in moved:
            if move.npc in ctx.layout.local and move.origin != move.location:
                self.moves += 1
                await self._bus.send("location", LocationMessage(run=ctx.run_id, agent=move.npc, tick=tick,
                                                                 location=move.location, activity=move.activity))

    def _counted(self, move: Moved) -> None:
        """The bus's count of who hears each place follows the move (its delivery counts)."""
        listeners = self._ctx.perception.listeners
        for place in (move.origin, move.location):
            self._bus.mail.listen(place, len(listeners(place)))

    def _episode_of(self, npc: str) -> EpisodeOf:
        ctx = self._ctx
        return ctx.kinds[ctx.layout.by_id[npc].kind].episode_of
