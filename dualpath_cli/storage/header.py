"""The on-disk block format: a 4 KiB header, then the payload padded to 4 KiB.

Why 4 KiB: the payload must start and end on an O_DIRECT boundary so one ``preadv`` of two
aligned buffers (header, payload) reads a whole block with no bounce copy. The header is
self-describing (shape, layout, dtype, codec, namespace) so any reader can decode a block
without knowing who wrote it, and it carries two xxh3-64 checksums: one of the payload and
one of the header itself, so a flipped byte anywhere is detected.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import xxhash

from dualpath_cli.core.layout import KEY_BYTES, LAYOUTS, BlockKey, BlockShape
from dualpath_cli.storage.errors import ChecksumMismatch, ForeignHeader, TruncatedBlock

__all__ = [
    "HEADER_SIZE",
    "ALIGN",
    "MAGIC",
    "VERSION",
    "BlockHeader",
    "pack_header",
    "unpack_header",
    "padded",
    "file_nbytes",
    "payload_checksum",
    "verify_payload",
]

HEADER_SIZE = 4096
ALIGN = 4096
MAGIC = b"DPKVBLK\x00"
VERSION = 1
_CHECKSUM_XXH3_64 = 1
_LABEL_BYTES = 192
_FIELDS = struct.Struct(f"<8sHH{KEY_BYTES}sBB2xIIIQQQ8s16s{_LABEL_BYTES}s")
_HCHK = struct.Struct("<Q")


def padded(nbytes: int) -> int:
    """``nbytes`` rounded up to the O_DIRECT alignment."""
    return -(-nbytes // ALIGN) * ALIGN


def file_nbytes(payload_len: int) -> int:
    """Size of a block file holding ``payload_len`` payload bytes."""
    return HEADER_SIZE + padded(payload_len)


def payload_checksum(payload: object) -> int:
    """xxh3-64 of the payload bytes (releases the GIL; ~80 GB/s on cached data)."""
    return int(xxhash.xxh3_64_intdigest(payload))  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class BlockHeader:
    """Everything needed to trust and decode a stored Full Block."""

    key: BlockKey
    shape: BlockShape
    layout: str
    dtype: str          # logical element dtype: fp16, bf16, fp32
    codec: str          # how the payload encodes it (see storage.codecs)
    namespace: str      # Namespace.label of the writer
    payload_len: int
    checksum: int
    created_ns: int = 0

    @property
    def file_nbytes(self) -> int:
        """Size of the block file on disk."""
        return file_nbytes(self.payload_len)


def pack_header(h: BlockHeader) -> bytes:
    """Serialise ``h`` into exactly :data:`HEADER_SIZE` bytes."""
    label = h.namespace.encode()
    if len(label) > _LABEL_BYTES:
        raise ValueError(f"namespace label longer than {_LABEL_BYTES} bytes: {h.namespace!r}")
    body = _FIELDS.pack(
        MAGIC, VERSION, 0, h.key.raw, LAYOUTS.index(h.layout), _CHECKSUM_XXH3_64,
        h.shape.n_layers, h.shape.block_tokens, h.shape.bytes_per_token_layer,
        h.payload_len, h.checksum, h.created_ns, h.dtype.encode(), h.codec.encode(), label,
    )
    body += _HCHK.pack(xxhash.xxh3_64_intdigest(body))
    return body + b"\x00" * (HEADER_SIZE - len(body))


def unpack_header(buf: object, path: str, expected_key: BlockKey | None = None) -> BlockHeader:
    """Parse and check a header; raises a typed :class:`CorruptBlockError` subclass."""
    raw = buf if isinstance(buf, memoryview) else memoryview(buf)  # type: ignore[arg-type]
    if raw.nbytes < _FIELDS.size + _HCHK.size:
        raise TruncatedBlock(path, f"header needs {_FIELDS.size + _HCHK.size} bytes, "
                                   f"file has {raw.nbytes}")
    body = raw[:_FIELDS.size]
    fields = _FIELDS.unpack(body)
    (magic, version, _flags, key_raw, layout_id, chk_algo, n_layers, block_tokens, width,
     payload_len, checksum, created_ns, dtype, codec, label) = fields
    if magic != MAGIC:
        raise ForeignHeader(path, f"bad magic {bytes(magic)!r}, not a dualpath block")
    if version != VERSION:
        raise ForeignHeader(path, f"unsupported block format version {version}")
    (stored,) = _HCHK.unpack_from(raw, _FIELDS.size)
    if xxhash.xxh3_64_intdigest(body) != stored:
        raise ChecksumMismatch(path, "header checksum mismatch")
    if chk_algo != _CHECKSUM_XXH3_64 or layout_id >= len(LAYOUTS):
        raise ForeignHeader(path, "unknown checksum algorithm or layout id")
    key = BlockKey(bytes(key_raw))
    if expected_key is not None and key != expected_key:
        raise ForeignHeader(path, f"header belongs to block {key.hex}, not {expected_key.hex}")
    try:
        shape = BlockShape(n_layers, block_tokens, width)
    except ValueError as err:
        raise ForeignHeader(path, str(err)) from None
    return BlockHeader(
        key=key, shape=shape, layout=LAYOUTS[layout_id],
        dtype=dtype.rstrip(b"\x00").decode(errors="replace"),
        codec=codec.rstrip(b"\x00").decode(errors="replace"),
        namespace=label.rstrip(b"\x00").decode(errors="replace"),
        payload_len=payload_len, checksum=checksum, created_ns=created_ns,
    )


def verify_payload(h: BlockHeader, payload: object, nread: int, path: str) -> None:
    """Check that the payload is complete and matches its checksum."""
    if nread < h.payload_len:
        raise TruncatedBlock(path, f"payload has {nread} of {h.payload_len} bytes")
    if payload_checksum(payload) != h.checksum:
        raise ChecksumMismatch(path, "payload checksum mismatch")
