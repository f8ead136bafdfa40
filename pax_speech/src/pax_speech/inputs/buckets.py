"""Which utterances make global batch ``k``: batches of utterances of similar length.

Every utterance goes to the smallest bucket whose bound (in samples) holds it, and a batch is
padded to its bucket's bound, so a run sees one batch shape per bucket (the training loop
compiles one step per shape) and pads little. The plan is a pure function of the lengths, the
bounds, the batch size and the seed, addressed by batch number: a resumed run, another process
count or another worker count computes the same global batches.

Training (``TrainingPlan``, endless): epoch ``e`` shuffles each bucket with a generator seeded
by (seed, e, bucket), cuts it into full batches (its remainder, a different one each epoch,
waits for a later epoch) and shuffles the epoch's batches by (seed, e). Every epoch has the
same number of batches ``n``, so batch ``k`` is item ``k % n`` of epoch ``k // n``.

Evaluation (``EvalPlan``, finite): the utterances sorted by length, cut in order, every one
exactly once; a batch takes the bucket of its longest utterance and the last one is padded
with rows of no utterance (index -1).
"""

from __future__ import annotations

import numpy as np

PADDING = -1  # the index of a row that holds no utterance


def assign(lengths: np.ndarray, bounds: tuple[int, ...]) -> np.ndarray:
    """The bucket of each length (the smallest bound >= it); ``len(bounds)`` for lengths
    longer than every bound."""
    return np.searchsorted(np.asarray(bounds), lengths, side="left")


class TrainingPlan:
    """The endless stream of training batches; ``shuffle=False`` keeps each bucket in
    manifest order and the batches in bucket order (the same every epoch)."""

    def __init__(self, buckets: np.ndarray, num_buckets: int, batch_size: int, seed: int,
                 shuffle: bool):
        self.members = [np.flatnonzero(buckets == b) for b in range(num_buckets)]
        self.batch_size, self.seed, self.shuffle = batch_size, seed, shuffle
        self.batches_per_epoch = sum(len(m) // batch_size for m in self.members)
        self._epoch: tuple[int, list[tuple[int, np.ndarray]]] | None = None

    def batch(self, k: int) -> tuple[int, np.ndarray]:
        """Global batch ``k``: its bucket and the indices of its utterances."""
        epoch, item = divmod(k, self.batches_per_epoch)
        if self._epoch is None or self._epoch[0] != epoch:
            self._epoch = (epoch, self._cut(epoch))
        return self._epoch[1][item]

    def _cut(self, epoch: int) -> list[tuple[int, np.ndarray]]:
        batches = []
        for bucket, members in enumerate(self.members):
            if self.shuffle:
                members = np.random.default_rng([self.seed, epoch, bucket]).permutation(members)
            full = len(members) // self.batch_size * self.batch_size
            batches += [(bucket, rows) for rows in
                        np.split(members[:full], full // self.batch_size)] if full else []
        if self.shuffle:
            order = np.random.default_rng([self.seed, epoch]).permutation(len(batches))
            batches = [batches[i] for i in order]
        return batches


class EvalPlan:
    """Every utterance once, in order of length (ties in manifest order), in
    ``num_batches`` batches; ``shuffle`` shuffles the order of the batches (by the seed)."""

    def __init__(self, lengths: np.ndarray, buckets: np.ndarray, batch_size: int, seed: int,
                 shuffle: bool):
        self.order = np.argsort(lengths, kind="stable")
        self.buckets, self.batch_size = buckets, batch_size
        self.num_batches = -(-len(self.order) // batch_size)
        self.sequence = (np.random.default_rng([seed]).permutation(self.num_batches)
                         if shuffle else np.arange(self.num_batches))

    def batch(self, k: int) -> tuple[int, np.ndarray]:
        """Batch ``k``: its bucket and the indices of its utterances (``PADDING`` past the
        last utterance)."""
        start = int(self.sequence[k]) * self.batch_size
        rows = np.full(self.batch_size, PADDING, np.int64)
        chosen = self.order[start:start + self.batch_size]
        rows[:len(chosen)] = chosen
        return int(self.buckets[chosen].max()), rows
