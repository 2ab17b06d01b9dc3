"""The drill's rows: one per fault class the project can make, and what each must show.

Why a catalogue: the rows are the acceptance test of the operator surface, so what each
expects (workflow, subject, grade, deadline, the metric that must move) is written down in
one place, from the issue's contract (deaths and leaves within 2 s at CRITICAL, degradation
within 10 s) and never tuned to what the product says today. A row that cannot be made here
(no joined node to stop, no way to fill the store) is kept, skipped with its reason.

Each row makes its fault through the same doors an operator has: ``PATCH /api/v1/faults``
(audited, token needed) for the injectable kinds (faultspec.py: a store that fails reads
with EIO, one that refuses writes as full, ...), a signal to an engine process for a death
(only where the cluster runs on this host), a flipped byte in a stored block file for a
corrupt block (only where the store is a local directory; the runtime keeps no DRAM copy
by default, storage.dram_cache 0, so the next turn that needs the block reads it).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dualpath_cli.errors import DualPathError
from dualpath_cli.services.drill_score import Expect, MetricSample, metric_values
from dualpath_cli.telemetry.status import Status
from dualpath_cli.telemetry.view import ClusterView

__all__ = ["Target", "Made", "Row", "ROWS", "row_names", "corrupt_in", "DEGRADE_S",
           "DEATH_S", "FIX_DROP"]

#: The issue's deadlines: a death or a leave within 2 s, a degradation within 10 s.
DEATH_S = 2.0
DEGRADE_S = 10.0
#: A fix judged by an evidence value (``Row.fix_drops``) helped when it took the value to
#: at most this share of what it was (two copies of a block: about half).
FIX_DROP = 0.75
#: How long a node told to leave may take to drain and exit before the drill starts it again
#: (the node's own drain is bounded by 30 s).
NODE_EXIT_S = 45.0


@dataclass(frozen=True, slots=True)
class Target:
    """What the rows need to know of the cluster under test (read once, healthy)."""

    status: Status
    view: ClusterView
    local: bool  # its processes run on this host (a state file here names it)
    store: Path | None  # its store directory, where it is local
    #: blocks the row's load read from the store before the fault, most-read first (the
    #: runner fills it in from ``/metrics``): the blocks the load needs from the store
    read_blocks: tuple[str, ...] = ()
    #: nodes by their store reads in the same stretch, most first
    read_nodes: tuple[int, ...] = ()
    #: a directory the drill owns for this cluster (its own clusters' work directory,
    #: removed when it stops them): where a node it starts again logs. None: the temporary
    #: directory (an operator's node outlives the drill, and so does its log)
    scratch: Path | None = None

    def node_name(self, node: int) -> str:
        """The operator's name of ``node`` (``D1``), else ``N``."""
        m = self.status.membership
        return (m.name_of(node) if m is not None else None) or str(node)

    def engines(self, role: str) -> list[Any]:
        """The ready engines of ``role``, by id."""
        return sorted((e for e in self.view.engines if e.role == role and e.state == "ready"),
                      key=lambda e: e.engine_id)

    def storage_node(self) -> int:
        """The node a storage fault targets: the first decode node (D1 in the default
        1P2D), else node 0."""
        decode = self.engines("decode")
        return decode[0].node if decode else 0

    def reading_node(self) -> int:
        """The node whose store the load read most before the fault (P0 under the drill's
        load on the default 1P2D: the prefill side reads most prefixes), else
        :meth:`storage_node`."""
        return self.read_nodes[0] if self.read_nodes else self.storage_node()


