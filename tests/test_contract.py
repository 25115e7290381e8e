"""The public topics' contract (`npcsim contract`, sim.wire.contract): a valid AsyncAPI 3.0
document, whose schemas accept what a real run publishes and what the documents show, and
refuse what the server refuses; docs/topics.md's table is the generator's.

The AsyncAPI 3.0.0 JSON Schema is vendored in tests/asyncapi (its README says from where), so
the test runs offline.
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any, get_args

import aiomqtt
import msgspec
import pytest
from jsonschema import Draft7Validator

from sim.protocol.bounds import InputBounds, bound_problem
from sim.shard import BrokerConfig, RunConfig, run
from sim.wire import topics
from sim.wire.channel import EntriesBound, TextBound
from sim.wire.contract import (
    CHANNELS,
    GAME,
    MARKDOWN_BEGIN,
    MARKDOWN_END,
    OWN_PLAYER,
    PLAYER,
    SERVER,
    ChannelName,
    asyncapi,
    channel_named,
    channel_of,
    markdown,
    message_schema,
)
from sim.wire.events import (
    GoalMessage,
    LocationMessage,
    MoveMessage,
    PlayerInputMessage,
    SayMessage,
    StatusMessage,
    WorldStateMessage,
    decode_world_state,
    encode_json,
)
from tests.helpers import REPO, VILLAGE, MosquittoProcess, eventually, listed_village, npcsim_in_process

ASYNCAPI_SCHEMA = REPO / "tests" / "asyncapi" / "asyncapi-3.0.0.json"
DOCUMENTS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
DOCUMENT = asyncapi("test")


def asyncapi_validator() -> Draft7Validator:
    return Draft7Validator(json.loads(ASYNCAPI_SCHEMA.read_text()))


def payload_validator(name: str, document: dict[str, Any] = DOCUMENT) -> Draft7Validator:
    """The document's schema of a message's payload (its $refs resolved in the document)."""
    payload = document["components"]["messages"][name]["payload"]
    return Draft7Validator({**payload, "components": document["components"]})


def problems(name: str, message: Any) -> list[str]:
    """Why `message` fails the schema of channel `name`, in the document and standalone (`--schema`)."""
    found = [e.message for e in payload_validator(name).iter_errors(message)]
    found += [f"--schema: {e.message}" for e in Draft7Validator(message_schema(name)).iter_errors(message)]
    return found


# --- the document --------------------------------------------------------------------------


@pytest.mark.parametrize("form", ["yaml", "json"])
def test_the_document_is_asyncapi_3(capsys: pytest.CaptureFixture[str], form: str) -> None:
    ran = npcsim_in_process(capsys, "contract", *(["--json"] if form == "json" else []))
    assert ran.code == 0, ran.err
    document = msgspec.yaml.decode(ran.out) if form == "yaml" else json.loads(ran.out)
    assert document["asyncapi"] == "3.0.0"
    errors = [f"{list(e.absolute_path)}: {e.message}" for e in asyncapi_validator().iter_errors(document)]
    assert not errors, errors[:5]
    assert set(document["channels"]) == {c.name for c in CHANNELS}


def test_the_validation_sees_a_broken_document() -> None:
    broken = json.loads(json.dumps(DOCUMENT))
    broken["operations"]["send-say"]["action"] = "publish"  # AsyncAPI 2's word
    broken["operations"]["send-say"]["bindings"]["mqtt"]["qos"] = 3
    assert len(list(asyncapi_validator().iter_errors(broken))) >= 1
    broken = json.loads(json.dumps(DOCUMENT))
    broken["components"]["schemas"]["SayMessage"]["type"] = 5
    assert list(asyncapi_validator().iter_errors(broken))


def test_each_channel_says_its_address_parameters_publishers_and_mqtt_flags() -> None:
    say = DOCUMENT["channels"]["say"]
    assert say["address"] == "npcsim/{run}/agent/{agent}/say"
    assert set(say["parameters"]) == {"run", "agent"}
    assert DOCUMENT["channels"]["player-input"]["address"] == "npcsim/{run}/player/{player}/input"
    assert DOCUMENT["operations"]["send-say"]["bindings"]["mqtt"] == {"qos": 1, "retain": False,
                                                                     "bindingVersion": "0.2.0"}
    assert DOCUMENT["operations"]["receive-player-input"]["action"] == "receive"
    assert "`game`" in DOCUMENT["operations"]["receive-world-state"]["description"]
    assert DOCUMENT["operations"]["send-world-state"]["bindings"]["mqtt"]["retain"] is True
    assert DOCUMENT["operations"]["send-status"]["bindings"]["mqtt"]["retain"] is True
    for channel in CHANNELS:
        # every parameter is a `{name}` of the address, and the address is a topic of its kind
        assert re.findall(r"\{(\w+)\}", channel.address) == list(channel.parameters)
        concrete = channel.topic(*(f"x{i}" for i, _ in enumerate(channel.parameters)))
        assert channel_of(concrete) is channel
        assert topics.parse(concrete) is not None and topics.parse(concrete).kind == channel.kind  # type: ignore[union-attr]


def test_the_channel_names_are_the_tables() -> None:
    assert get_args(ChannelName) == tuple(channel.name for channel in CHANNELS)


def test_each_channel_the_server_takes_is_held_to_a_bound_of_the_run_where_its_payload_has_text() -> None:
    limits = set(msgspec.structs.asdict(InputBounds()))
    for channel in CHANNELS:
        fields = set(channel.payload.__struct_fields__) if isinstance(channel.payload, type) else set()
        taken = any(role.action == "receive" for role in channel.publishers)
        if taken and fields & {"text", "goal"}:
            assert isinstance(channel.bound, TextBound) and channel.bound.chars in limits, channel.name
        elif taken and "state" in fields:
            assert isinstance(channel.bound, EntriesBound), channel.name
            assert {channel.bound.keys, channel.bound.key_chars, channel.bound.value_chars} <= limits, channel.name
        else:
            assert channel.bound is None, channel.name


def acl_allows(login: str | None, access: str, topic: str) -> bool:
    """Whether broker-config/acl lets `login` (None: anonymous) `access` ("read", "write") `topic`."""
    rules: list[tuple[str, str]] = []
    section: str | None = None  # the lines before the first `user` are the anonymous clients'
    for line in (REPO / "broker-config" / "acl").read_text().splitlines():
        words = line.split()
        if words[:1] == ["user"]:
            section = words[1]
        elif words[:1] == ["topic"] and section == login:
            rules.append((words[1], words[2]))
        elif words[:1] == ["pattern"] and login is not None:
            rules.append((words[1], words[2].replace("%u", login)))
    return any(access in granted and _matches(topic_filter, topic) for granted, topic_filter in rules)


def _matches(topic_filter: str, topic: str) -> bool:
    pattern = "/".join("[^/]+" if level == "+" else ".*" if level == "#" else re.escape(level)
                       for level in topic_filter.split("/"))
    return re.fullmatch(pattern, topic) is not None


def test_the_shipped_acl_grants_what_the_contract_says() -> None:
    logins = {SERVER: "shard", GAME: "game", PLAYER: "alice"}
    for channel in CHANNELS:
        topic = channel.topic(*("alice" if p == "player" else "r" if p == "run" else "a" for p in channel.parameters))
        for role in channel.publishers:
            assert acl_allows(logins[role], "write", topic), (role.name, topic)
            assert role.acl == ("player" if role is PLAYER else logins[role])  # the table's ACL role
        if channel.readers == OWN_PLAYER:
            assert acl_allows("alice", "read", topic) and acl_allows(None, "read", topic), topic
            assert not acl_allows("bob", "read", topic) and acl_allows("viewer", "read", topic), topic
            continue
        everyone = channel.readers.startswith("every client")
        assert acl_allows(None, "read", topic) == everyone == acl_allows("alice", "read", topic), topic
        assert acl_allows("viewer", "read", topic) == (everyone or "`viewer`" in channel.readers), topic
        assert acl_allows("game", "read", topic) == (everyone or "`game`" in channel.readers), topic
    assert acl_allows(None, "write", topics.player_input("r", "alice"))
    assert not acl_allows("alice", "write", topics.player_input("r", "bob"))
    assert not acl_allows(None, "read", topics.trace("r", "0"))


def test_internal_topics_are_no_part_of_the_contract() -> None:
    for topic in (topics.barrier("r", "0"), topics.agent_inbox("r", "a"), topics.location_events("r", "inn"),
                  topics.infer_request("r"), topics.infer_response("r", "0"), "npcsim/r/nothing", "other/r/x"):
        assert channel_of(topic) is None, topic
    addresses = {c.address for c in CHANNELS}
    assert not any("/barrier/" in a or "/infer/" in a or a.endswith("/inbox") for a in addresses)


def test_patterns_are_ecma_262() -> None:
    """JSON Schema's patterns are ECMA-262's: Python's `\\Z`, `\\A` or `(?P<` mean something else there."""
    text = json.dumps(DOCUMENT)
    patterns = re.findall(r'"pattern": "((?:[^"\\]|\\.)*)"', text)
    assert patterns, "the names' pattern is in the document"
    for pattern in patterns:
        assert not re.search(r"\\\\[AZ]|\(\?P<", pattern), pattern


