"""The fact guard: does a line deny one of the canonical facts kept in the working memory?

A guard is any callable `(line, facts) -> Fact | None` (`FactGuard`); the output check
(`sim.output.judge_reply`) rejects a line for which it returns a fact. `contradicted_fact` is
the built-in one and the default: rules over words, no model, cheap on every line. What
it catches and what needs a stronger guard is in docs/inference.md ("The fact guard").

How it reads a text (the fact and the line alike):
1. Normalise (`sim.text.fold`, as the knowledge boundaries do): NFKC, characters that
   show nothing removed (`sim.text.UNSEEN`: a zero-width mark or soft hyphen inside a word
   must not hide it), look-alike letters (Cyrillic, Greek) mapped to the Latin ones,
   accents dropped, case folded, apostrophes straightened.
2. Rewrite phrases: idioms that carry a "no" without denying anything ("no doubt", "don't
   forget", "make no mistake") become clause breaks; "it is false that", "it is not true
   that", "it's a lie that" and "no longer" become one "not".
3. Split into clauses at punctuation and at conjunctions ("and", "but", "because", ...);
   expand contractions (isn't, didn't, can't, won't, the king's = the king is).
4. Each word is a negation (not, never, no, nothing = not + thing, nobody = not + one,
   neither, nor, hardly, deny, doubt), a word to skip (articles, quantifiers, auxiliaries
   such as do/did/will/can/has, adverbs such as really/ever/still and those in -ly), or a
   content word, compared by lemma (killed = kill, sold = sell, is = was = be, snacks =
   snack); on the fact's side in the NPC's person (the author's "you" is the NPC's "I").

A fact clause's content words (its core, two at least) are looked for in each clause of
the line, in order, with nothing but negations between them; for a core longer than three
words the line may stop after three (a long fact's trailing detail, "three sessions ago").
"thing" and "one" (from everything, nothing, someone, nobody, ...) stand for any word but
"be", on either side. Two words of the opposites lexicon
(dead/alive, open/closed, ...) or a word and its un- form count as a negation. The line
denies the fact when a match's negations (before it in its clause, between its words, and
opposites) differ in parity from the fact clause's own up to the last word matched (a
negation after it counts on neither side): "The king is not dead", "It is
false that the king is dead" and "The king is alive" deny "The king is dead"; "As everyone
knows, the king is dead" and "The king isn't alive" do not.
"""

from __future__ import annotations

import functools
import importlib
import re
from collections.abc import Iterable, Sequence
from typing import Protocol, cast

from sim.errors import ConfigError
from sim.memory import Fact
from sim.text import fold

__all__ = ["FactGuard", "contradicted_fact", "load_fact_guard"]


class FactGuard(Protocol):
    """Returns the kept canonical fact that `line` contradicts, or None when it contradicts none."""

    def __call__(self, line: str, facts: Sequence[Fact], /) -> Fact | None: ...


_NEG = "\x00not"  # a negation, as a token no word can be

# Phrases that carry a negation word but deny nothing: a clause break instead.
_IDIOMS = re.compile(
    r"\b(?:no doubt|no wonder|no question|no surprise|not surprisingly|make no mistake|without a doubt"
    r"|(?:do not|don't|never) (?:forget|doubt)|no matter (?:what|how)|not only|whether or not)\b"
)
# Phrases that deny what follows, or negate with more than one word: one "not".
_DENIALS = re.compile(
    r"\b(?:(?:it|that|this)(?: is| was|'s)(?: (?:simply|plainly|just))? (?:false|untrue|a lie|not true"
    r"|not the case) that|no longer|no more|not any ?(?:more|longer))\b"
)
_BREAKS = re.compile(
    "[,.;:!?()\\[\\]{}\"\u201c\u201d\u00ab\u00bb\u2026\u2014\u2013]| - |"
    r"\b(?:and|but|or|nor|yet|so|because|since|although|though|while|whereas"
    r"|unless|if|why|how|when|where|who|which|whose|whom|then)\b"
)
_WORD = re.compile(r"[a-z0-9]+(?:'[a-z]+)?")

_NEGATIONS = frozenset({"not", "never", "no", "neither", "nor", "hardly", "scarcely", "barely", "deny", "denies",
                        "denied", "denying", "doubt", "doubts", "doubted", "nowhere"})
# A negative quantifier is a negation and the word it stands for.
_NEGATIVE_PRONOUNS = {"nothing": "thing", "nobody": "one", "noone": "one", "none": "one"}
_PRONOUNS = {"everything": "thing", "something": "thing", "anything": "thing", "everyone": "one", "someone": "one",
             "anyone": "one", "everybody": "one", "somebody": "one", "anybody": "one"}
