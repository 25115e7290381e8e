"""What passed the gates becomes the NPC's: beliefs and memories written with its authority,
an intent published for the game; a `go_to` the engine applies itself too (the NPC walks
there at the start of the next tick: sim.shard._whereabouts).

Only the accepted proposals of the reply that was said (the last attempt of a result that
is not a fallback) are applied; what the gates refused is in the audit and the counts,
never in the state. A belief is keyed by its subject and text (`sim.output.belief_of`), a
memory becomes an episodic memory of the proposed significance, and an intent goes out on
`npcsim/{run}/agent/{id}/intent`: the game decides what happens, the model changes nothing.
"""

from __future__ import annotations

from sim.bus import Bus
from sim.inference import InferenceResult
from sim.memory import NpcState
from sim.output import belief_of, memory_of, said_proposals, walked_to
from sim.store import Store, Writer
from sim.wire.events import IntentMessage

__all__ = ["apply_proposals"]


async def apply_proposals(
    store: Store, bus: Bus, *, run_id: str, state: NpcState, result: InferenceResult, reply_to: str | None,
    moves: list[tuple[str, str]],
) -> None:
    """Write the accepted beliefs and memories of `result` to the NPC of `state`, publish its
    intent; an accepted `go_to` is added to `moves` (npc, place) as well."""
    agent, tick = state.agent_id, result.tick
    beliefs = list(state.beliefs)
    memories = 0
    for proposal in said_proposals(result.attempts, fallback=result.fallback):
        if proposal.kind == "belief":
            belief = belief_of(proposal, beliefs, tick)
            beliefs = [b for b in beliefs if b.id != belief.id] + [belief]
            await store.add_belief(agent, belief, writer=Writer.NPC)
        elif proposal.kind == "memory":
            memories += 1
            await store.add_episode(agent, memory_of(proposal, result.id, memories, tick), writer=Writer.NPC)
        elif proposal.kind == "intent":
            place = walked_to(proposal)
            if place is not None:
                moves.append((agent, place))
            await bus.send("intent", IntentMessage(run=run_id, agent=agent, tick=tick, name=proposal.text,
                                                   args=proposal.args, inference_id=result.id, reply_to=reply_to))
