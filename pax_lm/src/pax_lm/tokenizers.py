"""Tokenizers: text to ids and back.

Every implementation is a dataclass of plain values (a path, a token name), so an experiment
configures it with ``fdl.Config`` and the config serialises to JSON. The heavy object (a
SentencePiece processor, a Hugging Face tokenizer) is loaded on first use, so building a config,
listing experiments or printing help reads no file.

Ids 0..``vocab_size``-1. ``decode`` drops pad, bos and eos and ids outside the vocabulary (a model
whose embedding is padded past the vocabulary can sample them), so a sample decodes to its text.
"""

from __future__ import annotations

import abc
import dataclasses
import functools
import hashlib
import os
from collections.abc import Iterable, Sequence
from typing import Any, ClassVar

import numpy as np

from pax_core import UsageError
from pax_lm.corpus import read_documents


class Tokenizer(abc.ABC):
    """What an input pipeline and a decoder need from a tokenizer."""

    @property
    @abc.abstractmethod
    def vocab_size(self) -> int:
        """Number of ids, special ones included."""

    @property
    @abc.abstractmethod
    def pad_id(self) -> int: ...

    @property
    @abc.abstractmethod
    def bos_id(self) -> int: ...

    @property
    @abc.abstractmethod
    def eos_id(self) -> int: ...

    @property
    @abc.abstractmethod
    def name(self) -> str:
        """How a command line names it (``tokenizer_from_path`` reads it back)."""

    @property
    @abc.abstractmethod
    def fingerprint(self) -> str:
        """What identifies the ids it gives: equal for copies of one model wherever they lie,
        different for another model (prepared datasets record it)."""

    @abc.abstractmethod
    def encode(self, text: str) -> list[int]:
        """The ids of ``text``, without bos or eos."""

    @abc.abstractmethod
    def decode(self, ids: Iterable[int]) -> str:
        """The text of ``ids``, skipping pad, bos, eos and ids outside the vocabulary."""

    def encode_batch(self, texts: Sequence[str], num_threads: int | None = None
                     ) -> list[np.ndarray]:
        """``encode`` of each text as int32 arrays; implementations override it with a
        vectorised or multi-threaded version, since input pipelines tokenize whole corpora.
        ``num_threads`` (None: one per core) bounds the threads where the library has them:
        worker processes that already share the cores ask for 1."""
        return [np.asarray(self.encode(text), np.int32) for text in texts]

    def _text_ids(self, ids: Iterable[int]) -> list[int]:
        special = {self.pad_id, self.bos_id, self.eos_id}
        return [i for i in map(int, ids) if 0 <= i < self.vocab_size and i not in special]


@dataclasses.dataclass(frozen=True)
class ByteTokenizer(Tokenizer):
    """UTF-8 bytes: no files, exact for any text. Ids 0 pad, 1 bos, 2 eos, byte ``b`` is ``b+3``.

    Invalid UTF-8 in ``decode`` (a model can sample half a character) becomes U+FFFD.
    """

    vocab_size: ClassVar[int] = 259
    pad_id: ClassVar[int] = 0
    bos_id: ClassVar[int] = 1
    eos_id: ClassVar[int] = 2
    _OFFSET: ClassVar[int] = 3
    name: ClassVar[str] = "bytes"
    fingerprint: ClassVar[str] = "bytes"

    def encode(self, text: str) -> list[int]:
        return self._encode(text).tolist()

    def encode_batch(self, texts: Sequence[str], num_threads: int | None = None
                     ) -> list[np.ndarray]:
        return [self._encode(text) for text in texts]

    def decode(self, ids: Iterable[int]) -> str:
        data = bytes(i - self._OFFSET for i in self._text_ids(ids))
        return data.decode("utf-8", errors="replace")

    def _encode(self, text: str) -> np.ndarray:
        return np.frombuffer(text.encode("utf-8"), np.uint8).astype(np.int32) + self._OFFSET


def _existing_file(path: str, what: str) -> str:
    if not os.path.isfile(path):
        raise UsageError(f"{what} not found: {path}")
    return path


