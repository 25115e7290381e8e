"""The shard's sans-I/O protocol: bytes and events in, events and bytes out; no client, no awaits.

- `sim.protocol.router`: which received message goes where, and the events it hands back;
- `sim.protocol.received`: those events (a batch arrived, a barrier message, player input,
  world state, the game system's events, facts and players' presence, a refused message
  with the error its client is to get);
- `sim.protocol.mailbox`: bounded mailboxes (an agent's inbox mail, a place's intake) and
  de-duplication;
- `sim.protocol.outbox`: a tick's events batched per topic, sealed for the broker when
  another shard takes them;
- `sim.protocol.batcher`: items batched by count, bytes, linger and deadline (the bus's
  traces, the inference transport's requests and replies);
- `sim.protocol.barrier`: the tick barrier's bookkeeping;
- `sim.protocol.bounds`: bounds on outside input (per message and per tick), the
  refusal counter, and the bound on error replies per client;
- `sim.protocol.admission`: which peers' requests (Join, Hello) a shard serves, and how often,
  and `Peers`, a shard's side of the handshake (Join -> re-sends, Hello -> Welcome);
- `sim.protocol.outside`: outside input's named types and `OutsideJournal`, which stamps
  each arrival with the tick that takes it;
- `sim.protocol.seal`: the run key, sealing and opening internal messages for one run instance.

The bus (sim.bus) is the thin I/O loop that feeds them; the shard (sim.shard) acts on
what they say.
"""

__all__: list[str] = []
