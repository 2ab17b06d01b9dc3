"""The simulated cluster's machines: nodes, their engines, and the engine groups that fetch.

Built once per run from the setup and the cost model; the simulation keeps the lists and
moves turns through them.
"""

from __future__ import annotations

from dataclasses import dataclass

from dualpath_cli.core.costs import CostModel
from dualpath_cli.core.groups import node_groups
from dualpath_cli.core.types import Role
from dualpath_cli.sim.setup import SimSetup
from dualpath_cli.sim.state import DEngine, Group, Node, PEngine

__all__ = ["Topology", "build_topology"]


@dataclass
class Topology:
    """The machines of one run, in order: PE nodes, groups and engines before DE ones.

    ``engines`` is indexed by engine id (a snapshot's ``engine_id``); ``pe_idle`` holds the
    PE groups with nothing to fetch (all of them at the start).
    """

    nodes: list[Node]
    pe_groups: list[Group]
    de_groups: list[Group]
    pes: list[PEngine]
    des: list[DEngine]
    engines: list[PEngine | DEngine]
    pe_idle: set[int]


def build_topology(s: SimSetup, cost: CostModel) -> Topology:
    """Build the nodes, engines and groups of ``s``, each group's fetch tick phased apart.

    Groups are numbered in order, PE groups first; a group's engines are its nodes'
    engines, node by node (``nodes_per_group`` consecutive nodes of one role, as
    :mod:`dualpath_cli.core.groups` says).
    """
    hw = s.hardware
    g = hw.gpus_per_node
    buf = float(hw.dram_buffer_bytes)
    nodes: list[Node] = []
    pe_groups: list[Group] = []
    de_groups: list[Group] = []
    pes: list[PEngine] = []
    des: list[DEngine] = []
    engines: list[PEngine | DEngine] = []
    for role, first, count in ((Role.PREFILL, 0, s.prefill_nodes),
                               (Role.DECODE, s.prefill_nodes, s.decode_nodes)):
        for run in node_groups(count, s.nodes_per_group):
            grp: Group | None = None
            for pos in run:
                node = Node(first + pos, role, cost.snic_rate, buf)
                nodes.append(node)
                if grp is None:
                    grp = Group(len(pe_groups) + len(de_groups), role, node)
                    (pe_groups if role is Role.PREFILL else de_groups).append(grp)
                node_snaps = []
                for _ in range(g):
                    idx = len(engines)
                    e: PEngine | DEngine
                    if role is Role.PREFILL:
                        e = PEngine(idx, node, grp, cost.pe_hbm_tokens, cost.cnic_kv_rate)
                        pes.append(e)
                    else:
                        e = DEngine(idx, node, grp, cost.de_hbm_tokens, cost.cnic_kv_rate)
                        des.append(e)
                    engines.append(e)
                    node.engines.append(e)
                    grp.engines.append(e)
                    grp.snaps.append(e.snap)
                    node_snaps.append(e.snap)
                grp.nodes.append((node, node_snaps))
            assert grp is not None
            grp.tok = sum(sn.tok for sn in grp.snaps)
            grp.hbm_free = sum(sn.hbm_free for sn in grp.snaps if sn.healthy)
    for grp in pe_groups:
        grp.idle = True
    phase = {grp.idx: (i + 0.5) / len(pe_groups) for i, grp in enumerate(pe_groups)}
    phase.update({grp.idx: (i + 0.5) / len(de_groups) for i, grp in enumerate(de_groups)})
    period = s.calibration.fetch_period_s
    for grp in (*pe_groups, *de_groups):
        grp.tick_ph = phase[grp.idx] * period
    return Topology(nodes, pe_groups, de_groups, pes, des, engines,
                    {grp.idx for grp in pe_groups})