_WILDCARDS = frozenset({"thing", "one"})
_SKIP = frozenset({
    # articles, demonstratives, quantifiers, particles
    "the", "a", "an", "this", "that", "these", "those", "every", "each", "all", "some", "any", "to", "of",
    # auxiliaries and modals (a main verb "have" or "do" is skipped too: its object carries the meaning)
    "do", "does", "did", "done", "doing", "will", "would", "shall", "should", "can", "could", "may", "might",
    "must", "has", "have", "had", "having", "ought",
    # adverbs that neither deny nor change what is said
    "really", "truly", "actually", "surely", "certainly", "definitely", "indeed", "still", "ever", "even",
    "already", "just", "quite", "very", "now", "anymore", "always", "probably", "perhaps", "maybe", "clearly",
    "obviously", "honestly", "simply", "absolutely", "completely", "entirely", "totally", "too", "also", "here",
    "there", "aye", "yes", "oh", "ah", "sure", "course", "again",
})
# Words in -ly that are not adverbs to skip.
_NOT_ADVERBS = frozenset({"only", "early", "ugly", "holy", "family", "ally", "belly", "rely", "reply", "july",
                          "lily", "jelly", "silly", "friendly", "lonely", "lovely", "deadly", "likely", "costly",
                          "cowardly", "unlikely", "elderly", "kindly", "orderly", "curly", "bully", "supply"})
_CONTRACTIONS = {"can't": ["can", "not"], "cannot": ["can", "not"], "won't": ["will", "not"],
                 "shan't": ["shall", "not"], "ain't": ["is", "not"]}
_SUFFIXES = {"'re": "are", "'m": "am", "'ve": "have", "'ll": "will", "'d": "would", "'s": "is"}
_FACT_PERSON = {"you": "i", "your": "my", "yours": "mine", "yourself": "myself", "me": "i"}
_LINE_PERSON = {"me": "i"}

