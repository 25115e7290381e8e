"""How the store keeps things once: content-addressed items and packed audit records.

Pure (no I/O): the store and the reader call these and do the SQL.

An *item* is the msgpack encoding of one state item (a fact, a world-state entry, an
episode, a belief, a dialogue line), of a system prompt, of a config, or of a compression
dictionary. Its key is the first 8 bytes of its BLAKE2b-128 digest (a signed 64-bit
integer, SQLite's rowid); the other 8 bytes are a check the writer compares, and a
trigger refuses a different body under an existing key. So the same episode heard by a
hundred NPCs, or repeated in an NPC's next fifty audit records, is stored once.

A *packed record* is an `AuditRecord` without copies: msgpack `[counts, keys, top_length,
compressed]`. `keys` are the item keys of the compression template, its state (system
prompt, then the lists of `_LISTS`, whose lengths `counts` gives) and its config;
`compressed` holds two msgpack maps, the record's other fields (less the ones the `audit`
table holds as columns; the first `top_length` bytes) and the state's other fields,
deflated with a preset dictionary made of the template and the referenced bodies. The
attempts' prompts are kept (what the model saw, and a drift shows as a diff); they
compress well against the items they were rendered from. zlib was chosen by measurement
over zstd (docs/store.md). Every field of `AuditRecord`, including fields added later,
rides along, and unpacking assembles the exact msgpack of the record from these bytes
and decodes it once, with the record's own decoder.
"""

from __future__ import annotations

import hashlib
import operator
import struct
import zlib
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import msgspec

from sim.audit import AuditRecord, decode_record
from sim.errors import StoreError

__all__ = [
    "COLUMNS",
    "Item",
    "PackedRecord",
    "RecordPacker",
    "item",
    "pack_keys",
    "read_packed",
    "unpack_keys",
    "unpack_record",
]

_ENCODER = msgspec.msgpack.Encoder()
_ZDICT_SIZE = 32_768  # deflate's window: only the last 32 KiB of a preset dictionary count
_KNOWN = 1 << 16  # state parts whose items a packer remembers
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


def pack_keys(keys: Sequence[int]) -> bytes:
    """Item keys as big-endian int64s: how heard rows and packed records list them."""
    return struct.pack(f">{len(keys)}q", *keys)


def unpack_keys(blob: bytes) -> tuple[int, ...]:
    return struct.unpack(f">{len(blob) // 8}q", blob)


def _encode_item(value: Any) -> Item:
    return item(_ENCODER.encode(value))


def _zdict(bodies: Sequence[bytes]) -> bytes:
    return b"".join(bodies)[-_ZDICT_SIZE:]


class RecordPacker:
    """Packs records; the first record packed becomes the compression template.

    The template is itself an item, referenced by every record packed with it, so a
    reader needs nothing but the items table to unpack.
    """

    def __init__(self) -> None:
        self._template: Item | None = None
        self._known: dict[Any, Item] = {}

    def _item(self, value: Any, fresh: list[Item]) -> Item:
        """The item of a state's part, remembered: neighbouring records share most of theirs
        (the same facts, the episodes a whole place heard), and state parts are frozen, so an
        equal value has an equal body. One made here is added to `fresh`. Past `_KNOWN`
        values it forgets them all."""
        found = self._known.get(value)
        if found is None:
            if len(self._known) >= _KNOWN:
                self._known.clear()
            found = self._known[value] = _encode_item(value)
            fresh.append(found)
        return found

    def pack(self, record: AuditRecord) -> tuple[bytes, list[Item]]:
        """The packed blob and the items it references that this packer has not handed out
        before (every item a record references was handed out with it or an earlier one)."""
        state = record.state
        fresh: list[Item] = []

        def known(value: Any) -> Item:
            return self._item(value, fresh)

        lists = [[known(x) for x in getattr(state, name)] for name in _LISTS]
        referenced = [known(state.system_prompt), *(i for group in lists for i in group), known(record.config)]
        fields = msgspec.structs.asdict(record)
        for name in (*COLUMNS, "config", "state"):
            del fields[name]
        rest_of_state = msgspec.structs.asdict(state)
        for name in ("system_prompt", *_LISTS):
            del rest_of_state[name]
        top = _ENCODER.encode(fields)
        payload = top + _ENCODER.encode(rest_of_state)
        if self._template is None:
            self._template = item(payload)
            fresh.insert(0, self._template)
        items = [self._template, *referenced]
        compressor = zlib.compressobj(_LEVEL, zdict=_zdict([i.body for i in items]))
        compressed = compressor.compress(payload) + compressor.flush()
        keys = pack_keys([i.key for i in items])
        return _ENCODER.encode(([len(group) for group in lists], keys, len(top), compressed)), fresh


