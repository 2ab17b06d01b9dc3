"""The wire protocol between the scheduler and the engines: every message kind, typed.

Why one module: the scheduler, the engines and the PE/DE workers used to build and read
terse header dicts in four places, so a renamed key failed silently. Each kind is a frozen
record here; :func:`encode` is the only code that turns a record into a transfer header and
:func:`decode` the only code that turns a header back into a record.

On the wire a message is the transfer layer's ``(header, buffers)``: the header is a flat map
of the record's fields plus ``"t"`` (the kind), which msgpack carries between processes; the
KV of a :class:`Layer` travels as raw buffer frames beside it, never serialised, and comes
back as the same (zero-copy) arrays in :attr:`Layer.frames`. Sequence fields are tuples in
records; they are restored from msgpack's lists on decode. A prompt (:class:`Decode` and
:class:`Prefill` ``tokens``) is a :class:`TokenArray` and travels as one int32 buffer frame
too: packing 12K tokens as a msgpack list cost the scheduler ~0.4 ms per message. Their
block ``keys`` are a :class:`KeyArray`, one frame of raw 16-byte digests (hex only where read).

Kinds (direction):

* engine -> scheduler: :class:`Hello`, :class:`QueueReport` (``rq``), :class:`Heartbeat`
  (``hb``), :class:`Fetch`, :class:`First`, :class:`Tokens` (a streamed turn's step),
  :class:`Done`, :class:`ReadFailed`;
* scheduler -> engine: :class:`Stop`, :class:`MetricsRequest` (``metrics``), :class:`Cancel`,
  :class:`Decode`, :class:`Prefill`, :class:`SetQuota` (``quota``), :class:`Lead`,
  :class:`~dualpath_cli.faultspec.Fault` (``fault``: fault injection, one record);
  :class:`~dualpath_cli.runtime.hbm.Compact` (``compact``: defragment the engine's HBM);
  :class:`~dualpath_cli.storage.warm.Warm` (``warm``: warm the loader's DRAM cache);
* engine -> engine: :class:`Layer`, :class:`PrefillDone`.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, cast

import numpy as np

from dualpath_cli.errors import DualPathError
from dualpath_cli.faultspec import Fault
from dualpath_cli.runtime.hbm import Compact
from dualpath_cli.storage.warm import Warm
from dualpath_cli.transfer.base import UNREADABLE, Endpoint

__all__ = ["WireError", "Hello", "QueueReport", "EngineCounters", "Heartbeat", "Fetch", "First",
           "Tokens", "Done", "ReadFailed", "Stop", "MetricsRequest", "Cancel", "Decode", "Prefill",
           "SetQuota", "Lead", "GroupLeader", "Layer", "PrefillDone", "Fault", "Compact", "Warm",
           "WireMessage", "KINDS", "TIERS", "encode", "decode", "send", "TokenArray", "full_prompt"]

#: Tiers of a per-layer hit, in :attr:`Heartbeat.layer_hits` order.
TIERS: tuple[str, ...] = ("dram", "store", "peer")


class WireError(DualPathError):
    """A header that is not a message of this protocol (unknown kind, missing field)."""


class TokenArray(Sequence[int]):
    """A prompt's token ids as one read-only int32 array: a message field sent as a frame.

    Compares equal to any sequence of the same ints (a tuple included), so records holding
    one still compare by value; ``np.asarray(t, dtype)`` gives the array.
    """

    __slots__ = ("array",)

    def __init__(self, tokens: Sequence[int] | np.ndarray) -> None:
        arr = np.ascontiguousarray(tokens, dtype=np.int32)
        if arr.ndim != 1:
            raise WireError(f"wire: tokens must be one-dimensional, got shape {arr.shape}")
        if arr.flags.writeable:
            arr = arr.copy() if arr is tokens else arr
            arr.flags.writeable = False
        self.array: np.ndarray = arr

    @classmethod
    def of(cls, tokens: Sequence[int] | np.ndarray) -> TokenArray:
        """``tokens`` as a :class:`TokenArray` (itself when it already is one)."""
        return tokens if isinstance(tokens, TokenArray) else cls(tokens)

    def __len__(self) -> int:
        return len(self.array)

    @typing.overload
    def __getitem__(self, i: int) -> int: ...

    @typing.overload
    def __getitem__(self, i: slice) -> TokenArray: ...

    def __getitem__(self, i: int | slice) -> int | TokenArray:
        if isinstance(i, slice):
            return TokenArray(self.array[i])
        return int(self.array[i])

    def __iter__(self) -> typing.Iterator[int]:
        return iter(self.array.tolist())

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        if dtype is None or np.dtype(dtype) == self.array.dtype:
            return self.array.copy() if copy else self.array
        return self.array.astype(dtype)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, TokenArray):
            return bool(np.array_equal(self.array, other.array))
        if isinstance(other, tuple | list | np.ndarray):
            return len(other) == len(self.array) and bool(np.array_equal(self.array, other))
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.array.tobytes())

    def __repr__(self) -> str:
        return f"TokenArray({self.array.tolist()!r})"


class KeyArray(Sequence[str]):
    """Block keys (hex strings of one width) as one read-only 2-D uint8 array of raw
    digests, one row per key: a message field sent as a frame. Why: a dispatch carries
    every hit block's key (~200 per turn at 48p96d); as a msgpack list of hex strings that
    cost tens of microseconds per message. Packed once, turned back into hex only where
    read; compares equal to any sequence of the same hex strings."""

    __slots__ = ("array",)

    def __init__(self, keys: Sequence[str] | np.ndarray) -> None:
        if isinstance(keys, np.ndarray):
            if keys.ndim != 2 or keys.dtype != np.uint8:
                raise WireError(f"wire: a keys frame must be a 2-D uint8 array, got "
                                f"{keys.dtype} of shape {keys.shape}")
            arr = np.ascontiguousarray(keys)
        else:
            width = len(keys[0]) // 2 if len(keys) else 16
            try:
                raw = bytes.fromhex("".join(keys))
            except (TypeError, ValueError):
                raise WireError(f"wire: block keys must be hex strings, got {keys!r}") from None
            # the total and the first key's width (a per-key check costs as much as the
            # packing; keys come from core.layout, one width per store)
            if not width or len(raw) != width * len(keys):
                raise WireError(f"wire: block keys must be hex strings of one even length, "
                                f"got {keys!r}")
            arr = np.frombuffer(raw, dtype=np.uint8).reshape(len(keys), width)
        if arr.flags.writeable:
            arr = arr.copy() if arr is keys else arr
            arr.flags.writeable = False
        self.array: np.ndarray = arr

    @classmethod
    def of(cls, keys: Sequence[str] | np.ndarray) -> KeyArray:
        """``keys`` as a :class:`KeyArray` (itself when it already is one)."""
        return keys if isinstance(keys, KeyArray) else cls(keys)

    def __len__(self) -> int:
        return int(self.array.shape[0])

    @typing.overload
    def __getitem__(self, i: int) -> str: ...

    @typing.overload
    def __getitem__(self, i: slice) -> KeyArray: ...

    def __getitem__(self, i: int | slice) -> str | KeyArray:
        if isinstance(i, slice):
            return KeyArray(self.array[i])
        return self.array[i].tobytes().hex()

    def __iter__(self) -> typing.Iterator[str]:
        raw, width = self.array.tobytes(), self.array.shape[1]
        return (raw[j:j + width].hex() for j in range(0, len(raw), width))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, KeyArray):
            return bool(np.array_equal(self.array, other.array))
        if isinstance(other, tuple | list):
            return len(other) == len(self) and list(self) == list(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.array.tobytes())

    def __repr__(self) -> str:
        return f"KeyArray({list(self)!r})"


# -- engine -> scheduler ----------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Hello:
    """An engine is up and listening at ``addr``."""

    KIND: ClassVar[str] = "hello"
    eid: int
    addr: str
    role: str
    node: int
    group: int
    pid: int


@dataclass(frozen=True, slots=True)
class QueueReport:
    """The node loader's read queue in tokens (``rq``), sent whenever it changes.

    ``n`` orders reports sent from several threads; ``seen`` is the last dispatch sequence
    whose reads ``rq`` already counts (it retires the scheduler's pending charges).
    Sent to the engine's group leader once the scheduler named it (:class:`GroupLeader`),
    which carries it on its next :class:`Fetch` (paper 6.1: only a group's leader talks to
    the scheduler); to the scheduler itself before that, or while the group has no leader.
    """

    KIND: ClassVar[str] = "rq"
    eid: int
    n: int
    seen: int
    rq: int


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineCounters:
    """Totals an engine counts itself since it started (the bench summarises them).

    Defined once, here: the engine's :class:`~dualpath_cli.runtime.context.Counters` hold
    them, every :class:`Heartbeat` carries them flat. ``kv_wait_s``/``kv_waits``: seconds
    the PE's prefills of a cached prefix waited from arrival until their KV let them queue
    for compute, and how many; ``compactions``: HBM compactions done on request.
    """

    busy_s: float = 0.0
    bubble_s: float = 0.0
    load_wait_s: float = 0.0
    snic_read_bytes: int = 0
    snic_write_bytes: int = 0
    cnic_tx_bytes: int = 0
    kv_rx_from_pe_bytes: int = 0
    kv_rx_from_de_bytes: int = 0
    blocks_persisted: int = 0
    corrupt_blocks: int = 0
    batches: int = 0
    batched_items: int = 0
    chunks: int = 0
    kv_wait_s: float = 0.0
    kv_waits: int = 0
    compactions: int = 0


@dataclass(frozen=True, slots=True)
class Heartbeat(EngineCounters):
    """A periodic report: the queue report, the engine's :class:`EngineCounters` (keyword
    fields, first in the header) and everything else the read model shows of an engine.

    ``layer_hits[l]`` is ``(dram, store, peer)`` Layer Blocks served for layer ``l``;
    ``layer_slack_s[l]`` the load-ahead slack of layer ``l`` in the PE's last prefill of a
    cached prefix (negative: a bubble; ``None``: none yet, and always on a DE). ``metrics``
    is the engine's whole registry as a frame (telemetry/frames.py: layout and values) every
    ``metrics_s`` (``None`` in between).
    """

    KIND: ClassVar[str] = "hb"
    eid: int
    n: int
    seen: int
    rq: int
    rq_bytes: int = 0
    rq_blocks: int = 0
    dram_cache_bytes: int = 0
    uptime_s: float = 0.0
    jobs: int = 0
    quota_s: float = 0.0
    hbm_capacity_blocks: int = 0
    hbm_used_blocks: int = 0
    hbm_largest_free_run: int = 0
    hbm_fragmentation: float = 0.0
    hbm_block_bytes: int = 0
    layer_hits: tuple[tuple[int, ...], ...] = ()
    layer_slack_s: tuple[float | None, ...] = ()
    metrics: dict[str, Any] | None = None

    @property
    def hbm_free_blocks(self) -> int:
        """Free HBM blocks."""
        return self.hbm_capacity_blocks - self.hbm_used_blocks

    @property
    def busy_fraction(self) -> float | None:
        """Busy seconds over seconds up (``None`` before any time has passed)."""
        return min(1.0, self.busy_s / self.uptime_s) if self.uptime_s > 0 else None


@dataclass(frozen=True, slots=True)
class Fetch:
    """A group leader asks for work (pull-based scheduling, paper 6.1), carrying its group's
    read-queue reports since its last fetch (``reports``: ``(eid, n, seen, rq)`` each, the
    newest of each engine, the leader's own among them: a :class:`QueueReport`'s fields)."""

    KIND: ClassVar[str] = "fetch"
    eid: int
    group: int
    role: str
    reports: tuple[tuple[int, ...], ...] = ()


@dataclass(frozen=True, slots=True)
class First:
    """A PE computed the first token of attempt ``att`` of request ``rid`` at ``at``.

    ``facts`` is the PE's side of the request's story (``dualpath explain``): when it got the
    prefill, when its KV was ready and compute began, blocks by tier, bytes, per-layer slack.
    """

    KIND: ClassVar[str] = "first"
    eid: int
    rid: int
    att: int
    token: int
    at: float
    facts: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class Tokens:
    """A DE's decode step of its streamed turns (:attr:`Decode.stream`): one message."""

    KIND: ClassVar[str] = "tokens"
    eid: int
    rids: tuple[int, ...]  # turn rids[i] (attempt atts[i]): tokens[i] from output starts[i]
    atts: tuple[int, ...]
    starts: tuple[int, ...]
    tokens: tuple[tuple[int, ...], ...]


