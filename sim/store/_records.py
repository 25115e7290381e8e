"""How schema 2 stores things once: content-addressed items and packed audit records.

Pure (no I/O): the store and the reader call these and do the SQL.

An *item* is the msgpack encoding of one state item (a fact, a world-state entry, an
episode, a belief, a dialogue line), of a system prompt, of a config, or of a compression
dictionary. Its key is the first 8 bytes of its BLAKE2b-128 digest (a signed 64-bit
integer, SQLite's rowid); the other 8 bytes are a check the writer compares, and a
trigger refuses a different body under an existing key. So the same episode heard by a
hundred NPCs, or repeated in an NPC's next fifty audit records, is stored once.

A *packed record* is an `AuditRecord` without copies: msgpack `[counts, keys, compressed]`
where `keys` are the item keys of its state and config in a fixed layout (`_LISTS`, whose
lengths `counts` gives), and `compressed` is the rest of the record (less the fields the `audit` table holds as
columns) as msgpack, deflated with a preset dictionary made of the template item and the
referenced items' bodies. The prompt is kept (it is what the model saw, and it lets a
drift show as a diff); it compresses well against the items it was rendered from.
zlib was chosen by measurement over zstd (docs/store.md). Every field of `AuditRecord`,
including fields added later, rides along in the remainder, and unpacking rebuilds the
exact msgpack encoding of the record before decoding it with the record's own decoder.
"""

from __future__ import annotations

import hashlib
import struct
import zlib
from collections.abc import Mapping
from typing import Any, NamedTuple

import msgspec

from sim.audit import AuditRecord, decode_record
from sim.errors import StoreError

__all__ = ["COLUMNS", "Item", "RecordPacker", "item", "record_keys", "unpack_record"]

_ENCODER = msgspec.msgpack.Encoder()
_ZDICT_SIZE = 32_768  # deflate's window: only the last 32 KiB of a preset dictionary count
_LEVEL = 6

COLUMNS = ("id", "run_id", "agent_id", "tick", "backend", "model", "fallback", "line")
"""AuditRecord fields the `audit` table holds as columns; a packed record leaves them out."""

# The state fields stored as items, in the order of the refs (after the template key);
# the config's key comes last.
_LISTS = ("canonical_facts", "world_state", "episodic", "beliefs", "dialogue")


class Item(NamedTuple):
    """One content-addressed body: `key` addresses it, `check` guards against collisions."""

    key: int
    check: int
    body: bytes


_KEY_AND_CHECK = struct.Struct(">qq")


def item(body: bytes) -> Item:
    key, check = _KEY_AND_CHECK.unpack(hashlib.blake2b(body, digest_size=16).digest())
    return Item(key, check, body)


def _encode_item(value: Any) -> Item:
    return item(_ENCODER.encode(value))


def _zdict(bodies: list[bytes]) -> bytes:
    return b"".join(bodies)[-_ZDICT_SIZE:]


class RecordPacker:
    """Packs records; the first record packed becomes the compression template.

    The template is itself an item, referenced by every record packed with it, so a
    reader needs nothing but the items table to unpack.
    """

    def __init__(self) -> None:
        self._template: Item | None = None

    def pack(self, record: AuditRecord) -> tuple[bytes, list[Item]]:
        """The packed blob and every item it references (template first)."""
        state = record.state
        lists = [[_encode_item(x) for x in getattr(state, name)] for name in _LISTS]
        referenced = [
            _encode_item(state.system_prompt),
            *(i for group in lists for i in group),
            _encode_item(record.config),
        ]
        fields = msgspec.structs.asdict(record)
        for name in (*COLUMNS, "config"):
            del fields[name]
        rest_of_state = msgspec.structs.asdict(state)
        for name in ("system_prompt", *_LISTS):
            del rest_of_state[name]
        fields["state"] = rest_of_state
        payload = _ENCODER.encode(fields)
        if self._template is None:
            self._template = item(payload)
        items = [self._template, *referenced]
        compressor = zlib.compressobj(_LEVEL, zdict=_zdict([i.body for i in items]))
        compressed = compressor.compress(payload) + compressor.flush()
        keys = struct.pack(f">{len(items)}q", *(i.key for i in items))
        return _ENCODER.encode(([len(group) for group in lists], keys, compressed)), items


# A packed record: the length of each of `_LISTS`, the item keys (template, system prompt,
# the lists' items in order, config) as big-endian int64s, the compressed remainder.
_BLOB_DECODER = msgspec.msgpack.Decoder(tuple[list[int], bytes, bytes])


def _unpack_blob(blob: bytes, where: str) -> tuple[list[int], tuple[int, ...], bytes]:
    try:
        counts, keys, compressed = _BLOB_DECODER.decode(blob)
    except msgspec.DecodeError as exc:
        raise StoreError(f"{where}: cannot decode the stored record: {exc}") from exc
    if len(keys) % 8 or len(counts) != len(_LISTS) or sum(counts) + 3 != len(keys) // 8 or min(counts) < 0:
        raise StoreError(f"{where}: cannot decode the stored record: its item keys do not match its layout")
    return counts, struct.unpack(f">{len(keys) // 8}q", keys), compressed


def record_keys(blob: bytes, *, where: str = "audit record") -> tuple[int, ...]:
    """The item keys a packed record references (to fetch their bodies first)."""
    return _unpack_blob(blob, where)[1]


def unpack_record(
    blob: bytes, columns: Mapping[str, Any], bodies: Mapping[int, bytes], *, where: str = "audit record"
) -> AuditRecord:
    """Rebuild the record from its packed blob, its columns and the referenced items' bodies."""
    counts, keys, compressed = _unpack_blob(blob, where)
    try:
        referenced = [bodies[k] for k in keys]
    except KeyError as exc:
        raise StoreError(f"{where}: references item {exc.args[0]} that is not in the store") from exc
    try:
        decompressor = zlib.decompressobj(zdict=_zdict(referenced))
        fields = msgspec.msgpack.decode(decompressor.decompress(compressed) + decompressor.flush())
    except (zlib.error, msgspec.DecodeError) as exc:
        raise StoreError(f"{where}: cannot decompress the stored record: {exc}") from exc
    if not isinstance(fields, dict) or not isinstance(fields.get("state"), dict):
        raise StoreError(f"{where}: the stored record is not a packed audit record")
    state = fields["state"]
    state["system_prompt"] = msgspec.Raw(referenced[1])
    at = 2
    for name, count in zip(_LISTS, counts, strict=True):
        state[name] = [msgspec.Raw(b) for b in referenced[at : at + count]]
        at += count
    fields["config"] = msgspec.Raw(referenced[at])
    fields.update(columns)
    return decode_record(_ENCODER.encode(fields), where=where)