# --- the schemas and the decoders agree ------------------------------------------------------


def test_the_schemas_accept_what_the_encoders_write() -> None:
    written = {
        "say": SayMessage(run="r", agent="innkeeper", tick=3, to=None, text="Welcome.", inference_id="r:i:3:0"),
        "player-input": PlayerInputMessage(to="innkeeper", text="A room?"),
        "world-state": WorldStateMessage(state={"king": "dead"}, tick=4),
        "status": StatusMessage(run="r", shard="0", state="online", tick=2, awaiting="shard 1", since=1.5),
        "location": LocationMessage(run="r", agent="smith", tick=8, location="forge", activity="working the bellows"),
        "game-move": MoveMessage(npc="smith", location="forge"),
        "game-goal": GoalMessage(npc="smith", goal="Finish the king's sword."),
    }
    for name, message in written.items():
        assert not problems(name, json.loads(encode_json(message))), name
    assert not problems("game-goal", {"npc": "smith", "goal": None})  # null clears the goal


def test_a_fixed_length_array_is_said_in_draft_07() -> None:
    """msgspec's 2020-12 `prefixItems` (a roster entry `[id, name, location]`) is draft-07's `items` list."""
    assert "prefixItems" not in json.dumps(DOCUMENT)
    assert len(DOCUMENT["components"]["schemas"]["RosterEntry"]["items"]) == 3
    assert not problems("roster", {"run": "r", "shard": "0", "npcs": [["a", "Ann", "inn"]]})
    assert problems("roster", {"run": "r", "shard": "0", "npcs": [["a", 5, "inn"]]})
    assert problems("roster", {"run": "r", "shard": "0", "npcs": [["a", "Ann"]]})


