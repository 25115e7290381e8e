"""The golden files (tests/golden) and the digest lines of an audit that the golden audits pin.

Each audit record becomes one line: its id, the SHA-256 of its prompt, of the working
memory's encoding, of the state snapshot and of every attempt, the fallback reason and the
line said. Everything a model saw or said is in those digests; the timings and what the
server reported about each call (its usage and times, the model that answered) are left out.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import msgspec

from sim.audit import Attempt
from sim.store import open_reader

__all__ = ["AUDIT_COLUMNS", "GOLDEN", "REGENERATE", "audit_lines"]

GOLDEN = Path(__file__).parent / "golden"
REGENERATE = os.environ.get("NPCSIM_REGENERATE_GOLDEN") == "1"
"""Write the golden audits from this run instead of comparing (a change that means to change
what NPCs say, in a commit of its own): tests/test_golden_audit.py."""
AUDIT_COLUMNS = ("id", "prompt", "encoding", "state", "attempts", "fallback", "line")
"""What each tab-separated field of an audit line is."""

_ENCODER = msgspec.msgpack.Encoder()
_REPORTED = ("usage", "served_by")
"""An attempt's fields the server reported, not what the model saw or said."""


def _seen_and_said(attempts: tuple[Attempt, ...]) -> list[dict[str, object]]:
    return [{k: v for k, v in msgspec.structs.asdict(a).items() if k not in _REPORTED} for a in attempts]


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


def audit_lines(dbs: list[Path]) -> list[str]:
    """One line per record, sorted by id: what the model saw and said, as digests."""
    lines = []
    for db in dbs:
        with open_reader(db) as reader:
            for r in reader.audit_records():
                attempts = _sha(_ENCODER.encode(_seen_and_said(r.attempts)))
                state = _sha(_ENCODER.encode(r.state))
                lines.append("\t".join([
                    r.id, r.prompt_sha256[:16], r.encoding_sha256[:16], state, attempts,
                    r.fallback_reason or "-", r.line,
                ]))
    return sorted(lines)
