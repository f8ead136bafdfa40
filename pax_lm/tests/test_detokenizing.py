"""The text a request gets a token at a time equals the decode of all its tokens, for the
tokenizers whose tokens' text depends on their neighbours."""

from __future__ import annotations

import numpy as np
import pytest

from pax_lm.inference.detokenizing import REPLACEMENT, IncrementalText


class _Bytes:
    """A byte tokenizer: a character of several UTF-8 bytes spans tokens."""

    def decode(self, ids) -> str:
        return bytes(ids).decode("utf-8", errors="replace")


class _Words:
    """SentencePiece's rule: a word's leading space is dropped at the start of a decode."""

    VOCAB = ["▁the", "▁cat", "s", "▁sat", ".", "▁on", "mat", "▁", "é"]

    def decode(self, ids) -> str:
        return "".join(self.VOCAB[i] for i in ids).replace("▁", " ").removeprefix(" ")


def _text_a_token_at_a_time(tokenizer, ids) -> tuple[list[str], str]:
    text = IncrementalText(tokenizer.decode)
    pieces = [text.add(i) for i in ids]
    assert text.text == "".join(pieces)
    return pieces, text.finish()


@pytest.mark.parametrize("seed", range(20))
def test_the_text_of_words_equals_their_whole_decode(seed):
    tokenizer = _Words()
    ids = np.random.default_rng(seed).integers(0, len(_Words.VOCAB), 40).tolist()
    pieces, whole = _text_a_token_at_a_time(tokenizer, ids)
    assert whole == tokenizer.decode(ids)
    grown = "".join(pieces)
    assert whole.startswith(grown) and REPLACEMENT not in grown


@pytest.mark.parametrize("seed", range(20))
def test_characters_split_over_byte_tokens_wait_for_their_last_byte(seed):
    tokenizer = _Bytes()
    text = "".join(np.random.default_rng(seed).choice(list("ab é€😀\n"), 30))
    ids = list(text.encode())
    pieces, whole = _text_a_token_at_a_time(tokenizer, ids)
    assert whole == text and "".join(pieces) == text
    assert REPLACEMENT not in "".join(pieces)
    # A piece comes out whole at the character's last byte, not before.
    assert all(piece == "" or piece.encode()[-1] == ids[i] for i, piece in enumerate(pieces))


def test_an_unfinished_character_at_the_end_is_decoded_as_a_whole_decode_would():
    tokenizer = _Bytes()
    ids = list("ok €".encode())[:-1]
    pieces, whole = _text_a_token_at_a_time(tokenizer, ids)
    assert "".join(pieces) == "ok " and whole == tokenizer.decode(ids) == "ok " + REPLACEMENT


def test_each_token_decodes_a_window_not_the_whole_text():
    lengths = []
    tokenizer = _Words()

    def decode(ids):
        lengths.append(len(ids))
        return tokenizer.decode(ids)

    text = IncrementalText(decode)
    for i in [0, 1, 2, 3, 4] * 200:
        text.add(i)
    assert max(lengths) <= 2 and text.text == tokenizer.decode([0, 1, 2, 3, 4] * 200)
