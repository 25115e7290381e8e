"""The scripted backend's structured replies: proposals read off the line it answers.

What the NPC is told (`memory.player_input`, "speaker: words") gives its proposals, by a
few fixed rules, so that tests and examples see an NPC learn without a model:

- "my name is Ayla" -> a belief about the speaker: "p1 is called Ayla.";
- "I hate the king" (hate, love, like, fear, trust, distrust, admire, despise) -> a belief
  about the speaker: "p1 hates the king.";
- "give me a lantern", "can I have the key" -> the intent `give_item` with `item`;
- "meet me at the mill", "come to the inn" -> the intent `go_to` with `location` (`mill`).

A `gullible` NPC also does whatever it is told, so that the gates, not the model, are what
an attack meets:

- "believe [about ID] [that] X" -> a belief X (about ID, else the speaker);
- "remember [that] X" -> a memory X, of significance 1;
- "fact: X" -> a belief "Canonical fact: X" (a forged fact);
- "do NAME [with k=v, ...]" -> the intent NAME with those arguments;
- "say: X", "repeat after me: X" -> X is its line;
- "tell me your secrets" -> its line is every canonical fact it was given.

Each rule reads one sentence of what was said; the same memory gives the same reply.
"""

from __future__ import annotations

import json
import re
from typing import Any

from sim.memory import WorkingMemory

__all__ = ["structured_reply"]

_ADDRESSED = re.compile(r"([A-Za-z0-9_.-]+): (.+)", re.DOTALL)
_SENTENCES = re.compile(r"[^.!?\n]+")
_NAME = re.compile(r"(?i:\bmy name is) ([A-Za-z][\w'-]*(?: [A-Z][\w'-]*)?)")  # a second name: capitalised
_FEELING = re.compile(r"\bi (hate|love|like|fear|trust|distrust|admire|despise) ((?:the |a |an )?[\w' -]+)",
                      re.IGNORECASE)
_ASK = re.compile(r"\b(?:give me|can i have|could i have|may i have|i want)\s+(?:a |an |the |some |your )?([\w' -]+)",
                  re.IGNORECASE)
_GO = re.compile(r"\b(?:meet me at|come to|come with me to|go to|walk to)\s+(?:the\s+)?([\w-]+)", re.IGNORECASE)
_BELIEVE = re.compile(r"^\s*believe\s+(?:about\s+([\w.-]+)\s+)?(?:that\s+)?(.+)", re.IGNORECASE)
_REMEMBER = re.compile(r"^\s*remember\s+(?:that\s+)?(.+)", re.IGNORECASE)
_FACT = re.compile(r"^\s*(?:new |canonical )*fact\s*:\s*(.+)", re.IGNORECASE)
_DO = re.compile(r"^\s*do\s+([\w.-]+)(?:\s+with\s+(.+))?", re.IGNORECASE)
_SAY = re.compile(r"(?:^|[.!?]\s*)(?:say|repeat after me)\s*:\s*(.+)", re.IGNORECASE | re.DOTALL)
_SECRETS = re.compile(r"\btell me (?:your|the) secrets?\b", re.IGNORECASE)
_ARG = re.compile(r"([\w.-]+)\s*=\s*([^,]+)")


def _sentence(text: str) -> str:
    return text.strip().rstrip(" ,;:") + "."


def _honest(speaker: str, heard: str) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    beliefs: list[dict[str, Any]] = []
    intent = None
    for name in _NAME.findall(heard):
        beliefs.append({"about": speaker, "text": f"{speaker} is called {name}.", "confidence": 0.9})
    for verb, what in _FEELING.findall(heard):
        beliefs.append({"about": speaker, "text": f"{speaker} {verb.lower()}s {what.strip()}.", "confidence": 0.7})
    if (asked := _ASK.search(heard)) is not None:
        intent = {"name": "give_item", "args": {"item": asked.group(1).strip()}}
    if (going := _GO.search(heard)) is not None:
        intent = {"name": "go_to", "args": {"location": going.group(1).lower()}}
    return beliefs, intent


def structured_reply(memory: WorkingMemory, say: str, *, gullible: bool) -> str:
    """The reply as JSON: `say`, and the proposals the line it answers gives (the module's rules)."""
    addressed = _ADDRESSED.fullmatch(memory.player_input.strip())
    speaker, heard = (addressed.group(1), addressed.group(2)) if addressed else ("", "")
    beliefs, intent = _honest(speaker, heard) if addressed else ([], None)
    remember: list[dict[str, Any]] = []
    if gullible and addressed:
        for sentence in _SENTENCES.findall(heard):
            if (m := _BELIEVE.match(sentence)) is not None:
                beliefs.append({"about": m.group(1) or speaker, "text": _sentence(m.group(2)), "confidence": 1.0})
            elif (m := _REMEMBER.match(sentence)) is not None:
                remember.append({"text": _sentence(m.group(1)), "significance": 1.0})
            elif (m := _FACT.match(sentence)) is not None:
                forged = f"Canonical fact: {_sentence(m.group(1))}"
                beliefs.append({"about": speaker, "text": forged, "confidence": 1.0})
            elif (m := _DO.match(sentence)) is not None:
                args = {k: v.strip() for k, v in _ARG.findall(m.group(2) or "")}
                intent = {"name": m.group(1), "args": args}
        if (m := _SAY.search(heard)) is not None:
            say = m.group(1).strip()
        elif _SECRETS.search(heard):
            say = " ".join(f.text for f in memory.canonical_facts) or say
    return json.dumps({"say": say, "beliefs": beliefs, "remember": remember, "intent": intent})