@dataclass(frozen=True, slots=True)
class Done:
    """A DE finished a request: every generated token and its timeline (monotonic s)."""

    KIND: ClassVar[str] = "done"
    eid: int
    rid: int
    att: int
    tokens: tuple[int, ...]
    rx_from_pe: int
    at: float
    second_at: float = 0.0
    facts: dict[str, Any] | None = None  # the DE's side of the story (its reads by tier)
    # full blocks of prompt + output, from the first, the DE knows are in the store as it
    # answers (its hits and every block it wrote, up to one it could not; -1: unknown):
    # the scheduler then need not stat them at the agent's next lookup
    stored: int = -1


@dataclass(frozen=True, slots=True)
class ReadFailed:
    """A read (or the HBM for it) failed; ``block`` is the first unusable block (-1: none)."""

    KIND: ClassVar[str] = "read_failed"
    eid: int
    rid: int
    att: int
    block: int
    why: str


# -- scheduler -> engine ----------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Stop:
    """Finish what is in hand and exit."""

    KIND: ClassVar[str] = "stop"


@dataclass(frozen=True, slots=True)
class MetricsRequest:
    """Send a heartbeat with a fresh metrics snapshot now."""

    KIND: ClassVar[str] = "metrics"


@dataclass(frozen=True, slots=True)
class Cancel:
    """Drop every trace of request ``rid`` (its other engine died or a read failed).

    ``att``: the attempt cancelled; its messages arriving later (a :class:`Decode` a PE
    forwards travels another path than this) are dropped, and a newer attempt's job is
    kept. -1: whatever attempt the engine holds."""

    KIND: ClassVar[str] = "cancel"
    rid: int
    att: int = -1


