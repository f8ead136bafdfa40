"""A request's text as its tokens arrive, each token decoded beside the few before it rather
than the whole list again: checking stop strings and streaming cost the same at the thousandth
token as at the first.

A token's text can depend on its neighbours (a SentencePiece word's leading space is dropped at
the start of a decode; a byte-level token may hold part of a character), so the new text is the
decode of a short window, from the start of the last piece of text taken, less the decode of that
window without the new tokens. Text is taken only once the window's decode grows and does not
end in an unfinished character; until then the tokens wait in the window. The text only ever
grows, so a stream of it never takes back what it sent; ``finish`` adds what is still waiting.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

REPLACEMENT = "\ufffd"  # what a decode makes of an unfinished UTF-8 character


class IncrementalText:
    """The text of the tokens ``add`` is given, by ``detokenize`` (token ids -> text)."""

    def __init__(self, detokenize: Callable[[Sequence[int]], str]) -> None:
        self._detokenize = detokenize
        self._tokens: list[int] = []
        self.text = ""
        # The window: from ``_start`` (where the last piece of text taken began), the tokens up
        # to ``_taken`` are in ``text``, those after it wait.
        self._start = self._taken = 0

    def add(self, token: int) -> str:
        """Take the next token; the text it completed ("" while it waits on the next)."""
        self._tokens.append(token)
        before = self._detokenize(self._tokens[self._start:self._taken])
        after = self._detokenize(self._tokens[self._start:])
        if len(after) <= len(before) or after.endswith(REPLACEMENT):
            return ""
        piece = after[len(before):]
        self.text += piece
        self._start, self._taken = self._taken, len(self._tokens)
        return piece

    def finish(self) -> str:
        """The whole text, the tokens still waiting included (an unfinished character as the
        replacement character, as a decode of them all gives)."""
        if self._taken < len(self._tokens):
            before = self._detokenize(self._tokens[self._start:self._taken])
            self.text += self._detokenize(self._tokens[self._start:])[len(before):]
            self._start = self._taken = len(self._tokens)
        return self.text
