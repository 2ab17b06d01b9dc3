"""Warm-up orchestration (seed 8.3, cold start): template prompts to block keys, a plan of
what the store holds, and a warm-up run offline (a store directory) or live (the engines).

The templates file (docs/warmup.md is the reference) is YAML or JSON: a list of templates,
or ``{"templates": [...]}``; each has a ``name`` and exactly one prompt form:

* ``tokens``: the token ids of the prefix;
* ``text``: text, as the OpenAI-compatible routes encode a text prompt (the reference
  model's byte tokenizer, no BOS);
* ``shared``: the trace format's shared-prefix segments ``[[seed, tokens], ...]``
  (docs/trace-format.md): the ids a trace replay sends for a shared system prompt.

A template warms the full blocks of its prompt that the store holds, walking the prefix
chain from the first block (a block after a missing one can never be a prefix hit).
Templates sharing a prefix share its blocks: each block is read once, in file order, so
the first templates are warm first.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from dualpath_cli.core.layout import BlockKey, Namespace, longest_cached_prefix, prefix_keys
from dualpath_cli.errors import UsageError
from dualpath_cli.limits import limit_value
from dualpath_cli.telemetry.warmup import Template
from dualpath_cli.units import format_bandwidth, parse_bandwidth

if TYPE_CHECKING:
    from dualpath_cli.cluster.system import RuntimeSystem

__all__ = ["TemplateError", "WarmPlan", "TemplatePlan", "DEFAULT_RATE",
           "load_templates", "parse_templates", "plan_warm", "parse_rate", "warm_store",
           "start_live", "live_progress"]

#: The default cap: a tenth of a node's storage NIC, so serving keeps the other nine.
DEFAULT_RATE = "10%"

#: Token ids of a trace replay's prompts lie in [0, 256): the runner's ``vocab_size``
#: (services/runner.py), which ``shared`` segments must use to match what a replay sends.
REPLAY_VOCAB = 256

_FORMS = ("tokens", "text", "shared")


class TemplateError(UsageError):
    """A templates file that cannot be used (one line: file, template, reason)."""


@dataclass(frozen=True, slots=True)
class TemplatePlan:
    """What one template warms: its full blocks, how many the store holds as a prefix, and
    how many of those an earlier template already warms."""

    name: str
    tokens: int
    blocks: int
    stored: int
    shared: int


@dataclass
class WarmPlan:
    """The keys to warm, in order (deduplicated), and the story per template."""

    templates: list[TemplatePlan]
    keys: list[BlockKey]
    block_nbytes: int
    dropped: int = 0  # stored blocks left out: more than the DRAM cache holds
    notes: list[str] = field(default_factory=list)

    @property
    def nbytes(self) -> int:
        """Block-file bytes the plan reads."""
        return len(self.keys) * self.block_nbytes

    def to_dict(self) -> dict[str, Any]:
        """JSON form."""
        return {"templates": [_plan_dict(t) for t in self.templates], "blocks": len(self.keys),
                "bytes": self.nbytes, "block_bytes": self.block_nbytes,
                "dropped_over_cache": self.dropped, "notes": list(self.notes)}


def _plan_dict(t: TemplatePlan) -> dict[str, Any]:
    """A template plan's fields as a dict."""
    return {"name": t.name, "tokens": t.tokens, "blocks": t.blocks, "stored": t.stored,
            "shared": t.shared}


# -- the templates file ----------------------------------------------------------------------
def load_templates(path: str | os.PathLike[str], vocab_size: int = 260) -> list[Template]:
    """Read and check a templates file (YAML or JSON).

    Raises:
        TemplateError: unreadable, too large, not YAML/JSON, or a bad template (one line).
    """
    where = os.fspath(path)
    limit = int(limit_value("request_bytes"))
    try:
        with open(path, "rb") as fh:
            data = fh.read(limit + 1)
    except OSError as err:
        raise TemplateError(f"{where}: cannot read: {err.strerror or err}") from None
    if len(data) > limit:
        raise TemplateError(f"{where}: larger than {limit:,} bytes (the request-body limit "
                            "DUALPATH_LIMIT_REQUEST_BYTES, which a live warm-up posts)")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise TemplateError(f"{where}: not UTF-8 text") from None
    return parse_templates(_parse_document(text, where), where, vocab_size)


