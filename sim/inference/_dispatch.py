"""`Dispatch`: what the pool calls to have a request answered, whatever carries it.

The pool (`sim.inference._pool`) holds the slots and the priority order; a transport
hands it one `Dispatch`: in-process, serving on a backend here (`sim.inference._serve`);
over MQTT, the pool's link to the remote workers (`sim.inference._link`). A dispatch never
raises for a backend or transport failure: it answers with a fallback result instead.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeAlias

from sim.wire.inference import InferenceRequest, InferenceResult

__all__ = ["Dispatch"]

Dispatch: TypeAlias = Callable[[InferenceRequest], Awaitable[InferenceResult]]
