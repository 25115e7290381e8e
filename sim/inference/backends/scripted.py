"""The `scripted` backend: deterministic, no model, built from the memory it received.

Its reply answers the line addressed to it (named by its speaker, a question taken as a
question) with one remark drawn from what the working memory kept: a canonical fact, a
belief, a memory, or (when there is none of those) a line of the dialogue. So a scripted
run shows the working memory at work: an NPC mentions what it remembers, and a memory
that truncation dropped is never mentioned again. The choice is a function of the prompt
(its SHA-256), so the same memory gives the same reply, while a conversation still varies:

- asked a question, it prefers a fact or belief that shares words with it (asked about
  the king, an NPC says what it knows of the king); otherwise a kind of remark (fact,
  belief, memory) is drawn, then one of its items;
- never a remark that repeats what was just said to it or what it said itself in the
  dialogue it kept, so two NPCs do not echo each other, nor one about the one it talks
  to (`guard_captain said to me: ...`, said to the guard captain), nor a memory
  whose quotation was already cut (a retelling of a retelling); and never, in its own
  words, a line it said before in that dialogue;
- every remark is a whole sentence of its own, the item's text as written (a text that
  begins with a lower-case letter, such as an agent's id, follows a lead-in instead of
  being capitalised), and a quotation it cites is one level deep (`sim.memory.quoted`).

`delay_ms` makes it answer after a fixed delay (benchmarks); `script` replaces the reply
by fixed texts used in turn (tests of output handling). Asked for a structured reply (a
`schema`), it answers with that line as `say` and the proposals its rules read off what it
was told (sim.inference.backends._proposing); `gullible` makes it propose whatever it is
told, so that the gates are what tests attack.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import itertools
import re
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

import msgspec

from sim.inference.backends._base import Reply, convert_options
from sim.inference.backends._proposing import structured_reply
from sim.memory import QUOTE_MARKS, WorkingMemory, own_words, quoted
from sim.wire.attempt import Usage

__all__ = ["ScriptedBackend", "ScriptedOptions", "scripted_reply"]

T = TypeVar("T")

_ADDRESSED = re.compile(r"([A-Za-z0-9_.-]+): (.+)", re.DOTALL)  # "speaker: line", as the NPC brain asks
_WORD = re.compile(r"[a-z]{4,}")
_SPACE_BEFORE_PUNCTUATION = re.compile(r"\s+([.,!?;:])")  # as output handling does
_ASIDE = re.compile(r"\*[^*]*\*|\([^)]*\)|\[[^\]]*\]")  # what output handling cuts as stage directions
_MAX_CITED = 120  # characters of an item's text cited whole; a longer one is cut (inside sim.output.MAX_LINE_CHARS)
_ELLIPSIS = "\u2026"
_THROWS = 8  # tries at a line not said before
_ENDS = ".!?" + _ELLIPSIS

# What answers the addressed line: by its last character, then the prompt's digest.
_OPENINGS: dict[str, tuple[str, ...]] = {
    "?": ("A fair question, {who}.", "You ask me that, {who}?", "Since you ask, {who}, I will tell you."),
    "!": ("Steady, {who}.", "No need to shout, {who}.", "Easy now, {who}."),
    ".": ("I hear you, {who}.", "So you say, {who}.", "Well said, {who}.", "Indeed, {who}."),
}
_GREETINGS = ("Well now.", "Listen.", "Good day.", "Hm.")  # an ambient prompt: nobody to answer

# Remarks by kind; `{}` is the item's text. "upper": its own sentence; "lower": after a lead-in.
_FACT = {"upper": ("{}", "{} Everyone here knows it.", "Everyone knows it. {}", "{} That much is certain."),
         "lower": ("Everyone here knows that {}",)}
_BELIEF = {"upper": ("{} I am sure of it.", "{} I would bet on it."),
           "upper-doubt": ("{} Or so I believe.", "{} I think so, anyway.", "{} Or so I suspect."),
           "lower": ("I believe {}", "It seems to me that {}")}
_MEMORY = {"upper": ("{} I remember it well.", "I remember it well. {}", "{} I have not forgotten it."),
           "lower": ("I remember that {}", "I recall that {}")}


_Item = tuple[str, dict[str, tuple[str, ...]], bool]  # an item's text, its remarks, whether it is doubted
_PHRASING = {
    word
    for group in (*_OPENINGS.values(), _GREETINGS, *_FACT.values(), *_BELIEF.values(), *_MEMORY.values(), ("said",))
    for text in group
    for word in _WORD.findall(text.lower())
}


class ScriptedOptions(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    delay_ms: float = 0.0
    script: tuple[str, ...] = ()
    gullible: bool = False


class _Dice:
    """Numbers drawn from the prompt's digest, one per draw, so the reply is a function of it."""

    def __init__(self, prompt: str, throw: int = 0) -> None:
        digest = hashlib.sha256(prompt.encode() + (b"\0%d" % throw if throw else b"")).digest()
        self._values = [int.from_bytes(digest[at : at + 4], "big") for at in range(0, 32, 4)]
        self._draws = 0

    def choice(self, options: Sequence[T]) -> T:
        value = self._values[self._draws % len(self._values)]
        self._draws += 1
        return options[value % len(options)]


