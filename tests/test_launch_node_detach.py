"""``launch --role prefill|decode --detach``: a node has no detached mode, so the flag is
refused in one line (it was ignored: the walk's ``--detach`` node never returned)."""

from __future__ import annotations

import pytest

from dualpath_cli.cli.app import main


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_a_joining_node_refuses_detach_in_one_line(role: str,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    # port 9 (discard) on loopback: were the flag ignored, the node would try to join it
    code = main(["launch", "--role", role, "--node", "N0", "--join", "127.0.0.1:9",
                 "--token-file", "/nonexistent/token", "--detach"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and "--detach is for the scheduler" in err, err