def _parse_document(text: str, where: str) -> Any:
    if where.endswith(".json"):
        try:
            return json.loads(text)
        except json.JSONDecodeError as err:
            raise TemplateError(f"{where}:{err.lineno}: invalid JSON: {err.msg}") from None
        except (ValueError, RecursionError):
            raise TemplateError(f"{where}: invalid JSON: a number too long or nesting too "
                                "deep") from None
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)  # only a MarkedYAMLError has a place
        line = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or "not YAML or JSON"
        raise TemplateError(f"{where}{line}: invalid YAML: {problem}") from None
    except RecursionError:
        raise TemplateError(f"{where}: invalid YAML: nested too deeply") from None


def parse_templates(doc: Any, where: str = "templates", vocab_size: int = 260
                    ) -> list[Template]:
    """Templates from a parsed document (what :func:`load_templates` and the API share).

    Raises:
        TemplateError: the first problem, naming the template.
    """
    if isinstance(doc, dict):
        unknown = sorted(set(doc) - {"templates", "version"})
        if unknown:
            raise TemplateError(f"{where}: unknown key {unknown[0]!r}; expected templates "
                                "(and optionally version: 1)")
        if doc.get("version", 1) != 1:
            raise TemplateError(f"{where}: unsupported version {doc.get('version')!r}; this "
                                "reader supports version 1")
        doc = doc.get("templates")
    if not isinstance(doc, list) or not doc:
        raise TemplateError(f"{where}: expected a non-empty list of templates (or "
                            "templates: [...]), each with a name and tokens, text or shared")
    out: list[Template] = []
    seen: set[str] = set()
    for i, item in enumerate(doc, start=1):
        out.append(_template(item, f"{where}: template {i}", vocab_size))
        if out[-1].name in seen:
            raise TemplateError(f"{where}: template {i}: duplicate name {out[-1].name!r}")
        seen.add(out[-1].name)
    return out


def _template(item: Any, where: str, vocab: int) -> Template:
    if not isinstance(item, dict):
        raise TemplateError(f"{where}: expected a mapping with a name and tokens, text or "
                            f"shared, got {type(item).__name__}")
    name = item.get("name")
    if not isinstance(name, str) or not name.strip():
        raise TemplateError(f"{where}: 'name' must be a non-empty string")
    where = f"{where} ({name!r})"
    unknown = sorted(set(item) - {"name", *_FORMS})
    if unknown:
        raise TemplateError(f"{where}: unknown key {unknown[0]!r}; expected name and one of "
                            f"{', '.join(_FORMS)}")
    forms = [f for f in _FORMS if f in item]
    if len(forms) != 1:
        raise TemplateError(f"{where}: give exactly one of {', '.join(_FORMS)}"
                            + (f" (got {', '.join(forms)})" if forms else ""))
    value = item[forms[0]]
    tokens: list[int]
    if forms[0] == "tokens":
        if not isinstance(value, list) or not value:
            raise TemplateError(f"{where}: 'tokens' must be a non-empty list of token ids")
        for t in value:
            if not _is_int(t) or not 0 <= t < vocab:
                raise TemplateError(f"{where}: token id {t!r} is not an integer in "
                                    f"[0, {vocab})")
        tokens = list(value)
    elif forms[0] == "text":
        if not isinstance(value, str) or not value:
            raise TemplateError(f"{where}: 'text' must be a non-empty string")
        tokens = list(value.encode("utf-8"))  # the byte tokenizer, no BOS
    else:
        tokens = _shared_tokens(value, where, vocab)
    limit = int(limit_value("tokens"))
    if len(tokens) > limit:
        raise TemplateError(f"{where}: {len(tokens):,} tokens, more than the {limit:,} one "
                            "prompt may have (DUALPATH_LIMIT_TOKENS)")
    return Template(name.strip(), tuple(tokens))


