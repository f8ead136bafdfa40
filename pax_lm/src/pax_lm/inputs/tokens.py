"""Language-model batches streamed from prepared token datasets (``pax data prepare``).

Nothing is loaded up front: a run of any size needs the datasets' index files (4 bytes a
document, memory-mapped) and the tokens of the batches in flight. The pipeline, in grain:

1. **Documents.** Each dataset's document numbers as a grain ``MapDataset``: shuffled globally
   with a seed (a new order every epoch), repeated for training, and, for a mixture, mixed by
   weight (``MapDataset.mix``: dataset ``d`` supplies ``weights[d] / sum(weights)`` of the
   documents).
2. **Rows.** ``pax_lm.inputs.packing`` plans rows of ``seq_len`` from document lengths alone
   (first-fit packing with segment ids and positions, or concatenation), and groups them into
   global batches. Every process plans every global batch; this costs index reads only.
3. **Tokens.** Process ``p`` reads the tokens of rows ``[p * local, (p + 1) * local)`` of each
   global batch and nothing else. With ``num_workers`` > 0 (training), grain's ``mp_prefetch``
   runs the pipeline in worker processes, worker ``w`` assembling global batches ``w, w + W,
   ...``: the batches are the same for any number of workers.

The position saved in checkpoints is the planner's (a pair of integers) and the number of batches
read: it is the same on every process and means the same rows whatever the process count, so a
resume continues on the exact next batch, also with another number of processes.

A finite input (evaluation) ends with ``StopIteration`` after a last batch filled with empty rows
(weight 0), so an evaluation counts every token once whatever the batch size and process count.

Text documents enter rows as ``[bos, *text, eos]`` and train on every prediction. Conversations
prepared with ``--chat`` are read by ``pax_lm.sft.prepared.PreparedChatInput`` through the same
pipeline: each enters as its stored tokens, and a prediction's weight is its label's loss-mask bit.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, ClassVar, Protocol

import grain
import numpy as np

from pax_core import IndexedInput, UsageError, fingerprint
from pax_lm.data.shards import PreparedDataset
from pax_lm.inputs.base import LmInput
from pax_lm.inputs.packing import Position, Row, RowPlanner, rows_per_batch


@dataclasses.dataclass
class TokensInput(LmInput):
    """Next-token batches ``ids``, ``labels``, ``weights``, ``segment_ids``, ``segment_pos``
    (each ``[local batch, seq_len]``) from one prepared dataset (``path``) or a weighted
    mixture of several (``mixture``: {path: weight}).

    ``tokenizer`` is the experiment's: the datasets must have been prepared with it.

    Position: ``{"position": [a, b], "batches": n, "plan": key}``, the planner's position after
    ``n`` batches and a key of what the rows are planned from (seed, layout, weights, the
    datasets). A position of another plan is refused (``UsageError``): it would name other rows.
    """

    KEY_NAME: ClassVar[str] = "plan"
    MASKED: ClassVar[bool] = False  # the datasets hold conversations with loss masks
    CHANGED: ClassVar[str] = ("the datasets, mixture weights, seed, seq_len, packing, shuffle "
                              "or repeat")

    path: str | None = None
    mixture: dict[str, float] | None = None

    def __post_init__(self):
        super().__post_init__()
        self._opened: _Sources | None = None

    def _check_fields(self) -> None:
        super()._check_fields()
        where = f"input '{self.name}'"
        if self.path is not None and self.mixture is not None:
            raise UsageError(f"{where}: give one of path (a prepared dataset) and mixture "
                             f"({{path: weight}}), not both")
        if self.mixture is not None:
            if not self.mixture:
                raise UsageError(f"{where}: the mixture is empty; give {{path: weight}}")
            for path, weight in self.mixture.items():
                if (not isinstance(weight, int | float) or isinstance(weight, bool)
                        or not math.isfinite(weight) or weight <= 0):
                    raise UsageError(f"{where}: the weight of {path} in the mixture must be a "
                                     f"number above 0, got {weight!r} (leave out a dataset "
                                     f"not to draw from it)")
            if not self.repeats:
                raise UsageError(f"{where}: a mixture is drawn from forever, so it cannot be a "
                                 f"finite input; evaluate each dataset on its own")

    def _open_datasets(self) -> list[TokenSource]:
        """The datasets to read, opened and checked (subclasses find them elsewhere)."""
        if self.path is None and self.mixture is None:
            raise UsageError(f"input '{self.name}': give path (a prepared dataset) or mixture "
                             f"({{path: weight}})")
        datasets = []
        for path in [self.path] if self.path is not None else list(self.mixture):
            data = PreparedDataset.open(path)  # text: conversations are refused
            data.check_tokenizer(self.tokenizer.name, self.tokenizer.fingerprint)
            datasets.append(data)
        return datasets

    def _sources(self) -> _Sources:
        """The datasets, opened and checked on first use (building a config reads nothing)."""
        if self._opened is not None:
            return self._opened
        datasets = self._open_datasets()
        weights = [1.0] if self.mixture is None else [float(w) for w in self.mixture.values()]
        # What the rows are planned from, hashed once: equal keys, equal rows at equal
        # positions (a key of the datasets' fingerprints, read here rather than every step).
        plan = [self.seed, self.seq_len, self.packing, self.shuffles, self.repeats, weights,
                [data.fingerprint for data in datasets]]
        self._opened = _Sources(datasets, weights, self.tokenizer.bos_id,
                                self.tokenizer.eos_id, self.tokenizer.pad_id, fingerprint(*plan),
                                self.MASKED)
        return self._opened

    def check(self) -> None:
        """Open the datasets: their files, sizes and tokenizer are checked on opening."""
        self._sources()

    # The stream (IndexedInput), planned in sequence: the position is the planner's.

    def data_key(self) -> str:
        return self._sources().plan_key

    def stream(self, position: dict[str, Any], workers: bool) -> grain.IterDataset:
        sources = self._sources()
        batches = PlannedBatches(sources, sources.documents(self.seed, self.shuffles,
                                                            self.repeats),
                                 self.seq_len, self.packing, self.batch_size,
                                 self.process_rows(), tuple(position["position"]),
                                 position["batches"])
        return self.prefetched(batches) if workers else batches

    def first_position(self) -> dict[str, Any]:
        return {"position": [0, 0], "batches": 0}

    def read_position(self, state: Any) -> dict[str, Any]:
        if isinstance(state, dict) and "position" not in state and "next_index" in state:
            raise UsageError(f"input '{self.name}': the checkpoint's input position was saved "
                             f"by an input that held its data in memory (an older pax-lm's C4 "
                             f"or text input); it names no rows here: train in a new job "
                             f"directory, or resume with the pax-lm that saved it")
        position = state.get("position") if isinstance(state, dict) else None
        if (not isinstance(position, list | tuple) or len(position) != 2
                or not isinstance(state.get("batches"), int)):
            raise ValueError(f"not a position of a token input: {state!r}")
        return {"position": [int(p) for p in position], "batches": state["batches"]}


class TokenSource(Protocol):
    """What the input reads of a dataset: ``pax_lm.data.shards.PreparedDataset``, or a text
    dataset tokenized as it is read (``pax_lm.data.tfds.TfdsText``); for a masked input, one
    whose ``masked_tokens`` gives loss masks (``pax_lm.sft.prepared.ChatSplit``)."""

    num_documents: int
    fingerprint: str  # changes when the documents do

    def lengths(self, documents: np.ndarray) -> np.ndarray:
        """Token counts of ``documents``."""

    def tokens(self, documents: list[int]) -> list[np.ndarray]:
        """Token ids of ``documents``."""


class _Sources:
    """The datasets of an input: documents to plan with, sequence lengths and tokens to read.
    ``masked``: the documents are conversations, entering rows as stored, with loss masks;
    else text, entering as ``[bos, *text, eos]``."""

    def __init__(self, datasets: list[TokenSource], weights: list[float], bos: int,
                 eos: int, pad: int, plan_key: str, masked: bool = False):
        self.datasets, self.weights = datasets, weights
        self.bos, self.eos, self.pad = bos, eos, pad
        self.plan_key = plan_key
        self.masked = masked

    def documents(self, seed: int, shuffle: bool, repeat: bool) -> grain.MapDataset:
        """The stream of (dataset, document) pairs."""
        streams = []
        for number, data in enumerate(self.datasets):
            docs = grain.MapDataset.range(data.num_documents)
            if shuffle:
                docs = docs.shuffle(seed=(seed + number) % 2**32)
            if repeat:
                docs = docs.repeat()
            streams.append(docs.map(functools.partial(_pair, number)))
        if len(streams) == 1:
            return streams[0]
        return grain.MapDataset.mix(streams, self.weights)

    def lengths(self, pairs: list[tuple[int, int]]) -> np.ndarray:
        """The sequence lengths of (dataset, document) pairs."""
        numbers = np.array(pairs, np.int64).reshape(-1, 2)
        out = np.empty(len(numbers), np.int64)
        for number, data in enumerate(self.datasets):
            mine = numbers[:, 0] == number
            if mine.any():
                out[mine] = data.lengths(numbers[mine, 1])
        return out if self.masked else out + 2  # text gains bos and eos

    def sequences(self, pairs: set[tuple[int, int]]
                  ) -> dict[tuple[int, int], tuple[np.ndarray, np.ndarray | None]]:
        """The token sequence of each (dataset, document) pair, with its loss mask (None:
        text, ``[bos, *tokens, eos]``, trained everywhere)."""
        out = {}
        for number, data in enumerate(self.datasets):
            docs = sorted(d for s, d in pairs if s == number)
            if not docs:
                continue
            if self.masked:
                out.update(((number, doc), sequence)
                           for doc, sequence in zip(docs, data.masked_tokens(docs), strict=True))
                continue
            for doc, ids in zip(docs, data.tokens(docs), strict=True):
                out[number, doc] = (np.concatenate([[self.bos], ids, [self.eos]]
                                                   ).astype(np.int32), None)
        return out


def _pair(number: int, document: int) -> tuple[int, int]:
    """Tag a document number with its dataset's (a module function: workers unpickle it)."""
    return number, int(document)


