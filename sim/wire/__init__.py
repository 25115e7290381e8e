"""Wire types: what crosses MQTT (and a pool's pipes), each with its module-level codec, and the topic scheme.

- `sim.wire.events`: events (Speech, Notice) and their tick batches, and the public JSON
  messages (say, player input, world state, status);
- `sim.wire.barrier`: the tick barrier's TickDone and Join;
- `sim.wire.trace`: the per-inference trace and a shard's roster, for viewers;
- `sim.wire.inference`: inference requests and results (with their priority);
- `sim.wire.attempt`: one call to a backend and what was judged of it (what the server said,
  the output policy and rules, the gates' verdicts): a leaf the audit and sim.output share;
- `sim.wire.batch`: many messages in one payload (the inference transport's batches);
- `sim.wire.local`: the frames between a shard and its helper processes (`sim.helper`:
  the pool's worker, the scenario parser; pipes, not MQTT);
- `sim.wire.topics`: one function per topic.
- `sim.wire.channel`: what a public channel is (its route, payload type, bound and roles);
- `sim.wire.contract`: `CHANNELS`, one per public channel, and the contract generated from
  it (AsyncAPI 3.0, JSON Schemas, docs/topics.md's table).

Pure: no I/O. Internal topics carry msgpack, public ones JSON.
"""

__all__: list[str] = []
