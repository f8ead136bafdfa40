"""Experiments on the demo data that ``pax speech make-demo-data DIR`` speaks with flite and
espeak-ng: the quick start, and the tests' smallest recognizer."""

from __future__ import annotations

from pax_speech.experiments.base import ManifestData, SpeechRecognitionExperiment


class QuickStartSpeech(ManifestData, SpeechRecognitionExperiment):
    """The quick start: a 4-block Conformer 144 wide (Conformer-S's width) trained with CTC on
    the generated demo speech in ``DATA_DIR`` (``pax speech make-demo-data ~/pax_speech_demo``),
    evaluated on its held-out sentences and, when Debian's ``pocketsphinx-testdata`` was there
    to copy, on 10 real recordings. About 10 minutes on two CPU cores."""

    MODEL_DIMS = 144
    NUM_LAYERS = 4
    NUM_HEADS = 4
    FFN_DIMS = 576
    CONV_KERNEL = 15
    SUBSAMPLING_CHANNELS = 32
    DROPOUT_RATE = 0.1
    LEARNING_RATE = 2e-3
    LR_COS_WARMUP = 100
    BATCH_SIZE = 16
    NUM_TRAIN_STEPS = 1000
    SUMMARY_INTERVAL_STEPS = 50
    EVAL_INTERVAL_STEPS = 250
    CHECKPOINT_EVERY_N_STEPS = 500
    CHECKPOINT_MAX_TO_KEEP = 2
    BUCKET_SECONDS = (1.75, 2.75, 5.0)
    MAX_TEXT_LENGTH = 64
    EVAL_MANIFESTS = {"heldout": "heldout.jsonl"}
    OPTIONAL_EVAL_MANIFESTS = {"real": "real.jsonl"}


class TinySpeechForTests(QuickStartSpeech):
    """The quick start cut down for tests: two blocks 32 wide, 20 steps."""

    MODEL_DIMS = 32
    NUM_LAYERS = 2
    NUM_HEADS = 2
    FFN_DIMS = 64
    CONV_KERNEL = 5
    SUBSAMPLING_CHANNELS = 8
    NUM_MEL_BINS = 40
    BATCH_SIZE = 8
    NUM_TRAIN_STEPS = 20
    LR_COS_WARMUP = 5
    SUMMARY_INTERVAL_STEPS = 5
    EVAL_INTERVAL_STEPS = 10
    CHECKPOINT_EVERY_N_STEPS = 10
    BUCKET_SECONDS = (2.0, 4.0)
    OPTIONAL_EVAL_MANIFESTS = {}
