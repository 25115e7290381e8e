"""npcsim's Python example: a player's side of a run over MQTT (aiomqtt), in one file.

    python examples/python/game.py --broker mqtt://127.0.0.1:PORT --run village-7 --player me

It reads the NPCs from the run's retained roster, asks each of them in turn (or only --npc)
a question with an id of its own, prints each answer (matched by `reply_to`, else by NPC and
player), each intent an answer carries (what the NPC proposes the game do: matched by the
answer's `inference_id`) and each error the run sends back, and exits: 0 when every question
was answered. It needs only aiomqtt. Topics and payloads: docs/integrate.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import secrets
import ssl
import sys
import unicodedata
from collections import Counter
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

import aiomqtt

NAME = re.compile(r"[A-Za-z0-9_.-]{1,128}")  # the rule of every id in npcsim (run, player, NPC)
ROSTER_QUIET_S = 1.0  # the retained rosters arrive together after the subscription: this long after one, all are in
INTENT_AFTER_S = 1.0  # an answer's intent follows its line at once: this long after the last answer, it is in


@dataclass(frozen=True)
class Broker:
    host: str
    port: int
    username: str | None
    password: str | None
    tls: bool


def broker_url(text: str) -> Broker:
    """mqtt[s]://[user[:password]@]host[:port]; a user without a password takes NPCSIM_MQTT_PASSWORD."""
    parts = urlsplit(text)
    if parts.scheme not in ("mqtt", "mqtts") or not parts.hostname:
        raise argparse.ArgumentTypeError(f"expected mqtt://host:port or mqtts://host:port, got {text!r}")
    try:
        port = parts.port or (8883 if parts.scheme == "mqtts" else 1883)
    except ValueError:
        raise argparse.ArgumentTypeError(f"the port of {parts.netloc!r} is not a port number") from None
    username = unquote(parts.username) if parts.username else None
    password = unquote(parts.password) if parts.password else os.environ.get("NPCSIM_MQTT_PASSWORD")
    return Broker(parts.hostname, port, username, password if username else None, parts.scheme == "mqtts")


