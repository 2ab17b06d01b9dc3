"""Issue 36: a turn's chain of block ids, from the runtime's keys to a replayable trace.

The ledger keeps each lookup's chain (the first 8 bytes of every prompt key, 63 bits) as a
delta from the conversation's previous turn; ``trace_from_decisions`` rebuilds the chains;
the global store's rule 4 (``outputs_stored``) stores a turn's generated blocks, as the
runtime's decode engine does.
"""

from __future__ import annotations

from typing import Any

import pytest

from dualpath_cli.core.layout import BlockShape, Namespace, prefix_keys
from dualpath_cli.errors import TraceError
from dualpath_cli.runtime.ledger import ID_MASK, RequestLedger
from dualpath_cli.services.recording import trace_from_decisions
from dualpath_cli.telemetry.registry import MetricsRegistry
from dualpath_cli.telemetry.view import Decision
from dualpath_cli.workload.prefix_store import GlobalPrefixStore
from dualpath_cli.workload.stats import trace_stats
from dualpath_cli.workload.trace_format import Trace, TraceHeader, decode_lines, encode_lines
from dualpath_cli.workload.trajectory import Trajectory, Turn

NS = Namespace("m", "layer_major", BlockShape(2, 4, 16), "fp16")


def _ids(tokens: list[int]) -> list[int]:
    return [int.from_bytes(k.raw[:8], "big") & ID_MASK for k in prefix_keys(tokens, NS)]


def test_the_ledger_keeps_a_turns_chain_as_a_delta_from_the_previous_turn() -> None:
    ledger = RequestLedger(MetricsRegistry(), NS)
    first = list(range(1, 42))  # 41 tokens: 10 full blocks of 4
    look = ledger.lookup(1, 9, prefix_keys(first, NS), len(first), 0, turn=0)
    d = look.as_dict(chain=True)
    assert d["chain_base"] == 0 and d["chain"] == _ids(first) and d["block_tokens"] == 4
    assert "chain" not in look.as_dict()  # the in-flight listing does not carry it
    ledger.finished(1, 9, output=[7, 8, 9, 10, 11], tokens=first, timeline={})
    follow = first + [7, 8, 9, 10] + list(range(50, 60))
    d = ledger.lookup(2, 9, prefix_keys(follow, NS), len(follow), 11, turn=1).as_dict(True)
    # the previous prompt's 10 keys are the base; the rest (output blocks too) are new
    assert d["chain_base"] == 10 and d["chain"] == _ids(follow)[10:]
    # a turn whose previous turn is not the one remembered carries its whole chain
    d = ledger.lookup(3, 9, prefix_keys(follow, NS), len(follow), 11, turn=5).as_dict(True)
    assert d["chain_base"] == 0 and d["chain"] == _ids(follow)


def _turn(agent: int, turn: int, length: int, lookup: dict[str, Any], gen: int = 2
          ) -> Decision:
    return Decision(1, 1.0, 10 * agent + turn, 0, agent, turn, length, 0, 0, 1, 1, "pe", 0,
                    0, 0, 0, gen=gen, inputs={"lookup": lookup})


def _look(base: int, ids: list[int]) -> dict[str, Any]:
    return {"chain_base": base, "chain": ids, "block_tokens": 4}


def test_recorded_deltas_rebuild_each_turns_chain() -> None:
    decisions = [
        _turn(0, 0, 10, _look(0, [1, 2])),
        _turn(0, 1, 17, _look(2, [3, 4])),  # 10 + 2 generated + 5: 4 full blocks
        _turn(1, 0, 9, _look(0, [1, 5])),
        _turn(2, 1, 9, _look(1, [6])),      # its turn 0 is not in the window
    ]
    trace = trace_from_decisions(decisions)
    assert trace.header.block_tokens == 4 and trace.header.outputs_stored
    by = {t.agent_id: t for t in trace.trajectories}
    assert by[0].blocks == ((1, 2), (1, 2, 3, 4)) and by[1].blocks == ((1, 5),)
    assert by[2].blocks == ()  # cannot be rebuilt: it hits its own context instead
    again = decode_lines(encode_lines(trace), "t")
    assert again.header.outputs_stored and again.trajectories[0].blocks == by[0].blocks
    # an older server's recording: no chains, the header as before
    old = trace_from_decisions([_turn(0, 0, 10, {"hit_blocks": 0})])
    assert old.header.block_tokens == 512 and not old.header.outputs_stored


def test_outputs_stored_is_rule_4_of_the_global_store() -> None:
    store = GlobalPrefixStore(4)
    store.store((1, 2))           # turn 0: a 10-token prompt, 2 full blocks
    store.store_context((1, 2, 3, 4), 12)  # then 2 generated: blocks within 11 tokens
    assert store.lookup((1, 2, 3, 4), 17).tokens == 8
    own = store.store_context((1, 2, 3, 4), 14, (1, 2))  # 4 generated: block 3 is stored
    assert own == (1, 2, 3)
    hit = store.lookup((1, 2, 3, 4), 19, own)
    assert (hit.tokens, hit.cross) == (12, 0)  # its own generated block: not another's
    traj = Trajectory(0, (Turn(10, 2), Turn(5, 2)), blocks=((1, 2), (1, 2, 3, 4)))
    plain = trace_stats([traj], 4)
    stored = trace_stats([traj], 4, outputs_stored=True)
    assert plain.hit_ratio == pytest.approx(8 / 27) and stored.hit_ratio == pytest.approx(
        8 / 27)  # block 3 (tokens 9-12) holds the prompt's partial block: not stored
    traj = Trajectory(0, (Turn(8, 6), Turn(5, 2)), blocks=((1, 2), (1, 2, 3, 4)))
    assert trace_stats([traj], 4).hit_ratio == pytest.approx(8 / 27)
    assert trace_stats([traj], 4, outputs_stored=True).hit_ratio == pytest.approx(12 / 27)
    with pytest.raises(TraceError, match="outputs_stored"):
        decode_lines(['{"format":"dualpath-trace","version":1,"max_len":9,'
                      '"outputs_stored":1}'], "t")
    assert Trace(TraceHeader(9), ()).header.outputs_stored is False