def _shared_tokens(value: Any, where: str, vocab: int) -> list[int]:
    from dualpath_cli.workload.tokens import MAX_SEED, shared_prefix_ids

    if not isinstance(value, list) or not value:
        raise TemplateError(f"{where}: 'shared' must be a non-empty list of [seed, tokens]")
    segments: list[tuple[int, int]] = []
    for seg in value:
        if (not isinstance(seg, list) or len(seg) != 2 or not all(_is_int(v) for v in seg)
                or not 0 <= seg[0] <= MAX_SEED or seg[1] < 1):
            raise TemplateError(f"{where}: shared segment {seg!r}: expected [seed, tokens] "
                                f"with 0 <= seed <= {MAX_SEED} and tokens >= 1")
        segments.append((seg[0], seg[1]))
    if sum(n for _, n in segments) > int(limit_value("tokens")):
        raise TemplateError(f"{where}: the shared segments hold more tokens than one prompt "
                            "may have (DUALPATH_LIMIT_TOKENS)")
    return shared_prefix_ids(segments, min(vocab, REPLAY_VOCAB)).tolist()


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# -- the plan --------------------------------------------------------------------------------
def plan_warm(templates: Sequence[Template], namespace: Namespace,
              contains: Callable[[BlockKey], bool], block_nbytes: int,
              cache_bytes: int | None = None) -> WarmPlan:
    """Keys to warm: each template's stored prefix blocks, once each, in file order, cut to
    what ``cache_bytes`` holds (``None``: no cut)."""
    keys: list[BlockKey] = []
    seen: set[bytes] = set()
    plans: list[TemplatePlan] = []
    notes: list[str] = []
    for t in templates:
        chain = prefix_keys(t.tokens, namespace)
        stored = longest_cached_prefix(chain, contains)
        shared = 0
        for key in chain[:stored]:
            if key.raw in seen:
                shared += 1
                continue
            seen.add(key.raw)
            keys.append(key)
        plans.append(TemplatePlan(t.name, len(t.tokens), len(chain), stored, shared))
        if not chain:
            notes.append(f"template {t.name!r}: {len(t.tokens)} tokens, shorter than one "
                         f"{namespace.shape.block_tokens}-token block: nothing to warm")
        elif stored < len(chain):
            notes.append(f"template {t.name!r}: the store holds {stored} of its "
                         f"{len(chain)} blocks (serve it once to store the rest)")
    dropped = 0
    if cache_bytes is not None:
        room = cache_bytes // block_nbytes if block_nbytes else len(keys)
        if len(keys) > room:
            dropped = len(keys) - room
            keys = keys[:room]
            notes.append(f"{dropped} blocks left out: the DRAM cache holds {room} blocks "
                         "(the first templates' blocks are kept)")
    return WarmPlan(plans, keys, block_nbytes, dropped, notes)


def parse_rate(text: str | None, snic_bps: float) -> float:
    """The warm-up cap in bytes/s: a bandwidth (``200MB/s``, ``1Gbps``) or a share of the
    storage NIC (``10%``; the default). A share of an unshaped NIC has no meaning.

    Raises:
        UsageError / UnitError: a bad value, zero, or a share with no NIC rate.
    """
    value = (text or DEFAULT_RATE).strip()
    if value.endswith("%"):
        try:
            share = float(value[:-1])
        except ValueError:
            raise UsageError(f"invalid --rate {value!r}: expected a bandwidth (200MB/s, "
                             "1Gbps) or a share of the storage NIC (10%)") from None
        if not 0 < share <= 100:
            raise UsageError(f"invalid --rate {value!r}: a share must be in (0, 100]%")
        if not snic_bps > 0:
            raise UsageError(f"--rate {value}: the storage NIC is unshaped (no bandwidth "
                             "set), so a share of it means nothing; give a bandwidth, e.g. "
                             "--rate 200MB/s")
        return snic_bps * share / 100.0
    rate = parse_bandwidth(value)
    if not rate > 0:
        raise UsageError(f"invalid --rate {value!r}: must be more than 0")
    return rate