def _file_digest(path: str, what: str) -> str:
    with open(_existing_file(path, what), "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()[:16]


@dataclasses.dataclass(frozen=True)
class SentencePieceTokenizer(Tokenizer):
    """A SentencePiece ``.model`` file (one from ``train_sentencepiece``, or a pretrained one).

    A model without a pad piece pads with its unk id (padded positions carry weight 0, so any
    valid id serves; ``decode`` then drops unk too); one without a bos piece (T5-style) starts
    documents with eos.
    """

    model_path: str

    @property
    def name(self) -> str:
        return self.model_path

    @functools.cached_property
    def fingerprint(self) -> str:
        return "sentencepiece:" + _file_digest(self.model_path, "SentencePiece model")

    @functools.cached_property
    def _processor(self) -> Any:
        import sentencepiece

        path = _existing_file(self.model_path, "SentencePiece model")
        try:
            processor = sentencepiece.SentencePieceProcessor(model_file=path)
        except (OSError, RuntimeError) as e:
            raise UsageError(f"not a SentencePiece model: {path} ({e})") from None
        if processor.eos_id() < 0:
            raise UsageError(f"SentencePiece model {path} has no eos piece; train it with eos_id")
        return processor

    @property
    def vocab_size(self) -> int:
        return self._processor.vocab_size()

    @property
    def pad_id(self) -> int:
        pad = self._processor.pad_id()
        return pad if pad >= 0 else self._processor.unk_id()

    @property
    def bos_id(self) -> int:
        bos = self._processor.bos_id()
        return bos if bos >= 0 else self.eos_id

    @property
    def eos_id(self) -> int:
        return self._processor.eos_id()

    def encode(self, text: str) -> list[int]:
        return self._processor.encode(text)

    def encode_batch(self, texts: Sequence[str], num_threads: int | None = None
                     ) -> list[np.ndarray]:
        encoded = self._processor.encode(list(texts),
                                         num_threads=num_threads or os.cpu_count() or 1)
        return [np.asarray(ids, np.int32) for ids in encoded]

    def decode(self, ids: Iterable[int]) -> str:
        return self._processor.decode(self._text_ids(ids))


@dataclasses.dataclass(frozen=True)
class HfTokenizer(Tokenizer):
    """A Hugging Face ``tokenizers`` JSON file (``tokenizer.json``), loaded with
    ``Tokenizer.from_file``; nothing is fetched from a hub.

    Special tokens are looked up by name. ``None`` takes the first conventional name the
    vocabulary has: eos ``</s>``, ``<|endoftext|>``, ``<eos>``, ``<|end_of_text|>``; bos
    ``<s>``, ``<bos>``, ``<|begin_of_text|>``, else eos (GPT-2's convention); pad ``<pad>``,
    ``[PAD]``, else eos. Encoding adds no special tokens (the input pipeline adds bos and eos).
    """

    json_path: str
    eos_token: str | None = None
    bos_token: str | None = None
    pad_token: str | None = None

    _EOS_NAMES: ClassVar[tuple[str, ...]] = ("</s>", "<|endoftext|>", "<eos>", "<|end_of_text|>")
    _BOS_NAMES: ClassVar[tuple[str, ...]] = ("<s>", "<bos>", "<|begin_of_text|>")
    _PAD_NAMES: ClassVar[tuple[str, ...]] = ("<pad>", "[PAD]")

    @property
    def name(self) -> str:
        return self.json_path

    @functools.cached_property
    def fingerprint(self) -> str:
        digest = _file_digest(self.json_path, "tokenizer JSON")
        return f"hf:{digest}:{self.pad_id}:{self.bos_id}:{self.eos_id}"

    @functools.cached_property
    def _tokenizer(self) -> Any:
        import tokenizers

        path = _existing_file(self.json_path, "tokenizer JSON")
        try:
            return tokenizers.Tokenizer.from_file(path)
        except Exception as e:  # the Rust side raises a bare Exception for a malformed file
            raise UsageError(f"not a Hugging Face tokenizer JSON: {path} ({e})") from None

    @functools.cached_property
    def _special_ids(self) -> tuple[int, int, int]:
        eos = self._token_id(self.eos_token, self._EOS_NAMES, None, "eos_token")
        bos = self._token_id(self.bos_token, self._BOS_NAMES, eos, "bos_token")
        pad = self._token_id(self.pad_token, self._PAD_NAMES, eos, "pad_token")
        return pad, bos, eos

    def _token_id(self, name: str | None, conventional: tuple[str, ...], fallback: int | None,
                  field: str) -> int:
        for candidate in (name,) if name is not None else conventional:
            token_id = self._tokenizer.token_to_id(candidate)
            if token_id is not None:
                return token_id
        if name is None and fallback is not None:
            return fallback
        wanted = repr(name) if name is not None else f"any of {', '.join(conventional)}"
        raise UsageError(f"tokenizer {self.json_path} has no token {wanted}; "
                         f"set HfTokenizer.{field} to one of its special tokens")

    @property
    def vocab_size(self) -> int:
        return self._tokenizer.get_vocab_size(with_added_tokens=True)

    @property
    def pad_id(self) -> int:
        return self._special_ids[0]

    @property
    def bos_id(self) -> int:
        return self._special_ids[1]

    @property
    def eos_id(self) -> int:
        return self._special_ids[2]

    def encode(self, text: str) -> list[int]:
        return self._tokenizer.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str], num_threads: int | None = None
                     ) -> list[np.ndarray]:
        # The Rust side sizes its own thread pool (RAYON_NUM_THREADS); one call cannot.
        encoded = self._tokenizer.encode_batch(list(texts), add_special_tokens=False)
        return [np.asarray(e.ids, np.int32) for e in encoded]

    def decode(self, ids: Iterable[int]) -> str:
        return self._tokenizer.decode(self._text_ids(ids), skip_special_tokens=False)


