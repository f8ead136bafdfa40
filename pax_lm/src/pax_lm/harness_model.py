"""lm-eval's model interface over a Pax language model: ``PaxLM``, registered in lm-eval's model
registry as ``pax``.

EleutherAI's lm-evaluation-harness asks a model three kinds of question, and each is answered
by the Pax operation built for it, batched:

* ``loglikelihood`` (multiple choice and the like): each ``(context, continuation)`` pair is
  tokenized as ``pax score`` tokenizes it (``pax_lm.scoring.encode_pair``) and scored by the
  ``Scorer``: the continuation's summed log-probabilities, and whether greedy decoding gives it.
* ``loglikelihood_rolling`` (perplexity): a document's tokens after ``bos``, cut into lm-eval's
  rolling windows of the model's length (``get_rolling_token_windows`` with one token of
  context, made disjoint): every token is scored exactly once, each window after the first with
  as much of the text before it as the model holds; the windows are scored by the ``Scorer``
  too and summed per document.
* ``generate_until``: each context continued through the decoding engine's slots
  (``pax_lm.inference``'s ``Batcher``), stopping at eos, at the request's ``until`` strings (the
  text cut before the first), at ``max_gen_toks`` (lm-eval's 256 unless the task says) or at
  the model's length; greedy unless ``do_sample`` is true or a ``temperature`` is given
  (``do_sample`` false wins), ``top_k`` and ``top_p`` as ``pax decode`` has them, each request
  seeded by its position. A prompt keeps its last ``max_length - max_gen_toks`` tokens (at
  least one), as lm-eval's Hugging Face model keeps room for the whole generation.

Importing this module imports lm-eval (the ``pax-lm[harness]`` extra); ``pax eval --harness``
(``pax_lm.harness``) imports it only once lm-eval is known to be there. In lm-eval's own Python
API, ``simple_evaluate(model="pax", model_args="job_dir=DIR")`` restores a job's latest
checkpoint after importing this module.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from lm_eval.api.model import LM
from lm_eval.api.registry import register_model
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window, simple_parse_args_string
from tqdm import tqdm

from pax_core import JobRequest, PluginHost, UsageError
from pax_lm.commands.lm_jobs import restore_lm
from pax_lm.decoding import SamplingSettings
from pax_lm.inference import Batcher, Engine, Request
from pax_lm.scoring import Score, Scorer, encode_pair

MAX_GEN_TOKS = 256  # lm-eval's models' default when a task names none
# What of a request's generation settings Pax's decoding has; a task asking for anything else
# (beam search, a repetition penalty) is refused rather than evaluated otherwise.
GENERATION_KEYS = ("until", "max_gen_toks", "do_sample", "temperature", "top_k", "top_p")
# Arguments of ``model_args``: which job, and how to restore it (as ``pax eval`` takes them).
JOB_ARGS = ("job_dir", "exp", "plugin", "restore_step", "platform")
SCORED_AT_ONCE = 32  # batches handed to the Scorer per call, between progress updates


@register_model("pax")
class PaxLM(LM):
    """A Pax decoder (``decoder``, a ``TransformerLm``, with ``variables``, its ``params`` and
    any other collection it reads) and its job's ``tokenizer``, answering lm-eval's requests
    ``batch_size`` at a time; ``step`` is the checkpoint's, for the report."""

    def __init__(self, decoder: Any, variables: dict[str, Any], tokenizer: Any,
                 batch_size: int = 8, step: int | None = None) -> None:
        super().__init__()
        self.decoder, self.variables, self.tokenizer = decoder, variables, tokenizer
        self.batch_size, self.step = batch_size, step
        self.scorer = Scorer(decoder, variables, batch_size)
        self._engine = None

    @classmethod
    def from_job(cls, job: JobRequest, batch_size: int = 8) -> PaxLM:
        """The latest checkpoint of ``job`` (or the one it asks for); a job that is no text
        language model is refused."""
        restored, tokenizer, decoder, variables = restore_lm(job)
        return cls(decoder, variables, tokenizer, batch_size, step=restored.step)

    @classmethod
    def create_from_arg_string(cls, arg_string: str,
                               additional_config: dict[str, Any] | None = None) -> PaxLM:
        """``model_args="job_dir=DIR[,exp=..,plugin=..,restore_step=N,platform=..]"``."""
        return cls.create_from_arg_obj(simple_parse_args_string(arg_string), additional_config)

    @classmethod
    def create_from_arg_obj(cls, arg_dict: dict[str, Any],
                            additional_config: dict[str, Any] | None = None) -> PaxLM:
        """A job restored as ``pax eval`` restores it, from lm-eval's ``model_args``;
        ``batch_size`` is lm-eval's (a number; Pax does not search for one). JAX places the
        model, so lm-eval's ``device`` plays no part (``platform`` picks JAX's)."""
        unknown = sorted(set(arg_dict) - set(JOB_ARGS))
        if unknown or "job_dir" not in arg_dict:
            raise TypeError(f"model_args of pax take job_dir (required), exp, plugin, "
                            f"restore_step and platform; got {sorted(arg_dict)}")
        batch_size = (additional_config or {}).get("batch_size") or 8
        if not str(batch_size).isdigit() or int(batch_size) < 1:
            raise ValueError(f"pax needs a batch_size of 1 or more, got {batch_size!r}")
        step = arg_dict.get("restore_step")
        job = JobRequest(PluginHost(), str(arg_dict["job_dir"]), arg_dict.get("plugin"),
                         arg_dict.get("exp"), [], arg_dict.get("platform"),
                         None if step is None else int(step))
        return cls.from_job(job, int(batch_size))

    @property
    def max_length(self) -> int:
        """The model's length: the most tokens it reads at once."""
        return int(self.decoder.max_seq_len)

    def loglikelihood(self, requests: list[Any]) -> list[tuple[float, bool]]:
        """Each ``(context, continuation)``'s log-likelihood and whether it is greedy."""
        pairs = [encode_pair(self.tokenizer, *r.args) for r in requests]
        for request, (_, continuation) in zip(requests, pairs, strict=True):
            if len(continuation) > self.max_length:
                raise UsageError(
                    f"task {request.task_name}, document {request.doc_id}: a continuation is "
                    f"{len(continuation)} tokens; this model scores at most {self.max_length} "
                    f"at once")
        scored = [i for i, (_, continuation) in enumerate(pairs) if continuation]
        out = [(0.0, True)] * len(pairs)  # an empty continuation is certain, and greedy
        for i, score in zip(scored, self._score([pairs[i] for i in scored], "loglikelihood"),
                            strict=True):
            out[i] = (score.log_likelihood, score.is_greedy)
        return out

    def loglikelihood_rolling(self, requests: list[Any]) -> list[float]:
        """Each document's log-likelihood (after ``bos``), window by window."""
        windows, owners = [], []
        for n, request in enumerate(requests):
            (text,) = request.args
            for window in get_rolling_token_windows(
                    token_list=self.tokenizer.encode(text), prefix_token=self.tokenizer.bos_id,
                    max_seq_len=self.max_length, context_len=1):
                windows.append(make_disjoint_window(window))
                owners.append(n)
        totals = [0.0] * len(requests)
        for n, score in zip(owners, self._score(windows, "loglikelihood_rolling"), strict=True):
            totals[n] += score.log_likelihood
        return totals

    def generate_until(self, requests: list[Any]) -> list[str]:
        """Each context's continuation, cut before the first of its ``until`` strings."""
        jobs = []
        for index, request in enumerate(requests):
            context, gen_kwargs = request.args
            settings = sampling_settings(gen_kwargs, index, request.task_name,
                                         self.tokenizer.eos_id)
            prompt = [self.tokenizer.bos_id, *self.tokenizer.encode(context)]
            keep = max(1, self.max_length - settings.max_tokens)
            jobs.append(Request(prompt[-keep:], settings))
        if self._engine is None:  # its KV cache is made only for a task that generates
            self._engine = Engine(self.decoder, self.variables, slots=self.batch_size)
        batcher = Batcher(self._engine, self.tokenizer.decode)
        return [done.text for done in tqdm(batcher.run(jobs), total=len(jobs),
                                           desc="generate_until")]

    def _score(self, pairs: Sequence[tuple[list[int], list[int]]], what: str) -> list[Score]:
        """The Scorer's scores of ``pairs``, in order, handed over by length (so each call's
        batches are alike) a few batches at a time, with a progress bar."""
        order = sorted(range(len(pairs)), key=lambda i: len(pairs[i][0]) + len(pairs[i][1]))
        out: list[Score | None] = [None] * len(pairs)
        with tqdm(total=len(pairs), desc=what) as bar:
            for part in _chunks(order, self.batch_size * SCORED_AT_ONCE):
                for i, score in zip(part, self.scorer.score([pairs[i] for i in part]),
                                    strict=True):
                    out[i] = score
                bar.update(len(part))
        return out  # type: ignore[return-value]