# A packed record: the length of each of `_LISTS`; the item keys (template, system prompt,
# the lists' items in order, config) as big-endian int64s; the length of the first of the
# two msgpack maps (the record's other fields, the state's other fields) compressed last.
_BLOB_DECODER = msgspec.msgpack.Decoder(tuple[list[int], bytes, int, bytes])


class PackedRecord(NamedTuple):
    """A packed record's parts, as stored; `keys` are the items to fetch before unpacking."""

    counts: list[int]
    keys: tuple[int, ...]
    top_length: int
    compressed: bytes


def read_packed(blob: bytes, *, where: str = "audit record") -> PackedRecord:
    try:
        counts, keys, top_length, compressed = _BLOB_DECODER.decode(blob)
    except msgspec.DecodeError as exc:
        raise StoreError(f"{where}: cannot decode the stored record: {exc}") from exc
    if len(keys) % 8 or len(counts) != len(_LISTS) or sum(counts) + 3 != len(keys) // 8 or min(counts) < 0:
        raise StoreError(f"{where}: cannot decode the stored record: its item keys do not match its layout")
    return PackedRecord(counts, unpack_keys(keys), top_length, compressed)


def _map_entries(data: bytes, where: str) -> tuple[int, bytes]:
    """A msgpack map's entry count and its entries' bytes (the header stripped)."""
    first = data[0] if data else 0
    if 0x80 <= first <= 0x8F:
        return first & 0x0F, data[1:]
    if first == 0xDE:
        return int.from_bytes(data[1:3], "big"), data[3:]
    if first == 0xDF:
        return int.from_bytes(data[1:5], "big"), data[5:]
    raise StoreError(f"{where}: the stored record is not a packed audit record")


def _header(n: int, fix: int, short: bytes, long: bytes) -> bytes:
    if n < 16:
        return bytes([fix | n])
    return short + n.to_bytes(2, "big") if n < 65_536 else long + n.to_bytes(4, "big")


_CONFIG_KEY, _STATE_KEY, _PROMPT_KEY = (_ENCODER.encode(k) for k in ("config", "state", "system_prompt"))
_LIST_KEYS = tuple(_ENCODER.encode(name) for name in _LISTS)


def unpack_record(
    packed: PackedRecord, columns: Mapping[str, Any], bodies: Mapping[int, bytes], *, where: str = "audit record"
) -> AuditRecord:
    """Rebuild the record from its packed blob, its columns and the referenced items' bodies.

    The record's msgpack is assembled from bytes (the stored maps' entries, the columns,
    the items' bodies) and decoded once, with the record's own decoder.
    """
    try:
        referenced: tuple[bytes, ...] = operator.itemgetter(*packed.keys)(bodies)
    except KeyError as exc:
        raise StoreError(f"{where}: references item {exc.args[0]} that is not in the store") from exc
    try:
        decompressor = zlib.decompressobj(zdict=_zdict(referenced))
        payload = decompressor.decompress(packed.compressed) + decompressor.flush()
    except zlib.error as exc:
        raise StoreError(f"{where}: cannot decompress the stored record: {exc}") from exc
    top_count, top = _map_entries(payload[: packed.top_length], where)
    state_count, state = _map_entries(payload[packed.top_length :], where)
    column_count, column_entries = _map_entries(_ENCODER.encode(columns), where)
    parts = [
        _header(top_count + column_count + 2, 0x80, b"\xde", b"\xdf"),
        top,
        column_entries,
        _CONFIG_KEY,
        referenced[-1],
        _STATE_KEY,
        _header(state_count + 1 + len(_LISTS), 0x80, b"\xde", b"\xdf"),
        state,
        _PROMPT_KEY,
        referenced[1],
    ]
    at = 2
    for key, count in zip(_LIST_KEYS, packed.counts, strict=True):
        parts += [key, _header(count, 0x90, b"\xdc", b"\xdd"), *referenced[at : at + count]]
        at += count
    return decode_record(b"".join(parts), where=where)
