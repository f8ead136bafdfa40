"""The ``paxml`` weight format: checkpoints that paxml's trainer wrote of praxis LMs.

``pax import paxml CKPT --exp NAME --output JOB`` rebuilds the checkpoint's model from the Pax
LM catalogue experiment that trained it (a paxml checkpoint does not say which one: its
experiment name and ``--set`` overrides do), with ``PRAXIS_CONVENTIONS`` so that the model
computes as praxis does, and reads the weights (``mdl_vars``; the optimizer state is not
carried over) one array at a time into it. Layers are read from either of paxml's layouts,
``x_layers_<i>`` one folder a layer, or stacked under the ``repeat`` layer
(``USE_REPEATED_LAYER``), into the experiment's own (looped or scanned). ``pax export`` does
not write this format.

Names, praxis's on the left (``lm.`` + the path under ``mdl_vars.params.lm``), Pax's on the
right (the decoder's parameters)::

    softmax.logits_ffn.linear.w [d, V]        embedding/embedding [V, d] (its transpose; tied)
                                              softmax/kernel [d, V] (separate embedding)
    softmax.logits_ffn.bias.b [V]             softmax/bias
    embedding_lookup.emb_var [V, d]           embedding/embedding (separate embedding)
    final_ln.{scale,bias}                     final_norm/{scale,bias}
    transformer.<layer i>.
      layer_norm.{scale,bias}                 attention_norm/{scale,bias}
      self_attention.combined_qkv.w [3,d,N,H] attention/{query,key,value}/kernel [d, N, H]
      self_attention.{query,key,value}.w      the same, when COMBINE_QKV is off
      self_attention.combined_qkv.b [3, N, H] attention/{query,key,value}/bias (USE_BIAS)
      self_attention.per_dim_scale.per_dim_scale [H]   attention/per_dim_scale
      self_attention.post.w [d, N, H]         attention/out/kernel [N, H, d]
      self_attention.post.b [d]               attention/out/bias (USE_BIAS)
      ff_layer.layer_norm.{scale,bias}        ffn_norm/{scale,bias}
      ff_layer.ffn_layer1.{linear.w,bias.b}   ffn/wi/{kernel,bias}
      ff_layer.ffn_layer1_gate.{...}          ffn/wi_gate/{...} (gated: the activation's side)
      ff_layer.ffn_layer2.{...}               ffn/wo/{...}

where ``<layer i>`` is ``x_layers_<i>``, or ``repeat.sub.x_layers_0`` with layer i at index i
of a leading axis.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from pax_core import SourceModel, UsageError, WeightFormat, key_paths
from pax_lm.paxml.checkpoint import read_array, state_folder, weight_names

LOOPED = "lm.transformer.x_layers_{}."
REPEATED = "lm.transformer.repeat.sub.x_layers_0."

# A layer's parameters (their path under the layer) -> (praxis's name under the layer, what is
# taken of its array: an index into a combined array's axis -4 or -3, or a transform).
_QKV = {"query": 0, "key": 1, "value": 2}
LAYER: dict[tuple[str, ...], tuple[str, Callable[[np.ndarray], np.ndarray]]] = {
    ("attention_norm", "scale"): ("layer_norm.scale", lambda a: a),
    ("attention_norm", "bias"): ("layer_norm.bias", lambda a: a),
    ("attention", "per_dim_scale"): ("self_attention.per_dim_scale.per_dim_scale", lambda a: a),
    ("attention", "out", "kernel"): ("self_attention.post.w", lambda a: np.moveaxis(a, -3, -1)),
    ("attention", "out", "bias"): ("self_attention.post.b", lambda a: a),
    ("ffn_norm", "scale"): ("ff_layer.layer_norm.scale", lambda a: a),
    ("ffn_norm", "bias"): ("ff_layer.layer_norm.bias", lambda a: a),
    **{("ffn", pax, leaf): (f"ff_layer.{praxis}.{name}", lambda a: a)
       for pax, praxis in (("wi", "ffn_layer1"), ("wi_gate", "ffn_layer1_gate"),
                           ("wo", "ffn_layer2"))
       for leaf, name in (("kernel", "linear.w"), ("bias", "bias.b"))},
}


class PaxmlFormat(WeightFormat):
    """paxml 1.x checkpoints of praxis ``TransformerLm`` models (Pax's LM catalogue)."""

    writes: ClassVar[bool] = False

    def inspect(self, source: Path, assets: Path, exp: str | None, set_items: list[str]
                ) -> SourceModel:
        state, step = state_folder(source)
        if exp is None:
            raise UsageError("a paxml checkpoint does not say which model it holds: name the "
                             "experiment that trained it with --exp (Pax's LM catalogue, for "
                             "example --exp LmCloudSpmd2B), and its --set overrides")
        at = "" if step is None else f" step {step}"
        return SourceModel(exp, ["PRAXIS_CONVENTIONS=True", *set_items],
                           f"paxml checkpoint{at} of {exp} ({state.parent})")

    def read(self, source: Path, model: Any) -> Iterator[tuple[tuple[str, ...], np.ndarray]]:
        import flax.linen as nn
        import jax

        decoder = model.decoder
        if decoder.stack is not None:
            raise UsageError("the experiment runs its layers as a pipeline; import the paxml "
                             "checkpoint with the experiment's unpipelined twin")
        state, _ = state_folder(source)
        found = weight_names(state)
        shapes = jax.eval_shape(decoder.init, jax.random.key(0), np.zeros((1, 1), np.int32))
        reader = _Reader(state, found, decoder)
        for path in key_paths(nn.unbox(shapes["params"])):
            yield ("decoder", *path), reader.tensor(path)
        unused = sorted(set(found) - reader.used)
        if unused:
            raise UsageError(f"{state}: the checkpoint holds mdl_vars.params.{unused[0]}, which "
                             f"this experiment's model does not have; check --exp and --set")


class _Reader:
    """Fetches praxis's arrays for Pax's parameter paths, keeping the last array read (the
    combined query/key/value array serves three parameters, a stacked one every layer)."""

    def __init__(self, state: Path, found: dict[str, tuple[int, ...]], decoder: Any):
        self.state, self.found, self.decoder = state, found, decoder
        self.used: set[str] = set()
        self.repeated = any(name.startswith(REPEATED) for name in found)
        self._last: tuple[str, np.ndarray] | None = None

    def array(self, name: str) -> np.ndarray:
        if name not in self.found:
            raise UsageError(f"{self.state}: the checkpoint lacks mdl_vars.params.{name}, which "
                             f"this experiment's model holds (with praxis's conventions); "
                             f"check --exp and --set")
        if self._last is None or self._last[0] != name:
            self._last = (name, read_array(self.state, name))
            self.used.add(name)
        return self._last[1]

    def tensor(self, path: tuple[str, ...]) -> np.ndarray:
        d = self.decoder
        if path == ("embedding", "embedding"):
            if d.tied_embedding:
                return self.array("lm.softmax.logits_ffn.linear.w").T
            return self.array("lm.embedding_lookup.emb_var")
        if path == ("softmax", "kernel"):
            return self.array("lm.softmax.logits_ffn.linear.w")
        if path == ("softmax", "bias"):
            return self.array("lm.softmax.logits_ffn.bias.b")
        if path[0] == "final_norm":
            return self.array(f"lm.final_ln.{path[1]}")
        if path[:2] == ("stack", "layers"):  # scanned: every layer, stacked
            return self.layer_tensor(path[2:], None)
        if path[0] == "stack" and path[1].startswith("layer_"):
            return self.layer_tensor(path[2:], int(path[1].removeprefix("layer_")))
        raise UsageError(f"the model's parameter {'/'.join(path)} has no counterpart in "
                         f"praxis's TransformerLm; import into an experiment without it")

    def layer_tensor(self, rest: tuple[str, ...], layer: int | None) -> np.ndarray:
        """Layer ``layer``'s parameter ``rest`` (None: every layer's, stacked)."""
        if rest[0] == "attention" and rest[1] in _QKV:
            combined = "self_attention.combined_qkv." + ("w" if rest[2] == "kernel" else "b")
            if self._has(combined):
                axis = -4 if rest[2] == "kernel" else -3
                return self._layers(combined, layer, lambda a: np.take(a, _QKV[rest[1]], axis))
            name = f"self_attention.{rest[1]}." + ("w" if rest[2] == "kernel" else "b")
            return self._layers(name, layer, lambda a: a)
        if rest not in LAYER:
            raise UsageError(f"the model's layer parameter {'/'.join(rest)} has no counterpart "
                             f"in praxis's transformer layer; import into an experiment without "
                             f"it")
        name, take = LAYER[rest]
        return self._layers(name, layer, take)

    def _has(self, name: str) -> bool:
        return (REPEATED + name if self.repeated else LOOPED.format(0) + name) in self.found

    def _layers(self, name: str, layer: int | None, take: Callable[[np.ndarray], np.ndarray]
                ) -> np.ndarray:
        if self.repeated:
            stacked = take(self.array(REPEATED + name))
            return stacked if layer is None else stacked[layer]
        if layer is not None:
            return take(self.array(LOOPED.format(layer) + name))
        return np.stack([take(self.array(LOOPED.format(i) + name))
                         for i in range(self.decoder.num_layers)])
