"""The one table of configuration keys: name, kind (parser), default, unit and meaning.

Loading, validation, ``config init``, ``config show`` and docs/config.md are all driven by
:data:`KEYS`, so a key cannot exist in one place and be missing in another. A key whose
default is ``None`` takes its value from the selected hardware or model profile
(``from_profile``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dualpath_cli.config.model import parse_pd
from dualpath_cli.config.quantities import (
    ALPHA_FORMS,
    BETA_FORMS,
    QUOTA_FORMS,
    parse_alpha,
    parse_beta,
    parse_quota,
)
from dualpath_cli.core.policies import POLICIES
from dualpath_cli.core.profiles import HARDWARE_PROFILES, MODEL_PROFILES
from dualpath_cli.errors import ConfigError, UnitError, UsageError
from dualpath_cli.units import (
    parse_bandwidth,
    parse_bytes,
    parse_duration,
    parse_flops,
    parse_tokens,
)

__all__ = [
    "Kind",
    "Key",
    "KEYS",
    "KEY_BY_PATH",
    "SECTIONS",
    "CUSTOM",
    "READ_SIDE_POLICIES",
    "CODECS",
    "LAYOUTS",
    "KV_DTYPES",
    "UNBUILT",
    "check_built",
]

CUSTOM = "custom"
READ_SIDE_POLICIES = tuple(POLICIES)  # the built-in rows of core's one policy table
KV_DTYPES = ("fp16", "bf16", "fp32", "fp8")
# The names of core.layout.LAYOUTS and storage.codecs.CODECS, kept here as literals so that
# loading a config imports neither numpy nor ml_dtypes (the CLI starts in well under a
# second); tests/test_cli_import_graph.py checks that they equal those registries.
LAYOUTS: tuple[str, ...] = ("layer_major", "token_major")
CODECS: tuple[str, ...] = ("fp16", "bf16", "fp32", "fp8_e4m3", "fp8_e4m3_layer")
SECTIONS = ("cluster", "hardware", "model", "storage", "scheduler")


@dataclass(frozen=True, slots=True)
class Kind:
    """How a key's raw value is parsed and checked, and how docs describe it."""

    name: str
    unit: str
    parse: Callable[[Any], Any]


