"""The digest of an audit export: ids, prompts (by their SHA-256) and lines, every attempt's
prompt and raw reply too, in id order.

    npcsim audit export --db run.db --out run.jsonl
    python benchmarks/audit_digest.py run.jsonl other.jsonl

Two runs whose digests match gave the same prompts and the same lines under the same ids:
how a change to the engine is shown to leave a seeded run as it was.
"""

from __future__ import annotations

import hashlib
import json
import sys


def digest(path: str) -> tuple[int, str]:
    """(records, SHA-256 of their ids, prompt digests, lines and attempts, in id order)."""
    rows = []
    with open(path, encoding="utf-8") as lines:
        for text in lines:
            record = json.loads(text)
            attempts = [(a.get("prompt"), a.get("raw_response")) for a in record.get("attempts") or []]
            rows.append((record["id"], record["prompt_sha256"], record["line"], attempts))
    rows.sort(key=lambda row: row[0])
    h = hashlib.sha256()
    for row in rows:
        h.update(json.dumps(row, ensure_ascii=False).encode())
        h.update(b"\n")
    return len(rows), h.hexdigest()


if __name__ == "__main__":
    for name in sys.argv[1:]:
        count, hexdigest = digest(name)
        print(f"{name}: {count} records, sha256 {hexdigest}")
