"""SeqIO tasks and mixtures as a Pax input, by name, as paxml's ``SeqIOInput``.

A SeqIO task (or mixture) is looked up by name in SeqIO's registries after importing the modules
that register it (``module_imports``, as Pax's experiments imported their task modules), read
through ``seqio.get_dataset`` with a feature converter, and handed to the loop as numpy batches
with the keys pax-lm's ``LanguageModel`` consumes.

Each process reads its own shard, ``seqio.ShardInfo(index=process_index,
num_shards=process_count)``, as Pax did: SeqIO shards by file when the split has at least as
many files as processes, else by example. The data a process sees therefore depends on the
process count, and a saved position only means something for the process count that saved it:
``set_state`` refuses a position saved with another count. The rest of a position's rules (a
position of another task, split or settings refused; order defaults from ``is_training``) are
the core's ``IndexedInput``, whose stream here is SeqIO's tf.data pipeline.

TensorFlow and SeqIO are imported when an input is built, never when this module is imported,
so an experiment module can name ``SeqIOInput`` without loading TensorFlow.
"""

from __future__ import annotations

import collections.abc
import contextlib
import dataclasses
import difflib
import functools
import importlib
import math
import os
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from pax_core import IndexedInput, UsageError, fingerprint

if TYPE_CHECKING:
    import jax
    import tensorflow as tf

# Feature converters by the name an experiment gives; each yields Pax's LM batch keys.
FEATURE_CONVERTERS = ("lm",)
BATCH_KEYS = ("ids", "labels", "weights", "segment_ids", "segment_pos")
# How many close names an unknown task name suggests.
_SUGGESTIONS = 5
_configured = False  # TensorFlow's devices chosen (_libraries)


def _libraries() -> tuple[Any, Any]:
    """``(seqio, tensorflow)``, imported on first use.

    TensorFlow only feeds the host's input pipeline here. Its C++ INFO lines (a missing CUDA
    driver on a CPU machine) stay out of the console unless the user asks for them; and when
    JAX computes on GPUs, TensorFlow is kept off them, so that it never takes their memory.
    """
    global _configured
    if "tensorflow" not in sys.modules:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    import seqio
    import tensorflow as tf

    if not _configured:
        _configured = True
        import jax

        if jax.default_backend() == "gpu":
            # RuntimeError: TensorFlow's devices are already in use; leave them.
            with contextlib.suppress(RuntimeError):
                tf.config.set_visible_devices([], "GPU")
    return seqio, tf


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0] if text else ''}".rstrip(": ")


