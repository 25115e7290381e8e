"""What an OpenAI-compatible server reports besides the text: the call's cost, the model
that answered, the model it serves now, and (llama.cpp) its context window.

Everything here comes from outside: a field that is missing, of the wrong type, negative,
or too long to be a name is None, never guessed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import httpx
import msgspec

from sim.errors import ConfigError
from sim.wire.attempt import ServedBy, Usage

__all__ = ["model_now", "reported_usage", "served_by", "server_root", "server_slots", "server_window"]

log = logging.getLogger(__name__)

T = TypeVar("T")

_NAME_CHARS = 256  # the longest model id or build kept from a reply: a longer one is not a name
_MOST_SLOTS = 4096  # more slots than a server could hold: not a count


def served_by(data: dict[str, Any]) -> ServedBy:
    """The model a reply names (`model`) and the server's build (`system_fingerprint`)."""
    return ServedBy(model=_name(data.get("model")), build=_name(data.get("system_fingerprint")))


def reported_usage(data: dict[str, Any]) -> Usage:
    """The call's cost as the reply states it: llama.cpp's `timings` first (its own count of
    the prompt tokens evaluated and reused), else `usage`. A reused count above the prompt's
    is not a count the server can mean: it is dropped."""
    usage, timings = _object(data.get("usage")), _object(data.get("timings"))
    prompt, cached = _count(usage.get("prompt_tokens")), _count(_object(usage.get("prompt_tokens_details"))
                                                                 .get("cached_tokens"))
    evaluated, reused = _count(timings.get("prompt_n")), _count(timings.get("cache_n"))
    if evaluated is not None and reused is not None:
        prompt, cached = evaluated + reused, reused
    if prompt is not None and cached is not None and cached > prompt:
        _more_cached_than_prompt(cached, prompt)
        cached = None
    return Usage(
        prompt_tokens=prompt, cached_tokens=cached, completion_tokens=_count(usage.get("completion_tokens")),
        prompt_ms=_ms(timings.get("prompt_ms")), predicted_ms=_ms(timings.get("predicted_ms")),
    )


_cached_over_prompt = 0  # replies of this process that said more tokens were cached than their prompt had


def _more_cached_than_prompt(cached: int, prompt: int) -> None:
    """Counted; logged the first time in a process (a server that always does it must not flood the log)."""
    global _cached_over_prompt
    _cached_over_prompt += 1
    if _cached_over_prompt == 1:
        log.warning("a reply says %d of its %d prompt tokens were cached: its cached tokens are not recorded "
                    "(nor those of any other such reply; not logged again)", cached, prompt)


def _object(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _count(value: object) -> int | None:
    """A token count, or None when missing or not a whole number >= 0."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _ms(value: object) -> float | None:
    """A duration in milliseconds, or None when missing or not a finite number >= 0."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < float("inf"):
        return None
    return float(value)


def _name(value: object) -> str | None:
    """A model id or build as the server gave it, or None when missing, empty or too long to be one."""
    return value if isinstance(value, str) and 0 < len(value) <= _NAME_CHARS else None


async def server_window(base_url: str, wait_s: float) -> int | None:
    """The context window of one of the server's slots, in tokens; None when it does not say.

    llama.cpp answers `GET /props` (`default_generation_settings.n_ctx`) and `GET /slots`
    (each slot's `n_ctx`) at its root, beside `/v1`. A server not reachable within `wait_s`
    says nothing either: the backend's own retries and circuit breaker deal with a server
    that is down.
    """
    return await _said(base_url, wait_s, "its context window", _props_window, _slots_window)


async def server_slots(base_url: str, wait_s: float) -> int | None:
    """How many slots the server serves requests in; None when it does not say or cannot be asked.

    llama.cpp says `total_slots` in `GET /props`, and lists its slots in `GET /slots`.
    """
    return await _said(base_url, wait_s, "its slots", _props_slots, _slots_count)


async def _said(
    base_url: str, wait_s: float, what: str, of_props: Callable[[object], int | None],
    of_slots: Callable[[object], int | None],
) -> int | None:
    """A count llama.cpp's `GET /props` or else `GET /slots` says; None when neither does or
    the server cannot be reached (logged, naming `what`)."""
    root = server_root(base_url)
    try:
        return await _first_answer(wait_s, ((f"{root}/props", of_props), (f"{root}/slots", of_slots)))
    except httpx.HTTPError as exc:
        log.info("cannot ask %s for %s: %s: %s", root, what, type(exc).__name__, exc)
        return None


async def model_now(base_url: str, wait_s: float) -> ServedBy:
    """The model the server serves now, named as its replies name it: llama.cpp's `GET /props`
    (`model_alias`, `build_info`), else the first of `GET {base_url}/models`. A ConfigError
    when the server cannot be reached."""
    root = server_root(base_url)
    asks = ((f"{root}/props", _props_model), (f"{base_url.rstrip('/')}/models", _listed_model))
    try:
        return await _first_answer(wait_s, asks) or ServedBy()
    except httpx.HTTPError as exc:
        raise ConfigError(f"cannot ask {root} which model it serves: {type(exc).__name__}: {exc}") from exc


def server_root(base_url: str) -> str:
    """The server's root, where llama.cpp answers beside its OpenAI-compatible `/v1`."""
    return base_url.rstrip("/").removesuffix("/v1")


async def _first_answer(wait_s: float, asks: Iterable[tuple[str, Callable[[object], T | None]]]) -> T | None:
    """The first of `asks` (a URL to GET, and what to read of its JSON) that gives something;
    raises httpx.HTTPError when the server cannot be reached."""
    async with httpx.AsyncClient(timeout=wait_s) as client:
        for url, read in asks:
            response = await client.get(url)
            if response.status_code != 200:
                continue
            try:
                answer = read(msgspec.json.decode(response.content))
            except msgspec.DecodeError:
                answer = None
            if answer is not None:
                return answer
    return None


def _props_window(props: object) -> int | None:
    settings = _object(_object(props).get("default_generation_settings"))
    return _count(settings.get("n_ctx")) or None


def _slots_window(slots: object) -> int | None:
    if not isinstance(slots, list) or not slots:
        return None
    return _count(_object(slots[0]).get("n_ctx")) or None


def _props_slots(props: object) -> int | None:
    slots = _count(_object(props).get("total_slots"))
    return slots if slots and slots <= _MOST_SLOTS else None


def _slots_count(slots: object) -> int | None:
    return len(slots) if isinstance(slots, list) and 0 < len(slots) <= _MOST_SLOTS else None


def _props_model(props: object) -> ServedBy | None:
    props = _object(props)
    said = ServedBy(model=_name(props.get("model_alias")), build=_name(props.get("build_info")))
    return None if said == ServedBy() else said


def _listed_model(models: object) -> ServedBy | None:
    listed = _object(models).get("data")
    if not isinstance(listed, list) or not listed:
        return None
    model = _name(_object(listed[0]).get("id"))
    return None if model is None else ServedBy(model=model)
