"""Encoding a Full Block for storage, and the read-side handle the loader returns.

:func:`encode_block` turns a logical Full Block (numpy array in the namespace's layout and
dtype) into a header plus payload. :class:`LoadedBlock` wraps a read buffer: ``array()`` is
a zero-copy view for raw codecs and ``layer(i)`` a zero-copy Layer Block, so layerwise
streaming reads straight out of the DRAM buffer the store wrote into.
"""

from __future__ import annotations

import time

import numpy as np

from dualpath_cli.core.layout import BlockKey, Namespace, full_block_shape, layer_view
from dualpath_cli.storage.buffers import BlockBuffer
from dualpath_cli.storage.codecs import dtype_name, get_codec, numpy_dtype
from dualpath_cli.storage.errors import StorageUsageError
from dualpath_cli.storage.header import BlockHeader, payload_checksum

__all__ = ["encode_block", "LoadedBlock"]


def encode_block(key: BlockKey, block: np.ndarray,
                 namespace: Namespace) -> tuple[BlockHeader, np.ndarray]:
    """Header and payload for ``block`` stored under ``key`` in ``namespace``.

    ``block`` must have the namespace's Full Block shape in its layout; its dtype is the
    logical KV dtype (fp16, bf16 or fp32; raw codecs require the codec's own dtype).
    """
    codec = get_codec(namespace.codec)
    dtype = dtype_name(block.dtype)
    want = full_block_shape(namespace.shape, namespace.layout, numpy_dtype(dtype).itemsize)
    if block.shape != want:
        raise StorageUsageError(f"block shape {block.shape} does not match namespace "
                                f"{namespace.label} ({namespace.layout} expects {want})")
    payload = codec.encode(block, namespace.layout)
    header = BlockHeader(
        key=key, shape=namespace.shape, layout=namespace.layout, dtype=dtype,
        codec=codec.name, namespace=namespace.label, payload_len=int(payload.nbytes),
        checksum=payload_checksum(payload), created_ns=time.time_ns(),
    )
    return header, payload


class LoadedBlock:
    """A verified Full Block held in a (shared, reference-counted) read buffer.

    Call :meth:`release` (or use ``with``) when done so the buffer can be reused; the
    arrays returned before release must not be used after it.
    """

    __slots__ = ("key", "header", "buffer", "tier", "_released")

    def __init__(self, key: BlockKey, header: BlockHeader, buffer: BlockBuffer,
                 tier: str = "store") -> None:
        self.key = key
        self.header = header
        self.buffer = buffer
        self.tier = tier
        self._released = False

    @property
    def payload(self) -> np.ndarray:
        """The encoded payload bytes (read-only view)."""
        view = self.buffer.payload(self.header.payload_len)
        view.flags.writeable = False
        return view

    @property
    def nbytes(self) -> int:
        """Bytes of the block file that was read."""
        return self.header.file_nbytes

    def array(self) -> np.ndarray:
        """The Full Block in its layout and logical dtype (zero-copy for raw codecs)."""
        h = self.header
        return get_codec(h.codec).decode(self.payload, h.shape, h.layout, h.dtype)

    def layer(self, index: int) -> np.ndarray:
        """Layer Block ``index`` as a view ``[1, tokens, width]``."""
        return layer_view(self.array(), index, self.header.layout)

    def release(self) -> None:
        """Give the buffer reference back (idempotent)."""
        if not self._released:
            self._released = True
            self.buffer.release()

    def __enter__(self) -> LoadedBlock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __repr__(self) -> str:
        return f"LoadedBlock({self.key.hex[:12]}, {self.header.namespace}, tier={self.tier})"
