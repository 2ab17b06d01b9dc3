"""The knobs of one embedded run, and how they come from a deployment config.

Why apart from the system: the bench command, the benchmark script and the tests all build
options, from flags or from :func:`dualpath_cli.config.load_config`; the system only starts
what the options say. Everything here is in base units (bytes/s, tokens, seconds).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dualpath_cli.config import LoadedConfig
from dualpath_cli.config.schema import check_built
from dualpath_cli.core.controllers import CONFIG_KEYS
from dualpath_cli.core.groups import node_groups
from dualpath_cli.core.hierarchy import check_subs, default_subs
from dualpath_cli.core.policies import ALIASES
from dualpath_cli.core.reference_model import MODEL_CONFIGS
from dualpath_cli.errors import ConfigError
from dualpath_cli.storage import get_codec

__all__ = ["RuntimeOptions", "options_from_config", "runtime_model_for",
           "DEFAULT_BATCH_WINDOW_S"]

#: How long the scheduler's loop waits, once it has handled every message waiting, before
#: it takes the next ones (``scheduler.batch_window``): it then handles what arrived
#: meanwhile in one pass under one lock. Why: at the paper's scale ~7,400 messages a second
#: reach it, and woken for each one the loop paid a wake-up, a lock pass and a cold cache per
#: message; batched it pays them per batch (bench/control_plane.py: ~0.05 cores of ~0.95
#: at 48P96D) for at most this much added latency a message (a turn's first token and end,
#: a group's fetch), against a 100 ms fetch period and TTFTs of seconds.
DEFAULT_BATCH_WINDOW_S = 0.002


@dataclass
class RuntimeOptions:
    """Shape and knobs of one embedded run (base units: bytes/s, tokens, seconds).

    Args:
        prefill_nodes / decode_nodes: the P/D spec (1P2D by default).
        gpus_per_node: engines per node (they share the node's storage NIC).
        model: reference-model profile name (runtime.model MODEL_CONFIGS).
        block_tokens: KV block size in tokens.
        snic_bw: storage-NIC bandwidth per node, each direction (<= 0: unshaped).
        cnic_bw: compute-NIC bandwidth per engine (<= 0: unshaped).
        hbm_blocks: HBM capacity per engine, in blocks.
        policy: a policy of the one table (:data:`dualpath_cli.core.policies.POLICIES`:
            basic, layerwise, round-robin, dualpath, random, split, seed-select, oracle, or
            one a plugin registered).
        store_dir: block directory (None: in-memory store, in-process cluster only).
        replica_dirs: replica roots beside ``store_dir`` for copies of hot blocks
            (``storage.replica_roots``; storage/replicas.py).
        processes: one process per engine over ZeroMQ (False: threads over queues).
        alpha / beta: scheduler thresholds in tokens.
        z_factor: the DE high-token factor Z.
        quota_s: PE compute quota per forward batch (seconds of predicted compute).
        flops_rate: achieved FLOP/s of the PE predictor (0: calibrate on this machine).
        codec: storage codec (raw ``fp16``: the KV must stay bit-exact).
        dram_cache_bytes: loader DRAM cache per node (0: every read crosses the NIC).
        fetch_s: group leaders' fetch period.
        heartbeat_s: engine heartbeat period.
        heartbeat_timeout: seconds of silence before an engine is declared dead. A crashed
            engine process is reported at once by the cluster (its sentinel), so this only
            catches hangs; 5 s keeps a stall on a loaded host from throwing away in-flight
            work (an engine that was only silent comes back with its next report).
        decision_log: JSONL file for scheduler decisions.
        decision_ring: decisions the scheduler keeps in memory for the read model (a ring;
            older ones are dropped, counts by class are kept apart).
        decision_ring_bytes: bytes the ring's packed decisions may hold (fewer than
            ``decision_ring`` are kept when they need more); the same again for the
            finished requests' timelines.
        prefix_cache_tokens: prompt tokens the scheduler keeps to reuse agents' prefix keys
            (least recently used agents dropped beyond it).
        no_engine_wait_s: how long a live cluster's turn waits for a role with no serving
            engine to come back before it is answered 503 (``scheduler.no_engine_wait``).
        batch_window_s: the scheduler loop's wait between two batches of messages
            (``scheduler.batch_window``, :data:`DEFAULT_BATCH_WINDOW_S`; 0: none).
        sources: where alpha, beta, z_factor, the quota and the read side came from
            (``config``, ``flag``, ``default``; keys ``alpha``, ``beta``, ``z_factor``,
            ``quota``, ``read_side``); a key not given reads ``config``.
        layerwise_prefill: False turns layerwise prefill off whatever the policy.
        controllers: dynamic controller (``alpha``, ``beta``, ``quota``) -> on.
        control_interval_s: seconds between two controller steps.
        random_seed: seed of the ``random`` policy's read side.
        engines: ``real`` (the reference model) or ``emulated`` (engines that speak the
            protocol over real sockets and take their time from the cost model of
            ``emulated_model`` on ``emulated_hardware``, ``emulated_hosts`` processes,
            ``emulated_speed`` emulated seconds per second; :mod:`dualpath_cli.runtime.emulated`).
        local_engines: False starts the scheduler alone (``launch --role scheduler``): nodes
            join it (:mod:`dualpath_cli.cluster.join`).
        curve: ZeroMQ CURVE between processes (``cluster.curve``: ``auto`` on when the
            fabric binds off loopback, ``on``, ``off``; :mod:`dualpath_cli.transfer.curve`).
        curve_key_file: where the cluster's CURVE key pair is kept (0600; ``None``: a
            fresh pair in memory for this run).
        api_rate_limit: requests per second per client address the HTTP API serves
            (``cluster.api_rate_limit``; 0: no limit; :mod:`dualpath_cli.api.ratelimit`).
        restart: restart an engine whose process died (``cluster.restart``; engines as
            processes only: :mod:`dualpath_cli.cluster.supervisor`).
        restart_backoff_s: the first restart's wait, doubling to 30 s
            (``cluster.restart_backoff``).
        nodes_per_group: nodes per engine group (``cluster.nodes_per_group``;
            :mod:`dualpath_cli.core.groups`); nodes that join keep one node per group.
        hierarchical: a root routes each new turn to one of ``sub_schedulers``
            sub-schedulers, each over a contiguous slice of the prefill and decode groups
            (``scheduler.hierarchical``; :mod:`dualpath_cli.runtime.hierarchy`).
        sub_schedulers: how many (0: :func:`dualpath_cli.core.hierarchy.default_subs` of the
            group counts); 1 to min(prefill groups, decode groups).
    """

    prefill_nodes: int = 1
    decode_nodes: int = 2
    gpus_per_node: int = 1
    model: str = "tiny"
    block_tokens: int = 16
    snic_bw: float = 0.0
    cnic_bw: float = 0.0
    hbm_blocks: int = 4096
    policy: str = "dualpath"
    store_dir: Path | None = None
    replica_dirs: tuple[Path, ...] = ()
    processes: bool = False
    alpha: int = 10**9
    beta: int = 10**9
    z_factor: float = 1.05
    quota_s: float = 0.3
    flops_rate: float = 0.0
    codec: str = "fp16"
    dram_cache_bytes: int = 0
    fetch_s: float = 0.005
    heartbeat_s: float = 0.05
    heartbeat_timeout: float = 5.0
    decision_log: Path | None = None
    decision_ring: int = 10_000
    decision_ring_bytes: int = 8 << 20
    prefix_cache_tokens: int = 32 << 20
    batch_window_s: float = DEFAULT_BATCH_WINDOW_S
    no_engine_wait_s: float = 30.0
    sources: dict[str, str] = field(default_factory=dict)
    layerwise_prefill: bool = True
    controllers: dict[str, bool] = field(default_factory=dict)
    control_interval_s: float = 1.0
    random_seed: int = 0
    extra: dict[str, Any] = field(default_factory=dict)
    engines: str = "real"
    emulated_hosts: int = 4
    emulated_model: str = "ds660b"
    emulated_hardware: str = "hopper"
    emulated_speed: float = 1.0
    local_engines: bool = True
    curve: str = "auto"
    api_rate_limit: float = 5000.0
    restart: bool = True
    restart_backoff_s: float = 0.5
    curve_key_file: Path | None = None
    nodes_per_group: int = 1
    hierarchical: bool = False
    sub_schedulers: int = 0

    def __post_init__(self) -> None:
        if self.model not in MODEL_CONFIGS:
            raise ConfigError(f"runtime model {self.model!r}: expected one of "
                              f"{', '.join(sorted(MODEL_CONFIGS))}")
        if get_codec(self.codec).name != "fp16":
            raise ConfigError(f"storage.codec {self.codec!r}: the embedded runtime keeps the "
                              "reference model's fp16 KV bit-exact, so it needs codec fp16")
        if self.engines not in ("real", "emulated"):
            raise ConfigError(f"engines {self.engines!r}: expected real or emulated")
        if self.curve not in ("auto", "on", "off"):
            raise ConfigError(f"cluster.curve {self.curve!r}: expected auto, on or off")
        for name in ("prefill_nodes", "decode_nodes", "gpus_per_node", "block_tokens",
                     "hbm_blocks", "decision_ring", "decision_ring_bytes", "emulated_hosts",
                     "nodes_per_group"):
            if getattr(self, name) < 1:
                raise ConfigError(f"runtime option {name} must be >= 1, got "
                                  f"{getattr(self, name)}")
        if self.prefix_cache_tokens < 0:
            raise ConfigError(f"runtime option prefix_cache_tokens must be >= 0, got "
                              f"{self.prefix_cache_tokens}")
        if not self.batch_window_s >= 0:
            raise ConfigError(f"runtime option batch_window_s must be >= 0, got "
                              f"{self.batch_window_s}")
        if self.nodes_per_group > 1 and not self.local_engines:
            raise ConfigError(f"cluster.nodes_per_group {self.nodes_per_group}: nodes that "
                              "join a scheduler-only launch (--join, --backend ray) form one "
                              "group each; set cluster.nodes_per_group=1")
        if self.sub_schedulers and not self.hierarchical:
            raise ConfigError(f"scheduler.sub_schedulers {self.sub_schedulers}: set only with "
                              "hierarchical scheduling (scheduler.hierarchical=true)")
        if self.hierarchical:  # a count that does not fit the groups: one line
            pre, dec = self.groups()
            check_subs(self.subs, len(pre), len(dec))

    def groups(self) -> tuple[list[int], list[int]]:
        """The prefill and the decode group ids (a group is named by its first node)."""
        pre = [g.start for g in node_groups(self.prefill_nodes, self.nodes_per_group)]
        dec = [self.prefill_nodes + g.start
               for g in node_groups(self.decode_nodes, self.nodes_per_group)]
        return pre, dec

    @property
    def subs(self) -> int:
        """Sub-schedulers a hierarchical run starts (the core default of the group counts
        when not given)."""
        pre, dec = self.groups()
        return self.sub_schedulers or default_subs(len(pre), len(dec))


def runtime_model_for(profile: str) -> str:
    """The runtime model whose profile is called ``profile`` (``reference`` -> ``tiny``)."""
    for name, cfg in MODEL_CONFIGS.items():
        if cfg.to_profile().name == profile:
            return name
    names = ", ".join(cfg.to_profile().name for cfg in MODEL_CONFIGS.values())
    raise ConfigError(f"model.profile {profile!r}: the embedded runtime runs the numpy "
                      f"reference model; use one of {names}")


def options_from_config(loaded: LoadedConfig, **overrides: Any) -> RuntimeOptions:
    """Runtime options from an effective config (``overrides`` win, e.g. ``policy``).

    P/D shape, GPUs per node, model, block size, codec, NIC bandwidths, HBM per GPU, alpha
    and beta (resolved to tokens), Z, the compute quota, the fetch period, the policy
    (``scheduler.read_side``), layerwise prefill, the dynamic controllers and the random
    seed all come from the config.

    Raises:
        ConfigError: a model the runtime cannot run, or a block layout it does not write.
    """
    cfg = loaded.config
    check_built(cfg)
    if cfg.storage.layout != "layer_major":
        raise ConfigError(f"storage.layout {cfg.storage.layout!r}: the embedded runtime "
                          "stores layer_major blocks (its layer-by-layer reads need them); "
                          "set storage.layout to layer_major")
    name = runtime_model_for(cfg.model.profile)
    model = MODEL_CONFIGS[name]
    if (cfg.model.n_layers, cfg.model.kv_bytes_per_token_layer) != (
            model.n_layers, model.kv_bytes_per_token_layer):
        raise ConfigError(f"model: {cfg.model.n_layers} layers x "
                          f"{cfg.model.kv_bytes_per_token_layer} B do not match the runtime "
                          f"model {name!r} ({model.n_layers} x "
                          f"{model.kv_bytes_per_token_layer} B)")
    bt = cfg.storage.block_size
    block_bytes = model.n_layers * bt * model.kv_bytes_per_token_layer
    values: dict[str, Any] = {
        "prefill_nodes": cfg.cluster.prefill_nodes, "decode_nodes": cfg.cluster.decode_nodes,
        "gpus_per_node": cfg.cluster.gpus_per_node, "model": name, "block_tokens": bt,
        "snic_bw": cfg.hardware.node_read_bandwidth, "cnic_bw": cfg.hardware.cnic_bandwidth,
        "hbm_blocks": max(1, cfg.hardware.hbm_per_gpu // block_bytes),
        "alpha": loaded.resolved.alpha_tokens, "beta": loaded.resolved.beta_tokens,
        "z_factor": cfg.scheduler.z_factor, "quota_s": loaded.resolved.compute_quota_s,
        "codec": cfg.storage.codec, "fetch_s": cfg.scheduler.fetch_period,
        "policy": ALIASES.get(cfg.scheduler.read_side, cfg.scheduler.read_side),
        "layerwise_prefill": cfg.scheduler.layerwise_prefill,
        "curve": cfg.cluster.curve,
        "api_rate_limit": cfg.cluster.api_rate_limit,
        "restart": cfg.cluster.restart,
        "restart_backoff_s": cfg.cluster.restart_backoff,
        "controllers": {name: bool(getattr(cfg.scheduler, key))
                        for name, key in CONFIG_KEYS.items()},
        "random_seed": cfg.scheduler.random_seed,
        "decision_ring": cfg.scheduler.decision_ring,
        "decision_ring_bytes": cfg.scheduler.decision_ring_bytes,
        "prefix_cache_tokens": cfg.scheduler.prefix_cache_tokens,
        "batch_window_s": cfg.scheduler.batch_window,
        "no_engine_wait_s": cfg.scheduler.no_engine_wait,
        "replica_dirs": tuple(Path(r).expanduser() for r in cfg.storage.replica_roots),
        "dram_cache_bytes": cfg.storage.dram_cache,
        "nodes_per_group": cfg.cluster.nodes_per_group,
        "hierarchical": cfg.scheduler.hierarchical,
        "sub_schedulers": cfg.scheduler.sub_schedulers,
    }
    keys = {"alpha": "scheduler.alpha", "beta": "scheduler.beta",
            "z_factor": "scheduler.z_factor", "quota": "scheduler.compute_quota"}
    sources = {name: _source_label(loaded.source(key).kind) for name, key in keys.items()}
    sources["read_side"] = _source_label(loaded.source("scheduler.read_side").kind)
    option = {"quota": "quota_s", "read_side": "policy"}
    sources.update({name: "flag" for name in sources if option.get(name, name) in overrides})
    values["sources"] = sources
    values.update(overrides)
    return RuntimeOptions(**values)


def _source_label(kind: str) -> str:
    """A config layer kind as a threshold source: ``default``, ``flag`` or ``config``."""
    return kind if kind in ("default", "flag") else "config"