@dataclass
class Made:
    """A fault as made: its label, the id to clear it by, and how to undo it."""

    label: str
    expect: Expect
    fault_id: int = 0
    engine: int = -1
    node: int = -1
    undo: Callable[[], None] | None = None
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Row:
    """One fault class.

    Args:
        name: what ``--only`` takes.
        how: ``api`` (a fault SPEC), ``kill`` (a signal to an engine), ``corrupt`` (a block
            file), ``leave`` (a joined node's launcher told to stop), ``none`` (cannot be
            made: ``why_not``).
        spec: the SPEC, ``{node}``/``{engine}`` filled from the target.
        role: for engine rows, the role of the engine to fault.
        workflow / grade / deadline_s: what diagnose must say, by when.
        metric: the metric family that must move (``None``: none exists, which fails).
        why_not: for ``none`` rows, why the fault cannot be made.
        fix_drops: the finding's evidence value the applied fix must lower (by
            :data:`FIX_DROP`) where the grade honestly stays: the fault's own reads keep
            coming at its rate, so copies of hot blocks halve each copy's share of the
            store's reads without taking it under the hot share. "": the grade must drop.
        on_reads: the fault goes on the node whose store the load reads most
            (:meth:`Target.reading_node`), not the first decode node: a fault that acts
            per read is seen only through reads, and a rule needs its minimum of them.
    """

    name: str
    how: str
    workflow: str | None = None
    grade: str = "WARNING"
    deadline_s: float = DEGRADE_S
    spec: str = ""
    role: str = "decode"
    metric: str | None = None
    why_not: str = ""
    fix_drops: str = ""
    on_reads: bool = False

    def skip_reason(self, t: Target) -> str:
        """Why this row cannot run against ``t`` ("": it can)."""
        if self.how == "none":
            return self.why_not
        if self.how == "kill" and not t.local:
            return "the engines run on another host: a death is made with a signal here"
        if self.how == "kill" and not t.engines(self.role):
            return f"no ready {self.role} engine"
        if self.how == "kill" and not all(e.pid for e in t.engines(self.role)):
            return "in-process engines have no process to kill"
        if self.how == "corrupt" and (t.store is None or not (t.store / "blocks").is_dir()):
            return "the store is not a local directory with blocks"
        if self.how == "leave":
            joined = [n for n in (t.status.membership.nodes if t.status.membership else ())
                      if n.role == "decode" and n.state == "serving"]
            if not t.local or len(joined) < 2 or not _joined_launcher(t):
                return ("no joined decode node (launch --role decode --join) on this host to "
                        "stop while another serves; the embedded default runs every node in "
                        "one launcher")
        return ""

    def make(self, t: Target, inject: Callable[[Sequence[str]], int]) -> Made:
        """Make the fault on ``t`` (``inject`` sends SPECs through the API, returning the
        new fault's id)."""
        node = t.reading_node() if self.on_reads else t.storage_node()
        if self.how == "api":
            engine = _engine_on(t, self.role)
            spec = self.spec.format(node=node, engine=engine)
            fid = inject([spec])
            on_node = spec.split(":", 1)[1].startswith("node=")
            subject = (f"node {t.node_name(node)}" if on_node else f"engine {engine}")
            subjects: tuple[str, ...] = ((subject, "block ") if self.name == "hot_blocks"
                                         else (subject,))
            # a fault on an engine is also rightly named by its node (one engine a node)
            if not on_node:
                subjects += (f"node {t.node_name(_node_of(t, engine))}",)
            return Made(spec, Expect(self.workflow, subjects, self.grade, self.deadline_s),
                        fault_id=fid, engine=engine, node=node if on_node else
                        _node_of(t, engine))
        if self.how == "kill":
            victim = t.engines(self.role)[-1]
            os.kill(int(victim.pid), signal.SIGKILL)
            name = t.node_name(victim.node)
            return Made(f"kill -9 {self.role} engine {victim.engine_id} ({name})",
                        Expect(self.workflow, (f"engine {victim.engine_id}", f"node {name}",
                                               f"role {self.role}"),
                               self.grade, self.deadline_s),
                        engine=victim.engine_id, node=victim.node)
        if self.how == "corrupt":
            assert t.store is not None
            before = corrupt_in(t.status)
            path, key = corrupt_one_block(t.store, t.read_blocks)
            # the store is shared: whichever node reads the block next finds it corrupt
            return Made(f"corrupt block {key[:12]}", Expect(self.workflow, (
                        f"block {key}", f"block {key[:12]}", "node "), self.grade,
                        self.deadline_s, words=("corrupt", "checksum", "quarantin")),
                        detail={"block": key, "path": str(path), "store": str(t.store),
                                "corrupt_before": before})
        if self.how == "leave":
            pid, node, name = _joined_launcher(t) or (0, -1, "")
            again = node_relauncher(pid, t.scratch)
            os.kill(pid, signal.SIGTERM)
            engine = next((e.engine_id for e in t.engines("decode") if e.node == node), -1)
            made = Made(f"node {name} leaves", Expect(self.workflow, (f"node {name}",
                        "role decode"), self.grade, self.deadline_s), node=node,
                        engine=engine, detail={"rejoin": name})
            made.undo = lambda: made.detail.update(again())
            return made
        raise ValueError(f"row {self.name}: nothing to make")

    def status_reports(self, made: Made, st: Status) -> bool:
        """Whether ``status`` shows the fault: listed among the faults in force, an engine
        or node not serving, more corrupt blocks in its store lines than when it was made."""
        if self.how == "api":
            return any(f.id == made.fault_id for f in st.faults)
        if self.how == "corrupt":
            return corrupt_in(st) > int(made.detail.get("corrupt_before", 0))
        if self.how in ("kill", "leave"):
            m = st.membership
            node_down = m is not None and any(n.node == made.node and n.state != "serving"
                                              for n in m.nodes)
            return st.engines_healthy < st.engines_total or node_down
        return False

    def metrics_report(self, made: Made, base: list[MetricSample],
                       now: list[MetricSample]) -> bool:
        """Whether the row's metric moved as the fault makes it move."""
        if self.metric is None:
            return False
        m = self.metric
        if m == "dualpath_engine_up":
            return any(s.name == m and s.labels.get("engine") == str(made.engine)
                       and s.value == 0 for s in now) or not any(
                s.name == m and s.labels.get("engine") == str(made.engine) for s in now)
        if m == "dualpath_storage_shaped_bandwidth_bytes_per_second":
            node = str(made.node)
            return metric_values(now, m, node=node) < metric_values(base, m, node=node)
        if m == "dualpath_engine_service_seconds":
            return _slower_than_peers(now, m, made.engine)
        if m == "dualpath_scheduler_requeued_turns_total":
            return (metric_values(now, m, reason="kv_lost")
                    > metric_values(base, m, reason="kv_lost"))
        if m == "dualpath_hbm_fragmentation_ratio":
            return metric_values(now, m, engine=str(made.engine)) >= 0.5
        if m == "dualpath_storage_read_latency_seconds":
            node = str(made.node)

            def mean(ss: list[MetricSample]) -> tuple[float, float]:
                return (metric_values(ss, m + "_sum", node=node, tier="store"),
                        metric_values(ss, m + "_count", node=node, tier="store"))

            (s0, c0), (s1, c1) = mean(base), mean(now)
            return c1 > c0 and (s1 - s0) / (c1 - c0) >= 0.5 * _latency_s(made.label)
        if m in ("dualpath_storage_read_errors_total", "dualpath_storage_write_errors_total"):
            # the faulted node's own counter (a refused write: refused as full)
            labels = {"node": str(made.node)}
            if m == "dualpath_storage_write_errors_total":
                labels["reason"] = "full"
            return metric_values(now, m, **labels) > metric_values(base, m, **labels)
        return metric_values(now, m) > metric_values(base, m)  # a counter that grew


