"""The wire protocol: every kind round-trips through the one encoder and decoder."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from dualpath_cli.runtime.context import Counters
from dualpath_cli.runtime.wire import (
    _CODECS,
    KINDS,
    Cancel,
    Compact,
    Decode,
    Done,
    EngineCounters,
    Fault,
    Fetch,
    First,
    GroupLeader,
    Heartbeat,
    Hello,
    KeyArray,
    Layer,
    Lead,
    MetricsRequest,
    Prefill,
    PrefillDone,
    QueueReport,
    ReadFailed,
    SetQuota,
    Stop,
    Tokens,
    Warm,
    WireError,
    WireMessage,
    decode,
    encode,
)
from dualpath_cli.transfer import InProcFabric, ZmqFabric

SAMPLES: list[WireMessage] = [
    Hello(3, "tcp://127.0.0.1:5555", "decode", 1, 1, 4242),
    QueueReport(3, 17, 5, 640),
    Heartbeat(3, 18, 5, 640, rq_bytes=1 << 20, rq_blocks=10, dram_cache_bytes=4096,
              uptime_s=2.5, busy_s=1.25, snic_read_bytes=123, cnic_tx_bytes=456,
              kv_rx_from_pe_bytes=7, chunks=2, jobs=1, quota_s=0.3,
              hbm_capacity_blocks=64, hbm_used_blocks=16, hbm_largest_free_run=40,
              hbm_fragmentation=0.2, hbm_block_bytes=1024,
              layer_hits=((0, 4, 2), (1, 4, 2)), layer_slack_s=(0.002, None),
              metrics={"dualpath_hbm_usage_bytes": [{"labels": {"engine": "3"}, "value": 1.0}]}),
    Fetch(0, 0, "prefill"),
    Fetch(0, 0, "decode", ((0, 4, 2, 640), (1, 9, 3, 0))),
    First(0, 9, 1, 77, 12.5),
    Tokens(3, (9, 11), (1, 0), (0, 3), ((77, 78), (5,))),
    Done(3, 9, 1, (77, 78, 79), 2048, 13.0, 12.75),
    ReadFailed(0, 9, 1, 2, "missing or corrupt block"),
    Stop(),
    MetricsRequest(),
    Cancel(9),
    Decode(9, 1, 4, (1, 2, 3, 4), 4, 16, ("ab" * 32,), 8, "inproc://engine0-1", True),
    Decode(9, 1, 4, (1, 2, 3, 4), 4, 16, ("ab" * 32,), 8, "inproc://engine0-1", True,
           stream=True),
    Prefill(9, 1, 5, (1, 2, 3, 4), 16, ("ab" * 32,), 8, "inproc://engine2-3", True, False),
    SetQuota(0.05),
    Lead(3),
    GroupLeader(3, "tcp://127.0.0.1:5556"),
    Layer(9, 1, 2, 16, (np.arange(12, dtype=np.uint8).reshape(3, 4),
                        np.ones((2, 4), np.uint8))),
    PrefillDone(9, 1, 77),
    Fault("hot_blocks", node=1, rate=20.0, count=0, blocks=("ab" * 16, "cd" * 16)),
    Compact(2),
    Warm(("ab" * 16, "cd" * 16), 1e6),
]


def test_every_kind_has_a_sample() -> None:
    assert {type(m).KIND for m in SAMPLES} == set(KINDS)
    assert len(KINDS) == 21


@pytest.mark.parametrize("msg", SAMPLES, ids=lambda m: type(m).KIND)
def test_round_trip_in_process(msg: WireMessage) -> None:
    header, frames = encode(msg)
    assert header["t"] == type(msg).KIND
    back = decode(header, frames)
    assert back == msg and type(back) is type(msg)
    if isinstance(msg, Layer):
        assert isinstance(back, Layer)
        assert all(a is b for a, b in zip(back.frames, msg.frames, strict=True))  # no copy


@pytest.mark.parametrize("msg", [m for m in SAMPLES if _CODECS[type(m).KIND].build],
                         ids=lambda m: type(m).KIND)
def test_a_record_built_field_by_field_is_the_dataclasss_own(msg: WireMessage) -> None:
    """The kinds a scheduler receives are decoded through the slots' setters (wire's
    ``_builder``), not ``__init__``: the same record, defaults for what a header leaves
    out, and still frozen."""
    header, _ = encode(msg)
    codec = _CODECS[type(msg).KIND]
    required = {name: getattr(msg, name) for name in codec.required}
    back = decode({"t": header["t"], **{k: header[k] for k in required}})
    assert back == type(msg)(**required) and type(back) is type(msg)
    for f in dataclasses.fields(back):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(back, f.name, getattr(back, f.name))


def test_what_a_scheduler_receives_takes_the_fast_path() -> None:
    assert all(_CODECS[k].build is not None
               for k in ("hello", "rq", "hb", "fetch", "first", "done", "read_failed"))
    assert _CODECS["prefill"].build is None  # frames and a __post_init__: the generic path


@pytest.mark.parametrize("fabric_cls", [InProcFabric, ZmqFabric])
def test_round_trip_across_a_fabric(fabric_cls: type) -> None:
    """msgpack gives lists back: the decoder restores tuples so records compare equal."""
    fabric = fabric_cls()
    a, b = fabric.endpoint("a"), fabric.endpoint("b")
    try:
        for msg in SAMPLES:
            header, frames = encode(msg)
            a.send(b.address, header, frames)
            raw = b.recv(timeout=5)
            assert raw is not None
            back = decode(raw.header, raw.buffers)
            assert back == msg
            for f in dataclasses.fields(back):
                if str(f.type).startswith("tuple") and f.name != "frames":
                    assert isinstance(getattr(back, f.name), tuple)
            if isinstance(msg, Layer):
                assert isinstance(back, Layer)
                for got, want in zip(back.frames, msg.frames, strict=True):
                    np.testing.assert_array_equal(got, want)
                    assert got.dtype == want.dtype
    finally:
        a.close()
        b.close()


def test_heartbeat_derived_facts() -> None:
    hb = next(m for m in SAMPLES if isinstance(m, Heartbeat))
    assert hb.hbm_free_blocks == 48 and hb.busy_fraction == 0.5
    assert Heartbeat(0, 1, -1, 0).busy_fraction is None  # not measured yet


def test_the_engines_counters_are_the_heartbeats_counter_fields() -> None:
    """One definition: Counters totals EngineCounters' fields and a heartbeat carries them
    flat, so a counter added to EngineCounters reaches the scheduler without a second edit."""
    counters = Counters()
    counters.add(busy_s=0.5, batches=2)
    counters.add(busy_s=0.25, compactions=1)
    snap = counters.snapshot()
    assert list(snap) == [f.name for f in dataclasses.fields(EngineCounters)]
    assert counters.total("busy_s") == 0.75
    header, _ = encode(Heartbeat(1, 2, 3, 4, **snap))
    back = decode(header)
    assert isinstance(back, Heartbeat)
    assert {name: getattr(back, name) for name in snap} == snap
    assert back.batches == 2 and isinstance(back.batches, int)
    with pytest.raises(KeyError):
        counters.add(no_such_counter=1)
    # decoding reads fields by name: the header's key order does not matter
    assert decode(dict(reversed(list(header.items())))) == back


def test_bad_headers_are_refused_with_a_reason() -> None:
    with pytest.raises(WireError, match="unknown message kind 'nope'"):
        decode({"t": "nope"})
    with pytest.raises(WireError, match="unknown message kind None"):
        decode({"rid": 1})
    with pytest.raises(WireError, match="first message lacks at, token"):
        decode({"t": "first", "eid": 0, "rid": 1, "att": 0})
    # a field that must be a list (of lists) is refused, not raised out of the decoder
    fetch = {"t": "fetch", "eid": 0, "group": 0, "role": "prefill"}
    with pytest.raises(WireError, match="fetch reports is not a list of lists"):
        decode({**fetch, "reports": 5})
    with pytest.raises(WireError, match="fetch reports is not a list of lists"):
        decode({**fetch, "reports": [5]})
    with pytest.raises(WireError, match="hb layer_slack_s is not a list$"):
        decode({"t": "hb", "eid": 0, "n": 1, "seen": 0, "rq": 0, "layer_slack_s": None})


KEYS = tuple(f"{i:032x}" for i in range(200))  # 200 16-byte block keys, as a dispatch carries


@pytest.mark.parametrize("fabric_cls", [InProcFabric, ZmqFabric])
def test_dispatch_keys_travel_as_one_binary_frame(fabric_cls: type) -> None:
    """A dispatch's block keys are one frame of raw digests, not a msgpack list of hex
    strings in the header; the engine gets the same hex keys back, in order."""
    msg = Decode(9, 1, 4, (1, 2, 3), 4, 200 * 64, KEYS, 64 * 64, "inproc://e", False)
    header, frames = encode(msg)
    assert "keys" not in header
    assert len(frames) == 2 and frames[1].dtype == np.uint8 and frames[1].shape == (200, 16)
    assert frames[1].tobytes() == b"".join(bytes.fromhex(k) for k in KEYS)
    fabric = fabric_cls()
    a, b = fabric.endpoint("a"), fabric.endpoint("b")
    try:
        a.send(b.address, header, frames)
        raw = b.recv(timeout=5)
        assert raw is not None
        back = decode(raw.header, raw.buffers)
    finally:
        a.close()
        b.close()
    assert isinstance(back, Decode) and isinstance(back.keys, KeyArray)
    assert list(back.keys) == list(KEYS) and back.keys == KEYS and back == msg
    assert back.keys[0] == KEYS[0] and back.keys[-1] == KEYS[-1]
    assert list(back.keys[3:7]) == list(KEYS[3:7]) and len(back.keys[:64]) == 64
    empty = Prefill(9, 1, 5, (1, 2), 0, (), 0, "inproc://e", True, False)
    assert decode(*encode(empty)) == empty and len(decode(*encode(empty)).keys) == 0


def test_bad_key_frames_are_refused_with_a_reason() -> None:
    with pytest.raises(WireError, match="hex strings"):
        KeyArray(("zz" * 16,))
    with pytest.raises(WireError, match="one even length"):
        KeyArray(("ab" * 16, "ab" * 8))
    with pytest.raises(WireError, match="hex strings"):
        KeyArray(("abc",))
    header, frames = encode(Decode(9, 1, 4, (1, 2), 4, 64, KEYS[:1], 0, "inproc://e", False))
    with pytest.raises(WireError, match="keys frame is not a 2-D byte array"):
        decode(header, [frames[0], np.zeros(16, np.uint8)])
    with pytest.raises(WireError, match="keys frame is not a 2-D byte array"):
        decode(header, [frames[0], np.zeros((1, 4), np.int32)])


def test_a_zmq_mailbox_refuses_unreadable_messages_and_reads_the_next_intact() -> None:
    """Raw parts a peer should not send: a header that is not msgpack, an undeclared extra
    part, buffers that do not match the header. Each is refused by ``decode`` with why, and
    the message after it is read whole (the mailbox stays in step)."""
    import msgpack
    import zmq

    fabric = ZmqFabric()
    ep = fabric.endpoint("mailbox")
    raw = zmq.Context.instance().socket(zmq.PUSH)
    raw.connect(ep.address)
    good, _ = encode(First(0, 9, 1, 77, 12.5))
    try:
        raw.send(b"\xc1 not msgpack")  # 0xc1 is never valid msgpack
        raw.send_multipart([msgpack.packb(good), b"an undeclared part"])
        raw.send_multipart([msgpack.packb({**good, "_b": [["|u1", [4]], ["|u1", [4]]]}),
                            b"four"])
        raw.send(msgpack.packb(good))
        got = [m for m in (ep.recv(timeout=10) for _ in range(5)) if m is not None]
        assert len(got) == 5
        first = First(0, 9, 1, 77, 12.5)
        with pytest.raises(WireError, match="unreadable message: a header that is not"):
            decode(got[0].header, got[0].buffers)
        assert decode(got[1].header, got[1].buffers) == first
        with pytest.raises(WireError, match="unreadable message: a header that is not"):
            decode(got[2].header, got[2].buffers)  # the undeclared part, on its own
        with pytest.raises(WireError, match="1 buffer parts that do not match the header's 2"):
            decode(got[3].header, got[3].buffers)
        assert decode(got[4].header, got[4].buffers) == first
        assert ep.recv(timeout=0) is None
    finally:
        raw.close(linger=0)
        ep.close()