class PlannedBatches(grain.IterDataset):
    """This process's rows of each global batch from ``start`` on, each batch carrying the
    position after it (``IndexedInput.POSITION``: planner position and batch count). Sliced by
    ``mp_prefetch``: worker ``w`` of ``W`` assembles batches ``w, w + W, ...``."""

    def __init__(self, sources: _Sources, documents: grain.MapDataset, seq_len: int,
                 packing: str, batch_size: int, local_rows: slice, start: Position,
                 batches: int):
        super().__init__()
        self.sources, self.documents = sources, documents
        self.seq_len, self.packing, self.batch_size = seq_len, packing, batch_size
        self.local_rows = local_rows
        self.start, self.first_batch = start, batches
        self.worker = slice(0, None, 1)

    def set_slice(self, sl: slice, sequential_slice: bool = False) -> None:
        del sequential_slice  # batches are interleaved, never sequential blocks
        self.worker = sl

    def __iter__(self) -> _PlannedBatchIterator:
        return _PlannedBatchIterator(self)

    def __str__(self) -> str:
        return "PlannedBatches"


class _PlannedBatchIterator(grain.DatasetIterator):
    def __init__(self, spec: PlannedBatches):
        super().__init__()
        self.spec = spec
        documents = spec.documents
        length = len(documents)
        planner = RowPlanner(documents.__getitem__, spec.sources.lengths,
                             None if length >= np.iinfo(np.int64).max else length,
                             spec.seq_len, spec.packing)
        self.batches = rows_per_batch(planner.rows(spec.start), spec.batch_size)
        self.count = spec.first_batch

    def __next__(self) -> dict[str, np.ndarray]:
        worker = self.spec.worker
        while True:
            rows, position = next(self.batches)
            index = self.count - self.spec.first_batch
            self.count += 1
            if index % (worker.step or 1) == (worker.start or 0):
                batch = assemble(rows[self.spec.local_rows], self.spec.sources,
                                 self.spec.seq_len)
                batch[IndexedInput.POSITION] = {"position": np.array(position, np.int64),
                                                "batches": np.int64(self.count)}
                return batch

    def get_state(self) -> dict[str, Any]:
        # grain's worker processes ask after every element; the input's own position is the
        # one each batch carries, and a resume builds a new pipeline from it.
        return {"batches": self.count}

    def set_state(self, state: dict[str, Any]) -> None:
        raise NotImplementedError("TokensInput keeps the position; rebuild the pipeline")


