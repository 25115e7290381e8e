"""What an independent checker found wrong: the rule (an invariant, or the gate that should
have refused) and why, one line a person reads."""

from __future__ import annotations

import msgspec

__all__ = ["Violation"]


class Violation(msgspec.Struct, frozen=True):
    """One rule broken: `invariant` names it ("I2", or a gate's code), `detail` says how."""

    invariant: str
    detail: str
