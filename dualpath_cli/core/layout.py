"""KV block layouts and prefix-hash-chain keys (paper 4.1 and Appendix A.5). Pure.

A **Full Block** holds ``block_tokens`` tokens of KV for every layer; a **Layer Block** holds
one layer. In the ``layer_major`` layout a Full Block is ``[n_layers, block_tokens, width]``,
so each layer's slice is one contiguous Layer Block and concatenating ``n_layers`` Layer
Blocks *is* the Full Block: storage moves Full Blocks, layerwise streaming moves Layer
Blocks, and nothing is ever converted. ``token_major`` (``[block_tokens, n_layers, width]``,
the usual paged-attention order) is supported for interop; its layer slices are strided
views, which is exactly why DualPath prefers layer-major.

Keys form a **prefix hash chain**: ``key_i = H(key_{i-1}, tokens of block i, namespace)``
where the namespace names the model and layout. Two prompts share key ``i`` only if they
share the whole prefix up to block ``i`` — the paper's trie, one node per Full Block — so
the longest cached prefix is found by walking keys until the first miss.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import struct
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

__all__ = [
    "first_difference",
    "token_ids",
    "LAYOUTS",
    "KEY_BYTES",
    "BlockShape",
    "BlockKey",
    "Namespace",
    "full_block_shape",
    "layer_view",
    "layer_views",
    "assemble_full_block",
    "to_layer_major",
    "block_key",
    "prefix_keys",
    "chain_keys",
    "chain_digests",
    "DigestKeys",
    "PresentPrefixCache",
    "PrefixKeyCache",
    "PromptKeys",
    "longest_cached_prefix",
]

LAYOUTS: tuple[str, ...] = ("layer_major", "token_major")
KEY_BYTES = 16  # 128-bit keys: collision odds are negligible at any realistic store size


@dataclass(frozen=True, slots=True)
class BlockShape:
    """Geometry of one Full Block.

    Args:
        n_layers: transformer layers whose KV the block holds.
        block_tokens: tokens per block (64 by default in the paper's runs).
        bytes_per_token_layer: KV bytes of one token in one layer.
    """

    n_layers: int
    block_tokens: int
    bytes_per_token_layer: int

    def __post_init__(self) -> None:
        for name in ("n_layers", "block_tokens", "bytes_per_token_layer"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"block shape: {name} must be a positive integer, got {value!r}")

    @property
    def layer_nbytes(self) -> int:
        """Bytes of one Layer Block."""
        return self.block_tokens * self.bytes_per_token_layer

    @property
    def full_nbytes(self) -> int:
        """Bytes of one Full Block."""
        return self.n_layers * self.layer_nbytes

    def width(self, itemsize: int) -> int:
        """Elements per token per layer for a dtype of ``itemsize`` bytes."""
        if self.bytes_per_token_layer % itemsize:
            raise ValueError(f"block shape: {self.bytes_per_token_layer} bytes per token-layer "
                             f"is not a multiple of the element size {itemsize}")
        return self.bytes_per_token_layer // itemsize


def full_block_shape(shape: BlockShape, layout: str, itemsize: int = 1) -> tuple[int, int, int]:
    """Array shape of a Full Block in ``layout`` with elements of ``itemsize`` bytes."""
    width = shape.width(itemsize)
    if layout == "layer_major":
        return (shape.n_layers, shape.block_tokens, width)
    if layout == "token_major":
        return (shape.block_tokens, shape.n_layers, width)
    raise ValueError(f"unknown layout {layout!r}; expected one of {', '.join(LAYOUTS)}")


def layer_view(full: np.ndarray, layer: int, layout: str = "layer_major") -> np.ndarray:
    """Layer Block ``layer`` of a Full Block as a zero-copy view ``[1, tokens, width]``.

    Contiguous for ``layer_major``; strided for ``token_major``.
    """
    if full.ndim != 3:
        raise ValueError(f"a Full Block is 3-D, got shape {full.shape}")
    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}; expected one of {', '.join(LAYOUTS)}")
    axis = 0 if layout == "layer_major" else 1
    if not 0 <= layer < full.shape[axis]:
        raise IndexError(f"layer {layer} out of range for a Full Block of shape {full.shape}")
    if layout == "layer_major":
        return full[layer:layer + 1]
    return full[:, layer, :][np.newaxis]


def layer_views(full: np.ndarray, layout: str = "layer_major") -> list[np.ndarray]:
    """All Layer Blocks of a Full Block, in layer order, as views."""
    n_layers = full.shape[0] if layout == "layer_major" else full.shape[1]
    return [layer_view(full, layer, layout) for layer in range(n_layers)]


def assemble_full_block(layers: Sequence[np.ndarray]) -> np.ndarray:
    """Concatenate Layer Blocks ``[1, tokens, width]`` into a layer-major Full Block."""
    if not layers:
        raise ValueError("cannot assemble a Full Block from zero Layer Blocks")
    return np.concatenate(list(layers), axis=0)


def to_layer_major(full: np.ndarray, layout: str) -> np.ndarray:
    """A Full Block in ``layout`` as a layer-major array (a view when already layer-major)."""
    if layout == "layer_major":
        return full
    if layout == "token_major":
        return np.ascontiguousarray(full.transpose(1, 0, 2))
    raise ValueError(f"unknown layout {layout!r}; expected one of {', '.join(LAYOUTS)}")


@dataclass(frozen=True, slots=True)
class Namespace:
    """What makes two blocks with equal tokens incompatible: model, layout, geometry, codec."""

    model: str
    layout: str
    shape: BlockShape
    codec: str = "fp16"

    @property
    def label(self) -> str:
        """Human-readable form, stored in block headers and shown by ``storage inspect``."""
        s = self.shape
        return (f"{self.model}/{self.layout}/{s.n_layers}x{s.block_tokens}x"
                f"{s.bytes_per_token_layer}/{self.codec}")

    @property
    def digest(self) -> bytes:
        """Fixed-size hash of :attr:`label`, mixed into every key."""
        return hashlib.blake2b(self.label.encode(), digest_size=KEY_BYTES).digest()


@dataclass(frozen=True, slots=True, order=True)
class BlockKey:
    """A 128-bit block key; ``hex`` is its file name."""

    raw: bytes

    def __post_init__(self) -> None:
        if len(self.raw) != KEY_BYTES:
            raise ValueError(f"a block key has {KEY_BYTES} bytes, got {len(self.raw)}")

    @property
    def hex(self) -> str:
        """Lower-case hex form (32 characters)."""
        return self.raw.hex()

    @classmethod
    def from_hex(cls, text: str) -> BlockKey:
        """Parse the hex form; ``ValueError`` naming the text when malformed."""
        try:
            raw = bytes.fromhex(text)
        except ValueError:
            raise ValueError(
                f"not a block key: {text!r} (expected {2 * KEY_BYTES} hex digits)") from None
        if len(raw) != KEY_BYTES:
            raise ValueError(f"not a block key: {text!r} (expected {2 * KEY_BYTES} hex digits)")
        return cls(raw)

    def __str__(self) -> str:
        return self.hex


_ROOT = b"\x00" * KEY_BYTES


def block_key(parent: BlockKey | None, tokens: Sequence[int], namespace: Namespace) -> BlockKey:
    """Key of the block holding ``tokens`` after the prefix whose last key is ``parent``."""
    h = hashlib.blake2b(digest_size=KEY_BYTES, person=b"dualpath-kv-v1")
    h.update(namespace.digest)
    h.update(parent.raw if parent is not None else _ROOT)
    h.update(struct.pack("<I", len(tokens)))
    h.update(np.asarray(tokens, dtype="<u4").tobytes())
    return BlockKey(h.digest())


def prefix_keys(tokens: Sequence[int], namespace: Namespace) -> list[BlockKey]:
    """Keys of every *complete* block of ``tokens`` (a trailing partial block has no key)."""
    size = namespace.shape.block_tokens
    keys: list[BlockKey] = []
    parent: BlockKey | None = None
    for start in range(0, len(tokens) - size + 1, size):
        parent = block_key(parent, tokens[start:start + size], namespace)
        keys.append(parent)
    return keys


_U4 = np.dtype("<u4")


def token_ids(tokens: Sequence[int] | np.ndarray) -> np.ndarray:
    """``tokens`` as :class:`PrefixKeyCache` keeps a prompt: uint32, read-only, a new array
    (so no one else holds a writable view of it). A caller that builds a prompt this way
    spares the scheduler a copy of it per turn. Raises ``OverflowError`` for a Python int
    outside uint32 (token ids are under 2**31)."""
    arr = np.array(tokens, dtype=_U4)
    arr.flags.writeable = False
    return arr


def _token_bytes(tokens: Sequence[int] | np.ndarray) -> bytes:
    """The tokens as the hash reads them (little-endian uint32), converted in one call."""
    return np.asarray(tokens).astype("<u4", copy=False).tobytes()


@functools.lru_cache(maxsize=64)
def _seeded_hash(namespace: Namespace) -> Any:
    """A blake2b with the key personalisation and ``namespace``'s digest already in (each
    block's hash starts from a copy of it; the digest is a hash of the label)."""
    base = hashlib.blake2b(digest_size=KEY_BYTES, person=b"dualpath-kv-v1")
    base.update(namespace.digest)
    return base


def chain_digests(tokens: Sequence[int] | np.ndarray, namespace: Namespace,
                  parent: bytes | None = None, first: int = 0, stop: int | None = None,
                  ) -> bytes:
    """The digests of :func:`chain_keys` joined (``KEY_BYTES`` each), with no key objects.

    ``parent``: the digest of block ``first - 1`` (``None`` with ``first == 0``). Why: a
    scheduler keeps each session's keys as joined digests; a key object per block (~200 a
    session) cost its allocation and, kept, the garbage collector's every pass.
    """
    size = namespace.shape.block_tokens
    n = len(tokens) // size if stop is None else min(stop, len(tokens) // size)
    if n <= first:
        return b""
    data = memoryview(_token_bytes(np.asarray(tokens)[first * size:n * size]))
    base = _seeded_hash(namespace)
    length = struct.pack("<I", size)
    step = 4 * size
    raw = parent if parent is not None else _ROOT
    digests: list[bytes] = []
    for off in range(0, (n - first) * step, step):
        h = base.copy()
        h.update(raw + length)
        h.update(data[off:off + step])
        raw = h.digest()
        digests.append(raw)
    return b"".join(digests)


def _key(raw: bytes) -> BlockKey:
    """A key from a digest known to be ``KEY_BYTES`` long (the constructor's length check
    cannot fail, and cost more than the hash)."""
    key = object.__new__(BlockKey)
    object.__setattr__(key, "raw", raw)
    return key


def chain_keys(tokens: Sequence[int] | np.ndarray, namespace: Namespace,
               parent: BlockKey | None = None, first: int = 0, stop: int | None = None,
               ) -> list[BlockKey]:
    """Keys of complete blocks ``first..stop-1`` of ``tokens`` after ``parent`` (the key of
    block ``first - 1``; ``None`` with ``first == 0``): :func:`block_key` chained, with the
    tokens converted once and each block's hash seeded from one copy of the namespace's.

    Why: a scheduler hashes every turn's prompt (12K tokens, ~190 blocks); converting each
    block's slice separately cost more than the hashing. Equal to :func:`prefix_keys`
    (``prefix_keys(t)[first:stop] == chain_keys(t, ns, prefix_keys(t)[first - 1], first,
    stop)``).
    """
    joined = chain_digests(tokens, namespace, parent.raw if parent is not None else None,
                           first, stop)
    return [_key(joined[i:i + KEY_BYTES]) for i in range(0, len(joined), KEY_BYTES)]


class DigestKeys(Sequence[BlockKey]):
    """Block keys held as their digests joined: a key object is made only when one is read.

    Why: :class:`PrefixKeyCache` keeps every session's keys (~200 a session, thousands of
    sessions); as key objects they were most of the scheduler's objects, which every full
    pass of Python's garbage collector walks. Equal to any sequence of the same keys.
    """

    __slots__ = ("raw",)

    def __init__(self, raw: bytes) -> None:
        self.raw = raw

    def __len__(self) -> int:
        return len(self.raw) // KEY_BYTES

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("key index out of range")
        return _key(self.raw[i * KEY_BYTES:(i + 1) * KEY_BYTES])

    def __iter__(self) -> Iterator[BlockKey]:
        raw = self.raw
        return (_key(raw[i:i + KEY_BYTES]) for i in range(0, len(raw), KEY_BYTES))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, DigestKeys):
            return self.raw == other.raw
        if isinstance(other, Sequence) and not isinstance(other, str | bytes):
            return len(other) == len(self) and all(
                isinstance(k, BlockKey) and k.raw == self.raw[i * KEY_BYTES:(i + 1) * KEY_BYTES]
                for i, k in enumerate(other))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # equal to lists, which do not hash

    def __repr__(self) -> str:
        return f"DigestKeys({len(self)} keys)"