@dataclasses.dataclass
class SeqIOInput(IndexedInput):
    """This process's batches of a SeqIO task or mixture: ``ids``, ``labels``, ``weights``
    (float32), ``segment_ids`` and ``segment_pos``, each ``[local batch, seq_len]`` with
    ``seq_len = task_feature_lengths["targets"]``.

    Fields:

    * ``mixture_or_task_name``: a name in SeqIO's task or mixture registry.
    * ``split_name``: the split to read (``"train"``, ``"validation"``, ...).
    * ``task_feature_lengths``: the task's features and their lengths, e.g.
      ``{"targets": 1024}``; SeqIO trims or packs to them.
    * ``feature_converter``: ``"lm"``, a decoder-only LM (``seqio.LMFeatureConverter``):
      ``ids`` are ``decoder_input_tokens``, ``labels`` ``decoder_target_tokens``, ``weights``
      ``decoder_loss_weights``.
    * ``packing``: pack several examples into a row (segments 1, 2, ... with positions from 0
      in each); default ``is_training``. Unpacked rows are one segment: ``segment_ids`` 1 where
      a token is predicted (weight > 0) and 0 on padding, ``segment_pos`` 0, 1, 2, ...
    * ``shuffle``, ``repeat``: default ``is_training``. Shuffling (files and examples) is seeded
      by ``seed``, so a pipeline rebuilt with the same settings gives the same batches.
      ``num_workers`` must stay 0: tf.data reads in parallel itself.
    * ``use_cached``: read the task's offline cache (``seqio.add_global_cache_dirs``).
    * ``module_imports``: modules imported before the lookup: those that register the tasks.

    Position: ``get_state()`` is ``{"batches": n, "rows_per_process": r, "process_count": P,
    "data": key}``: this input has delivered ``n`` batches, ``r`` rows of its shard (``n`` times
    the local batch size, padding rows included), in a run of ``P`` processes, of the task,
    split and settings ``key`` names. ``set_state`` rebuilds the pipeline and skips ``r`` rows
    of the shard, so a resumed run continues with the next batch (and a changed batch size with
    the next example). A position saved with another process count is refused with a
    ``UsageError``: with another count every process reads another shard, so no position of the
    old run names the same data; so is one of another task, split or settings.

    A finite input (``repeat=False``, the default for eval) counts the rows of every process's
    shard first, so that every process reads the same number of batches, the largest shard's;
    rows past a shard's end (the last partial batch, and whole batches on smaller shards) are
    padding with weight 0. An evaluation over all batches (``eval_num_batches=-1``) thus counts
    every example exactly once, whatever the batch size and process count, and then raises
    ``StopIteration``. A finite mixture ends when its first task runs out (SeqIO samples with
    ``stop_on_empty_dataset``), so evaluate tasks one by one rather than a mixture.
    """

    mixture_or_task_name: str = ""
    split_name: str = "train"
    task_feature_lengths: dict[str, int] = dataclasses.field(default_factory=dict)
    CHANGED: ClassVar[str] = ("the task, split, feature lengths, packing, seed, shuffle or "
                              "repeat")

    feature_converter: str = "lm"
    packing: bool | None = None
    use_cached: bool = False
    module_imports: tuple[str, ...] = ()

    def __post_init__(self):
        super().__post_init__()
        if not isinstance(self.task_feature_lengths, collections.abc.Mapping):
            raise UsageError(f"{self._where}: task_feature_lengths must be a dict of feature "
                             f"lengths, e.g. {{'targets': 1024}}; got "
                             f"{self.task_feature_lengths!r}")
        self.task_feature_lengths = dict(self.task_feature_lengths)
        if isinstance(self.module_imports, str):  # one module, not its letters
            self.module_imports = (self.module_imports,)
        self.module_imports = tuple(self.module_imports)
        self._check_fields()
        # The registry lookup imports TensorFlow but reads no data: a wrong name, split or
        # feature stops `pax train` (exit 2) before anything is written, eval inputs included.
        self._provider = self._look_up()
        self._shard_rows: list[int] | None = None  # every shard's row count (finite input)

    # -- configuration -------------------------------------------------------------------------

    @property
    def _where(self) -> str:
        return f"input '{self.name}'"

    @property
    def _packs(self) -> bool:
        return self.is_training if self.packing is None else self.packing

    @property
    def seq_len(self) -> int:
        """Positions of a row: the length of the ``targets`` feature."""
        return self.task_feature_lengths["targets"]

    def _check_fields(self) -> None:
        where = self._where
        if not self.mixture_or_task_name:
            raise UsageError(f"{where}: mixture_or_task_name is empty; name a registered SeqIO "
                             f"task or mixture")
        if self.feature_converter not in FEATURE_CONVERTERS:
            raise UsageError(f"{where}: feature_converter must be one of "
                             f"{', '.join(FEATURE_CONVERTERS)}, got {self.feature_converter!r}")
        for feature, length in self.task_feature_lengths.items():
            if not isinstance(length, int) or isinstance(length, bool) or length < 1:
                raise UsageError(f"{where}: task_feature_lengths[{feature!r}] must be a positive "
                                 f"integer, got {length!r}")
        if self.num_workers:
            raise UsageError(f"{where}: num_workers must be 0: SeqIO's tf.data pipeline reads in "
                             f"parallel itself")
        if self.repeats and not self.is_training and self.eval_num_batches == -1:
            raise UsageError(f"{where}: repeat=True with eval_num_batches=-1 never ends; set "
                             f"eval_num_batches or leave repeat to its default")

    def _look_up(self) -> Any:
        """The registered task or mixture, after importing ``module_imports``; every mistake
        in naming it, its split or its features is one ``UsageError`` line."""
        where, name = self._where, self.mixture_or_task_name
        seqio, _ = _libraries()  # first: a task module may start TensorFlow
        for module in self.module_imports:
            try:
                importlib.import_module(module)
            except Exception as e:
                raise UsageError(f"{where}: module_imports: cannot import {module!r} "
                                 f"({_first_line(e)})") from e
        registered = sorted({*seqio.TaskRegistry.names(), *seqio.MixtureRegistry.names()})
        if name not in registered:
            raise UsageError(f"{where}: no SeqIO task or mixture named {name!r}"
                             + _suggest(name, registered, self.module_imports))
        provider = seqio.get_mixture_or_task(name)
        splits = sorted(provider.splits)
        if self.split_name not in splits:
            raise UsageError(f"{where}: SeqIO {_kind(provider, seqio)} {name!r} has no split "
                             f"{self.split_name!r}; its splits: {', '.join(splits) or 'none'}")
        self._check_features(provider, seqio)
        self._check_cache(provider, seqio)
        return provider

    def _check_features(self, provider: Any, seqio: Any) -> None:
        where, name = self._where, self.mixture_or_task_name
        features = sorted(provider.output_features)
        needed = sorted(seqio.LMFeatureConverter.TASK_FEATURES)
        for feature in needed:
            if feature not in features:
                raise UsageError(f"{where}: the '{self.feature_converter}' feature converter "
                                 f"needs a {feature!r} feature, and SeqIO "
                                 f"{_kind(provider, seqio)} {name!r} has only "
                                 f"{', '.join(features)}")
            if feature not in self.task_feature_lengths:
                raise UsageError(f"{where}: task_feature_lengths has no length for {feature!r} "
                                 f"(the '{self.feature_converter}' feature converter reads it); "
                                 f"e.g. task_feature_lengths={{{feature!r}: 1024}}")
        for feature in self.task_feature_lengths:
            if feature not in features:
                raise UsageError(f"{where}: task_feature_lengths names {feature!r}, which SeqIO "
                                 f"{_kind(provider, seqio)} {name!r} does not have; its "
                                 f"features: {', '.join(features)}")

    def _check_cache(self, provider: Any, seqio: Any) -> None:
        for task in seqio.get_subtasks(provider):
            if self.use_cached and task.supports_caching and not task.cache_dir:
                raise UsageError(f"{self._where}: use_cached=True, but SeqIO task "
                                 f"{task.name!r} is in none of the cache directories "
                                 f"({', '.join(seqio.get_global_cache_dirs()) or 'none set'}); "
                                 f"cache it (seqio_cache_tasks) or set use_cached=False")
            if task.requires_caching and not self.use_cached:
                raise UsageError(f"{self._where}: SeqIO task {task.name!r} must be read from "
                                 f"its cache; set use_cached=True")

    # -- the pipeline --------------------------------------------------------------------------

    def shard(self, process_index: int, process_count: int) -> None:
        if process_count != self.process_count:
            self._shard_rows = None
        super().shard(process_index, process_count)

    def _examples(self, index: int, count: int) -> tf.data.Dataset:
        """Shard ``index`` of ``count``: one example (a row of Pax's keys) at a time."""
        seqio, tf = _libraries()
        try:
            ds = seqio.get_dataset(
                self._provider,
                task_feature_lengths=self.task_feature_lengths,
                feature_converter=seqio.LMFeatureConverter(pack=self._packs),
                dataset_split=self.split_name,
                use_cached=self.use_cached,
                shuffle=self.shuffles,
                num_epochs=None if self.repeats else 1,
                shard_info=seqio.ShardInfo(index=index, num_shards=count),
                seed=self.seed,
                verbose=False,
            )
        except (ValueError, AssertionError, tf.errors.NotFoundError) as e:
            # SeqIO says ValueError for what the user names: files not found, a split too small.
            raise UsageError(f"{self._where}: SeqIO cannot read {self.mixture_or_task_name!r} "
                             f"split {self.split_name!r}: {_first_line(e)}") from e
        options = tf.data.Options()
        options.deterministic = True  # the same batches after a rebuild (resume, reset)
        to_pax = tf.autograph.experimental.do_not_convert(functools.partial(
            _to_pax_keys, tf, self._packs))  # plain TensorFlow ops: nothing to convert
        return ds.with_options(options).map(to_pax, num_parallel_calls=tf.data.AUTOTUNE)

    def shard_rows(self) -> list[int]:
        """Rows in each process's shard of a finite input (examples, or packed rows), counted
        once per process count; every process counts them all, so all agree on the number of
        batches."""
        if self.repeats:
            raise UsageError(f"{self._where}: a repeating input has no end to count")
        if self._shard_rows is None:
            counts = [int(self._examples(p, self.process_count).reduce(
                np.int64(0), lambda n, _: n + 1)) for p in range(self.process_count)]
            if not sum(counts):
                raise UsageError(f"{self._where}: split {self.split_name!r} of "
                                 f"{self.mixture_or_task_name!r} has no examples")
            self._shard_rows = counts
        return self._shard_rows

    def num_batches(self) -> int:
        """Batches a finite input gives on every process: its largest shard's."""
        return max(math.ceil(rows / self.local_batch_size) for rows in self.shard_rows())

    # -- the stream (IndexedInput): this shard's rows, from a number of rows on --------------

    def data_key(self) -> str:
        return fingerprint(self.mixture_or_task_name, self.split_name,
                           self.task_feature_lengths, self.feature_converter, self._packs,
                           self.seed, self.shuffles, self.repeats, self.use_cached)

    def stream(self, position: dict[str, Any], workers: bool) -> Iterator[dict[str, Any]]:
        del workers  # tf.data's own
        rows = position["rows_per_process"]
        _, tf = _libraries()
        ds = self._examples(self.process_index, self.process_count)
        ds = ds.skip(rows).batch(self.local_batch_size, drop_remainder=self.repeats)
        end = None if self.repeats else self.num_batches() * self.local_batch_size
        return self._padded_batches(ds.prefetch(tf.data.AUTOTUNE).as_numpy_iterator(), rows,
                                    end)

    def _padded_batches(self, batches: Iterator[dict[str, np.ndarray]], rows: int,
                        end: int | None) -> Iterator[dict[str, Any]]:
        """The batches after ``rows``, each carrying the position after it; a finite shard
        is padded with batches of weight 0 up to ``end`` rows."""
        _, tf = _libraries()
        while end is None or rows < end:
            try:
                batch = next(batches)
            except StopIteration:
                if self.repeats:
                    raise UsageError(
                        f"{self._where}: split {self.split_name!r} of "
                        f"{self.mixture_or_task_name!r} gives process {self.process_index} of "
                        f"{self.process_count} no examples (SeqIO shards by file when a split "
                        f"has at least as many files as processes, else by example)") from None
                batch = None  # past this shard's end: a batch of padding
            except tf.errors.NotFoundError as e:
                raise UsageError(f"{self._where}: SeqIO cannot read "
                                 f"{self.mixture_or_task_name!r} split {self.split_name!r}: "
                                 f"{_first_line(e)}") from e
            rows += self.local_batch_size
            yield {**self._padded(batch), self.POSITION: self._position_at(rows)}

    def _position_at(self, rows: int) -> dict[str, int]:
        return {"batches": rows // self.local_batch_size, "rows_per_process": rows,
                "process_count": self.process_count}

    def _padded(self, batch: dict[str, np.ndarray] | None) -> dict[str, np.ndarray]:
        """``batch`` filled up to the local batch size with rows of weight 0."""
        shape = (self.local_batch_size, self.seq_len)
        out = {k: np.zeros(shape, np.float32 if k == "weights" else np.int32) for k in BATCH_KEYS}
        if batch is not None:
            rows = len(batch["ids"])
            for key in BATCH_KEYS:
                out[key][:rows] = batch[key]
        return out

    def first_position(self) -> dict[str, Any]:
        return self._position_at(0)

    def read_position(self, state: Any) -> dict[str, Any]:
        try:
            rows, count = int(state["rows_per_process"]), int(state["process_count"])
        except (KeyError, TypeError, ValueError):
            # Not a position at all: the checkpoint is damaged (the run falls back), unlike a
            # position of another process count below, which is the user's to act on.
            raise ValueError(f"{state!r} is not a position of a SeqIO input "
                             f"(rows_per_process, process_count)") from None
        if count != self.process_count:
            raise UsageError(
                f"{self._where}: the saved position is from a run of {count} process(es), this "
                f"run has {self.process_count}; SeqIO gives each process its own shard "
                f"(seqio.ShardInfo), so the data depends on the process count: resume with "
                f"{count} process(es), or train in a new job directory")
        if rows < 0:
            raise UsageError(f"{self._where}: rows_per_process must be >= 0, got {rows}")
        return self._position_at(rows)

    def set_state(self, state: dict[str, Any]) -> None:
        if isinstance(state, dict) and self.KEY_NAME not in state:
            state = {**state, self.KEY_NAME: self.data_key()}  # saved before positions had it
        super().set_state(state)

    def abstract_batch(self) -> dict[str, jax.ShapeDtypeStruct]:
        """Shapes from ``task_feature_lengths`` and the local batch size; reads no data, so
        ``pax plan`` works where the data is not."""
        import jax

        shape = (self.local_batch_size, self.seq_len)
        return {k: jax.ShapeDtypeStruct(shape, np.float32 if k == "weights" else np.int32)
                for k in BATCH_KEYS}