def assemble(rows: list[Row], sources: _Sources, seq_len: int) -> dict[str, np.ndarray]:
    """The arrays of ``rows``: each segment's tokens, joined from its spans, give its ids
    (all but the last) and labels (all but the first); a prediction weighs 1, or, for
    conversations, its label's loss-mask bit (0 on prompts and templates' text)."""
    shape = (len(rows), seq_len)
    batch = {"ids": np.full(shape, sources.pad, np.int32),
             "labels": np.full(shape, sources.pad, np.int32),
             "segment_ids": np.zeros(shape, np.int32), "segment_pos": np.zeros(shape, np.int32)}
    weights = np.zeros(shape, np.float32)
    sequences = sources.sequences({(s.source, s.document)
                                   for row in rows for segment in row for s in segment})
    for r, row in enumerate(rows):
        column = 0
        for number, segment in enumerate(row, 1):
            pieces = [(sequences[s.source, s.document], slice(s.first, s.first + s.count))
                      for s in segment]
            tokens = np.concatenate([ids[at] for (ids, _), at in pieces])
            n = len(tokens) - 1
            batch["ids"][r, column:column + n] = tokens[:-1]
            batch["labels"][r, column:column + n] = tokens[1:]
            batch["segment_ids"][r, column:column + n] = number
            batch["segment_pos"][r, column:column + n] = np.arange(n)
            weights[r, column:column + n] = (
                1.0 if not sources.masked
                else np.concatenate([trained[at] for (_, trained), at in pieces])[1:])
            column += n
    batch["weights"] = weights
    return batch
