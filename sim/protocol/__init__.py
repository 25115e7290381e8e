"""The shard's sans-I/O protocol: bytes and events in, events and bytes out; no client, no awaits.

- `sim.protocol.router`: which received message goes where;
- `sim.protocol.mailbox`: agents' bounded mailboxes and de-duplication;
- `sim.protocol.barrier`: the tick barrier's bookkeeping;
- `sim.protocol.bounds`: bounds on outside input and the refusal counter;
- `sim.protocol.seal`: the run key, sealing and opening internal messages.

The bus (sim.bus) is the thin I/O loop that feeds them.
"""