def _cut(text: str, limit: int) -> str:
    """`text`, or its first words within `limit` characters and an ellipsis."""
    if len(text) <= limit:
        return text
    head = text[: limit - 1].rsplit(" ", 1)[0].rstrip(" ,;:-")
    return (head or text[: limit - 1]) + _ELLIPSIS


@functools.lru_cache(maxsize=65536)  # a reply asks it of every kept item, a few times over
def _sentence(text: str) -> str:
    """An item's text ready to be said: one line, spaces collapsed (none before punctuation),
    no aside in brackets
    (output handling would cut it as a stage direction), first person for a fact
    written to the NPC ("You are ..."), a quotation one level deep with no space inside its
    marks, cut to `_MAX_CITED`, ending with a full stop when it has no end of its own."""
    text = _SPACE_BEFORE_PUNCTUATION.sub(r"\1", " ".join(_ASIDE.sub(" ", text).split()))
    for second, first in (("You are ", "I am "), ("You have ", "I have ")):
        if text.startswith(second):
            text = first + text[len(second) :]
    parts = text.split('"')
    if any(mark in text for mark in QUOTE_MARKS.replace('"', "")) or len(parts) not in (1, 3):
        text, parts = own_words(text), [own_words(text)]
    if len(parts) == 3 and not parts[1].strip():
        text, parts = own_words(text), [own_words(text)]
    if len(parts) == 3:  # `who said: "words"`: the words cut to fit, inside their marks
        room = _MAX_CITED - len(parts[0]) - len(parts[2]) - 2
        text = f'{parts[0]}"{_cut(parts[1].strip(), max(room, 1))}"{parts[2]}' if room >= 20 else own_words(text)
    text = _cut(text, _MAX_CITED).rstrip(" ,;:-")
    body = text.rstrip(QUOTE_MARKS)
    return text if body.endswith(tuple(_ENDS)) or not text else text + "."


@functools.lru_cache(maxsize=65536)
def _sayable(text: str) -> bool:
    """Whether the text says anything (a word or a number) once made a sentence."""
    return any(ch.isalnum() for ch in _sentence(text))


def _remark(text: str, templates: dict[str, tuple[str, ...]], dice: _Dice, doubt: bool = False) -> str:
    said = _sentence(text)
    if not said[:1].isupper():
        return dice.choice(templates["lower"]).format(said)
    kind = "upper-doubt" if doubt and "upper-doubt" in templates else "upper"
    return dice.choice(templates[kind]).format(said)


_MARKS = str.maketrans("", "", QUOTE_MARKS)


@functools.lru_cache(maxsize=65536)
def _plain(text: str) -> str:
    """The text without quotation marks, spaces collapsed: what two texts compare by."""
    return " ".join(text.translate(_MARKS).split())


@functools.lru_cache(maxsize=65536)
def _said_plain(text: str) -> str:
    """An item's text as it would be said, compared plain (`_plain`)."""
    return _plain(_sentence(text))


def _words(text: str) -> set[str]:
    """The words that say what a text is about: not those of the replies' own phrasing."""
    return set(_WORD.findall(text.lower())) - _PHRASING


