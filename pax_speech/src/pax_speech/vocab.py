"""The characters a CTC head predicts, and how transcripts become label ids and back.

Id 0 is CTC's blank; the others are the alphabet's characters in order. Transcripts are
lower-cased and their runs of white space become one space before they are looked up (as
LibriSpeech's are written: upper case, no punctuation); any other character outside the
alphabet is the user's to fix, so ``encode`` names it rather than dropping it silently.
"""

from __future__ import annotations

import dataclasses

import numpy as np

BLANK = 0
ENGLISH = " 'abcdefghijklmnopqrstuvwxyz"


def normalise(text: str) -> str:
    """Lower case, single spaces, no leading or trailing space."""
    return " ".join(text.lower().split())


@dataclasses.dataclass(frozen=True)
class CharVocabulary:
    """CTC's blank (id 0) followed by ``alphabet``'s characters (ids 1..len)."""

    alphabet: str = ENGLISH

    @property
    def size(self) -> int:
        """The number of classes the CTC head predicts: the alphabet and the blank."""
        return len(self.alphabet) + 1

    def unknown(self, text: str) -> str:
        """The characters of the normalised ``text`` outside the alphabet, in order of first
        appearance ('' when there are none)."""
        known = set(self.alphabet)
        return "".join(dict.fromkeys(c for c in normalise(text) if c not in known))

    def encode(self, text: str) -> np.ndarray:
        """The ids (int32) of the normalised ``text``; ``ValueError`` naming characters outside
        the alphabet."""
        text = normalise(text)
        bad = self.unknown(text)
        if bad:
            raise ValueError(f"characters outside the vocabulary: {bad!r}")
        index = {c: i + 1 for i, c in enumerate(self.alphabet)}
        return np.asarray([index[c] for c in text], np.int32)

    def decode(self, ids) -> str:
        """The text of label ids (blanks and ids out of range are left out)."""
        return "".join(self.alphabet[i - 1] for i in np.asarray(ids).tolist()
                       if 0 < i <= len(self.alphabet))
