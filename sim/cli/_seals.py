"""`npcsim audit verify`, and the check `npcsim audit replay` makes first: a store against its seals.

The run key is the one kept beside the store (`RUN.db.key`, what `--broker auto` keeps); a
run started with `--run-key-file` is checked with a copy of that key put there. Without the
key of a store sealed with one, its digests and its chain are checked, not its seals.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sim.cli._terminal import Out
from sim.errors import TamperError
from sim.store import Verification, kept_key, kept_key_path, open_reader

__all__ = ["register_verify", "sealed_chain"]


def register_verify(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    verify = commands.add_parser(
        "verify", help="check the store against its seals: the chain over the audit and inputs, every sealed row",
        description="Check every record, input and world change against the chain of commits and its seals, "
        "every row a resume reads against its seal and every item against its digest, with the run key kept "
        "beside the store (RUN.db.key). Exit 1 naming the first tick and record, input or row that does not "
        "verify, or when the store is sealed with a run key that is not there.",
    )
    verify.add_argument("--db", required=True, help="store file (opened read-only)")
    verify.set_defaults(func=verify_command)


def _verify(db: Path) -> Verification:
    """The store checked against its seals, with the run key kept beside it when there is one."""
    with open_reader(db) as reader:
        return reader.verify(kept_key(db), kept_key_path(db).name)


def _counted(n: int, noun: str) -> str:
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


def _verified(db: Path, verified: Verification) -> str:
    """What `verify` says of a store that verifies (as far as the key at hand lets it)."""
    through = "" if verified.last_tick is None else f" through tick {verified.last_tick}"
    rotated = f" ({verified.rotated:,} rotated out)" if verified.rotated else ""
    held = (f"{_counted(verified.commits, 'commit')}{through}: {_counted(verified.records, 'record')}{rotated}, "
            f"{_counted(verified.inputs, 'input')}, {_counted(verified.world_changes, 'world change')}")
    if not verified.sealed:
        return (f"{db}: not verified: its digests and its chain hold ({held}), but it is sealed with a run key that "
                f"is not beside it ({kept_key_path(db).name}): put it there to check the seals")
    how = (f"sealed with the run key ({kept_key_path(db).name})" if verified.keyed else
           "sealed without a run key: digests, which catch an accidental edit, not a forger who computes them again")
    return (f"{db}: verified: {held}; {_counted(verified.rows, 'sealed row')} and "
            f"{_counted(verified.items, 'item')}; {how}")


def verify_command(args: argparse.Namespace) -> int:
    out, db = Out(), Path(args.db)
    try:
        verified = _verify(db)
    except TamperError as exc:
        out.record((str(exc), "bold red"))
        return 1
    out.record((_verified(db, verified), "green" if verified.sealed else "bold yellow"))
    if not verified.sealed:
        return 1
    # a store put back to an earlier copy of itself verifies too: the head kept elsewhere tells
    out.record(f"head of the chain: {verified.head} (kept elsewhere, it tells a store put back to an earlier copy)")
    return 0


def sealed_chain(db: Path, out: Out) -> bool:
    """Whether the store verifies (as far as the key at hand lets it); what breaks it, on `out`."""
    try:
        verified = _verify(db)
    except TamperError as exc:
        out.record((str(exc), "bold red"))
        return False
    if not verified.sealed:
        Out(sys.stderr).record(f"the seals are not checked, only the digests: the run key is not beside the store "
                               f"({kept_key_path(db).name})")
    return True
