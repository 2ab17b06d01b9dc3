"""Named bundles of configuration values, applied over the defaults.

* ``embedded`` — the defaults themselves: 1P2D emulated on one CPU machine with the numpy
  reference model; thresholds in the paper's form (seconds), which scale to any hardware.
* ``small`` / ``medium`` / ``large`` — the seed's section 8.1 recommendations, on the paper's
  hardware (Hopper nodes, DS 660B) because that is what the seed describes. The seed gives no
  quota for medium/large, so they use the paper's 300 ms. For ``large`` the seed says only
  "64+ nodes, dynamic P/D ratio": 8P16D (24 nodes, the 1:2 ratio of the other presets) is
  our choice, as is turning layerwise prefill on there too.
* ``paper`` — the paper's evaluation setup: 2P4D, 8 GPUs/node, 400 Gbps storage and compute
  NICs, alpha 3 s of reads, beta 5 s of GPU work, quota 300 ms, layerwise prefill.

Values are written exactly as a user would write them in YAML, so ``config init`` can emit them
verbatim. Note the seed's byte alphas resolve to 0 tokens for DS 660B (48,068 KV bytes per
token): an honest consequence of the seed's numbers, shown by ``config show``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

__all__ = ["Preset", "PRESETS"]


@dataclass(frozen=True, slots=True)
class Preset:
    """A named set of raw values keyed by dotted key (``scheduler.alpha``)."""

    name: str
    description: str
    values: Mapping[str, object] = field(default_factory=dict)


_SEED_HARDWARE: dict[str, object] = {"hardware.profile": "hopper", "model.profile": "ds660b"}

PRESETS: Mapping[str, Preset] = MappingProxyType({
    "embedded": Preset("embedded", "1P2D on this machine: CPU hardware, numpy reference model"),
    "small": Preset("small", "seed 8.1 small scale (1-8 nodes)", {
        **_SEED_HARDWARE,
        "cluster.pd": "1P2D",
        "scheduler.alpha": "4KB",
        "scheduler.beta": "8K",
        "scheduler.compute_quota": "15TFLOP",
        "scheduler.layerwise_prefill": False,  # the seed turns it on from medium scale up
    }),
    "medium": Preset("medium", "seed 8.1 medium scale (16-32 nodes), layerwise prefill", {
        **_SEED_HARDWARE,
        "cluster.pd": "2P4D",
        "scheduler.alpha": "8KB",
        "scheduler.beta": "16K",
        "scheduler.compute_quota": "300ms",
        "scheduler.layerwise_prefill": True,
    }),
    "large": Preset("large", "seed 8.1 large scale, hierarchical scheduling (8P16D is our "
                    "choice)", {
        **_SEED_HARDWARE,
        "cluster.pd": "8P16D",
        "scheduler.alpha": "16KB",
        "scheduler.beta": "32K",
        "scheduler.compute_quota": "300ms",
        "scheduler.layerwise_prefill": True,
        "scheduler.hierarchical": True,
    }),
    "paper": Preset("paper", "the paper's testbed: 2P4D Hopper, 400 Gbps NICs, DS 660B", {
        **_SEED_HARDWARE,
        "cluster.pd": "2P4D",
        "cluster.gpus_per_node": 8,
        "hardware.snic_bandwidth": "400Gbps",
        "hardware.snics_per_node": 1,
        "hardware.cnic_bandwidth": "400Gbps",
        "hardware.dram_bandwidth": "500GB/s",
        "hardware.dram_buffer_per_node": "80GB",
        "storage.block_size": 64,
        "scheduler.alpha": "3s",
        "scheduler.beta": "5s",
        "scheduler.compute_quota": "300ms",
        "scheduler.z_factor": 1.05,
        "scheduler.read_side": "dualpath",
        "scheduler.layerwise_prefill": True,
    }),
})