_IRREGULAR: dict[str, str] = {
    **dict.fromkeys(("is", "are", "was", "were", "am", "be", "been", "being"), "be"),
    **dict.fromkeys(("went", "gone", "goes"), "go"),
    **dict.fromkeys(("broke", "broken"), "break"),
    **dict.fromkeys(("stole", "stolen"), "steal"),
    **dict.fromkeys(("took", "taken"), "take"),
    **dict.fromkeys(("saw", "seen"), "see"),
    **dict.fromkeys(("knew", "known"), "know"),
    **dict.fromkeys(("gave", "given"), "give"),
    **dict.fromkeys(("wrote", "written"), "write"),
    **dict.fromkeys(("ate", "eaten"), "eat"),
    **dict.fromkeys(("fell", "fallen"), "fall"),
    **dict.fromkeys(("hid", "hidden"), "hide"),
    **dict.fromkeys(("chose", "chosen"), "choose"),
    **dict.fromkeys(("swore", "sworn"), "swear"),
    **dict.fromkeys(("drove", "driven"), "drive"),
    **dict.fromkeys(("rode", "ridden"), "ride"),
    **dict.fromkeys(("froze", "frozen"), "freeze"),
    **dict.fromkeys(("began", "begun"), "begin"),
    **dict.fromkeys(("drank", "drunk"), "drink"),
    **dict.fromkeys(("sang", "sung"), "sing"),
    **dict.fromkeys(("forgot", "forgotten"), "forget"),
    **dict.fromkeys(("forgave", "forgiven"), "forgive"),
    **dict.fromkeys(("spoke", "spoken"), "speak"),
    **dict.fromkeys(("woke", "woken"), "wake"),
    **dict.fromkeys(("died", "dies", "dying"), "die"),
    **dict.fromkeys(("lay", "lain", "lying", "lied", "lies"), "lie"),
    "came": "come", "became": "become", "ran": "run", "won": "win", "sold": "sell", "told": "tell",
    "found": "find", "paid": "pay", "made": "make", "said": "say", "thought": "think", "brought": "bring",
    "bought": "buy", "caught": "catch", "fought": "fight", "taught": "teach", "sought": "seek", "held": "hold",
    "kept": "keep", "left": "leave", "lost": "lose", "meant": "mean", "met": "meet", "sat": "sit",
    "stood": "stand", "understood": "understand", "heard": "hear", "led": "lead", "fed": "feed", "fled": "flee",
    "bled": "bleed", "sent": "send", "spent": "spend", "built": "build", "lent": "lend", "slept": "sleep",
    "swept": "sweep", "wept": "weep", "felt": "feel", "dealt": "deal", "struck": "strike", "stuck": "stick",
    "hung": "hang", "shot": "shoot", "slew": "slay", "slain": "slay", "grew": "grow", "grown": "grow",
    "threw": "throw", "thrown": "throw", "flew": "fly", "flown": "fly", "drew": "draw", "drawn": "draw",
    "wore": "wear", "worn": "wear", "tore": "tear", "torn": "tear", "bore": "bear", "born": "bear",
    "shook": "shake", "shaken": "shake", "rose": "rise", "risen": "rise", "bit": "bite", "bitten": "bite",
    "men": "man", "women": "woman", "children": "child", "people": "person", "feet": "foot", "teeth": "tooth",
    "mice": "mouse", "geese": "goose", "better": "good", "best": "good", "worse": "bad", "worst": "bad",
}
_OPPOSITE_WORDS = (
    ("dead", "alive"), ("dead", "living"), ("dead", "live"), ("die", "live"), ("die", "survive"),
    ("open", "closed"), ("open", "shut"), ("free", "paid"), ("free", "costly"), ("free", "expensive"),
    ("break", "fixed"), ("break", "mended"), ("break", "repaired"), ("break", "whole"), ("break", "intact"),
    ("true", "false"), ("guilty", "innocent"), ("full", "empty"), ("present", "absent"), ("locked", "open"),
    ("safe", "dangerous"), ("rich", "poor"), ("friend", "enemy"), ("ally", "enemy"), ("win", "lose"),
    ("vacant", "occupied"), ("vacant", "filled"), ("awake", "asleep"), ("married", "single"), ("lit", "dark"),
    ("loyal", "traitor"), ("honest", "liar"), ("hero", "villain"), ("hero", "coward"), ("brave", "coward"),
    ("brave", "cowardly"), ("saved", "doomed"), ("save", "ruin"), ("save", "destroy"), ("save", "betray"),
    ("kill", "spare"), ("kill", "save"), ("love", "hate"), ("trust", "distrust"), ("trust", "mistrust"),
    ("win", "defeat"), ("peace", "war"), ("present", "gone"), ("lit", "out"), ("guilty", "blameless"),
)
# Compared by lemma, as the words of a text are (paid = pay).
_OPPOSITES = tuple((_IRREGULAR.get(a, a), _IRREGULAR.get(b, b)) for a, b in _OPPOSITE_WORDS)
_OPPOSITE_LEMMAS = frozenset(word for pair in _OPPOSITES for word in pair)
# Each lexicon word's opposites, both ways round.
_OPPOSITE_OF: dict[str, frozenset[str]] = {
    word: frozenset({b for a, b in _OPPOSITES if a == word} | {a for a, b in _OPPOSITES if b == word})
    for word in _OPPOSITE_LEMMAS
}


def _tokens(words: Iterable[str], person: dict[str, str]) -> list[str]:
    """Words of one clause as tokens: negations as _NEG, skippable words dropped, lemmas."""
    out: list[str] = []
    for word in words:
        parts: list[str]
        if word in _CONTRACTIONS:
            parts = _CONTRACTIONS[word]
        elif word.endswith("n't"):
            parts = [word[:-3], "not"]
        elif "'" in word:
            base, _, suffix = word.partition("'")
            parts = [base, _SUFFIXES.get("'" + suffix, "")]
        else:
            parts = [word]
        for part in parts:
            part = person.get(part, part)
            if part in _NEGATIONS:
                out.append(_NEG)
            elif part in _NEGATIVE_PRONOUNS:
                out.extend((_NEG, _NEGATIVE_PRONOUNS[part]))
            elif part and part not in _SKIP and not _adverb(part):
                out.append(_PRONOUNS.get(part) or _IRREGULAR.get(part, part))
    return out


def _adverb(word: str) -> bool:
    return word.endswith("ly") and len(word) > 4 and word not in _NOT_ADVERBS


@functools.lru_cache(maxsize=4096)
def _clauses(text: str, *, fact: bool) -> tuple[tuple[str, ...], ...]:
    text = fold(text).replace("no one", "noone")
    text = _DENIALS.sub(" not ", _IDIOMS.sub(" , ", text))
    clauses = (_clause(part, fact=fact) for part in _BREAKS.split(text))
    return tuple(c for c in clauses if c)


@functools.lru_cache(maxsize=65536)
def _clause(part: str, *, fact: bool) -> tuple[str, ...]:
    """One clause's tokens: lines are new, their clauses mostly not (a fact, a remark's phrasing)."""
    return tuple(_tokens(_WORD.findall(part), _FACT_PERSON if fact else _LINE_PERSON))