def _to_pax_keys(tf: Any, packed: bool, example: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
    """SeqIO's decoder features under the names pax-lm's LanguageModel reads."""
    weights = example["decoder_loss_weights"]
    if packed:
        segment_ids, positions = example["decoder_segment_ids"], example["decoder_positions"]
    else:  # one example a row: one segment over the predicted tokens
        segment_ids = tf.cast(weights > 0, tf.int32)
        positions = tf.range(tf.shape(weights)[-1], dtype=tf.int32)
    return {"ids": tf.cast(example["decoder_input_tokens"], tf.int32),
            "labels": tf.cast(example["decoder_target_tokens"], tf.int32),
            "weights": tf.cast(weights, tf.float32),
            "segment_ids": tf.cast(segment_ids, tf.int32),
            "segment_pos": tf.cast(positions, tf.int32)}


def _kind(provider: Any, seqio: Any) -> str:
    return "mixture" if isinstance(provider, seqio.Mixture) else "task"


def _suggest(name: str, registered: list[str], module_imports: tuple[str, ...]) -> str:
    """The end of an unknown-name message: close registered names, or how to register one."""
    close = difflib.get_close_matches(name, registered, n=_SUGGESTIONS, cutoff=0.6)
    if close:
        return f"; close registered names: {', '.join(close)}"
    if not registered:
        return ("; none is registered: list the module that registers it in module_imports"
                if not module_imports else
                f"; none is registered after importing {', '.join(module_imports)}")
    return (f"; {len(registered)} are registered (e.g. {', '.join(registered[:_SUGGESTIONS])}); "
            f"is the module that registers it in module_imports?")