def _chunks(items: list[int], size: int) -> Iterator[list[int]]:
    for start in range(0, len(items), size):
        yield items[start:start + size]


def sampling_settings(gen_kwargs: dict[str, Any], seed: int, task: str,
                      eos_id: int) -> SamplingSettings:
    """A ``generate_until`` request's generation settings as Pax's decoding takes them; a
    setting it has no counterpart for is a ``UsageError`` naming the task."""
    unknown = sorted(set(gen_kwargs) - set(GENERATION_KEYS))
    if unknown:
        raise UsageError(f"task {task} asks for generation settings {', '.join(unknown)}, "
                         f"which Pax's decoding does not have (it takes "
                         f"{', '.join(GENERATION_KEYS)})")
    def setting(key: str, default: Any) -> Any:
        value = gen_kwargs.get(key)
        return default if value is None else value

    until = setting("until", [])
    until = [until] if isinstance(until, str) else list(until)
    temperature = setting("temperature", 0.0)
    do_sample = gen_kwargs.get("do_sample")
    if do_sample is False:
        temperature = 0.0
    elif do_sample and temperature == 0:
        temperature = 1.0
    try:
        return SamplingSettings(
            max_tokens=setting("max_gen_toks", MAX_GEN_TOKS), temperature=temperature,
            top_k=setting("top_k", 0), top_p=setting("top_p", 1.0), seed=seed,
            stop=tuple(s for s in until if s), stop_ids=(eos_id,))
    except UsageError as e:
        raise UsageError(f"task {task}: {e}") from None