def _load_memcmp() -> Callable[[int, int, int], int] | None:
    """The C library's ``memcmp`` through ctypes; ``None`` where it cannot be loaded (then
    :func:`first_difference` compares with numpy alone). Through ``PyDLL``: the call keeps
    the GIL (a few microseconds), so it does not hand the GIL to another thread and wait
    to take it back, as a ``CDLL`` call would."""
    try:
        fn = ctypes.PyDLL(None).memcmp
    except (OSError, AttributeError, TypeError):
        return None
    fn.argtypes = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)
    fn.restype = ctypes.c_int
    return fn


_MEMCMP = _load_memcmp()


def first_difference(a: np.ndarray, b: np.ndarray, n: int) -> int:
    """Index of the first element where ``a[:n]`` and ``b[:n]`` differ; ``n`` if none.

    Why: a scheduler compares each session's prompt with its last one every turn (33K
    tokens, 132 KB each, the old one long out of cache). ``memcmp`` reads the two once and
    makes nothing; numpy's ``!=`` writes a boolean array that ``flatnonzero`` reads twice.
    In the control-plane bench the comparison took 24 against 42 us a turn (thread CPU).
    A difference, the rare case, is then located with numpy. Pure: libc's ``memcmp`` reads
    memory and has no other effect; arrays that are not C-contiguous, or of two dtypes,
    are compared with numpy.
    """
    n = max(0, min(n, len(a), len(b)))
    if (_MEMCMP is not None and n and a.dtype == b.dtype and a.ndim == b.ndim == 1
            and a.flags.c_contiguous and b.flags.c_contiguous
            and _MEMCMP(a.ctypes.data, b.ctypes.data, n * a.itemsize) == 0):
        return n
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if len(diff) else n