@dataclass(frozen=True, slots=True)
class Decode:
    """Run attempt ``att`` of request ``rid`` on this DE.

    The DE reads hit blocks ``[pe_tokens, cached)`` (``keys`` are every hit block) and
    streams them to the PE at ``pe``; ``seq`` is the dispatch sequence the read is charged to.
    ``tokens`` are the prompt's from token ``start`` on (see :func:`full_prompt`).
    """

    KIND: ClassVar[str] = "decode"
    rid: int
    att: int
    seq: int
    tokens: TokenArray
    gen: int
    cached: int
    keys: KeyArray
    pe_tokens: int
    pe: str
    shaped: bool
    start: int = 0
    stream: bool = False  # report each step's tokens (:class:`Tokens`)

    def __post_init__(self) -> None:
        object.__setattr__(self, "tokens", TokenArray.of(self.tokens))
        object.__setattr__(self, "keys", KeyArray.of(self.keys))
        _check_start(self)

    def prompt(self) -> np.ndarray:
        """The whole prompt as int64 (:func:`full_prompt`)."""
        return full_prompt(self.tokens, self.start)


@dataclass(frozen=True, slots=True)
class Prefill:
    """Prefill attempt ``att`` of request ``rid`` on this PE, sending its KV to ``de``.

    ``keys`` are the hit blocks: this PE reads the first ``pe_tokens`` of them; ``tokens``
    are the prompt's from token ``start`` on (see :func:`full_prompt`). ``de_seq`` >= 0: the
    PE forwards the turn's :class:`Decode` (:meth:`decode`, dispatch ``de_seq`` of that DE)
    to ``de`` ahead of its KV, on the same link, so the scheduler sends one message per
    dispatch; -1: the scheduler sent the Decode itself.
    """

    KIND: ClassVar[str] = "prefill"
    rid: int
    att: int
    seq: int
    tokens: TokenArray
    cached: int
    keys: KeyArray
    pe_tokens: int
    de: str
    layerwise: bool
    shaped: bool
    start: int = 0
    gen: int = 0  # the Decode's (when forwarded)
    de_seq: int = -1
    stream: bool = False  # the Decode's (when forwarded)

    def __post_init__(self) -> None:
        object.__setattr__(self, "tokens", TokenArray.of(self.tokens))
        object.__setattr__(self, "keys", KeyArray.of(self.keys))
        _check_start(self)

    def prompt(self) -> np.ndarray:
        """The whole prompt as int64 (:func:`full_prompt`)."""
        return full_prompt(self.tokens, self.start)

    def pe_keys(self, block_tokens: int) -> KeyArray:
        """The hit blocks this PE reads (the first ``pe_tokens``)."""
        return self.keys[:self.pe_tokens // block_tokens]

    def decode(self, pe: str) -> Decode | None:
        """The :class:`Decode` this PE (at address ``pe``) forwards to ``de`` (``None``:
        the scheduler sent it)."""
        if self.de_seq < 0:
            return None
        return Decode(self.rid, self.att, self.de_seq, self.tokens, self.gen, self.cached,
                      self.keys, self.pe_tokens, pe, self.shaped, self.start, self.stream)


def _check_start(m: Decode | Prefill) -> None:
    if not 0 <= m.start <= m.cached:
        raise WireError(f"wire: {m.KIND} start {m.start} is outside 0..cached ({m.cached})")


def full_prompt(tokens: TokenArray, start: int) -> np.ndarray:
    """A dispatch's prompt as int64 at its full length, ``start`` + ``len(tokens)``.

    Why: an engine computes KV only for the tokens after the hit (``cached``); the hit's KV
    is read from the store, so the scheduler sends the prompt from ``start`` (at most
    ``cached``) on and leaves the rest out: ~4 KB a turn instead of twice the whole prompt
    (~54 KB each for 13.5K tokens; 260 MB/s at 2,400 turns/s). The tokens before ``start``
    are zeros here: nothing reads them (prefill embeds from ``cached``, a DE hashes the
    blocks it writes, all after the hit).
    """
    if not start:
        return np.asarray(tokens, dtype=np.int64)
    out = np.zeros(start + len(tokens), dtype=np.int64)
    out[start:] = tokens.array
    return out


@dataclass(frozen=True, slots=True)
class SetQuota:
    """Use ``quota_s`` seconds of predicted compute per prefill batch from now on."""

    KIND: ClassVar[str] = "quota"
    quota_s: float


@dataclass(frozen=True, slots=True)
class Lead:
    """Fetch for group ``group`` from now on: its leader died (the scheduler promotes the
    next live engine of the group, so one dead GPU does not idle its node's others)."""

    KIND: ClassVar[str] = "lead"
    group: int


@dataclass(frozen=True, slots=True)
class GroupLeader:
    """Send queue reports to ``addr``, the leader of group ``group``, which carries them on
    its fetches; ``addr`` empty: send them to the scheduler (the group has no leader now)."""

    KIND: ClassVar[str] = "leader"
    group: int
    addr: str


# -- engine -> engine -------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Layer:
    """KV rows of one layer of request ``rid``, carried as raw frames.

    PE -> DE: ``frames`` are ``(pe_read_hit_rows, new_rows)`` and ``start`` is the first new
    token. DE -> PE (DE read path): ``frames`` are ``(hit_rows,)`` and ``start`` is unused.
    """

    KIND: ClassVar[str] = "layer"
    rid: int
    att: int
    layer: int
    start: int = 0
    frames: tuple[np.ndarray, ...] = field(default=(), compare=False, repr=False)


@dataclass(frozen=True, slots=True)
class PrefillDone:
    """The PE sent every layer of the request; ``token`` is the first generated token."""

    KIND: ClassVar[str] = "prefill_done"
    rid: int
    att: int
    token: int


WireMessage = (Hello | QueueReport | Heartbeat | Fetch | First | Tokens | Done | ReadFailed
               | Stop | MetricsRequest | Cancel | Decode | Prefill | SetQuota | Lead
               | GroupLeader | Layer | PrefillDone | Fault | Compact | Warm)

#: kind -> record class (every member of :data:`WireMessage`)
KINDS: dict[str, type[Any]] = {cls.KIND: cls for cls in typing.get_args(WireMessage)}


@dataclass(frozen=True, slots=True)
class _Codec:
    cls: type[Any]
    names: tuple[str, ...]  # header fields, in declaration order
    required: frozenset[str]
    tuples: tuple[str, ...]  # fields that are tuples in the record (lists after msgpack)
    nested: tuple[str, ...]  # fields that are tuples of tuples
    arrays: tuple[str, ...]  # TokenArray/KeyArray fields: buffer frames, in this order
    array_types: tuple[tuple[type[Any], str], ...]  # their classes and dtype kinds
    build: Callable[[Mapping[str, Any]], Any] | None = None  # see _builder


#: field types sent as buffer frames: type name -> (class, dtype kinds accepted)
_ARRAY_TYPES: dict[str, tuple[type[Any], str]] = {"TokenArray": (TokenArray, "iu"),
                                                  "KeyArray": (KeyArray, "u")}


def _codec(cls: type[Any]) -> _Codec:
    fields = [f for f in dataclasses.fields(cls) if f.name != "frames"]
    arrays = tuple(f.name for f in fields if str(f.type) in _ARRAY_TYPES)
    fields = [f for f in fields if f.name not in arrays]
    required = frozenset(f.name for f in fields if f.default is dataclasses.MISSING
                         and f.default_factory is dataclasses.MISSING)
    tuples = tuple(f.name for f in fields if str(f.type).startswith("tuple["))
    nested = tuple(f.name for f in fields if str(f.type).startswith("tuple[tuple["))
    types = {f.name: str(f.type) for f in dataclasses.fields(cls)}
    codec = _Codec(cls, tuple(f.name for f in fields), required,
                   tuple(n for n in tuples if n not in nested), nested, arrays,
                   tuple(_ARRAY_TYPES[types[n]] for n in arrays))
    return dataclasses.replace(codec, build=_builder(codec))


def _as_tuple(kind: str, name: str, value: Any) -> tuple[Any, ...]:
    try:  # tuple() of a tuple is the same object: free in process
        return tuple(value)
    except TypeError:
        raise WireError(f"wire: {kind} {name} is not a list") from None


def _as_tuples(kind: str, name: str, value: Any) -> tuple[tuple[Any, ...], ...]:
    try:
        return tuple(map(tuple, value))
    except TypeError:
        raise WireError(f"wire: {kind} {name} is not a list of lists") from None


def _builder(codec: _Codec) -> Callable[[Mapping[str, Any]], Any] | None:
    """A function that makes ``codec``'s record from a header straight, field by field
    through the slots' own setters: equal to ``cls(**fields)``, a third of the time.

    Why: a frozen dataclass's ``__init__`` sets each field through ``object.__setattr__``
    and ``decode`` first copied the fields into a dict for it; for a heartbeat (34 fields,
    ~1,150 a second at 48P96D) that was ~17 of its ~20 us at the scheduler. ``None`` (the
    generic path) for a record with frames, a ``__post_init__``, a factory default or no slots.
    """
    cls = codec.cls
    fields = {f.name: f for f in dataclasses.fields(cls)}
    if (codec.arrays or cls is Layer or hasattr(cls, "__post_init__")
            or any(f.default_factory is not dataclasses.MISSING for f in fields.values())):
        return None
    setters: list[Any] = [getattr(cls, name, None) for name in codec.names]
    if not all(type(s).__name__ == "member_descriptor" for s in setters):
        return None
    env: dict[str, Any] = {"_new": object.__new__, "_cls": cls, "_t": _as_tuple,
                           "_tt": _as_tuples}
    lines = ["def build(h):", "    o = _new(_cls)"]
    for i, name in enumerate(codec.names):
        env[f"s{i}"], env[f"d{i}"] = setters[i].__set__, fields[name].default
        get = f"h[{name!r}]"
        value = (f"_t({cls.KIND!r}, {name!r}, {get})" if name in codec.tuples else
                 f"_tt({cls.KIND!r}, {name!r}, {get})" if name in codec.nested else get)
        if name in codec.required:
            lines.append(f"    s{i}(o, {value})")
        elif value == get:
            lines.append(f"    s{i}(o, h.get({name!r}, d{i}))")
        else:
            lines.append(f"    s{i}(o, {value} if {name!r} in h else d{i})")
    lines.append("    return o")
    exec("\n".join(lines), env)  # our own field names, made at import
    return cast(Callable[[Mapping[str, Any]], Any], env["build"])


_CODECS: dict[str, _Codec] = {kind: _codec(cls) for kind, cls in KINDS.items()}


def encode(msg: WireMessage) -> tuple[dict[str, Any], list[np.ndarray]]:
    """The transfer header and buffer frames of ``msg`` (a :class:`Layer`'s KV, a
    prompt's tokens)."""
    codec = _CODECS[msg.KIND]
    header: dict[str, Any] = {"t": msg.KIND}
    for name in codec.names:
        header[name] = getattr(msg, name)
    if codec.arrays:
        return header, [getattr(msg, name).array for name in codec.arrays]
    return header, list(msg.frames) if isinstance(msg, Layer) else []


def decode(header: Mapping[str, Any], buffers: Sequence[np.ndarray] = ()) -> WireMessage:
    """The record a received ``header`` (and its frames) carries.

    Raises:
        WireError: the header names no known kind or lacks a required field.
    """
    kind = header.get("t")
    codec = _CODECS.get(kind) if isinstance(kind, str) else None
    if codec is None:
        if UNREADABLE in header:
            raise WireError(f"wire: unreadable message: {header[UNREADABLE]}")
        raise WireError(f"wire: unknown message kind {kind!r}; expected one of "
                        f"{', '.join(KINDS)}")
    if not codec.required <= header.keys():  # a set's test against the keys: no new set
        missing = codec.required.difference(header)
        raise WireError(f"wire: {kind} message lacks {', '.join(sorted(missing))}")
    if codec.build is not None:
        return cast(WireMessage, codec.build(header))
    values = {name: header[name] for name in codec.names if name in header}
    for name in codec.tuples:
        if name in values:
            values[name] = _as_tuple(codec.cls.KIND, name, values[name])
    for name in codec.nested:
        if name in values:
            values[name] = _as_tuples(codec.cls.KIND, name, values[name])
    if codec.cls is Layer:
        values["frames"] = tuple(buffers)
    elif codec.arrays:
        if len(buffers) != len(codec.arrays):
            raise WireError(f"wire: {kind} message carries {len(buffers)} buffer frames; "
                            f"expected {len(codec.arrays)} ({', '.join(codec.arrays)})")
        for name, buf, (array_cls, kinds) in zip(codec.arrays, buffers, codec.array_types,
                                                 strict=True):
            if buf.ndim != (2 if array_cls is KeyArray else 1) or (
                    buf.dtype.kind not in kinds) or (
                    array_cls is KeyArray and buf.dtype.itemsize != 1):
                raise WireError(f"wire: {kind} {name} frame is not a "
                                f"{'2-D byte' if array_cls is KeyArray else '1-D integer'} array "
                                f"({buf.dtype}, shape {buf.shape})")
            values[name] = array_cls(buf)
    return cast(WireMessage, codec.cls(**values))


def send(endpoint: Endpoint, to: str, msg: WireMessage) -> None:
    """Encode ``msg`` and send it from ``endpoint`` to the address ``to``."""
    header, frames = encode(msg)
    endpoint.send(to, header, frames)