def _text(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise UnitError(f"expected a non-empty string, got {value!r}")
    return value.strip()


def _choice(options: tuple[str, ...]) -> Callable[[Any], str]:
    def parse(value: Any) -> str:
        if not isinstance(value, str) or value not in options:
            raise UnitError(f"{value!r} is not one of: {', '.join(options)}")
        return value
    return parse


_TRUE = {"true", "yes", "on", "1"}
_FALSE = {"false", "no", "off", "0"}


def _boolean(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return value.strip().lower() in _TRUE
    raise UnitError(f"expected true or false, got {value!r}")


def _integer(minimum: int) -> Callable[[Any], int]:
    def parse(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            raise UnitError(f"expected a whole number, got {value!r}")
        try:
            number = int(value)
        except ValueError:
            raise UnitError(f"expected a whole number, got {value!r}") from None
        if number < minimum:
            raise UnitError(f"must be at least {minimum}, got {number}")
        return number
    return parse


def _at_least(parse: Callable[[Any], Any], minimum: float, what: str) -> Callable[[Any], Any]:
    def checked(value: Any) -> Any:
        number = parse(value)
        if number < minimum:
            raise UnitError(f"{value!r} must be {what}")
        return number
    return checked


def _at_most(parse: Callable[[Any], Any], maximum: float, what: str) -> Callable[[Any], Any]:
    def checked(value: Any) -> Any:
        number = parse(value)
        if number > maximum:
            raise UnitError(f"{value!r} must be {what}")
        return number
    return checked


def _positive(parse: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def checked(value: Any) -> Any:
        number = parse(value)
        if number <= 0:
            raise UnitError(f"{value!r} must be greater than zero")
        return number
    return checked


def _real(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise UnitError(f"expected a number, got {value!r}")
    try:
        number = float(value)
    except ValueError:
        raise UnitError(f"expected a number, got {value!r}") from None
    if not math.isfinite(number):
        raise UnitError(f"expected a finite number, got {value!r}")
    return number


def _rate(value: Any) -> float:
    """A finite number in ASCII digits, shown without a ``.0`` when whole (``5000``)."""
    if isinstance(value, str) and not value.isascii():  # float() reads "١٢٣" as 123
        raise UnitError(f"expected a number in ASCII digits, got {value!r}")
    number = _real(value)
    return int(number) if number.is_integer() and abs(number) < 2**53 else number


def _fraction(value: Any) -> float:
    number = _real(value)
    if not 0 < number <= 1:
        raise UnitError(f"must be in (0, 1], got {value!r}")
    return number


def _pd(value: Any) -> Any:
    try:
        return parse_pd(value)
    except UsageError as err:  # reported as a field problem
        raise UnitError(str(err)) from None


TEXT = Kind("string", "-", _text)
BOOL = Kind("bool", "true/false", _boolean)
COUNT = Kind("integer", "count", _integer(1))
NON_NEGATIVE_INT = Kind("integer", "count", _integer(0))
PD = Kind("P/D spec", "nodes", _pd)
BYTES = Kind("bytes", "bytes", _positive(parse_bytes))
BYTES_ANY = Kind("bytes", "bytes", parse_bytes)  # 0 allowed (0: off)
BANDWIDTH = Kind("bandwidth", "bytes/s", _positive(parse_bandwidth))
DURATION = Kind("duration", "seconds", _positive(parse_duration))
NO_ENGINE_WAIT = Kind("duration", "seconds",
                      _at_most(_at_least(parse_duration, 0.0, "at least 0"), 600.0,
                               "at most 10m"))
RESTART_BACKOFF = Kind("duration", "seconds",
                       _at_most(_at_least(parse_duration, 0.001, "at least 1ms"), 30.0,
                                "at most 30s"))
BATCH_WINDOW = Kind("duration", "seconds", _at_most(parse_duration, 0.05, "at most 50ms"))
FLOP_RATE = Kind("FLOP/s", "FLOP/s", _positive(parse_flops))
FRACTION = Kind("fraction", "ratio", _fraction)
TOKENS = Kind("tokens", "tokens", _positive(parse_tokens))
TOKENS_ANY = Kind("tokens", "tokens", parse_tokens)
PARAMS = Kind("count", "parameters", _positive(parse_tokens))
Z = Kind("number", "factor", _at_least(_real, 1.0, "at least 1"))
ALPHA = Kind("alpha", "bytes | tokens | seconds", parse_alpha)
BETA = Kind("beta", "tokens | seconds", parse_beta)
QUOTA = Kind("quota", "seconds | FLOPs", parse_quota)


def _paths(value: Any) -> tuple[str, ...]:
    """Directories as a YAML list or one comma-separated string ("" or [] for none)."""
    if isinstance(value, str):
        parts = value.split(",")
    elif isinstance(value, (list, tuple)) and all(isinstance(p, str) for p in value):
        parts = list(value)
    else:
        raise UnitError(f"expected a list of directories or a comma-separated string, got "
                        f"{value!r}")
    return tuple(p.strip() for p in parts if p.strip())


PATHS = Kind("paths", "-", _paths)


def _choices(options: tuple[str, ...]) -> Kind:
    return Kind("choice", "-", _choice(options))


def _curve_mode(value: Any) -> str:
    """``auto``, ``on`` or ``off`` (YAML reads a bare on/off as a boolean: taken as such)."""
    if isinstance(value, bool):
        return "on" if value else "off"
    return _choice(("auto", "on", "off"))(value)


def _policy_name(value: Any) -> str:
    """A name in core's policy table as it is now (a plugin's policy once registered)."""
    from dualpath_cli.core.policies import ALIASES

    if not isinstance(value, str) or (value not in POLICIES and value not in ALIASES):
        raise UnitError(f"{value!r} is not one of: {', '.join(POLICIES)}")
    return value


@dataclass(frozen=True, slots=True)
class Key:
    """One configuration key.

    Attributes:
        section: top-level section ("" for top-level keys such as ``preset``).
        name: key inside its section.
        kind: parser and documentation of the value.
        default: raw default (as it would be written in YAML); ``None`` means the value
            comes from a profile, see ``from_profile``.
        doc: one-line meaning.
        from_profile: ``(section whose profile, attribute of the core profile)``.
        forms: accepted input forms, for docs.
    """

    section: str
    name: str
    kind: Kind
    default: Any
    doc: str
    from_profile: tuple[str, str] | None = None
    forms: str = ""

    @property
    def path(self) -> str:
        """Dotted key, e.g. ``scheduler.alpha``."""
        return f"{self.section}.{self.name}" if self.section else self.name

    @property
    def env_var(self) -> str:
        """The DUALPATH_* variable that sets this key."""
        if not self.section:
            return f"DUALPATH_{self.name.upper()}"
        return f"DUALPATH_{self.section.upper()}__{self.name.upper()}"


def _hw(name: str, kind: Kind, attr: str, doc: str) -> Key:
    return Key("hardware", name, kind, None, doc, from_profile=("hardware", attr))


def _mdl(name: str, kind: Kind, attr: str, doc: str) -> Key:
    return Key("model", name, kind, None, doc, from_profile=("model", attr))


def _preset_names() -> tuple[str, ...]:
    from dualpath_cli.config.presets import PRESETS  # presets import nothing from here
    return tuple(PRESETS)


PRESET = Kind("choice", "-", lambda value: _choice(_preset_names())(value))

KEYS: tuple[Key, ...] = (
    Key("", "preset", PRESET, "embedded",
        "Named bundle of values applied over the defaults (embedded, small, medium, large, "
        "paper)."),
    # cluster
    Key("cluster", "pd", PD, "1P2D",
        "Prefill and decode node counts, e.g. 2P4D (2 PE nodes, 4 DE nodes)."),
    Key("cluster", "gpus_per_node", COUNT, None,
        "GPUs per node; one engine per GPU. Default: from the hardware profile.",
        from_profile=("hardware", "gpus_per_node")),
    Key("cluster", "nodes_per_group", COUNT, 1,
        "Nodes per engine group (paper 6.1: a group is all PEs or all DEs, e.g. an "
        "expert-parallel group spanning nodes; it fetches together through the first engine "
        "of its first node). Groups are consecutive nodes of one role; when a role's node "
        "count is not a multiple, its last group is smaller. The PE fetch compares each "
        "engine's own node's read queue with alpha. Launches whose nodes join "
        "(--role scheduler) keep one node per group."),
    Key("cluster", "curve", Kind("choice", "-", _curve_mode), "auto",
        "ZeroMQ CURVE (authenticated, encrypted) on the control and KV sockets between "
        "nodes: auto is on when they bind a non-loopback address, off on loopback."),
    Key("cluster", "api_rate_limit",
        Kind("number", "requests/s", _at_least(_rate, 0.0, "at least 0 (0: no limit)")), 5000,
        "Requests per second the HTTP API serves one client address (a token bucket; 429 with "
        "Retry-After past it). Read-only GETs (status, metrics) have four times this in a "
        "bucket of their own, so monitoring is never throttled by work. 0: no limit; "
        "DUALPATH_LIMIT_API_RATE overrides it for one server."),
    Key("cluster", "restart", BOOL, True,
        "Restart an engine whose process died (launch, bench): its turns are re-queued, it "
        "restarts after a backoff (cluster.restart_backoff, doubling to 30s, afresh once it "
        "has run 60s) and says hello again; five deaths in 60s is a crash loop: it stays "
        "down (a CRITICAL membership finding). false: a dead engine stays dead."),
    Key("cluster", "restart_backoff", RESTART_BACKOFF, "500ms",
        "Wait before an engine's first restart; each quick restart after it waits twice the "
        "last, up to 30s (tests set a few ms to reach a crash loop quickly)."),
    # hardware
    Key("hardware", "profile", _choices((*HARDWARE_PROFILES, CUSTOM)), "cpu",
        "Hardware profile the fields below default to ('custom': set them all)."),
    _hw("gpu_peak_flops", FLOP_RATE, "gpu_peak_flops", "Peak FLOP/s of one GPU (e.g. 989TFLOPS)."),
    _hw("mfu", FRACTION, "mfu", "Achieved fraction of peak FLOP/s (model FLOP utilisation)."),
    _hw("hbm_per_gpu", BYTES, "hbm_bytes", "HBM capacity of one GPU."),
    _hw("snic_bandwidth", BANDWIDTH, "snic_bandwidth", "Bandwidth of one storage NIC."),
    _hw("snics_per_node", COUNT, "snics_per_node", "Storage NICs per node."),
    _hw("cnic_bandwidth", BANDWIDTH, "cnic_bandwidth", "Compute-network NIC bandwidth per GPU."),
    _hw("dram_bandwidth", BANDWIDTH, "dram_bandwidth", "DRAM bandwidth of one node."),
    _hw("dram_buffer_per_node", BYTES, "dram_buffer_bytes",
        "DRAM set aside per node for the PE/DE KV buffer."),
    _hw("hbm_bandwidth", BANDWIDTH, "hbm_bandwidth",
        "HBM read bandwidth of one GPU (memory-bound decode; hopper 3.35 TB/s)."),
    # model
    Key("model", "profile", _choices((*MODEL_PROFILES, CUSTOM)), "reference",
        "Model profile the fields below default to ('custom': set them all)."),
    _mdl("n_layers", COUNT, "n_layers", "Transformer layers."),
    _mdl("kv_bytes_per_token_layer", BYTES, "kv_bytes_per_token_layer",
         "KV-cache bytes of one token in one layer."),
    _mdl("n_heads", COUNT, "n_heads", "Attention heads (FLOP model)."),
    _mdl("head_dim", COUNT, "head_dim", "Dimension of one attention head (FLOP model)."),
    _mdl("active_params", PARAMS, "active_params",
         "Parameters active per token, for linear-layer FLOPs (e.g. 37B)."),
    _mdl("attention_topk", NON_NEGATIVE_INT, "attention_topk",
         "Sparse-attention top-k (0 = dense attention)."),
    _mdl("kv_dtype", _choices(KV_DTYPES), "kv_dtype", "Element type of the KV cache."),
    _mdl("indexer_flops_per_token_layer", NON_NEGATIVE_INT, "indexer_flops_per_token_layer",
         "Sparse-attention indexer FLOPs per earlier token per layer, uncapped by top-k "
         "(DeepSeek DSA: 2 x indexer heads x indexer dim; 0 = none)."),
    # storage
    Key("storage", "root", TEXT, "~/.local/share/dualpath/kv",
        "Directory (or 3FS/NFS mount) holding KV blocks; ~ is expanded."),
    Key("storage", "replica_roots", PATHS, "",
        "Extra store roots for copies of hot blocks (comma-separated or a YAML list; each "
        "another 3FS directory or NFS export, i.e. other storage targets): blocks are "
        "written to root only, and reads of a block copied here (diagnose long-tail --fix) "
        "rotate over its copies. Empty: no replicas."),
    Key("storage", "block_size", TOKENS, 64, "Tokens per full block (the paper's example: 64)."),
    Key("storage", "dram_cache", BYTES_ANY, 0,
        "DRAM buffer cache of each engine's loader: verified blocks kept for later hits, "
        "and what storage warm fills (docs/warmup.md). 0: every read crosses the storage "
        "NIC."),
    Key("storage", "layout", _choices(LAYOUTS), "layer_major",
        "Byte layout of a full block: layer_major [layer, tokens, bytes] or token_major."),
    Key("storage", "codec", _choices(CODECS), "fp16",
        "Encoding of KV bytes on storage: raw fp16/bf16/fp32, or FP8 e4m3 with per-block or "
        "per-layer scales."),
    # scheduler
    Key("scheduler", "alpha", ALPHA, "3s",
        "Short-read-queue threshold; resolved to tokens (bytes / KV bytes per token, or tokens "
        "one node's storage NICs read in the given seconds).", forms=ALPHA_FORMS),
    Key("scheduler", "beta", BETA, "5s",
        "Unfinished-token limit per engine; resolved to tokens: prompt tokens (cached + new, "
        "the unit PE fetch charges) one GPU prefills in the given seconds, for a turn of "
        "reference_append new tokens after reference_context cached ones. Must resolve to at "
        "least one block.",
        forms=BETA_FORMS),
    Key("scheduler", "compute_quota", QUOTA, "300ms",
        "Predicted attention time allowed per prefill batch; resolved to seconds (FLOPs / "
        "achieved GPU FLOP/s).", forms=QUOTA_FORMS),
    Key("scheduler", "z_factor", Z, 1.05,
        "Z = z_factor x mean DE tokens: the high-token line in DE scheduling (at least 1)."),
    Key("scheduler", "read_side", Kind("choice", "-", _policy_name), "dualpath",
        "The policy used when no --policy flag is given (a row of the policy table: read "
        "rule, layerwise prefill, NIC shaping): " + ", ".join(READ_SIDE_POLICIES) + ", or one "
        "a plugin registers."),
    Key("scheduler", "fetch_period", DURATION, "100ms",
        "How often an engine group fetches work (our choice; the paper does not say)."),
    Key("scheduler", "batch_window", BATCH_WINDOW, "2ms",
        "Once the scheduler has handled every message waiting, it waits this long before "
        "taking the next ones, and handles what arrived meanwhile in one pass: fewer "
        "wake-ups and lock passes (about 0.05 of a core at 48P96D) for at most this "
        "much added latency per message. 0: each message handled as it arrives."),
    Key("scheduler", "no_engine_wait", NO_ENGINE_WAIT, "30s",
        "How long a turn waits for a role with no serving engine (no prefill or no decode "
        "engine: its nodes left or died) to come back before it is answered 503, stated in "
        "the error; a turn sent once that long has passed is answered at once. 0: at once."),
    Key("scheduler", "reference_context", TOKENS, "32K",
        "Cached context of the reference turn at which beta in seconds is converted to tokens "
        "(the 64K trace's mean context is about 32K)."),
    Key("scheduler", "reference_append", TOKENS, 429,
        "New (appended) tokens of the reference turn for beta in seconds (the paper's mean "
        "append on the 64K trace, Table 2: 429)."),
    Key("scheduler", "layerwise_prefill", BOOL, True,
        "Stream KV layer by layer while prefilling; false turns it off whatever the policy."),
    Key("scheduler", "hierarchical", BOOL, False,
        "Hierarchical scheduling for large clusters: a root routes each new turn to the "
        "least-loaded of N sub-schedulers (N = min(prefill, decode groups) / 4, at least 1), "
        "each running the flat algorithms over its own slice of the groups. Runs in sim, "
        "bench and launch (not with --join nodes or the Ray backend)."),
    Key("scheduler", "sub_schedulers", Kind("integer", "count", _integer(0)), 0,
        "Sub-schedulers of hierarchical scheduling (0: the default above); each owns at "
        "least one prefill and one decode group. Set only with scheduler.hierarchical."),
    Key("scheduler", "dynamic_alpha", BOOL, False,
        "Alpha follows the busiest storage NIC's utilisation (x0.9 above 80%, x1.1 below "
        "50%), one bounded step per interval."),
    Key("scheduler", "dynamic_beta", BOOL, False,
        "Beta follows the prefill GPUs' utilisation (x0.9 above 90%, x1.1 below 60%), one "
        "bounded step per interval."),
    Key("scheduler", "dynamic_quota", BOOL, False,
        "The compute quota follows the TTFT tail (x0.9 when p99/p50 is above 4, x1.1 below "
        "2), one bounded step per interval."),
    Key("scheduler", "random_seed", Kind("integer", "count", _integer(0)), 0,
        "Seed of the 'random' policy's read side (and the simulator's online arrivals)."),
    Key("scheduler", "decision_ring", Kind("integer", "count", _integer(1)), 10_000,
        "Decisions the running scheduler keeps in memory for the read model, the API and "
        "recordings (a ring: the oldest go first), and as many finished requests' "
        "timelines. Kept packed: about 50 bytes a decision and 200 a timeline at the "
        "default configuration."),
    Key("scheduler", "decision_ring_bytes", BYTES, 8 << 20,
        "Bytes the packed decisions may hold (and, apart, the timelines): with larger "
        "inputs (big engine groups) fewer than decision_ring are kept, not more memory. "
        "The default holds 10,000 decisions of up to about 800 bytes packed."),
    Key("scheduler", "prefix_cache_tokens", Kind("integer", "count", _integer(0)), 32 << 20,
        "Prompt tokens the scheduler keeps (4 bytes each) so an agent's next turn hashes "
        "only its new blocks. Beyond it the least recently used agents are dropped and "
        "their next prompt is hashed whole: size it to the agents in flight times their "
        "context (about 64M at the paper's 48P96D, 256 MiB)."),
)

KEY_BY_PATH: dict[str, Key] = {key.path: key for key in KEYS}


UNBUILT: dict[str, str] = {}
"""Keys accepted in a file (presets set them) but refused when switched on, with why (none
now: ``scheduler.hierarchical`` runs in the runtime too, runtime/hierarchy.py)."""


def check_built(config: Any, world: str = "runtime") -> None:
    """Refuse a config that switches on something not built yet in ``world``, in one line.

    Raises:
        ConfigError: a key of :data:`UNBUILT` is on (the simulator, ``world="sim"``, runs
            them all).
    """
    if world == "sim":
        return
    for path, why in UNBUILT.items():
        section, name = path.split(".", 1)
        if getattr(getattr(config, section), name):
            raise ConfigError(f"{path}: {why}")
