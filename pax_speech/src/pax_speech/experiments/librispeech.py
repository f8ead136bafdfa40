"""Conformer + CTC at the sizes of Gulati et al. 2020 (S, M, L) on LibriSpeech's 960 hours, as
manifests the user writes (one JSONL line per utterance: ``audio``, ``text``) in
``DATA_DIR``. Data-parallel over a [1, 8, 1] mesh; length buckets up to the corpus's longest
utterances; the paper's SpecAugment and Adam (0.9, 0.98, 1e-9) with a 10k-step warm-up."""

from __future__ import annotations

from pax_speech.experiments.base import ManifestData, SpeechRecognitionExperiment


class LibriSpeechConformer(ManifestData, SpeechRecognitionExperiment):
    DATA_DIR = "~/librispeech"
    TRAIN_MANIFEST = "train-960.jsonl"
    EVAL_MANIFESTS = {"dev_clean": "dev-clean.jsonl", "dev_other": "dev-other.jsonl"}
    BATCH_SIZE = 256
    EVAL_BATCH_SIZE = 64
    NUM_TRAIN_STEPS = 150_000
    BUCKET_SECONDS = (5.0, 10.0, 15.0, 20.0, 25.0, 35.0)
    MAX_TEXT_LENGTH = 640
    INPUT_WORKERS = 16
    ICI_MESH_SHAPE = [1, 8, 1]


class ConformerCtcS(LibriSpeechConformer):
    """Conformer-S's encoder (144 wide, 16 blocks, 4 heads) with a CTC head: 8.4M weights."""

    MODEL_DIMS = 144
    FFN_DIMS = 576
    SUBSAMPLING_CHANNELS = 144


class ConformerCtcM(LibriSpeechConformer):
    """Conformer-M's encoder (256 wide, 16 blocks, 4 heads) with a CTC head, 26.3M weights:
    the usual ASR size."""


class ConformerCtcL(LibriSpeechConformer):
    """Conformer-L's encoder (512 wide, 17 blocks, 8 heads) with a CTC head: 110.7M weights."""

    MODEL_DIMS = 512
    NUM_LAYERS = 17
    NUM_HEADS = 8
    FFN_DIMS = 2048
    SUBSAMPLING_CHANNELS = 512
