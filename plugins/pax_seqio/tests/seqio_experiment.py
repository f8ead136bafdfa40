"""A tiny byte-level LM trained on a SeqIO task, for the end-to-end test: given to
``pax train --exp plugins/pax_seqio/tests/seqio_experiment.py:TinySeqIOLm``."""

from __future__ import annotations

import fiddle as fdl

from pax_lm import TinyLmForTests
from pax_seqio.inputs import SeqIOInput


class TinySeqIOLm(TinyLmForTests):
    """pax-lm's test model on ``pax_seqio_test_text`` (registered by ``seqio_test_tasks``):
    packed training rows, every validation sentence evaluated once."""

    VOCAB_SIZE = 259  # seqio.ByteVocabulary: pad, eos, unk and 256 bytes
    MAX_SEQ_LEN = 64
    NUM_TRAIN_STEPS = 30
    LR_COS_WARMUP = 5
    LR_COS_DECAY_START = 5
    LR_COS_DECAY_END = 40
    SUMMARY_INTERVAL_STEPS = 5
    EVAL_INTERVAL_STEPS = 30
    CHECKPOINT_EVERY_N_STEPS = 15
    TASK_NAME = "pax_seqio_test_text"

    def datasets(self) -> list[fdl.Config[SeqIOInput]]:
        common = dict(mixture_or_task_name=self.TASK_NAME, module_imports=("seqio_test_tasks",),
                      task_feature_lengths={"targets": self.MAX_SEQ_LEN},
                      batch_size=self.global_batch_size())
        return [fdl.Config(SeqIOInput, name="train", split_name="train", is_training=True,
                           **common),
                fdl.Config(SeqIOInput, name="validation", split_name="validation",
                           is_training=False, eval_num_batches=-1, **common)]
