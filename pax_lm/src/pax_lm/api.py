"""A language-model job from Python: ``pax_lm.load(job_dir)`` and its text in, text out.

``load`` restores the job as ``pax decode`` and ``pax score`` do (``restore_lm``: the decoder
and its variables, int8 with ``quantize="int8"``, and the job's tokenizer); ``generate`` is
``pax decode --prompts`` (every prompt through the engine's slots with continuous batching),
``beam_search`` is ``pax decode --beam-size`` and ``score`` is ``pax score``, each on the
command's own code. A mistake (a bad setting, a prompt too long) is a ``UsageError`` naming it.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from typing import Any

from pax_core import LoadedJob, PluginHost, UsageError, job_request
from pax_lm.commands.lm_jobs import restore_lm
from pax_lm.decoding import prompt_ids, until_eos


@dataclasses.dataclass(frozen=True)
class Continuation:
    """One hypothesis of a beam search: its ``text`` and ``tokens`` (eos in neither),
    ``score`` (``log_prob`` over the length penalty), ``log_prob`` (natural log, summed over
    the tokens, eos included) and ``finish_reason`` (``stop``: eos; ``length``)."""

    text: str
    tokens: list[int]
    score: float
    log_prob: float
    finish_reason: str


@dataclasses.dataclass
class LmJob(LoadedJob):
    """A language-model job restored for decoding and scoring: ``tokenizer``, ``decoder`` and
    ``decoder_variables`` (int8 ones with ``quantize="int8"``), with ``model``, ``config``,
    ``experiment``, ``step`` and ``job_dir`` as any loaded job. The train state is not kept
    (the decoder's variables are all that decoding needs)."""

    tokenizer: Any = None
    decoder: Any = None
    decoder_variables: dict[str, Any] = dataclasses.field(default_factory=dict)
    quantize: str = "none"
    # The engine of the last ``generate``, by slot count: its programs compiled once serve
    # the next call with as many slots.
    _engine: Any = dataclasses.field(default=None, init=False, repr=False)

    def variables(self) -> dict[str, Any]:
        """The model's variables (the decoder's, under the model's names)."""
        if self.quantize != "none":
            raise UsageError(f"this job was loaded with quantize={self.quantize!r}: the model's "
                             f"own variables are not kept; use .decoder with "
                             f".decoder_variables, or load it with quantize='none'")
        return {name: {"decoder": value} for name, value in self.decoder_variables.items()}

    def generate(self, prompts: str | Sequence[str], *, max_tokens: int = 128,
                 temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0, seed: int = 0,
                 stop: Sequence[str] = (), batch_size: int = 8) -> list[str]:
        """The continuation of each prompt (a list even for one prompt), in order: greedy
        with ``temperature`` 0, else drawn (``top_k``, ``top_p``, ``seed``), ending at eos, a
        ``stop`` string (cut before it) or ``max_tokens``. Up to ``batch_size`` prompts decode
        at once, as ``pax decode --prompts --batch-size`` does."""
        from pax_lm.decoding import SamplingSettings
        from pax_lm.inference import Batcher, Engine, Request

        texts = _texts(prompts)
        if isinstance(stop, str):
            stop = (stop,)
        settings = until_eos(SamplingSettings(max_tokens, temperature, top_k, top_p, seed,
                                              tuple(stop)), self.tokenizer)
        if batch_size < 1:
            raise UsageError(f"batch_size must be >= 1, got {batch_size}")
        if self._engine is None or self._engine.slots != batch_size:
            self._engine = Engine(self.decoder, self.decoder_variables, slots=batch_size)
        ids = self._checked(self._engine, texts)
        batcher = Batcher(self._engine, self.tokenizer.decode)
        try:
            return [done.text for done in batcher.run(Request(i, settings) for i in ids)]
        except BaseException:  # an interrupted run leaves slots taken: the next starts afresh
            self._engine = None
            raise

    def beam_search(self, prompt: str, beam_size: int = 4, *, max_tokens: int = 128,
                    length_norm_alpha: float = 0.0) -> list[Continuation]:
        """The best continuations of ``prompt`` (at most ``beam_size``), best first, ranked by
        log-probability over GNMT's length penalty of ``length_norm_alpha``, as ``pax decode
        --beam-size`` finds them."""
        from pax_lm.inference import BeamSearch

        [text] = _texts(prompt)
        searcher = BeamSearch(self.decoder, self.decoder_variables, beam_size)
        [ids] = self._checked(searcher, [text])
        eos = self.tokenizer.eos_id
        found = []
        for h in searcher.search(ids, max_tokens, length_norm_alpha, eos):
            tokens = h.tokens[:-1] if h.finish_reason == "stop" else h.tokens
            found.append(Continuation(self.tokenizer.decode(tokens), tokens, h.score,
                                      h.log_prob, h.finish_reason))
        return found

    def score(self, pairs: Sequence[tuple[str, str]], *, batch_size: int = 8) -> list[Any]:
        """A ``Score`` of each ``(context, continuation)`` pair, in order: the continuation's
        log-likelihood after the context, its token count, whether greedy decoding gives it and
        whether the context was cut to fit, as ``pax score`` scores."""
        from pax_lm.scoring import Scorer, encode_pair

        if isinstance(pairs, tuple) and len(pairs) == 2 and all(isinstance(p, str)
                                                                for p in pairs):
            raise UsageError("score takes a list of (context, continuation) pairs; for one, "
                             "give [(context, continuation)]")
        encoded = []
        for number, pair in enumerate(pairs, 1):
            if not (isinstance(pair, (tuple, list)) and len(pair) == 2
                    and all(isinstance(p, str) for p in pair)):
                raise UsageError(f"pair {number}: expected (context, continuation), two "
                                 f"strings; got {pair!r}"[:200])
            encoded.append(encode_pair(self.tokenizer, *pair))
        return Scorer(self.decoder, self.decoder_variables, batch_size).score(encoded)

    def _checked(self, runner: Any, texts: list[str]) -> list[list[int]]:
        """Each prompt's ids as ``pax decode`` makes them, all checked before any decodes; a
        prompt the model cannot continue is a ``UsageError`` naming it."""
        found = []
        for number, text in enumerate(texts, 1):
            ids = prompt_ids(self.tokenizer, text)
            try:
                runner.check_prompt(ids)
            except UsageError as e:
                raise UsageError(f"prompt {number}: {e} (the bos token included)") from None
            found.append(ids)
        return found


def _texts(prompts: str | Sequence[str]) -> list[str]:
    texts = [prompts] if isinstance(prompts, str) else list(prompts)
    wrong = [p for p in texts if not isinstance(p, str)]
    if wrong:
        raise UsageError(f"a prompt is text; got {type(wrong[0]).__name__}")
    return texts


def load(job_dir: str | os.PathLike[str], quantize: str = "none", *, step: int | None = None,
         overrides: Any = (), platform: str | None = None,
         host: PluginHost | None = None, exp: str | None = None) -> LmJob:
    """Restore a language-model job's latest checkpoint (or ``step``'s) for decoding and
    scoring, its decoder quantized as ``quantize`` says (``none``, ``int8``), as ``pax decode``
    restores it (with experiment ``exp`` in place of the recorded one, as ``--exp``); a job
    that is no text language model is a ``UsageError``."""
    from pax_lm.quantization import MODES

    if quantize not in MODES:
        raise UsageError(f"quantize must be one of {', '.join(MODES)}, got {quantize!r}")
    request = job_request(job_dir, step=step, overrides=overrides, platform=platform, host=host,
                          exp=exp)
    restored, tokenizer, decoder, variables = restore_lm(request, quantize)
    return LmJob(restored.run, None, restored.step, request.job_dir, tokenizer, decoder,
                 variables, quantize)