def _slower_than_peers(now: list[MetricSample], m: str, engine: int) -> bool:
    """Whether ``engine``'s compute per request is at least twice the median of its role
    peers' (the slow-service rule's factor) in one scrape."""
    mine = [s for s in now if s.name == m and s.labels.get("engine") == str(engine)]
    if not mine:
        return False
    role = mine[0].labels.get("role")
    peers = sorted(s.value for s in now if s.name == m and s.labels.get("role") == role
                   and s.labels.get("engine") != str(engine))
    if not peers or peers[len(peers) // 2] <= 0:
        return False
    return mine[0].value >= 2.0 * peers[len(peers) // 2]


def _latency_s(spec: str) -> float:
    from dualpath_cli.faultspec import parse_fault

    try:
        return parse_fault(spec).latency_s
    except ValueError:
        return 0.0


def _engine_on(t: Target, role: str) -> int:
    engines = t.engines(role) or t.engines("decode") or t.engines("prefill")
    return engines[0].engine_id if engines else 0


def _node_of(t: Target, engine: int) -> int:
    return next((e.node for e in t.view.engines if e.engine_id == engine), engine)


def _joined_launcher(t: Target) -> tuple[int, int, str] | None:
    """A decode node's own launcher process on this host (pid, node, name): the parent of
    its engines when that is not the cluster's launcher; None when every node runs in
    one launcher (the embedded default)."""
    import psutil

    parents: dict[int, set[int]] = {}
    for e in t.engines("decode"):
        try:
            parents.setdefault(e.node, set()).add(psutil.Process(int(e.pid)).ppid())
        except (psutil.Error, TypeError, ValueError):
            continue
    roots = set().union(*parents.values()) if parents else set()
    if len(roots) < 2:
        return None
    node = max(parents)
    return next(iter(parents[node])), node, t.node_name(node)


def corrupt_in(st: Status) -> int:
    """Corrupt blocks found since start, all nodes, as ``status`` lists them."""
    return sum(n.corrupt_blocks for n in st.storage)


def node_relauncher(pid: int, log_dir: Path | None = None) -> Callable[[], dict[str, Any]]:
    """How to start the launcher ``pid`` again with its own command, directory and
    environment (read now, before it is told to stop): the undo of a leave. The returned
    call waits (bounded) for the old launcher to finish draining and exit, starts the same
    command in a session of its own (an operator's node outlives the drill), and returns
    its pid and log file, for the row's notes.

    Raises (the returned call):
        DualPathError: the old launcher did not exit within :data:`NODE_EXIT_S`.
    """
    import subprocess
    import tempfile

    import psutil

    from dualpath_cli.services.drill_cluster import RELAUNCH_LOG_PREFIX

    proc = psutil.Process(pid)
    cmd, cwd, env = proc.cmdline(), proc.cwd(), proc.environ()

    def again() -> dict[str, Any]:
        if not _exits(proc, NODE_EXIT_S):
            raise DualPathError(f"the node's launcher (pid {pid}) did not exit within "
                                f"{NODE_EXIT_S:g} s of its SIGTERM")
        fd, log = tempfile.mkstemp(prefix=RELAUNCH_LOG_PREFIX, suffix=".log", dir=log_dir)
        with os.fdopen(fd, "w") as err:
            new = subprocess.Popen(cmd, cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                                   stdout=subprocess.DEVNULL, stderr=err,
                                   start_new_session=True)
        return {"pid": new.pid, "log": log}

    return again


def _exits(proc: Any, timeout: float) -> bool:
    """Whether ``proc`` (a psutil.Process) exits within ``timeout``; a zombie has exited
    (its parent, not the drill, reaps it)."""
    import time

    import psutil

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.2)
    return False


def _copied_keys(replica_root: Path) -> set[str]:
    """Blocks with a copy on the replica root beside the store (the drill's own cluster puts
    one there, and ``long-tail --fix`` copies hot blocks to it): a reader may take the copy,
    so corrupting such a block's stored file proves nothing."""
    if not replica_root.is_dir():
        return set()
    return {p.name.removesuffix(".kv") for p in replica_root.rglob("*.kv")}


def corrupt_one_block(store: Path, read: Sequence[str] = ()) -> tuple[Path, str]:
    """Change one payload byte of a stored block file, and of every copy of it on the
    replica root beside the store (its checksum tells; the header does not), so whichever
    copy a reader takes is corrupt.

    Which block: the first of ``read`` (blocks the load was just reading from the store,
    most-read first) that is stored: engines keep a prefix in HBM once read, so the store
    is read only for some blocks, and a corrupt block nobody reads is no incident any
    surface can see (checksums are checked on read). With none of those, the first stored
    block with no copy, else the first block. The byte is incremented, not XOR-ed, so a
    second drill on a block nobody read yet leaves it corrupt, not repaired."""
    replica = store.parent / "replica"
    copied = _copied_keys(replica)
    files = sorted(p for p in (store / "blocks").rglob("*.kv") if not p.name.startswith("."))
    if not files:
        raise FileNotFoundError(f"no block files under {store / 'blocks'}")
    by_key = {p.name.removesuffix(".kv"): p for p in files}
    alone = [p for p in files if p.name.removesuffix(".kv") not in copied]
    wanted = [by_key[k] for k in read if k in by_key]
    path = (wanted or alone or files)[0]
    key = path.name.removesuffix(".kv")
    copies = sorted(replica.rglob(path.name)) if key in copied else []
    for f in (path, *copies):
        _bump_payload_byte(f)
    return path, key


def _bump_payload_byte(path: Path) -> None:
    with open(path, "r+b") as f:
        f.seek(4096 + 7)
        byte = f.read(1)
        f.seek(4096 + 7)
        f.write(bytes([(byte[0] + 1) & 0xFF]) if byte else b"\x01")


ROWS: tuple[Row, ...] = (
    Row("snic_throttle", "api", "snic-imbalance", "CRITICAL",
        spec="snic_throttle:node={node},fraction=0.25",
        metric="dualpath_storage_shaped_bandwidth_bytes_per_second"),
    # on the store the load reads (store-latency needs 10 reads of the node: the first
    # decode node's store gets about 1 a second under the drill's load, P0's about 15)
    Row("read_latency", "api", "snic-imbalance", "WARNING",
        spec="read_latency:node={node},latency=200ms",
        metric="dualpath_storage_read_latency_seconds", on_reads=True),
    # also on the store the load reads: a failed read is seen only when there is a read
    Row("read_errors", "api", "store-health", "WARNING",
        spec="read_errors:node={node},rate=0.5", metric="dualpath_storage_read_errors_total",
        on_reads=True),
    Row("store_full", "api", "store-health", "WARNING", spec="store_full:node={node}",
        metric="dualpath_storage_write_errors_total"),
    # its fix (copies on the replica roots) needs a store with replica roots: on a cluster
    # without them (joined nodes launched without --replica-root) the finding says to launch
    # with them, and the row applies no fix (services/drill.py, _fix_for)
    Row("hot_blocks", "api", "long-tail", "WARNING",
        spec="hot_blocks:node={node},count=4,rate=50",
        metric="dualpath_storage_read_blocks_total", fix_drops="hot_share"),
    # CRITICAL by the documented rule (hbm-frag: CRITICAL >= 0.8): pinning every 4th free
    # block leaves free runs of 3 blocks, a score of 1 - 3/free, about 1.0 (not 0.75)
    Row("hbm_frag", "api", "hbm-frag", "CRITICAL", spec="hbm_frag:engine={engine},stride=4",
        metric="dualpath_hbm_fragmentation_ratio"),
    Row("slow_compute", "api", "long-tail", "WARNING",
        spec="slow_compute:engine={engine},factor=8",
        metric="dualpath_engine_service_seconds"),
    Row("fabric_drop", "api", "fabric", "WARNING", spec="fabric_drop:engine={engine}",
        role="prefill", metric="dualpath_scheduler_requeued_turns_total"),
    Row("corrupt_block", "corrupt", "store-health", "WARNING",
        metric="dualpath_storage_corrupt_blocks_total"),
    Row("kill_decode", "kill", "membership", "CRITICAL", DEATH_S, role="decode",
        metric="dualpath_engine_up"),
    Row("kill_prefill", "kill", "membership", "CRITICAL", DEATH_S, role="prefill",
        metric="dualpath_engine_up"),
    # a leave on purpose while another decode node serves is less capacity, not an outage:
    # WARNING (a role with no engine left is CRITICAL; the row needs two decode nodes)
    Row("node_leave", "leave", "membership", "WARNING", DEATH_S, metric="dualpath_engine_up"),
)


def row_names() -> list[str]:
    """What ``--only`` accepts."""
    return [r.name for r in ROWS]