FORGED = [
    ("player-input", {"to": "innkeeper"}),
    ("player-input", {"to": "innkeeper", "text": ""}),
    ("player-input", {"to": "inn keeper", "text": "hi"}),
    ("player-input", {"to": "i" * 129, "text": "hi"}),
    ("player-input", {"to": "innkeeper", "text": "hi", "admin": True}),
    ("player-input", {"to": "innkeeper", "text": 5}),
    ("player-input", ["innkeeper", "hi"]),
    ("world-state", {"state": {"the king": "dead"}}),
    ("world-state", {"state": {"king": 1}}),
    ("world-state", {"state": {"king": "dead"}, "by": "a player"}),
    ("world-state", {"state": {"king": "dead"}, "tick": "soon"}),
    ("game-move", {"npc": "smith"}),
    ("game-move", {"npc": "smith", "location": "the forge"}),
    ("game-move", {"npc": "smith", "location": "forge", "tick": 3}),
    ("game-goal", {"npc": "smith"}),
    ("game-goal", {"npc": "smith", "goal": ""}),
    ("game-goal", {"npc": "smith", "goal": 5}),
]


@pytest.mark.parametrize(("name", "forged"), FORGED, ids=lambda v: str(v)[:40])
def test_the_schemas_refuse_what_the_server_refuses(name: str, forged: Any) -> None:
    assert problems(name, forged)
    with pytest.raises(msgspec.ValidationError):
        channel_named(name).reader.decode(json.dumps(forged).encode())


