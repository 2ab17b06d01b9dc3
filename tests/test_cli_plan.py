"""`dualpath plan pd-ratio|working-set`: the stated numbers, --pd, rendering, bad input."""

from __future__ import annotations

import json

import pytest

from dualpath_cli.cli.app import main
from dualpath_cli.cli.plan_cmd import ratio_text

PAPER = ["plan", "pd-ratio", "--gpus-per-node", "8", "--snics-per-node", "1",
         "--nic-bandwidth", "400Gbps", "--dram-bandwidth", "500GB/s"]


def run_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict:
    code = main([*args, "--json"])
    out = capsys.readouterr().out
    assert code == 0, out
    return json.loads(out)


def test_pd_ratio_paper_numbers(capsys: pytest.CaptureFixture[str]) -> None:
    data = run_json(capsys, *PAPER)
    assert data["min_ratio"] == pytest.approx(1 / 7)
    assert data["max_ratio"] == pytest.approx(3.5)
    assert [b["value"] for b in data["upper_bounds"]] == [6.0, 3.5, 3.5]
    assert [b["name"] for b in data["upper_bounds"]] == ["de_cnic_read", "de_cnic_write",
                                                         "de_dram"]
    assert data["checks"] == {"pe_cnic_read_ok": True, "pe_dram_ok": True}
    assert data["feasible"] is True
    assert "inside" not in data


def test_pd_ratio_defaults_to_the_hopper_testbed(capsys: pytest.CaptureFixture[str]) -> None:
    explicit = run_json(capsys, *PAPER)
    default = run_json(capsys, "plan", "pd-ratio")
    assert default["min_ratio"] == explicit["min_ratio"]
    assert default["max_ratio"] == explicit["max_ratio"]


def test_pd_ratio_with_a_deployment(capsys: pytest.CaptureFixture[str]) -> None:
    data = run_json(capsys, *PAPER, "--pd", "2P4D")
    assert data["pd"] == "2P4D" and data["ratio"] == 0.5 and data["inside"] is True
    assert {link["name"] for link in data["links"]} == {
        "pe_cnic_read", "pe_cnic_write", "de_cnic_read", "de_cnic_write", "pe_dram", "de_dram"}
    outside = run_json(capsys, *PAPER, "--pd", "5p1d")
    assert outside["inside"] is False
    assert any(not link["ok"] for link in outside["links"])


def test_pd_ratio_infeasible_node_serialises_infinity_as_null(
        capsys: pytest.CaptureFixture[str]) -> None:
    data = run_json(capsys, "plan", "pd-ratio", "--gpus-per-node", "2", "--snics-per-node", "2")
    assert data["min_ratio"] is None and data["feasible"] is False
    assert data["checks"]["pe_cnic_read_ok"] is False


def test_pd_ratio_human_mode_shows_the_derivation(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*PAPER, "--pd", "2P4D"]) == 0
    out = capsys.readouterr().out
    assert "bottleneck-free range: 1/7 (0.1429) <= P/D <= 7/2 (3.5)" in out
    assert "(M/(Bs)-3)/2" in out and "7/2 (binding)" in out
    assert "2P4D is inside the bottleneck-free range" in out
    assert "the paper writes s <= g" in out


def test_ratio_text() -> None:
    assert ratio_text(1 / 7) == "1/7"
    assert ratio_text(3.5) == "7/2"
    assert ratio_text(6.0) == "6"
    assert ratio_text(float("inf")) == "inf"
    assert ratio_text(0.123456789) == "0.123"


def test_working_set(capsys: pytest.CaptureFixture[str]) -> None:
    data = run_json(capsys, "plan", "working-set", "--aps", "0.45", "--jct", "3000s",
                    "--total-len", "56K", "--bytes-per-token", "48068")
    assert data["working_set_tokens"] == pytest.approx(0.45 * 3000 * 56_000 / 2)
    assert data["working_set_bytes"] == pytest.approx(0.45 * 3000 * 28_000 * 48_068)
    assert data["live_trajectories"] == pytest.approx(1350)
    by_model = run_json(capsys, "plan", "working-set", "--aps", "0.45", "--jct", "50m",
                        "--total-len", "56K", "--model", "ds660b")
    assert by_model["working_set_bytes"] == pytest.approx(data["working_set_bytes"])
    assert main(["plan", "working-set", "--aps", "0.45", "--jct", "3000s", "--total-len",
                 "56K", "--model", "ds660b"]) == 0
    assert "1.82TB" in capsys.readouterr().out


@pytest.mark.parametrize(("args", "message"), [
    ([*PAPER, "--pd", "2X4D"], "invalid P/D spec '2X4D'"),
    ([*PAPER, "--pd", "0P4D"], "at least one prefill"),
    (["plan", "pd-ratio", "--nic-bandwidth", "-400Gbps"], "invalid bandwidth"),
    (["plan", "pd-ratio", "--dram-bandwidth", "0GB/s"], "DRAM bandwidth"),
    (["plan", "pd-ratio", "--gpus-per-node", "0"], "GPUs per node"),
    (["plan", "pd-ratio", "--hardware", "tpu"], "unknown hardware profile 'tpu'"),
    (["plan", "working-set", "--aps", "1", "--jct", "1s", "--total-len", "1K"],
     "exactly one of --bytes-per-token or --model"),
    (["plan", "working-set", "--aps", "1", "--jct", "soon", "--total-len", "1K", "--model",
      "ds660b"], "invalid duration 'soon'"),
    (["plan", "working-set", "--aps", "many", "--jct", "1s", "--total-len", "1K", "--model",
      "ds660b"], "Invalid value for '--aps'"),
    (["plan", "pd-ratio", "--gpus-per-node", "eight"], "Invalid value for '--gpus-per-node'"),
])
def test_bad_input_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str], args: list[str],
                                          message: str) -> None:
    assert main(args) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert message in captured.err and "Traceback" not in captured.err