def tokenizer_from_path(spec: str) -> Tokenizer:
    """A tokenizer named on a command line: ``bytes``, a ``.model`` file or a ``.json`` file."""
    if spec == "bytes":
        return ByteTokenizer()
    if spec.endswith(".model"):
        return SentencePieceTokenizer(spec)
    if spec.endswith(".json"):
        return HfTokenizer(spec)
    raise UsageError(f"unknown tokenizer {spec!r}: give 'bytes', a SentencePiece .model file or a "
                     f"Hugging Face .json file")


MODEL_TYPES = ("unigram", "bpe")
# SentencePiece skips training lines longer than max_sentence_length bytes; longer lines are cut
# into pieces of this many characters (at most 4 bytes each) so that no text is silently lost.
_MAX_LINE_CHARS = 4096


def train_sentencepiece(
    source: str | os.PathLike | Iterable[str],
    model_prefix: str | os.PathLike,
    vocab_size: int,
    model_type: str = "unigram",
    byte_fallback: bool = True,
    max_sentences: int | None = 100_000,
    seed: int = 0,
    text_key: str = "text",
    **trainer_options: Any,
) -> str:
    """Train a SentencePiece model on local text; returns the path of ``<model_prefix>.model``
    (a ``.vocab`` file is written beside it).

    ``source`` is a path (file or folder, read with ``pax_lm.corpus.read_documents``) or the
    documents themselves. Each line of a document is one training sentence; more than
    ``max_sentences`` lines are subsampled (seeded) because training time grows with the text.

    The model round-trips text exactly: normalization is the identity, whitespace is kept as it
    is (no collapsing, no dummy prefix), and ``byte_fallback`` spells characters outside the
    vocabulary as bytes instead of ``<unk>``. Ids 0 pad, 1 bos, 2 eos, 3 unk, as
    ``ByteTokenizer``'s first three. ``trainer_options`` go to ``SentencePieceTrainer.train``.
    """
    import sentencepiece

    if model_type not in MODEL_TYPES:
        raise UsageError(f"unknown SentencePiece model type {model_type!r}: use one of "
                         f"{', '.join(MODEL_TYPES)}")
    if isinstance(source, str | os.PathLike):
        source = read_documents(source, text_key)
    lines = _training_lines(source, max_sentences, seed)
    if not lines:
        raise UsageError("no text to train a tokenizer on")
    prefix = os.fspath(model_prefix)
    os.makedirs(os.path.dirname(os.path.abspath(prefix)), exist_ok=True)
    options = dict(
        model_type=model_type, vocab_size=vocab_size, byte_fallback=byte_fallback,
        normalization_rule_name="identity", remove_extra_whitespaces=False,
        add_dummy_prefix=False, allow_whitespace_only_pieces=True,
        pad_id=0, bos_id=1, eos_id=2, unk_id=3, max_sentence_length=4 * _MAX_LINE_CHARS,
        num_threads=os.cpu_count() or 1, minloglevel=2,
    )
    options.update(trainer_options)
    try:
        sentencepiece.SentencePieceTrainer.train(
            sentence_iterator=iter(lines), model_prefix=prefix, **options)
    except RuntimeError as e:
        # "INTERNAL: src/trainer_interface.cc(744) [check] Vocabulary size too high (8000). ..."
        message = str(e).splitlines()[0].rsplit("] ", 1)[-1]
        raise UsageError(f"SentencePiece training failed: {message}") from None
    return prefix + ".model"


def _training_lines(documents: Iterable[str], max_sentences: int | None, seed: int) -> list[str]:
    lines = [
        line[i:i + _MAX_LINE_CHARS]
        for document in documents
        for line in document.splitlines()
        if line.strip()
        for i in range(0, len(line), _MAX_LINE_CHARS)
    ]
    if max_sentences is not None and len(lines) > max_sentences:
        keep = np.random.default_rng(seed).choice(len(lines), max_sentences, replace=False)
        lines = [lines[i] for i in np.sort(keep)]
    return lines
