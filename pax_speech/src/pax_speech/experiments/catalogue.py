"""The experiments pax-speech registers.

Plain data, so that listing them imports nothing: each class is imported only when a run uses
it.
"""

from __future__ import annotations

from pax_core import ExperimentRef


def _ref(module: str, name: str, summary: str) -> ExperimentRef:
    return ExperimentRef(name, f"pax_speech.experiments.{module}:{name}", summary)


EXPERIMENTS: list[ExperimentRef] = [
    _ref("demo", "QuickStartSpeech",
         "the quick start: a small Conformer + CTC on generated speech, 10 minutes on a CPU"),
    _ref("demo", "TinySpeechForTests", "the smallest recognizer: for tests"),
    *(_ref("librispeech", f"ConformerCtc{size}",
           f"Conformer-{size} + CTC on LibriSpeech 960h manifests, mesh [1, 8, 1]")
      for size in "SML"),
]
