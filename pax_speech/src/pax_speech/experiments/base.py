"""The base of pax-speech's experiments: the recognizer and its data from UPPER_CASE constants
(``--set MODEL_DIMS=144`` means what it says), on the core's skeleton
(``pax_core.SingleTaskExperiment``: optimizer, schedule, training). Subclasses set sizes and mix
in their data."""

from __future__ import annotations

import os

import fiddle as fdl

from pax_core import SingleTaskExperiment
from pax_speech.inputs.manifest import ManifestInput
from pax_speech.layers.conformer import ConformerConfig
from pax_speech.layers.frontend import LogMelConfig
from pax_speech.models import CtcRecognizer, SpecAugment
from pax_speech.vocab import ENGLISH


class SpeechRecognitionExperiment(SingleTaskExperiment):
    """A Conformer + CTC recognizer of 16 kHz speech into ``ALPHABET``'s characters.

    The encoder is ``NUM_LAYERS`` blocks ``MODEL_DIMS`` wide; features are ``NUM_MEL_BINS``
    log-mels normalised per utterance or by global statistics (``NORMALISATION``), masked by
    SpecAugment in training unless ``SPEC_AUGMENT`` is off. Adam with a linear warm-up over
    ``LR_COS_WARMUP`` steps and a cosine to ``LR_COS_MIN_RATIO`` at the last step. Early
    stopping watches the first eval set's character error rate (``EARLY_STOP_TARGET``).
    """

    constant_aliases = {"TARGET_CER": "EARLY_STOP_TARGET", "WARMUP_STEPS": "LR_COS_WARMUP"}

    # Model.
    MODEL_DIMS = 256
    NUM_LAYERS = 16
    NUM_HEADS = 4
    FFN_DIMS = 1024
    CONV_KERNEL = 32
    CONV_NORM = "batchnorm"
    SUBSAMPLING_CHANNELS = 256
    DROPOUT_RATE = 0.1
    NUM_MEL_BINS = 80
    NORMALISATION = "utterance"
    SPEC_AUGMENT = True
    FREQ_MASKS = 2
    MAX_FREQ_WIDTH = 27
    TIME_MASKS = 2
    MAX_TIME_WIDTH = 40
    MAX_TIME_RATIO = 0.05
    ALPHABET = ENGLISH
    FPROP_DTYPE = "float32"

    # Optimizer.
    ADAM_BETA2 = 0.98
    ADAM_EPSILON = 1e-9
    WEIGHT_DECAY = 1e-6
    CLIP_GRADIENT_NORM_TO_VALUE = 5.0
    LR_SCHEDULE = "linear_rampup_cosine_decay"
    LR_COS_WARMUP = 10_000
    LR_COS_MIN_RATIO = 0.01

    # Training and data.
    BATCH_SIZE = 256
    NUM_TRAIN_STEPS = 100_000
    EVAL_INTERVAL_STEPS = 5_000
    CHECKPOINT_EVERY_N_STEPS = 5_000
    CHECKPOINT_MAX_TO_KEEP = 5
    EARLY_STOP_METRIC = "cer"
    SAMPLE_RATE = 16000
    ON_OTHER_RATE = "resample"
    BUCKET_SECONDS: tuple[float, ...] = ()
    MAX_TEXT_LENGTH = 0
    INPUT_WORKERS = 0
    ICI_MESH_SHAPE: list[int] | None = None  # Pax's data-parallel path: every device

    def encoder(self) -> fdl.Config[ConformerConfig]:
        return fdl.Config(ConformerConfig, model_dims=self.MODEL_DIMS, num_layers=self.NUM_LAYERS,
                          num_heads=self.NUM_HEADS, ffn_dims=self.FFN_DIMS,
                          conv_kernel=self.CONV_KERNEL, conv_norm=self.CONV_NORM,
                          subsampling_channels=self.SUBSAMPLING_CHANNELS,
                          dropout_rate=self.DROPOUT_RATE, dtype=self.FPROP_DTYPE)

    def model(self) -> fdl.Config[CtcRecognizer]:
        masks = (fdl.Config(SpecAugment, freq_masks=self.FREQ_MASKS,
                            max_freq_width=self.MAX_FREQ_WIDTH, time_masks=self.TIME_MASKS,
                            max_time_width=self.MAX_TIME_WIDTH,
                            max_time_ratio=self.MAX_TIME_RATIO)
                 if self.SPEC_AUGMENT else None)
        return fdl.Config(CtcRecognizer, encoder=self.encoder(),
                          features=fdl.Config(LogMelConfig, sample_rate=self.SAMPLE_RATE,
                                              num_mel_bins=self.NUM_MEL_BINS),
                          normalisation=self.NORMALISATION, spec_augment=masks,
                          alphabet=self.ALPHABET)


class ManifestData:
    """Mixin: a training manifest and eval manifests (JSONL of ``audio``, ``text``) under
    ``DATA_DIR``: ``TRAIN_MANIFEST`` and ``EVAL_MANIFESTS`` (eval name -> file), each eval set
    read whole (its labels padded to its own longest transcript: ``MAX_TEXT_LENGTH`` is the
    training batches'). An eval manifest listed in ``OPTIONAL_EVAL_MANIFESTS`` is evaluated when its
    file exists (the demo's real recordings need a Debian package)."""

    DATA_DIR = "~/pax_speech_demo"
    TRAIN_MANIFEST = "train.jsonl"
    EVAL_MANIFESTS: dict[str, str] = {}
    OPTIONAL_EVAL_MANIFESTS: dict[str, str] = {}
    EVAL_BATCH_SIZE = 0  # 0: the training batch

    def _manifest(self, name: str, file: str, training: bool) -> fdl.Config[ManifestInput]:
        return fdl.Config(
            ManifestInput, name=name, manifest=os.path.join(os.path.expanduser(self.DATA_DIR),
                                                            file),
            is_training=training, eval_num_batches=1 if training else -1, seed=1234,
            batch_size=(self.global_batch_size() if training
                        else self.EVAL_BATCH_SIZE or self.global_batch_size()),
            sample_rate=self.SAMPLE_RATE, on_other_rate=self.ON_OTHER_RATE,
            bucket_seconds=tuple(self.BUCKET_SECONDS),
            max_text_length=self.MAX_TEXT_LENGTH if training else 0,
            alphabet=self.ALPHABET, num_workers=self.INPUT_WORKERS if training else 0)

    def datasets(self) -> list[fdl.Config[ManifestInput]]:
        root = os.path.expanduser(self.DATA_DIR)
        evals = dict(self.EVAL_MANIFESTS)
        evals.update({name: file for name, file in self.OPTIONAL_EVAL_MANIFESTS.items()
                      if os.path.exists(os.path.join(root, file))})
        return [self._manifest("train", self.TRAIN_MANIFEST, True),
                *(self._manifest(name, file, False) for name, file in evals.items())]