def scripted_reply(memory: WorkingMemory) -> str:
    """The reply built from the working memory; the same memory gives the same reply.

    Never, in its own words, a line it said in the dialogue it kept (its listeners would
    remember the same words twice): the dice are thrown again, a few times at most."""
    said_before = {own_words(line.text) for line in memory.dialogue if line.speaker == memory.agent_id}
    reply = ""
    for throw in range(_THROWS):
        reply = _reply(memory, _Dice(memory.prompt, throw))
        if own_words(reply) not in said_before:
            break
    return reply


def _reply(memory: WorkingMemory, dice: _Dice) -> str:
    addressed = _ADDRESSED.fullmatch(" ".join(memory.player_input.split()))
    heard = addressed.group(2) if addressed else ""
    if addressed:
        end = heard.rstrip(QUOTE_MARKS + " ")[-1:]
        opening = dice.choice(_OPENINGS.get(end, _OPENINGS["."])).format(who=addressed.group(1))
    else:
        opening = dice.choice(_GREETINGS)
    kinds: list[list[_Item]] = [
        [(f.text, _FACT, False) for f in memory.canonical_facts if _sayable(f.text)],
        [(b.text, _BELIEF, b.confidence < 0.7) for b in memory.beliefs if _sayable(b.text)],
        # a memory whose quotation was cut (a retelling of a retelling) is not retold again
        [(e.text, _MEMORY, False) for e in memory.episodic if _sayable(e.text) and _ELLIPSIS not in e.text],
    ]
    spoken = [_plain(heard), *(_plain(line.text) for line in memory.dialogue if line.speaker == memory.agent_id)]
    just_heard = _plain(heard).rstrip(_ENDS)

    # who it talks to: the speaker it answers, or whoever an ambient prompt names
    them = {addressed.group(1)} if addressed else set(memory.player_input.split())

    def to_them(item: _Item) -> bool:
        """Not about the one it talks to (an id that begins the text): they know best what
        they said and want."""
        first = _said_plain(item[0]).split(" ", 1)[0]
        return not (first[:1].islower() and first in them)

    def fresh(item: _Item) -> bool:
        """Not said just now, by it or to it, nor the memory of the line it answers."""
        plain = _said_plain(item[0]).rstrip(_ENDS)
        return not any(plain in said for said in spoken) and not (just_heard and just_heard in plain)

    # the strictest choice that leaves something to say: fresh and for them, for them, anything
    for keep in (lambda i: fresh(i) and to_them(i), to_them, lambda i: True):
        chosen = [kind for kind in ([i for i in kind if keep(i)] for kind in kinds) if kind]
        if chosen:
            break
    kinds = chosen
    if not kinds:
        if memory.dialogue:
            line = memory.dialogue[-1]
            return f"{opening} Earlier, {_sentence(f'{line.speaker} said {quoted(line.text)}')}"
        return opening
    asked = _words(own_words(heard)) if heard.rstrip(QUOTE_MARKS + " ").endswith("?") else set()
    known = [item for kind in kinds if kind[0][1] is not _MEMORY for item in kind]
    best = max((len(asked & _words(item[0])) for item in known), default=0)
    pool = [item for item in known if len(asked & _words(item[0])) == best] if best else dice.choice(kinds)
    text, templates, doubt = dice.choice(pool)
    return f"{opening} {_remark(text, templates, dice, doubt)}"


class ScriptedBackend:
    name = "scripted"
    model = "scripted"
    prompt_form = "text"
    prompt_prefix = ""

    def __init__(self, options: Mapping[str, Any]) -> None:
        self._options = convert_options(self.name, options, ScriptedOptions)
        self._script = itertools.cycle(self._options.script) if self._options.script else None
        self._params: dict[str, Any] = {"delay_ms": self._options.delay_ms}
        if self._options.gullible:
            self._params["gullible"] = True

    async def generate(self, memory: WorkingMemory, schema: Mapping[str, Any] | None = None) -> Reply:
        if self._options.delay_ms > 0:
            await asyncio.sleep(self._options.delay_ms / 1000)
        if self._script is not None:
            text = next(self._script)
        elif schema is not None:
            text = structured_reply(memory, scripted_reply(memory), gullible=self._options.gullible)
        else:
            text = scripted_reply(memory)
        return Reply(text=text, model=self.model, params=self._params,
                     usage=Usage(completion_tokens=len(text.split())))
