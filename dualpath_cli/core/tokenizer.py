"""Byte-level tokenizer: token ``b`` (0..255) is byte ``b``; a few special tokens follow.

Bytes need no vocabulary file and round-trip any text exactly, which is all a reference model
serving synthetic agentic traces needs. Pure (a function of the text), so it lives in core/:
the engines' model and the OpenAI-compatible API map text the same way.
"""

from __future__ import annotations

from collections.abc import Iterable

from dualpath_cli.errors import UsageError

__all__ = ["BOS", "EOS", "PAD", "SEP", "N_BYTE_TOKENS", "SPECIAL_TOKENS", "ByteTokenizer"]

N_BYTE_TOKENS = 256
BOS = 256  # start of a conversation
EOS = 257  # end of a generation
PAD = 258  # padding (never produced by encode)
SEP = 259  # turn separator for agentic traces
SPECIAL_TOKENS: dict[str, int] = {"<bos>": BOS, "<eos>": EOS, "<pad>": PAD, "<sep>": SEP}


class ByteTokenizer:
    """UTF-8 bytes in, token ids out; specials are skipped (or shown) when decoding."""

    def __init__(self, vocab_size: int = 260) -> None:
        if vocab_size < N_BYTE_TOKENS + len(SPECIAL_TOKENS):
            raise UsageError(f"byte tokenizer needs vocab_size >= 260, got {vocab_size}")
        self.vocab_size = vocab_size

    def encode(self, text: str, *, bos: bool = False, eos: bool = False) -> list[int]:
        """Token ids of ``text``'s UTF-8 bytes, optionally wrapped in BOS/EOS."""
        ids = list(text.encode("utf-8"))
        return ([BOS] if bos else []) + ids + ([EOS] if eos else [])

    def decode(self, tokens: Iterable[int], *, show_specials: bool = False) -> str:
        """Text of the byte tokens (invalid UTF-8 becomes U+FFFD).

        Raises:
            UsageError: a token id outside the vocabulary.
        """
        names = {v: k for k, v in SPECIAL_TOKENS.items()}
        out: list[str] = []
        run = bytearray()
        for tok in tokens:
            t = int(tok)
            if 0 <= t < N_BYTE_TOKENS:
                run.append(t)
                continue
            if not 0 <= t < self.vocab_size:
                raise UsageError(f"token id {t} is outside the vocabulary [0, {self.vocab_size})")
            if show_specials:
                out.append(run.decode("utf-8", errors="replace"))
                run.clear()
                out.append(names.get(t, f"<{t}>"))
        out.append(run.decode("utf-8", errors="replace"))
        return "".join(out)
