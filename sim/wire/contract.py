"""The public topics as a contract: an AsyncAPI 3.0 document, each message's JSON Schema, and
the table of docs/topics.md, all generated from the topic functions and the wire Structs.

`CHANNELS` has one entry per public channel: its name (`npcsim contract --schema NAME`), its
route (the function of `sim.wire.topics` that builds its topic, whose parameters are the
address's, the filter the server subscribes to take it, and whether the name in the topic is
its publisher's own login), the type of its JSON payload, the bound the run holds it to (the
server decodes and checks what it takes by this table: sim.protocol.router), who publishes it
(the ACL's role), whether it is retained, and who may read it. Adding a public channel is
adding an entry there. The schemas are msgspec's (`msgspec.json.schema_components`), so the
document cannot drift from the decoders; a channel's bound is added to its schema from the
defaults the run holds the channel to (`MessageBounds`), so the two cannot drift either.
Given a scenario's intents (`Intents`), the intent payload is one of them: the NPCs that may
propose each, its arguments and their types or listed values.

AsyncAPI's Schema Object is JSON Schema draft-07; msgspec writes draft 2020-12. The two differ
in what our types use in one keyword (a fixed-length array: 2020-12 `prefixItems`, draft-07
`items` as a list), translated here, and the regular expressions are ECMA-262's (Python's
end of text `\\Z` is ECMA's `$`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import msgspec

from sim.wire import topics
from sim.wire.channel import Bound, Channel, EntriesBound, MessageBounds, Role, TextBound
from sim.wire.events import (
    NAME_RULE,
    ErrorMessage,
    GameEventMessage,
    GameFactMessage,
    GoalMessage,
    IntentMessage,
    LocationMessage,
    MoveMessage,
    PlayerInputMessage,
    PresenceMessage,
    SayMessage,
    StatusMessage,
    WorldStateMessage,
)
from sim.wire.trace import RosterMessage, TraceMessage

__all__ = [
    "ASYNCAPI_VERSION",
    "CHANNELS",
    "GAME",
    "MARKDOWN_BEGIN",
    "MARKDOWN_END",
    "MQTT_BINDING_VERSION",
    "OWN_PLAYER",
    "PLAYER",
    "SERVER",
    "ChannelName",
    "Intents",
    "asyncapi",
    "channel_named",
    "channel_of",
    "encode_document",
    "markdown",
    "message_schema",
]

ASYNCAPI_VERSION = "3.0.0"
MQTT_BINDING_VERSION = "0.2.0"
QOS = 1
"""Every npcsim client publishes and subscribes at QoS 1 (sim.mqtt)."""
DRAFT_07 = "http://json-schema.org/draft-07/schema#"
MARKDOWN_BEGIN = "<!-- contract:begin -->"
MARKDOWN_END = "<!-- contract:end -->"

SERVER = Role("npcsim", "send", "the npcsim server (each shard of the run; broker login `shard`)", "shard")
PLAYER = Role("a player", "receive",
              "a player client (broker login: its player id, which the shipped ACL lets publish on its own "
              "`player/{player}/input` only; anonymous clients too, where the broker lets them in)", "player")
GAME = Role("the game system", "receive", "the game system (broker login `game`)", "game")

EVERYONE = "every client: each login, and anonymous ones where the broker lets them in"
OWN_PLAYER = ("that player's own login, and the `viewer` (it shows what the run refused); anonymous clients "
              "where the broker lets them in (they may write any player's input too)")

PARAMETERS = {
    "run": "The run's id (`npcsim run --run-id`; by default the scenario's name and seed, e.g. `village-7`).",
    "agent": f"An NPC's id: {NAME_RULE}.",
    "player": f"A player's id: {NAME_RULE}, and not the login of an internal role "
              f"({', '.join(f'`{r}`' for r in sorted(topics.ROLE_LOGINS))}).",
    "shard": "A shard's index in its run, as in `npcsim run --shard i/n` (`0` for a run of one shard).",
    "location": f"A place's id: {NAME_RULE}.",
}
"""What each `{name}` of an address is (AsyncAPI's parameters)."""

ChannelName = Literal[
    "say", "intent", "location", "player-input", "player-error", "presence", "game-event", "game-fact", "game-move",
    "game-goal", "game-error", "world-state", "status", "roster", "trace",
]
"""The channels' names, in `CHANNELS`' order (a test holds the two together)."""

CHANNELS: tuple[Channel, ...] = (
    Channel(
        "say", topics.agent_say, SayMessage, (SERVER,), retained=False,
        readers=EVERYONE,
        summary="What an NPC said, one message per line, from the shard that holds the NPC. `to` is the "
                "player or NPC it answered (null: said to the room); `inference_id` names the inference, "
                "and its trace. An answer to a player has `in_reply_to` = the player and `reply_to` = the "
                "`id` of its input (null without one); a line to an NPC or to no one has both null.",
    ),
    Channel(
        "intent", topics.agent_intent, IntentMessage, (SERVER,), retained=False,
        readers=EVERYONE,
        summary="What an NPC proposes the game do, from the shard that holds the NPC: an intent on the "
                "NPC's allow-list (its scenario's `intents`), each argument of the type or one of the values "
                "the allow-list gives it (`npcsim contract SCENARIO --schema intent` says which), that "
                "passed every gate (docs/npc-output.md). The game acts on it or not: a model never changes "
                "the world. `inference_id` names the inference, as on `say`; `reply_to` is the `id` of the "
                "player input it answered (null when none).",
    ),
    Channel(
        "location", topics.agent_location, LocationMessage, (SERVER,), retained=True,
        subscribe=topics.agent_location_all, readers=EVERYONE,
        summary="Where an NPC stands from tick `tick` and what it does there, from the shard holding the NPC, "
                "each time it walks to another place (its schedule, a `go_to`, `game/move`). Retained: a late "
                "subscriber learns where everyone is; an NPC no message names stands where the roster says.",
    ),
    Channel(
        "player-input", topics.player_input, PlayerInputMessage, (PLAYER,), retained=False,
        bound=TextBound("player_text_chars"), subscribe=topics.player_input_all, sender_named=True,
        readers="the server; the `viewer` login",
        summary="A player's words to an NPC. The shard holding `to` answers on that NPC's `say` with `to` = "
                "the player and `reply_to` = the input's `id` (optional, chosen by the client); a retained "
                "input is never taken, and input over its bounds is refused whole, with an `error`.",
    ),
    Channel(
        "player-error", topics.player_error, ErrorMessage, (SERVER,), retained=False,
        readers=OWN_PLAYER,
        summary="Why a player's input was refused: one message for each refused input (at most 10 a client "
                "in 10 seconds, then one `rate_limited`), from one shard. `code` is stable (the schema "
                "lists them), `id` the input's id when it could be read, `topic` where the input was sent.",
    ),
    Channel(
        "presence", topics.player_presence, PresenceMessage, (GAME,), retained=False,
        subscribe=topics.player_presence_all,
        readers="the server",
        summary="Where a live player stands, as the game system says (null: nowhere). It takes effect at "
                "the same tick on every shard, like a world-state change; from then on, what the player says "
                "to an NPC standing at that place is said there: every NPC there overhears it and "
                "remembers it, not only the addressee.",
    ),
    Channel(
        "game-event", topics.game_event, GameEventMessage, (GAME,), retained=False,
        bound=TextBound("game_text_chars"),
        readers="the server",
        summary="Something happened at a place: the shard holding the place makes it a notice there at the "
                "tick that takes it, and every NPC there has it in its memory, and in its prompt, from the "
                "next tick.",
    ),
    Channel(
        "game-fact", topics.game_fact, GameFactMessage, (GAME,), retained=False,
        bound=TextBound("game_text_chars"),
        readers="the server",
        summary="A canonical fact added, replaced or withdrawn (`action`: add, the default, replace, withdraw) "
                "with the game system's authority, for NPC `npc` or for every NPC (null: at the same tick on "
                "every shard, like a world-state change): in every later prompt of the NPC, never truncated. "
                "Added: a fact for an NPC that holds its id already is refused (`exists`), as is a fact for "
                "every NPC whose id one for every NPC has; an NPC that holds the id of a fact for every NPC "
                "keeps its own. Replaced (with its new `text`) or withdrawn (no `text`): by id, for the NPC or "
                "for every NPC that holds it; refused (`no_fact`) when the NPC, or for every NPC the run, "
                "does not hold it.",
    ),
    Channel(
        "game-move", topics.game_move, MoveMessage, (GAME,), retained=False,
        readers="the server",
        summary="The game moves NPC `npc` to place `location`: the NPC stands there from the next tick on, "
                "and its `location` says so. An NPC or a place the run does not have is refused "
                "(`unknown_npc`, `unknown_location`).",
    ),
    Channel(
        "game-goal", topics.game_goal, GoalMessage, (GAME,), retained=False,
        bound=TextBound("game_text_chars", field="goal"),
        readers="the server",
        summary="NPC `npc`'s current goal, as the game sets it, from the next tick on until another replaces it "
                "(null clears it). An NPC the run does not have is refused (`unknown_npc`).",
    ),
    Channel(
        "game-error", topics.game_error, ErrorMessage, (SERVER,), retained=False,
        readers="the `game` login",
        summary="Why a message of the game system (`world/state`, `game/event`, `game/fact`, `game/move`, "
                "`game/goal`, presence) was refused, as on `player/{player}/error`.",
    ),
    Channel(
        "world-state", topics.world_state, WorldStateMessage, (GAME, SERVER), retained=True,
        bound=EntriesBound("world_keys", "world_key_chars", "world_value_chars"),
        readers=EVERYONE,
        summary="The world state as the game system sets it (shard 0 publishes the scenario's world at a fresh "
                "start). Each live change reaches every NPC at the same tick, with the game system's "
                "authority; a retained state is not applied again.",
    ),
    Channel(
        "status", topics.status, StatusMessage, (SERVER,), retained=True,
        readers=EVERYONE,
        summary="A shard's liveness: `state` online or offline (also its last will), and while the tick "
                "barrier holds it, what it awaits (`awaiting`) and since when (`since`, Unix time).",
    ),
    Channel(
        "roster", topics.roster, RosterMessage, (SERVER,), retained=True,
        readers=EVERYONE,
        summary="A shard's NPCs as `[id, name, location]`, published at its start: how a viewer that "
                "connects late learns the world.",
    ),
    Channel(
        "trace", topics.trace, list[TraceMessage], (SERVER,), retained=False,
        readers="the `viewer` login",
        summary="A batch of the shard's inferences, in their order: each one's truncation report and its "
                "explanation, the prompt's SHA-256 and (unless `npcsim run --set record.trace_prompts=false`) "
                "the prompt, and "
                "each attempt with the gates' verdicts on its reply's parts (`proposals`: the line, beliefs, "
                "memories, the intent; docs/npc-output.md).",
    ),
)


_NAMED: dict[str, Channel] = {channel.name: channel for channel in CHANNELS}


def channel_named(name: str) -> Channel:
    """The channel called `name`; a ValueError listing the names for another."""
    if name in _NAMED:
        return _NAMED[name]
    raise ValueError(f"no public message {name[:80]!r}; the names are: {', '.join(c.name for c in CHANNELS)}")


def channel_of(topic: str) -> Channel | None:
    """The public channel `topic` belongs to (read by `topics.parse`), or None for any other topic."""
    parsed = topics.parse(topic)
    if parsed is None:
        return None
    return next((c for c in CHANNELS if c.kind == parsed.kind), None)


Intents = Sequence[dict[str, Any]]
"""The intents a scenario allows, as JSON Schema alternatives of the intent payload
(sim.output's `intent_schemas`); with none, `npcsim contract` says no more than the types."""


def _schemas(
    channels: Sequence[Channel], ref_template: str, intents: Intents | None
) -> tuple[list[Any], dict[str, Any]]:
    """msgspec's schemas of the channels' payloads and the components they refer to, in
    draft-07, each with its channel's bound, the intent payload one of `intents` (when given)."""
    payloads, components = msgspec.json.schema_components([c.payload for c in channels], ref_template=ref_template)
    components = {name: _draft_07(s) for name, s in components.items()}
    for channel in channels:
        if channel.bound is not None:
            _bounded(components[_struct(channel.payload).__name__]["properties"], channel.bound)
    intent = components.get(_struct(channel_named("intent").payload).__name__)
    if intent is not None and intents is not None:
        intent["anyOf"] = list(intents) or [{"not": {}, "description": "This scenario allows no intent."}]
    return [_draft_07(p) for p in payloads], components


_DEFAULT_BOUNDS = MessageBounds()


def _bounded(properties: dict[str, Any], bound: Bound) -> None:
    """Say `bound` in a payload's `properties`: the run's default, and how a run sets its own."""
    def said(name: str) -> int:
        return int(getattr(_DEFAULT_BOUNDS, name))

    def unless(*names: str) -> str:
        settings = ", ".join(f"`--set limits.bounds.{name}=N`" for name in names)
        return (f"the run's bound{'s' if len(names) > 1 else ''} unless `npcsim run` sets its own ({settings}); "
                "over it, the message is refused with `too_long`.")

    if isinstance(bound, TextBound):
        properties[bound.field].update(maxLength=said(bound.chars),
                                  description=f"At most {said(bound.chars)} characters: {unless(bound.chars)}")
        return
    state = properties["state"]
    state.update(maxProperties=said(bound.keys),
                 description=f"At most {said(bound.keys)} keys of at most {said(bound.key_chars)} characters, "
                             f"each value at most {said(bound.value_chars)}: "
                             f"{unless(bound.keys, bound.key_chars, bound.value_chars)}")
    state["propertyNames"]["maxLength"] = said(bound.key_chars)
    state["additionalProperties"]["maxLength"] = said(bound.value_chars)


def _draft_07(schema: Any) -> Any:
    """A JSON Schema 2020-12 of msgspec's as draft-07 says it (the module's docstring)."""
    if isinstance(schema, list):
        return [_draft_07(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    translated = {}
    for key, value in schema.items():
        if key == "prefixItems" and schema.get("type") == "array":
            translated["items"] = _draft_07(value)
        elif key == "pattern" and isinstance(value, str):
            translated[key] = value[:-2] + "$" if value.endswith("\\Z") else value
        else:
            translated[key] = _draft_07(value)
    return translated


def message_schema(name: str, intents: Intents | None = None) -> dict[str, Any]:
    """The JSON Schema (draft-07, self-contained) of the payload of the channel called `name`."""
    channel = channel_named(name)
    [payload], definitions = _schemas([channel], "#/definitions/{name}", intents)
    return {"$schema": DRAFT_07, **payload, "definitions": definitions}


def asyncapi(version: str, intents: Intents | None = None) -> dict[str, Any]:
    """The AsyncAPI 3.0 document of every public channel; `version`: npcsim's."""
    payloads, schemas = _schemas(CHANNELS, "#/components/schemas/{name}", intents)
    channels: dict[str, Any] = {}
    operations: dict[str, Any] = {}
    messages: dict[str, Any] = {}
    for channel, payload in zip(CHANNELS, payloads, strict=True):
        messages[channel.name] = {
            "name": channel.name,
            "title": _type_name(channel.payload),
            "contentType": "application/json",
            "payload": payload,
        }
        channels[channel.name] = {
            "address": channel.address,
            "description": f"{channel.summary}\n\nRetained: {'yes' if channel.retained else 'no'}. "
                           f"Published by {' and by '.join(r.description for r in channel.publishers)}. "
                           f"Read by {channel.readers}.",
            "parameters": {name: {"description": PARAMETERS[name]} for name in channel.parameters},
            "messages": {channel.name: {"$ref": f"#/components/messages/{channel.name}"}},
        }
        for role in channel.publishers:
            operations[f"{role.action}-{channel.name}"] = {
                "action": role.action,
                "channel": {"$ref": f"#/channels/{channel.name}"},
                "description": f"Published by {role.description}; "
                               f"{'read by ' + channel.readers if role is SERVER else 'the server takes it'}.",
                "messages": [{"$ref": f"#/channels/{channel.name}/messages/{channel.name}"}],
                "bindings": {"mqtt": {"qos": QOS, "retain": channel.retained, "bindingVersion": MQTT_BINDING_VERSION}},
            }
    return {
        "asyncapi": ASYNCAPI_VERSION,
        "info": {
            "title": "npcsim public topics",
            "version": version,
            "description": "What an outside client (a player, the game system, a viewer) publishes and reads "
                           "on a run's MQTT broker, as JSON. The operations are the npcsim server's: `send` "
                           "is what it publishes, `receive` what it takes. Every other topic under "
                           "`npcsim/{run}` is internal (msgpack, signed with a run key).",
            "license": {"name": "MIT"},
        },
        "defaultContentType": "application/json",
        "channels": channels,
        "operations": operations,
        "components": {"messages": messages, "schemas": schemas},
    }


def encode_document(document: dict[str, Any], form: Literal["yaml", "json"]) -> bytes:
    """The document as YAML, or as JSON indented by two spaces; both end in a newline."""
    if form == "yaml":
        return msgspec.yaml.encode(document)
    return msgspec.json.format(msgspec.json.encode(document), indent=2) + b"\n"


def _struct(payload: Any) -> type[msgspec.Struct]:
    """The Struct of a payload type: itself, or the items' of `list[X]`."""
    struct: type[msgspec.Struct] = payload if isinstance(payload, type) else payload.__args__[0]
    return struct


def _type_name(payload: Any) -> str:
    return _struct(payload).__name__ if isinstance(payload, type) else f"array of {_struct(payload).__name__}"


def _shape(payload: Any) -> str:
    """`SayMessage {run, agent, ...}`: a payload's type and its fields, for a table."""
    struct = _struct(payload)
    fields = "{" + ", ".join(f.encode_name for f in msgspec.structs.fields(struct)) + "}"
    return f"{'' if isinstance(payload, type) else 'array of '}`{struct.__name__}` {fields}"


def markdown() -> str:
    """The public topics for docs/topics.md: a table and each channel's summary, between the markers."""
    lines = [
        MARKDOWN_BEGIN,
        "| topic | JSON payload | retained | published by | read by |",
        "|---|---|---|---|---|",
    ]
    for c in CHANNELS:
        publishers = " and ".join(r.name for r in c.publishers)
        lines.append(f"| `{c.address}` | {_shape(c.payload)} | "
                     f"{'yes' if c.retained else 'no'} | {publishers} | {c.readers} |")
    lines.append("")
    lines += [f"- `{c.name}` (`npcsim contract --schema {c.name}`): {c.summary}" for c in CHANNELS]
    lines.append(MARKDOWN_END)
    return "\n".join(lines) + "\n"