def shown(text: str) -> str:
    """`text` with control and invisible characters as escapes: a line off the network cannot drive the terminal."""
    return "".join(f"\\u{ord(c):04x}" if unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp") else c for c in text)


def name(text: str) -> str:
    if not NAME.fullmatch(text):
        raise argparse.ArgumentTypeError(f"expected 1-128 of A-Z a-z 0-9 _ . -, got {text!r}")
    return text


def fact(text: str) -> str:
    fact_id, equals, said = text.partition("=")
    if not (equals and NAME.fullmatch(fact_id) and said.strip()):
        raise argparse.ArgumentTypeError(f"expected ID=TEXT (an id of A-Z a-z 0-9 _ . -), got {text!r}")
    return text


def seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value < 3600:
        raise argparse.ArgumentTypeError(f"expected seconds between 0 and 3600, got {text!r}")
    return value


@dataclass
class Question:
    id: str
    npc: str
    answered: bool = False
    failed: bool = False
    inference_id: str | None = None  # its answer's: the intent that answer carries has the same

    @property
    def closed(self) -> bool:
        return self.answered or self.failed


class Game:
    """What the player knows: the NPCs, the open questions, and what was ignored."""

    def __init__(self, run: str, player: str) -> None:
        self.root, self.player = f"npcsim/{run}", player
        self.rosters: dict[str, list[list[str]]] = {}  # shard -> [[id, name, location], ...]
        self.questions: dict[str, Question] = {}  # id -> question, oldest first
        self.ignored: Counter[str] = Counter()

    def npcs(self) -> dict[str, str]:
        """NPC id -> name, from every shard's roster."""
        return {npc[0]: npc[1] for roster in self.rosters.values() for npc in roster}

    def receive(self, topic: str, payload: bytes) -> None:
        kind, *_, leaf = topic.removeprefix(self.root + "/").split("/")  # roster/{shard}, agent/{npc}/say, ...
        if not payload:  # an emptied retained message: when a roster, the shard's is gone
            if kind == "roster":
                self.rosters.pop(leaf, None)
            return
        try:
            message = json.loads(payload)
        except ValueError:
            return self.ignore(topic, "not JSON")
        if not isinstance(message, dict):
            return self.ignore(topic, "not a JSON object")
        if kind == "roster":
            self.roster(topic, leaf, message)
        elif leaf == "say":
            self.said(topic, message)
        elif leaf == "intent":
            self.intended(topic, message)
        elif leaf == "error":
            self.failed(topic, message)

    def ignore(self, topic: str, why: str) -> None:
        if not self.ignored[why]:
            print(f"ignored a message on {shown(topic)}: {why} (each later one is only counted)", file=sys.stderr)
        self.ignored[why] += 1

    def roster(self, topic: str, shard: str, message: dict[str, Any]) -> None:
        npcs = message.get("npcs")
        if not (isinstance(npcs, list) and all(
                isinstance(n, list) and len(n) == 3 and all(isinstance(p, str) for p in n) and NAME.fullmatch(n[0])
                for n in npcs)):
            return self.ignore(topic, "npcs is not a list of [id, name, location]")
        self.rosters[shard] = npcs

    def said(self, topic: str, say: dict[str, Any]) -> None:
        agent, text = say.get("agent"), say.get("text")
        if not (isinstance(agent, str) and isinstance(text, str)):
            return self.ignore(topic, "no agent or text")
        to = say["in_reply_to"] if isinstance(say.get("in_reply_to"), str) else say.get("to")
        if to != self.player:
            return  # said to someone else
        open_ = [q for q in self.questions.values() if not q.closed]
        reply_to = say.get("reply_to")
        question = next((q for q in open_ if (q.id == reply_to if isinstance(reply_to, str) else q.npc == agent)), None)
        if question is None or question.npc != agent:
            return
        question.answered = True
        question.inference_id = say.get("inference_id") if isinstance(say.get("inference_id"), str) else None
        print(f"answer {question.id} <- {agent}: {shown(text)}", flush=True)

    def intended(self, topic: str, intent: dict[str, Any]) -> None:
        """An intent: printed when it came with an answer to this player (the game would act on it here)."""
        agent, name, args, inference_id = (intent.get(k) for k in ("agent", "name", "args", "inference_id"))
        if not (isinstance(agent, str) and isinstance(name, str) and isinstance(args, dict)
                and isinstance(inference_id, str)):
            return self.ignore(topic, "no agent, name, args or inference_id")
        question = next((q for q in self.questions.values() if q.inference_id == inference_id), None)
        if question is not None and question.npc == agent:
            print(f"intent {question.id} <- {agent}: {shown(name)} {shown(json.dumps(args, ensure_ascii=False))}",
                  flush=True)

    def failed(self, topic: str, error: dict[str, Any]) -> None:
        code, text, id_ = error.get("code"), error.get("message"), error.get("id")
        if not (isinstance(code, str) and isinstance(text, str)):
            return self.ignore(topic, "no code or message")
        question = self.questions.get(id_) if isinstance(id_, str) else None
        if question is not None:
            question.failed = True
        print(f"error {id_ if question else '-'}: {shown(code)}: {shown(text)}", flush=True)


async def next_message(client: aiomqtt.Client, within: float) -> aiomqtt.Message | None:
    """The next message, or None after `within` seconds without one."""
    try:
        async with asyncio.timeout(within):
            return await anext(aiter(client.messages))
    except TimeoutError:
        return None


class Acks:
    """The reason code of each QoS 1 publish's PUBACK. MQTT 5 brokers answer a publish their ACL
    refuses with "Not authorized" (Mosquitto 2 does), but aiomqtt returns from `publish` as if it
    had been taken: this wraps the callback of aiomqtt's paho client (no public way) to see it.
    Under MQTT 3.1.1 a PUBACK has no reason code, and a refused publish is silently dropped."""

    def __init__(self, client: aiomqtt.Client) -> None:
        self.last: Any = None
        paho = client._client
        forward = paho.on_publish

        def on_publish(paho_client: Any, userdata: Any, mid: int, reason_code: Any, properties: Any) -> None:
            self.last = reason_code
            forward(paho_client, userdata, mid, reason_code, properties)

        paho.on_publish = on_publish

    async def publish(self, client: aiomqtt.Client, topic: str, body: dict[str, Any]) -> str | None:
        """Publish at QoS 1 (one at a time); why the broker refused it, or None."""
        self.last = None
        await client.publish(topic, json.dumps(body), qos=1)
        return str(self.last) if getattr(self.last, "is_failure", False) else None


async def play(args: argparse.Namespace) -> int:
    game, broker = Game(args.run, args.player), args.broker
    tls = ssl.create_default_context() if broker.tls else None
    async with aiomqtt.Client(broker.host, broker.port, username=broker.username, password=broker.password,
                              tls_context=tls, protocol=aiomqtt.ProtocolVersion.V5) as client:
        acks = Acks(client)
        if args.fact is not None:  # the game system's side: a canonical fact for the NPC (the `game` login)
            fact_id, _, text = args.fact.partition("=")
            body = {"npc": args.npc, "id": fact_id, "text": text}
            refused = await acks.publish(client, f"{game.root}/game/fact", body)
            if refused is not None:
                print(f"refused: game/fact {fact_id}: {refused} (the game system's topics need its login: "
                      "mqtt://game@host:port)", file=sys.stderr)
                return 1
            print(f"fact {fact_id} -> {args.npc}: {text}", flush=True)
        for topic in ("roster/+", "agent/+/say", "agent/+/intent", f"player/{args.player}/error"):
            await client.subscribe(f"{game.root}/{topic}", qos=1)
        loop = asyncio.get_running_loop()
        end = loop.time() + args.wait
        while message := await next_message(client, end - loop.time()):
            game.receive(message.topic.value, bytes(message.payload))
            if game.rosters and message.topic.matches(f"{game.root}/roster/+"):
                end = loop.time() + ROSTER_QUIET_S
        npcs = game.npcs()
        if not npcs:
            print(f"no roster on {game.root}/roster/+ within {args.wait:g} s: is run {args.run} on this broker?",
                  file=sys.stderr)
            return 1
        print(f"roster: {len(npcs)} NPCs: {', '.join(sorted(npcs))}", flush=True)
        if args.npc is not None and args.npc not in npcs:
            print(f"--npc {args.npc}: not in the roster", file=sys.stderr)
            return 2
        session = secrets.token_hex(3)  # ids stay unique across runs of this script
        for n, npc in enumerate([args.npc] if args.npc else sorted(npcs), 1):
            question = Question(f"{session}-q{n}", npc)
            game.questions[question.id] = question
            body = {"to": npc, "text": args.text, "id": question.id}
            refused = await acks.publish(client, f"{game.root}/player/{args.player}/input", body)
            if refused is not None:
                print(f"refused: player/{args.player}/input: {refused} (does this login speak as {args.player}?)",
                      file=sys.stderr)
                return 1
            print(f"asked {question.id} -> {npc}: {args.text}", flush=True)
            end = loop.time() + args.wait  # one question at a time: a run hears a player a few times a tick
            while not question.closed and (message := await next_message(client, end - loop.time())):
                game.receive(message.topic.value, bytes(message.payload))
            if not question.closed:
                print(f"no answer {question.id} from {npc} within {args.wait:g} s", flush=True)
        if any(q.answered for q in game.questions.values()):  # the last answer's intent may be on its way
            end = loop.time() + INTENT_AFTER_S
            while message := await next_message(client, end - loop.time()):
                game.receive(message.topic.value, bytes(message.payload))
    questions = game.questions.values()
    answered, failed = sum(q.answered for q in questions), sum(q.failed for q in questions)
    print(f"{answered} of {len(questions)} answered, {failed} refused", flush=True)
    if game.ignored:
        print(f"ignored {game.ignored.total()} malformed message(s)", file=sys.stderr)
    return 0 if answered == len(questions) else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--broker", type=broker_url, required=True, metavar="URL",
                        help="mqtt[s]://[user[:password]@]host:port (password also from NPCSIM_MQTT_PASSWORD)")
    parser.add_argument("--run", type=name, required=True, help="the run id (npcsim run prints it)")
    parser.add_argument("--player", type=name, required=True, help="who asks (a player id)")
    parser.add_argument("--npc", type=name, default=None, help="ask only this NPC (default: every NPC in the roster)")
    parser.add_argument("--text", default="What news?", help="the question (default: %(default)s)")
    parser.add_argument("--fact", type=fact, default=None, metavar="ID=TEXT",
                        help="first publish a canonical fact for --npc, as the game system (needs its login)")
    parser.add_argument("--wait", type=seconds, default=30.0, metavar="S",
                        help="seconds to wait for the roster, then for each answer (default 30)")
    args = parser.parse_args()
    if not args.text.strip():
        parser.error("--text: the question is empty")
    if args.fact is not None and args.npc is None:
        parser.error("--fact: name the NPC it is for with --npc")
    try:
        return asyncio.run(play(args))
    except aiomqtt.MqttError as exc:
        print(f"{args.broker.host}:{args.broker.port}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