def test_each_schema_states_the_bound_the_run_holds_its_channel_to() -> None:
    """The schema's `maxLength` (and `maxProperties`) is the run's default bound, and the decoder
    leaves the length to the bound: one character more is the run's `too_long`, never `schema`."""
    bounds = InputBounds()
    bounded = [c for c in CHANNELS if c.bound is not None]
    assert {c.name for c in bounded} == {"player-input", "game-event", "game-fact", "game-goal", "world-state"}
    for channel in bounded:
        schema = message_schema(channel.name)
        properties = schema["definitions"][channel.payload.__name__]["properties"]
        if isinstance(channel.bound, TextBound):
            text = channel.bound.field
            chars = properties[text]["maxLength"]
            assert chars == getattr(bounds, channel.bound.chars), channel.name
            fields = {"to": "innkeeper", "location": "inn", "id": "f1", "npc": "innkeeper"}
            at_bound = {k: v for k, v in fields.items() if k in properties} | {text: "x" * chars}
            over = at_bound | {text: "x" * (chars + 1)}
            assert not Draft7Validator(schema).is_valid(over) and Draft7Validator(schema).is_valid(at_bound)
            assert bound_problem(channel.bound, channel.reader.decode(json.dumps(at_bound).encode()), bounds) is None
            assert bound_problem(channel.bound, channel.reader.decode(json.dumps(over).encode()), bounds)
            continue
        assert isinstance(channel.bound, EntriesBound)
        state = properties["state"]
        said = (state["maxProperties"], state["propertyNames"]["maxLength"], state["additionalProperties"]["maxLength"])
        assert said == (bounds.world_keys, bounds.world_key_chars, bounds.world_value_chars)
        for over in ({f"k{n}": "v" for n in range(bounds.world_keys + 1)}, {"k" * (bounds.world_key_chars + 1): "v"},
                     {"k": "v" * (bounds.world_value_chars + 1)}):
            assert not Draft7Validator(schema).is_valid({"state": over})
            assert bound_problem(channel.bound, decode_world_state(json.dumps({"state": over}).encode()), bounds)


# --- the command -----------------------------------------------------------------------------


def test_schema_prints_one_message(capsys: pytest.CaptureFixture[str]) -> None:
    ran = npcsim_in_process(capsys, "contract", "--schema", "say")
    assert ran.code == 0 and json.loads(ran.out) == message_schema("say")
    assert json.loads(ran.out)["$schema"] == "http://json-schema.org/draft-07/schema#"


@pytest.mark.parametrize("name", ["nope", "", "say\n", "../say", "x" * 10_000])
def test_an_unknown_schema_name_is_one_line_listing_the_names(capsys: pytest.CaptureFixture[str], name: str) -> None:
    ran = npcsim_in_process(capsys, "contract", "--schema", name)
    assert ran.code == 2 and not ran.out
    assert len(ran.err.strip().splitlines()) == 1, ran.err
    assert all(c.name in ran.err for c in CHANNELS)