class PrefixKeyCache:
    """Each session's last prompt and its prefix keys, so a turn hashes only what changed.

    An agent's next prompt is its last one plus the output and the appended tokens, so the
    keys of every block up to the first token that differs are the ones computed last turn.
    :meth:`keys` compares the new prompt with the kept one (one vectorised comparison),
    keeps the keys of the blocks before the first difference and hashes the rest with
    :func:`chain_digests`: the result always equals :func:`prefix_keys` of the prompt,
    whatever the prompt (a changed prefix only costs more hashing). Keys are kept as joined
    digests (:class:`DigestKeys`). Bounded: at most ``sessions`` sessions and
    ``max_tokens`` kept tokens (4 bytes each), least recently used dropped.
    Not thread-safe (the caller's lock guards it).
    """

    def __init__(self, namespace: Namespace, sessions: int = 4096,
                 max_tokens: int = 32 << 20) -> None:
        self.ns = namespace
        self.sessions = max(1, sessions)
        self.max_tokens = max(0, max_tokens)
        self._kept: OrderedDict[object, PromptKeys] = OrderedDict()
        self._tokens = 0
        self.reused = 0  # blocks whose key came from the cache
        self.hashed = 0  # blocks hashed

    def __len__(self) -> int:
        return len(self._kept)

    def keys(self, session: object, tokens: Sequence[int] | np.ndarray) -> list[BlockKey]:
        """:func:`prefix_keys` of ``tokens`` (a new list), reusing ``session``'s last keys."""
        return list(self.prompt(session, tokens).keys)

    def prompt(self, session: object, tokens: Sequence[int] | np.ndarray) -> PromptKeys:
        """``tokens`` as :class:`PromptKeys`: its uint32 form and :func:`prefix_keys`, the
        keys also as one bytes object of raw digests; ``session``'s last keys reused.

        Why the joined digests: a dispatch sends the hit keys as one frame and the ledger
        compares chains as bytes, so keeping them joined (extended by the new keys only)
        saves a join of ~200 digests per use. Treat the result as read-only: it is kept.
        """
        size = self.ns.shape.block_tokens
        arr = np.asarray(tokens)
        # the uint32 form is what the hash reads; keeping it is what makes a match exact.
        # One handed over read-only in that form (:func:`token_ids`) is kept as it is: a
        # copy of a 33K-token prompt per turn was a tenth of a turn's scheduling
        if arr.dtype == _U4 and not arr.flags.writeable and arr.flags.c_contiguous:
            u4 = arr
        else:
            u4 = arr.astype("<u4")
            u4.flags.writeable = False  # kept, and handed out as the prompt's frame
        prev = self._kept.pop(session, None)
        same = 0
        joined = b""
        if prev is not None:
            self._tokens -= len(prev.tokens)
            n = min(len(prev.tokens), len(u4), len(prev.raw) // KEY_BYTES * size)
            same = first_difference(prev.tokens, u4, n) // size
            joined = prev.raw[:same * KEY_BYTES]
        fresh = chain_digests(u4, self.ns, joined[-KEY_BYTES:] if same else None, same)
        self.reused += same
        self.hashed += len(fresh) // KEY_BYTES
        got = PromptKeys(u4, DigestKeys(joined + fresh))
        if len(u4) <= self.max_tokens:
            self._kept[session] = got
            self._tokens += len(u4)
            while self._kept and (len(self._kept) > self.sessions
                                  or self._tokens > self.max_tokens):
                _, dropped = self._kept.popitem(last=False)
                self._tokens -= len(dropped.tokens)
        return got


class PromptKeys(NamedTuple):
    """A prompt as :class:`PrefixKeyCache` keeps it (read-only by convention).

    ``tokens``: the prompt as little-endian uint32 (what the hash reads); ``keys``: its
    :func:`prefix_keys`, held as their digests joined (:attr:`raw`).
    """

    tokens: np.ndarray
    keys: DigestKeys

    @property
    def raw(self) -> bytes:
        """The keys' digests joined (``KEY_BYTES`` each)."""
        return self.keys.raw


def longest_cached_prefix(keys: Iterable[BlockKey], contains: Callable[[BlockKey], bool]) -> int:
    """Number of leading blocks present (the trie walk): stops at the first missing key."""
    hits = 0
    for key in keys:
        if not contains(key):
            break
        hits += 1
    return hits


class PresentPrefixCache:
    """Per session, how many leading blocks a lookup found present, and at which removal
    generation, so the next lookup stats only the blocks after them.

    Why: an agent's prompt grows turn by turn, so a lookup used to check again every block
    it had found last turn (hundreds of ``stat`` calls for a long context) though a block
    only disappears when a store removes it, and every removal moves the store's removal
    generation (:class:`~dualpath_cli.storage.store.CountsRemovals`). While the generation
    is the one the blocks were found present at, they still are; keys are a chain, so the
    new prompt shares all of them when it shares the last one. :meth:`hits` always equals
    :func:`longest_cached_prefix` of ``keys[:limit]`` provided blocks only go through the
    store's removal paths. Bounded to ``sessions`` (least recently used dropped); not
    thread-safe (the caller's lock guards it).
    """

    def __init__(self, sessions: int = 65_536) -> None:
        self.sessions = max(1, sessions)
        self._kept: OrderedDict[object, tuple[Hashable, int, BlockKey]] = OrderedDict()
        self.trusted = 0  # blocks taken as present without a check
        self.checked = 0  # blocks checked with ``contains``

    def __len__(self) -> int:
        return len(self._kept)

    def hits(self, session: object, keys: Sequence[BlockKey], limit: int,
             generation: Hashable | None, contains: Callable[[BlockKey], bool]) -> int:
        """Leading blocks of ``keys[:limit]`` present. ``generation``: the store's removal
        generation read *before* this call (``None``: unknown, every block is checked)."""
        limit = max(0, min(limit, len(keys)))
        start = known = 0
        kept = self._kept.pop(session, None)
        if kept is not None and generation is not None and kept[0] == generation:
            n = kept[1]
            if n <= len(keys) and keys[n - 1] == kept[2]:  # the same chain up to block n
                known, start = n, min(n, limit)
        hits = start
        while hits < limit and contains(keys[hits]):
            hits += 1
        self.trusted += start
        self.checked += min(limit, hits + 1) - start
        if generation is not None and max(hits, known):
            # a lookup cut short (``limit``) keeps what an earlier one found beyond it
            self._keep(session, (generation, hits, keys[hits - 1]) if hits >= known
                       else (generation, known, keys[known - 1]))
        return hits

    def note(self, session: object, generation: Hashable | None, blocks: int,
             last: BlockKey) -> None:
        """``session``'s first ``blocks`` blocks, the chain ending in ``last``, are in the
        store as of ``generation``, read *before* they were written (a turn's blocks,
        which its engine reports written as it answers; read at the turn's lookup): the
        next :meth:`hits` at that generation takes them as present without a ``stat``.

        Sound for the reason :meth:`hits` is: a block written after the read is still
        there while no removal has moved the generation since.
        """
        if generation is None or blocks <= 0:
            return
        self._kept.pop(session, None)
        self._keep(session, (generation, blocks, last))

    def _keep(self, session: object, entry: tuple[Hashable, int, BlockKey]) -> None:
        """Keep ``session``'s entry as the most recent (popped by the caller), dropping the
        least recently used beyond ``sessions``."""
        self._kept[session] = entry
        while len(self._kept) > self.sessions:
            self._kept.popitem(last=False)
