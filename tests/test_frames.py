"""Metrics frames (telemetry/frames.py): an engine registry as layout + values, expanded back
to snapshot rows, and merged for /metrics exactly as snapshot rows are."""

from __future__ import annotations

import math

import msgpack

from dualpath_cli.api.render_bench import engine_registry, synthetic_view
from dualpath_cli.telemetry.exposition import render_prometheus
from dualpath_cli.telemetry.frames import FrameMerger, expand_frame, frame, is_frame
from dualpath_cli.telemetry.registry import MetricsRegistry


def _wire(fr: dict) -> dict:
    """What the scheduler gets: the frame after msgpack (lists, no tuples)."""
    return msgpack.unpackb(msgpack.packb(fr))


def _registry() -> MetricsRegistry:
    r = MetricsRegistry()
    r.counter("dualpath_storage_read_blocks_total", node=0, role="prefill").inc(5)
    r.gauge("dualpath_prefetch_accuracy_ratio", node=0).set(0.25)
    r.histogram("dualpath_storage_read_latency_seconds", node=0, tier="store").observe_many(
        [1e-4, 0.02, 3.0])
    return r


def test_a_frame_expands_to_the_registrys_snapshot() -> None:
    r = _registry()
    fr = _wire(frame(r))
    assert is_frame(fr) and not is_frame(r.snapshot())
    assert expand_frame(fr) == r.snapshot()


def test_the_layout_id_changes_only_when_a_series_appears() -> None:
    r = _registry()
    lid = frame(r)["lid"]
    r.counter("dualpath_storage_read_blocks_total", node=0, role="prefill").inc(1)
    assert frame(r)["lid"] == lid  # a value changed, not the layout
    r.counter("dualpath_storage_read_blocks_total", node=1, role="prefill").inc(1)
    assert frame(r)["lid"] != lid


def test_frames_render_the_same_page_as_snapshot_rows() -> None:
    view = synthetic_view(2, 3, 2, layers=2)
    regs = {e.engine_id: engine_registry(e, layers=2) for e in view.engines}
    # the cases the merge rules name: a value not available, an engine with a series the
    # others lack, a shared NIC (maximum), a ratio (mean)
    regs[0].gauge("dualpath_storage_reads_in_flight", node=0).set(math.nan)
    regs[1].counter("dualpath_storage_cancelled_reads_total", node=9).inc(3)
    regs[2].gauge("dualpath_storage_shaped_bandwidth_bytes_per_second", node=1).set(7e9)
    regs[3].gauge("dualpath_prefetch_accuracy_ratio", node=1).set(0.9)
    rows = {eid: {"metrics": r.snapshot()} for eid, r in regs.items()}
    frames = {eid: _wire(frame(r)) for eid, r in regs.items()}
    expected = render_prometheus(view, engine_metrics=rows)
    merger = FrameMerger()
    assert render_prometheus(view, engine_frames=frames, merger=merger) == expected
    # the next scrape reuses the remembered layouts, with new values
    for r in regs.values():
        r.counter("dualpath_storage_prefetched_blocks_total", node=0).inc(2)
    rows = {eid: {"metrics": r.snapshot()} for eid, r in regs.items()}
    frames = {eid: _wire(frame(r)) for eid, r in regs.items()}
    assert render_prometheus(view, engine_frames=frames, merger=merger) == \
        render_prometheus(view, engine_metrics=rows)


def test_a_frame_whose_values_do_not_fit_its_layout_is_left_out() -> None:
    a, b = _registry(), _registry()
    bad = _wire(frame(b))
    bad["values"] = bad["values"][:-1]
    merged = FrameMerger().merge({0: _wire(frame(a)), 1: bad, 2: {"not": "a frame"}})
    assert merged.scalars["dualpath_storage_read_blocks_total"] == {("0", "prefill"): 5.0}
    les, counts, total, count = merged.hists["dualpath_storage_read_latency_seconds"][
        ("0", "store")]
    assert count == 3 and counts[-1] == 3 and les[-1] == "+Inf"
    assert math.isclose(total, 3.0201)
