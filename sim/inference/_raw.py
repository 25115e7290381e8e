"""A model's raw reply as serving keeps it: whole up to a bound, else an excerpt with its size.

The raw reply goes into the inference result, over MQTT from a remote worker, and into the
audit, once per attempt. A reply of 50 MB whose line is 200 characters must not cost a
store 50 MB per attempt: past `RAW_EXCERPT_CHARS` it is kept as its first characters and a
marker with its true size. The excerpt is what output handling judges too, so the line, the
verdict and the record agree, and the pool's checks of a remote reply hold on it. The
marker is a line of its own in brackets: output handling never says it (a stage
direction).
"""

from __future__ import annotations

__all__ = ["RAW_EXCERPT_CHARS", "raw_excerpt"]

RAW_EXCERPT_CHARS = 8_192


def raw_excerpt(text: str) -> str:
    """`text` when it is at most RAW_EXCERPT_CHARS long, else its start and a marker with its size."""
    if len(text) <= RAW_EXCERPT_CHARS:
        return text
    return f"{text[:RAW_EXCERPT_CHARS]}\n[reply cut: {RAW_EXCERPT_CHARS} of {len(text)} characters kept]"
