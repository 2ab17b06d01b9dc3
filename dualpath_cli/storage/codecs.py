"""Payload codecs: raw fp16/bf16/fp32 (zero-copy) and FP8 e4m3 with per-block or per-layer
scales (half the bytes of fp16 on the storage NIC, at a bounded reconstruction error).

Raw codecs are views both ways: encoding reinterprets the array's bytes, decoding
reinterprets the read buffer, so a block read by the loader is never copied. FP8 stores the
e4m3 values first (layer-major like the data) and the float32 scales after them.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np

from dualpath_cli.core.layout import BlockShape, full_block_shape
from dualpath_cli.errors import pick
from dualpath_cli.storage.errors import StorageUsageError

__all__ = [
    "DTYPES",
    "CODECS",
    "Codec",
    "CodecReport",
    "get_codec",
    "numpy_dtype",
    "dtype_name",
    "codec_report",
]



@cache
def _ml_dtypes() -> Any:
    """ml_dtypes (bf16, e4m3), imported on first use: importing it takes about half a second,
    which every ``dualpath`` command that only names a codec would otherwise pay."""
    import ml_dtypes

    return ml_dtypes


class _Dtypes(Mapping[str, np.dtype]):
    """The logical dtype names and their numpy dtypes; the names are known without
    ml_dtypes, the bf16 dtype is built on first lookup."""

    _NAMES = ("fp16", "bf16", "fp32")

    def __init__(self) -> None:
        self._built: dict[str, np.dtype] = {"fp16": np.dtype(np.float16),
                                            "fp32": np.dtype(np.float32)}

    def __getitem__(self, name: str) -> np.dtype:
        try:
            return self._built[name]
        except KeyError:
            if name != "bf16":
                raise
        self._built[name] = np.dtype(_ml_dtypes().bfloat16)
        return self._built[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._NAMES)

    def __len__(self) -> int:
        return len(self._NAMES)

    def __repr__(self) -> str:
        return f"DTYPES({dict(self.items())!r})"


DTYPES: Mapping[str, np.dtype] = _Dtypes()
CODECS: tuple[str, ...] = ("fp16", "bf16", "fp32", "fp8_e4m3", "fp8_e4m3_layer")


@cache
def _e4m3() -> tuple[np.dtype, float]:
    """The FP8 e4m3 dtype and its largest finite value (448)."""
    mld = _ml_dtypes()
    return np.dtype(mld.float8_e4m3fn), float(mld.finfo(mld.float8_e4m3fn).max)


def numpy_dtype(name: str) -> np.dtype:
    """The numpy dtype of a logical dtype name; a usage error naming the accepted ones."""
    try:
        return DTYPES[name]
    except KeyError:
        raise StorageUsageError(f"unknown KV dtype {name!r}; expected one of "
                                f"{', '.join(DTYPES)}") from None


def dtype_name(dtype: np.dtype) -> str:
    """The logical name of a numpy dtype (inverse of :func:`numpy_dtype`)."""
    for name, dt in DTYPES.items():
        if dt == dtype:
            return name
    raise StorageUsageError(f"unsupported KV dtype {dtype}; expected one of {', '.join(DTYPES)}")


@dataclass(frozen=True, slots=True)
class Codec:
    """One payload encoding.

    Args:
        name: one of :data:`CODECS`.
        scale: ``None`` (raw), ``"block"`` or ``"layer"`` (FP8 scale granularity).
    """

    name: str
    scale: str | None = None

    @property
    def lossless(self) -> bool:
        """True for the raw codecs."""
        return self.scale is None

    def n_scales(self, shape: BlockShape) -> int:
        """Number of float32 scales stored after the values."""
        return 0 if self.scale is None else (1 if self.scale == "block" else shape.n_layers)

    def encoded_nbytes(self, shape: BlockShape, dtype: str) -> int:
        """Payload bytes of one encoded Full Block of logical ``dtype``."""
        if self.scale is None:
            return shape.full_nbytes
        elements = shape.full_nbytes // numpy_dtype(dtype).itemsize
        return elements + 4 * self.n_scales(shape)

    def encode(self, block: np.ndarray, layout: str) -> np.ndarray:
        """Encode a Full Block into a flat uint8 payload (a view for raw codecs)."""
        if self.scale is None:
            want = numpy_dtype(self.name)
            if block.dtype != want:
                raise StorageUsageError(f"codec {self.name} stores {self.name} blocks, "
                                        f"got dtype {block.dtype}")
            return np.ascontiguousarray(block).reshape(-1).view(np.uint8)
        dtype_name(block.dtype)  # validates the source dtype
        e4m3, e4m3_max = _e4m3()
        data = block.astype(np.float32)
        lm = data if layout == "layer_major" else data.transpose(1, 0, 2)
        if self.scale == "block":
            amax = np.array([np.abs(lm).max(initial=0.0)], dtype=np.float32)
            scales = np.where(amax > 0, amax / e4m3_max, 1.0).astype(np.float32)
            values = (data / scales[0]).astype(e4m3)
        else:
            amax = np.abs(lm).reshape(lm.shape[0], -1).max(axis=1, initial=0.0)
            scales = np.where(amax > 0, amax / e4m3_max, 1.0).astype(np.float32)
            per = scales[:, None, None] if layout == "layer_major" else scales[None, :, None]
            values = (data / per).astype(e4m3)
        return np.concatenate([values.reshape(-1).view(np.uint8), scales.view(np.uint8)])

    def decode(self, payload: np.ndarray, shape: BlockShape, layout: str,
               dtype: str) -> np.ndarray:
        """Decode a flat uint8 payload into a Full Block (a view for raw codecs)."""
        dt = numpy_dtype(dtype)
        dims = full_block_shape(shape, layout, dt.itemsize)
        if self.scale is None:
            return payload[:shape.full_nbytes].view(dt).reshape(dims)
        n = shape.full_nbytes // dt.itemsize
        values = payload[:n].view(_e4m3()[0]).reshape(dims).astype(np.float32)
        scales = payload[n:n + 4 * self.n_scales(shape)].view(np.float32)
        if self.scale == "block":
            values *= scales[0]
        elif layout == "layer_major":
            values *= scales[:, None, None]
        else:
            values *= scales[None, :, None]
        return values.astype(dt)


_REGISTRY: dict[str, Codec] = {
    "fp16": Codec("fp16"),
    "bf16": Codec("bf16"),
    "fp32": Codec("fp32"),
    "fp8_e4m3": Codec("fp8_e4m3", "block"),
    "fp8_e4m3_layer": Codec("fp8_e4m3_layer", "layer"),
}


def get_codec(name: str) -> Codec:
    """The codec called ``name``; a usage error listing the accepted names."""
    return pick(_REGISTRY, name, "codec", StorageUsageError)


@dataclass(frozen=True, slots=True)
class CodecReport:
    """What a codec saves and what it costs in accuracy, for one block."""

    codec: str
    raw_bytes: int
    encoded_bytes: int
    max_abs_error: float
    rel_rms_error: float

    @property
    def saved_bytes(self) -> int:
        """Bytes not moved thanks to the codec."""
        return self.raw_bytes - self.encoded_bytes

    @property
    def saved_ratio(self) -> float:
        """Fraction of raw bytes saved (0 for raw codecs)."""
        return self.saved_bytes / self.raw_bytes if self.raw_bytes else 0.0


def codec_report(block: np.ndarray, codec: Codec, layout: str, shape: BlockShape) -> CodecReport:
    """Encode and decode ``block`` and measure bytes saved and reconstruction error."""
    dtype = dtype_name(block.dtype)
    payload = codec.encode(block, layout)
    back = codec.decode(payload, shape, layout, dtype).astype(np.float64)
    ref = block.astype(np.float64)
    diff = back - ref
    rms_ref = float(np.sqrt(np.mean(ref * ref))) or 1.0
    return CodecReport(codec.name, block.nbytes, int(payload.nbytes),
                       float(np.abs(diff).max(initial=0.0)),
                       float(np.sqrt(np.mean(diff * diff))) / rms_ref)