def test_out_writes_the_file_and_markdown_replaces_between_the_markers(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    out = tmp_path / "contract.json"
    assert npcsim_in_process(capsys, "contract", "--json", "--out", str(out)).code == 0
    assert json.loads(out.read_text())["channels"].keys() == DOCUMENT["channels"].keys()

    page = tmp_path / "topics.md"
    page.write_text(f"# Topics\n\nbefore\n\n{MARKDOWN_BEGIN}\nold table\n{MARKDOWN_END}\n\nafter\n")
    assert npcsim_in_process(capsys, "contract", "--markdown", "--out", str(page)).code == 0
    assert page.read_text() == f"# Topics\n\nbefore\n\n{markdown()}\nafter\n"
    again = npcsim_in_process(capsys, "contract", "--markdown", "--out", str(page))
    assert again.code == 0  # and again: the same
    assert page.read_text() == f"# Topics\n\nbefore\n\n{markdown()}\nafter\n"

    bare = tmp_path / "bare.md"
    bare.write_text("# nothing to replace\n")
    ran = npcsim_in_process(capsys, "contract", "--markdown", "--out", str(bare))
    assert ran.code == 2 and "contract:begin" in ran.err and len(ran.err.strip().splitlines()) == 1
    assert bare.read_text() == "# nothing to replace\n"
    ran = npcsim_in_process(capsys, "contract", "--out", str(tmp_path / "no" / "such" / "dir.yaml"))
    assert ran.code == 2 and ran.err.startswith("npcsim: error: --out ")


def intent(agent: str, name: str, **args: object) -> dict[str, object]:
    return {"run": "r", "agent": agent, "tick": 3, "name": name, "args": args, "inference_id": "r:i:3:0"}


def test_with_a_scenario_the_intent_schema_holds_its_npcs_intents_and_listed_values(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    ran = npcsim_in_process(capsys, "contract", listed_village(tmp_path), "--schema", "intent")
    assert ran.code == 0, ran.err
    schema = json.loads(ran.out)
    alternatives = schema["definitions"]["IntentMessage"]["anyOf"]
    give = next(a for a in alternatives if a["properties"]["name"] == {"const": "give_item"})
    assert give["properties"]["agent"] == {"enum": ["innkeeper"]}
    assert give["properties"]["args"]["properties"]["item"] == {"type": "string", "enum": ["lantern", "ale"]}
    valid = Draft7Validator(schema).is_valid
    assert valid(intent("innkeeper", "give_item", item="lantern")) and valid(intent("innkeeper", "call_guards"))
    assert valid(intent("innkeeper", "tip", coins=3))
    for refused in (intent("innkeeper", "give_item", item="crown jewels"), intent("blacksmith", "give_item",
                    item="ale"), intent("innkeeper", "give_item"), intent("innkeeper", "give_item", item="ale", n=1),
                    intent("innkeeper", "open_vault"), intent("innkeeper", "tip", coins=2.5)):
        assert not valid(refused), refused
    document = npcsim_in_process(capsys, "contract", listed_village(tmp_path), "--json")
    assert document.code == 0 and not list(asyncapi_validator().iter_errors(json.loads(document.out)))
    generic = message_schema("intent")  # without a scenario: the types alone
    assert "anyOf" not in generic["definitions"]["IntentMessage"]
    assert Draft7Validator(generic).is_valid(intent("anyone", "give_item", item="crown jewels"))


def test_a_scenario_without_intents_allows_none_and_the_table_takes_no_scenario(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    plain = tmp_path / "plain.toml"
    plain.write_text('[scenario]\nname = "p"\n[[locations]]\nid = "inn"\n[[npcs]]\nid = "tobin"\nname = "T"\n'
                     'location = "inn"\nsystem_prompt = "You are Tobin."\n')
    ran = npcsim_in_process(capsys, "contract", str(plain), "--schema", "intent")
    assert ran.code == 0 and not Draft7Validator(json.loads(ran.out)).is_valid(intent("tobin", "give_item"))
    ran = npcsim_in_process(capsys, "contract", str(plain), "--markdown")
    assert ran.code == 2 and "--markdown" in ran.err and len(ran.err.strip().splitlines()) == 1


# --- the documents ---------------------------------------------------------------------------


def test_docs_topics_holds_the_generated_table() -> None:
    text = (REPO / "docs" / "topics.md").read_text()
    start, end = text.index(MARKDOWN_BEGIN), text.index(MARKDOWN_END) + len(MARKDOWN_END)
    assert text[start:end] + "\n" == markdown(), "run: npcsim contract --markdown --out docs/topics.md"


def _console_examples(text: str) -> list[tuple[str, str]]:
    """Each `$ npcsim contract ...` of a console block, with the lines shown after it."""
    found = []
    for block in re.findall(r"```console\n(.*?)```", text, re.DOTALL):
        for command, shown in re.findall(r"^\$ (npcsim contract[^\n]*)\n((?:(?!\$ )[^\n]*\n)*)", block, re.M):
            found.append((command, shown))
    return found


def test_the_documents_show_what_the_contract_command_prints(capsys: pytest.CaptureFixture[str]) -> None:
    examples = [e for document in DOCUMENTS for e in _console_examples(document.read_text())]
    assert examples, "docs/topics.md shows `npcsim contract --schema`"
    for command, shown in examples:
        if shown:
            ran = npcsim_in_process(capsys, *command.split()[1:])
            assert ran.code == 0 and ran.out == shown, f"{command}: the document shows other output"


_PUBLISHED = re.compile(r"mosquitto_pub\b[^\n]*?-t\s+'?(\S+?)'?\s[^\n]*?-m\s+'([^']*)'")


def test_every_documented_public_payload_fits_its_schema() -> None:
    examples = [(document.name, topic, payload) for document in DOCUMENTS
                for topic, payload in _PUBLISHED.findall(document.read_text())]
    assert len(examples) >= 6, examples
    for document, topic, payload in examples:
        channel = channel_of(topic)
        assert channel is not None, f"{document}: {topic} is no public topic"
        assert not problems(channel.name, json.loads(payload)), (document, topic, payload)


# --- a real run ------------------------------------------------------------------------------


@pytest.mark.mosquitto
async def test_what_a_real_run_publishes_fits_the_contract(mosquitto: MosquittoProcess) -> None:
    run_id = "contract-1"
    captured: list[tuple[str, bytes]] = []
    stop = asyncio.Event()
    ready = asyncio.Event()
    config = RunConfig(scenario=VILLAGE, run_id=run_id, ticks=500, tick_ms=20, broker=BrokerConfig(url=mosquitto.url))

    def seen(name: str, where: Any = lambda _: True) -> bool:
        return any((c := channel_of(t)) is not None and c.name == name and where(json.loads(p)) for t, p in captured)

    async with asyncio.TaskGroup() as group:
        job = group.create_task(run(config, stop=stop, on_ready=lambda _: ready.set()))
        await ready.wait()
        async with aiomqtt.Client("127.0.0.1", mosquitto.port) as client:
            await client.subscribe(f"npcsim/{run_id}/#", qos=1)

            async def listen() -> None:
                async for message in client.messages:
                    captured.append((message.topic.value, bytes(message.payload)))  # type: ignore[arg-type]

            listener = group.create_task(listen())
            await client.publish(topics.player_input(run_id, "visitor"),
                                 b'{"to": "innkeeper", "text": "A room, please. Can I have a lantern?"}', qos=1)
            await client.publish(topics.world_state(run_id), b'{"state": {"weather": "rain"}}', qos=1)
            # the game system's topics, and one refused message on each error topic
            await client.publish(topics.player_presence(run_id, "visitor"), b'{"location": "inn"}', qos=1)
            await client.publish(topics.game_event(run_id), b'{"location": "inn", "text": "A cart arrives."}', qos=1)
            await client.publish(topics.game_fact(run_id), b'{"id": "cart", "text": "A cart came today."}', qos=1)
            await client.publish(topics.game_event(run_id), b'{"location": "moon", "text": "x"}', qos=1)
            await client.publish(topics.game_move(run_id), b'{"npc": "blacksmith", "location": "inn"}', qos=1)
            await client.publish(topics.game_goal(run_id), b'{"npc": "blacksmith", "goal": "Sell a sword."}', qos=1)
            await client.publish(topics.player_input(run_id, "visitor"), b'{"to": "nobody", "text": "Hi"}', qos=1)
            await eventually(lambda: seen("say", lambda m: m["to"] == "visitor"), what="the innkeeper's answer")
            await eventually(lambda: seen("intent"), what="the innkeeper's intent")
            await eventually(lambda: seen("player-error") and seen("game-error"), what="both errors")
            stop.set()
            await job
            await eventually(lambda: seen("status", lambda m: m["state"] == "offline") and seen("trace"),
                             what="the shard's last status and traces")
            listener.cancel()

    public = [(channel_of(t), t, p) for t, p in captured if channel_of(t) is not None]
    assert {c.name for c, _, _ in public} == {c.name for c in CHANNELS}  # type: ignore[union-attr]
    for channel, topic, payload in public:
        assert channel is not None
        assert not problems(channel.name, json.loads(payload)), (topic, payload[:300])