# -- offline: a store directory --------------------------------------------------------------
def warm_store(store: Any, plan: WarmPlan, rate_bps: float, cache_bytes: int, *,
               on_progress: Callable[[Any], None] | None = None) -> Any:
    """Warm a loader over ``store`` with ``plan`` at ``rate_bps``; returns the final
    :class:`~dualpath_cli.storage.warm.WarmProgress`.

    Offline there is no serving loader to keep warm: this reads the templates' blocks
    through a loader like an engine's (verifying every checksum, filling the OS page cache
    of a POSIX store) at the cap, which checks the store holds them whole and measures what
    the cap gives.
    """
    from dualpath_cli.storage import StorageLoader
    from dualpath_cli.storage.warm import Warmer
    from dualpath_cli.telemetry.registry import MetricsRegistry

    with StorageLoader(store, cache_bytes=max(cache_bytes, plan.block_nbytes),
                       block_nbytes=plan.block_nbytes, registry=MetricsRegistry()) as loader:
        warmer = Warmer(loader, plan.keys, rate_bps, block_nbytes=plan.block_nbytes)
        if on_progress is None:
            return warmer.run()
        warmer.start()
        while True:
            try:
                return warmer.wait(0.2)
            except TimeoutError:
                on_progress(warmer.progress())


# -- live: through the running system --------------------------------------------------------
def start_live(system: RuntimeSystem, templates: Sequence[Template], rate: str | None,
               role: str = "all") -> tuple[WarmPlan, dict[str, Any]]:
    """Plan against the live store and send each target engine its warm-up.

    ``system`` is a started :class:`~dualpath_cli.cluster.system.RuntimeSystem`. The cap is
    per node (the NIC is the node's): a node's targeted engines share it evenly.

    Raises:
        UsageError: a bad rate or role, emulated engines, or engines without a DRAM cache.
    """
    from dualpath_cli.storage.header import file_nbytes

    shape = system.shape
    block = file_nbytes(shape.full_nbytes)
    snic = system.opts.snic_bw if system.shaped else 0.0
    rate_bps = parse_rate(rate, float(snic or 0.0))
    cache = int(system.opts.dram_cache_bytes)
    plan = plan_warm(templates, system.namespace, system.store.contains, block, cache)
    sent = system.warm([k.hex for k in plan.keys], rate_bps, role)
    return plan, {"rate_bps": rate_bps, "rate": format_bandwidth(rate_bps), "role": role,
                  "engines": sent, "started": time.time()}


def live_progress(metrics: dict[int, dict[str, Any]],
                  engines: Sequence[int] | None = None) -> dict[str, Any]:
    """Warm-up progress summed over the engines' metrics (``RuntimeSystem.metrics``: each
    engine's ``metrics`` snapshot): bytes read and blocks still to read, by engine too.

    ``done`` needs every live engine of ``engines`` (those sent a warm-up; a dead one is
    left out) to report its remaining blocks, all 0: an engine reports them from the
    moment it handles its ``warm`` message, and a fresh snapshot (``metrics(fresh=True)``)
    is taken after that message on the engine's one ordered channel.
    """
    total_bytes = 0.0
    remaining = 0.0
    by_engine: dict[str, float] = {}
    alive = {eid for eid, report in metrics.items() if report.get("alive", True)}
    for eid, report in sorted(metrics.items()):
        if eid not in alive:  # a dead engine's last report would hold the warm-up open
            continue
        snap = report.get("metrics") or {}
        rows = snap.get("dualpath_storage_warm_blocks_remaining")
        total_bytes += sum(r["value"] for r in snap.get("dualpath_storage_warm_bytes_total",
                                                         []))
        if rows:
            left = sum(r["value"] for r in rows)
            remaining += left
            by_engine[str(eid)] = left
    reported = all(str(e) in by_engine for e in (engines or ()) if e in alive)
    return {"bytes": int(total_bytes), "blocks_remaining": int(remaining),
            "engines": by_engine, "done": reported and remaining == 0}
