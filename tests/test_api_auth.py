"""The launch token: 0600 file, refused when others can read it, short id, checked headers."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from dualpath_cli.api.auth import MissingToken, TokenAuth, TokenFileError, WrongToken, token_id
from dualpath_cli.api.control import SystemUnits, parse_scheduler_change
from dualpath_cli.errors import UsageError


def test_generate_writes_a_0600_file_and_load_reads_it_back(tmp_path: Path) -> None:
    path = tmp_path / "run" / "token"
    auth = TokenAuth.generate(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert len(auth.token) >= 32 and path.read_text().strip() == auth.token
    again = TokenAuth.load(path)
    assert again.token_id == auth.token_id == token_id(auth.token)
    assert TokenAuth.load_or_generate(path).token == auth.token
    other = TokenAuth.generate(tmp_path / "other")
    assert other.token != auth.token and other.token_id != auth.token_id


def test_the_token_never_shows_in_repr_or_id(tmp_path: Path) -> None:
    auth = TokenAuth.generate(tmp_path / "token")
    for text in (repr(auth), str(auth), auth.token_id):
        assert auth.token not in text
    assert auth.token_id.startswith("tok-") and len(auth.token_id) == 12


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o660, 0o644])
def test_a_token_file_others_can_read_is_refused(tmp_path: Path, mode: int) -> None:
    path = tmp_path / "token"
    TokenAuth.generate(path)
    os.chmod(path, mode)
    with pytest.raises(TokenFileError, match=r"mode 0[0-7]{3}; group or others") as err:
        TokenAuth.load(path)
    assert "\n" not in str(err.value)
    with pytest.raises(TokenFileError):
        TokenAuth.load_or_generate(path)


def test_missing_empty_and_symlinked_token_files_are_refused(tmp_path: Path) -> None:
    with pytest.raises(TokenFileError, match="does not exist"):
        TokenAuth.load(tmp_path / "nope")
    empty = tmp_path / "empty"
    empty.write_text("\n")
    empty.chmod(0o600)
    with pytest.raises(TokenFileError, match="is empty"):
        TokenAuth.load(empty)
    real = TokenAuth.generate(tmp_path / "real")
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "real")
    with pytest.raises(TokenFileError, match="cannot read"):
        TokenAuth.load(link)
    assert real.path == tmp_path / "real"


def test_check_header_missing_401_wrong_403_right_ok() -> None:
    auth = TokenAuth("s3cret-token")
    for header in (None, "", "Basic abc", "s3cret-token"):
        with pytest.raises(MissingToken) as missing:
            auth.check_header(header)
        assert missing.value.status == 401
    for header in ("Bearer nope", "Bearer s3cret-token-but-longer", "Bearer s3cret-toke"):
        with pytest.raises(WrongToken) as wrong:
            auth.check_header(header)
        assert wrong.value.status == 403 and "s3cret" not in str(wrong.value)
    auth.check_header("Bearer s3cret-token")
    assert auth.matches("s3cret-token") and not auth.matches("")


UNITS = SystemUnits(kv_bytes_per_token=1024, block_tokens=16, snic_bytes_per_s=1e6,
                    flops_per_s=1e12)


@pytest.mark.parametrize("body,field,value", [
    ({"alpha": "200K"}, "alpha_tokens", 200_000),
    ({"alpha": 4096}, "alpha_tokens", 4096),
    ({"alpha": "16K tokens"}, "alpha_tokens", 16_000),
    ({"alpha": "8KiB"}, "alpha_tokens", 8),  # 8 KiB of KV at 1 KiB per token
    ({"alpha": "2s"}, "alpha_tokens", 1953),  # 2 s x 1 MB/s / 1 KiB per token
    ({"beta": "1M"}, "beta_tokens", 1_000_000),
    ({"beta": 16}, "beta_tokens", 16),
    ({"quota": "300ms"}, "quota_s", 0.3),
    ({"quota": 0.05}, "quota_s", 0.05),
    ({"quota": "20TFLOP"}, "quota_s", 20.0),  # at 1 TFLOP/s achieved
    ({"read_side": "basic"}, "read_side", "basic"),
])
def test_patch_values_accept_the_clis_units(body: dict, field: str, value: object) -> None:
    change = parse_scheduler_change(body, UNITS)
    assert getattr(change, field) == value
    others = {"alpha_tokens", "beta_tokens", "quota_s", "read_side"} - {field}
    assert all(getattr(change, name) is None for name in others)


@pytest.mark.parametrize("body,match", [
    ({}, "nothing to change"),
    ({"alpha": None}, "nothing to change"),
    ({"gamma": 1}, "unknown field 'gamma'"),
    ({"alpha": "12 parsecs"}, "invalid alpha"),
    ({"alpha": "-5"}, "alpha"),
    ({"alpha": "3m"}, "ambiguous"),
    ({"beta": "5s"}, "beta in tokens"),
    ({"beta": 8}, "below one block"),
    ({"beta": "8KiB"}, "cannot be given in bytes"),
    ({"quota": "0ms"}, "more than zero"),
    ({"quota": "200K"}, "invalid compute quota"),
    ({"read_side": "dualpth"}, "did you mean 'dualpath'"),
    ({"read_side": 3}, "policy name"),
])
def test_bad_patch_values_are_refused_with_the_reason(body: dict, match: str) -> None:
    with pytest.raises(UsageError, match=match) as err:
        parse_scheduler_change(body, UNITS)
    assert "\n" not in str(err.value)


def test_forms_the_running_system_cannot_resolve_are_refused() -> None:
    unshaped = SystemUnits(kv_bytes_per_token=1024, block_tokens=16)
    with pytest.raises(UsageError, match="unshaped"):
        parse_scheduler_change({"alpha": "3s"}, unshaped)
    with pytest.raises(UsageError, match="not measured"):
        parse_scheduler_change({"quota": "20TFLOP"}, unshaped)
