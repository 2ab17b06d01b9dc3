"""Byte-level tokenizer round trips."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dualpath_cli.core.tokenizer import BOS, EOS, SEP, ByteTokenizer
from dualpath_cli.errors import UsageError


@given(st.text())
def test_round_trip_any_text(text: str) -> None:
    tok = ByteTokenizer()
    ids = tok.encode(text, bos=True, eos=True)
    assert ids[0] == BOS and ids[-1] == EOS
    assert all(0 <= i < 256 for i in ids[1:-1])
    assert tok.decode(ids) == text


def test_bytes_are_utf8() -> None:
    tok = ByteTokenizer()
    assert tok.encode("aé") == [97, 0xC3, 0xA9]
    assert tok.decode([104, 105, SEP, 33], show_specials=True) == "hi<sep>!"
    assert tok.decode([0xC3]) == "\ufffd"  # a cut multi-byte char degrades, never raises


def test_out_of_vocab_id() -> None:
    with pytest.raises(UsageError, match="token id 300 is outside"):
        ByteTokenizer().decode([65, 300])
    with pytest.raises(UsageError, match="vocab_size >= 260"):
        ByteTokenizer(100)
