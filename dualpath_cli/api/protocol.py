"""The one seam between the front-ends and a live cluster: :class:`ClusterClient`.

Why a Protocol: the CLI, the TUI and the recorder talk to a cluster through the HTTP client
(:class:`~dualpath_cli.api.client.DualPathClient`) and are tested against the shipped fake
(:class:`~dualpath_cli.api.fake.FakeClient`); both implement exactly these methods with
these signatures, so a front-end types its client as ``ClusterClient`` and never probes it
with ``getattr``. mypy checks each class against it (a ``TYPE_CHECKING`` assignment at the
end of its module), and
tests/test_api_fake.py checks that neither has a public method the other lacks.

The services cannot import the API, so they declare the narrower protocols they need
(services/recording.py's ``ViewSource``, services/tuning.py's ``TuneClient``); each is a
structural subset of this one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from dualpath_cli.telemetry.status import Status
from dualpath_cli.telemetry.stories import RequestListing, RequestStory
from dualpath_cli.telemetry.view import AuditEntry, ClusterView, Decision, EngineView, NodeView
from dualpath_cli.telemetry.warmup import Template, WarmUp

__all__ = ["ClusterClient"]


class ClusterClient(Protocol):
    """A client of one cluster's API (errors: :class:`~dualpath_cli.api.errors.ApiError`,
    one line; see DualPathClient for each call's failures)."""

    #: the API's base URL (shown in messages; never the token)
    url: str

    def __enter__(self) -> ClusterClient: ...

    def __exit__(self, *exc: object) -> None: ...

    def close(self) -> None:
        """Release the connection."""
        ...

    # -- read ---------------------------------------------------------------------------
    def healthz(self) -> bool:
        """True when the server process answers."""
        ...

    def readyz(self) -> bool:
        """True when every engine said hello and turns are admitted."""
        ...

    def status(self) -> Status:
        """State, shape, engines, queues, thresholds, audit, faults in force."""
        ...

    def view(self) -> ClusterView:
        """The whole ClusterView now."""
        ...

    def engines(self) -> list[EngineView]:
        """Every engine."""
        ...

    def nodes(self) -> list[NodeView]:
        """Every node."""
        ...

    def decisions(self, since: int = -1) -> list[Decision]:
        """Logged decisions with ``seq > since``, oldest first."""
        ...

    def request(self, request_id: int | str) -> RequestStory:
        """A request's story: the integer id, the OpenAI body's id or a client's
        ``x-request-id`` (telemetry/request_ids.py)."""
        ...

    def requests(self, state: str = "inflight", limit: int = 100,
                 after: int | None = None) -> RequestListing:
        """The turns in flight, or finished requests' stories."""
        ...

    def metrics_text(self) -> str:
        """The Prometheus exposition of ``/metrics``."""
        ...

    # -- control (token required) -------------------------------------------------------
    def update_scheduler(self, *, alpha: str | int | None = None,
                         beta: str | int | None = None, quota: str | float | None = None,
                         read_side: str | None = None) -> AuditEntry:
        """Change the running scheduler's thresholds."""
        ...

    def patch_scheduler(self, body: Mapping[str, object]) -> AuditEntry:
        """PATCH the scheduler with ``body`` as given."""
        ...

    def set_faults(self, specs: Sequence[str]) -> AuditEntry:
        """Inject faults given as SPEC texts."""
        ...

    def clear_faults(self) -> AuditEntry:
        """Undo every injected fault."""
        ...

    def clear_fault(self, fault_id: int) -> AuditEntry:
        """Undo the one injected fault numbered ``fault_id``."""
        ...

    def compact_hbm(self, engine_id: int) -> AuditEntry:
        """Defragment one engine's HBM pool."""
        ...

    def warm(self, templates: Sequence[Template], rate: str | None = None,
             role: str = "all") -> WarmUp:
        """Start warming the engines' DRAM caches with ``templates``."""
        ...

    def warm_status(self) -> WarmUp:
        """The last warm-up's plan and progress."""
        ...

    def replicate_blocks(self, blocks: Sequence[str], copies: int | None = None
                         ) -> AuditEntry:
        """Copy hot blocks to the store's replica roots."""
        ...

