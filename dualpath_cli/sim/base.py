"""The state the stages of a simulated turn share, and the calls one stage makes on another.

Why a base class and a stack of stages: a simulation's event handlers are split by the stage
of a turn's life they model (:mod:`.fetch` the schedulers' fetches, :mod:`.kv_reads` the
storage NICs and DRAM buffers, :mod:`.prefill` the PE batches, :mod:`.decode` the DE batches,
:mod:`.control` the dynamic controllers). Each stage subclasses the one before it (fetch,
reads, prefill, decode, control), and :class:`~dualpath_cli.sim.cluster.Simulation` the
last: one line of inheritance, which mypyc compiles into one native class (no mixins: it
compiles single inheritance only; docs/simulator.md, "Compiled core"). A stage calls another
only through this class's declarations, never by its position in the stack. A handler still
calls another stage's handler with one plain method call and reads the shared state as plain
attributes: a large run is 50M events, so no helper object stands in between. Subclasses
(:mod:`.hierarchy`, :mod:`.measured`) override the handlers as before. This class only
declares; ``Simulation`` builds the state.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable
from typing import Any

from mypy_extensions import mypyc_attr

from dualpath_cli.core.controllers import Controllers, ControlStep
from dualpath_cli.core.costs import CostModel
from dualpath_cli.core.policies import Policy, SchedParams
from dualpath_cli.sim.events import EventLoop
from dualpath_cli.sim.online import StopRule
from dualpath_cli.sim.setup import SimSetup
from dualpath_cli.sim.state import DEngine, Group, Node, PEngine, Req
from dualpath_cli.sim.trace import AgentPlan
from dualpath_cli.workload.prefix_store import GlobalPrefixStore

__all__ = ["SimBase"]


@mypyc_attr(allow_interpreted_subclasses=True)
class SimBase(ABC):
    """Declarations only: the attributes and cross-stage calls of one simulated run."""

    # the run's definition and derived constants
    setup: SimSetup
    plans: list[AgentPlan]
    policy: Policy
    core_policy: Policy | None  # None: an unshaped policy (the oracle) plans no reads
    cost: CostModel
    alpha: int
    beta: int
    params: SchedParams
    _io: bool
    _layerwise: bool
    _period: float
    _quota: float
    _host_cores: int | None
    _overhead_each: float
    _computing: int
    _z_factor: float
    _full_blocks: bool
    _block_tokens: int
    _kvpt: int
    _topk: int
    _fixed_step_s: float | None
    _hbm_bw: float
    _decode_base_s: float
    _linear_s: dict[int, float]
    _bin_s: float
    # the event loop and its handler kinds
    loop: EventLoop
    _at: Callable[[float, int, Any], None]
    _heap: list[tuple[float, int, int, Any]]
    _ticket: Callable[[], int]
    K_PE_FETCH: int
    K_DE_DRAIN: int
    K_DE_FETCH: int
    K_READ: int
    K_PE_DONE: int
    K_JOIN: int
    K_STEP: int
    K_AGENT: int
    K_CHECK: int
    K_IO_RETRY: int
    K_CONTROL: int
    # the machines
    nodes: list[Node]
    pe_groups: list[Group]
    de_groups: list[Group]
    pes: list[PEngine]
    des: list[DEngine]
    engines: list[PEngine | DEngine]
    pe_idle: set[int]
    # the workload in flight and what was counted
    num_turns: list[int]
    next_turn: list[int]
    context: list[int]
    _shared_chains: list[list[int] | None]
    _stored_shared: set[int]
    _prefix_store: GlobalPrefixStore | None
    prompt_tokens: int
    hit_tokens: int
    shared_hit_tokens: int
    agent_start: list[float]
    agent_end: list[float]
    reqs: dict[int, Req]
    pe_queue: deque[Req]
    de_global: deque[Req]
    drain_pending: bool
    rid: int
    turns_done: int
    ordinal: int
    read_pe_tokens: int
    read_de_tokens: int
    joined_read_tokens: int
    record: bool
    samples: list[tuple[float, float, float, float]]
    stop_rule: StopRule | None
    stopped: str | None
    _total_turns: int
    # the dynamic controllers (:mod:`.control`)
    controllers: Controllers
    control_steps: list[ControlStep]
    _ctl_values: dict[str, float]
    _ctl_bytes: list[float]
    _ctl_busy: list[float]
    _ttfts: list[float] | None

    # ------------------------------------------------------------ calls across stages
    @abstractmethod
    def _start_turn(self, agent: int) -> None:
        """An agent's next turn arrives (:mod:`.cluster`)."""

    @abstractmethod
    def _wake(self, grp: Group, kind: int) -> None:
        """Schedule ``grp``'s fetch of ``kind`` at its next tick (:mod:`.fetch`)."""

    @abstractmethod
    def _start_io(self, req: Req) -> None:
        """Plan and queue a placed turn's KV reads (:mod:`.kv_reads`)."""

    @abstractmethod
    def _dram(self, node: Node, nbytes: float) -> None:
        """Count KV bytes through a node's DRAM (:mod:`.kv_reads`)."""

    @abstractmethod
    def _release(self, node: Node, nbytes: float) -> None:
        """Free read bytes from a node's DRAM buffer (:mod:`.kv_reads`)."""

    @abstractmethod
    def _pe_ready(self, req: Req) -> None:
        """A turn's KV is loaded: queue it for a prefill batch (:mod:`.prefill`)."""

    @abstractmethod
    def _start_batch(self, pe: PEngine) -> None:
        """Pack and run a PE's next prefill batch (:mod:`.prefill`)."""

    @abstractmethod
    def _slowdown(self) -> float:
        """How much slower engines compute sharing the host cores (:mod:`.decode`)."""

    @abstractmethod
    def _retime_decode(self, now: float, skip: DEngine | None) -> None:
        """Re-time the decode batches after the host-core share changed (:mod:`.decode`)."""
