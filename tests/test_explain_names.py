"""``dualpath explain`` names the PE's and DE's nodes as status, monitor and top do: the
operator's names the decision kept (``--node D0``), else, for a decision or a story made
before names were kept (an older recording), the index names diagnose uses (``P0``/``D1``)."""

from __future__ import annotations

from typing import Any

from dualpath_cli.diagnose.explain import explain_request, render_story
from dualpath_cli.telemetry.stories import RequestStory
from dualpath_cli.telemetry.view import Decision


def _decision(inputs: dict[str, Any]) -> Decision:
    return Decision(seq=1, at=0.0, rid=7, attempt=0, agent=0, turn=1, length=100, cached=64,
                    pe=0, de=3, de_group=1, side="de", pe_tokens=0, de_tokens=64,
                    pe_read_q=0, de_read_q=0, pe_class="C1", de_class="normal",
                    inputs={"read_side": "dualpath",
                            "pe_engines": [{"id": 0, "node": 0, "seq": 0, "tok": 0}],
                            "de_engine": {"id": 3, "node": 2, "seq": 1, "tok": 9},
                            **inputs})


def _lines(story: dict[str, Any]) -> str:
    return "\n".join(render_story(RequestStory.from_dict(story)))


def test_explain_names_nodes_as_the_operator_named_them() -> None:
    story = explain_request(7, [_decision({"pe_node_name": "gpu-a",
                                           "de_node_name": "D0"})])
    assert (story["pe"]["node_name"], story["de"]["node_name"]) == ("gpu-a", "D0")
    text = _lines(story)
    assert "(class C1; node gpu-a," in text and "DE 3 on node D0 in group 1" in text


def test_a_decision_without_names_falls_back_to_index_names() -> None:
    story = explain_request(7, [_decision({})])  # logged before names were kept
    assert (story["pe"]["node_name"], story["de"]["node_name"]) == ("P0", "D2")
    old = {k: v for k, v in story.items()}  # a story served before: no node_name at all
    old["pe"] = {k: v for k, v in story["pe"].items() if k != "node_name"}
    old["de"] = {k: v for k, v in story["de"].items() if k != "node_name"}
    text = _lines(old)
    assert "node P0," in text and "DE 3 on node D2 in group 1" in text