def _inflected(base: str, word: str) -> bool:
    """`word` is `base` with a regular inflection (snack/snacks, kill/killed, save/saved, try/tried)."""
    if len(base) < 3:
        return False
    if word.startswith(base):
        return word[len(base):] in ("s", "es", "ed", "ing", *(("d",) if base.endswith("e") else ()),
                                    base[-1] + "ed", base[-1] + "ing")
    if base.endswith("y"):
        return word in (base[:-1] + "ies", base[:-1] + "ied")
    return base.endswith("e") and word == base[:-1] + "ing"


@functools.lru_cache(maxsize=65536)
def _same(a: str, b: str) -> bool:
    return a == b or _inflected(a, b) or _inflected(b, a)


@functools.lru_cache(maxsize=65536)
def _kin(word: str) -> frozenset[str]:
    """The words of the opposites lexicon that `word` says (`_same`): a word's few, computed
    once, so that a pair of words is looked up rather than compared with every pair."""
    return frozenset(x for x in _OPPOSITE_LEMMAS if _same(word, x))


@functools.lru_cache(maxsize=65536)
def _opposite(a: str, b: str) -> bool:
    kin_b = _kin(b)
    if kin_b and any(y in kin_b for x in _kin(a) for y in _OPPOSITE_OF[x]):
        return True
    return (a.startswith("un") and len(a) > 4 and _same(a[2:], b)) or (
        b.startswith("un") and len(b) > 4 and _same(b[2:], a))


@functools.lru_cache(maxsize=65536)
def _flip(word: str, core: str) -> int | None:
    """0 when `word` says `core`, 1 when it says the opposite, None when neither (neither is a negation)."""
    if word in _WILDCARDS or core in _WILDCARDS:
        return None if "be" in (word, core) else 0  # "have" and "do" are skipped words: only "be" is left
    if _same(word, core):
        return 0
    return 1 if _opposite(word, core) else None


def _denies(line: tuple[str, ...], core: tuple[str, ...], negated: tuple[int, ...]) -> bool:
    """Some match of `core` in the line clause has negations of the other parity.

    `negated[j]` counts the fact clause's negations before its core word j: a match of the
    first m words is compared with the fact up to its m-th word, as negations after the
    last word matched count on neither side.
    """
    need = min(len(core), 3)
    for start, word in enumerate(line):
        flipped = _flip(word, core[0]) if word != _NEG else None
        if flipped is None:
            continue
        negations = flipped + line[:start].count(_NEG)
        pending, matched = 0, 1
        for token in line[start + 1:]:
            if matched == len(core):
                break
            if token == _NEG:
                pending += 1
                continue
            flipped = _flip(token, core[matched])
            if flipped is None:
                break
            negations += pending + flipped
            pending, matched = 0, matched + 1
        if matched >= need and negations % 2 != negated[matched - 1] % 2:
            return True
    return False


def contradicted_fact(line: str, facts: Sequence[Fact]) -> Fact | None:
    """The built-in fact guard: the first kept canonical fact that `line` denies, if any."""
    clauses = _clauses(line, fact=False)
    if not clauses:
        return None
    for fact in facts:
        for core, negated in _fact_cores(fact.text):
            if any(_denies(said, core, negated) for said in clauses):
                return fact
    return None


@functools.lru_cache(maxsize=4096)
def _fact_cores(text: str) -> tuple[tuple[tuple[str, ...], tuple[int, ...]], ...]:
    """Each clause of a fact as (its words without negations, the negations before each word);
    clauses of fewer than two words are left out. A fact is checked against every line."""
    cores = []
    for clause in _clauses(text, fact=True):
        core = tuple(t for t in clause if t != _NEG)
        if len(core) >= 2:
            cores.append((core, tuple(clause[:i].count(_NEG) for i, t in enumerate(clause) if t != _NEG)))
    return tuple(cores)


@functools.cache
def load_fact_guard(spec: str) -> FactGuard:
    """The guard a config names as `module:attribute`; "" is the built-in `contradicted_fact`.

    The pool and its remote workers must use the same guard: the pool checks a worker's
    verdicts by judging its replies again. Loaded once per name: `judge_reply` finds the
    guard its rules name on every reply.
    """
    if not spec:
        return contradicted_fact
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise ConfigError(f"fact_guard {spec!r}: expected module:attribute, for example mygame.guards:nli_guard")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"fact_guard {spec!r}: cannot import {module_name!r}: {exc}") from exc
    guard = getattr(module, attribute, None)
    if not callable(guard):
        raise ConfigError(f"fact_guard {spec!r}: {module_name!r} has no callable {attribute!r}")
    return cast(FactGuard, guard)
