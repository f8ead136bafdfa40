"""Int8 weights for running a trained decoder: scoring, evaluation and decoding.

``quantize(decoder, variables, "int8")`` gives the pair to run instead of ``(decoder,
variables)``: Qwix's post-training quantization (``qwix.PtqProvider``), weight-only, each
projection's kernel stored as int8 values with one float32 scale per output channel (symmetric,
absmax: the channel's largest magnitude maps to 127). The kernels are held as int8 in the
variables, not as rounded floats, so a decoder's weights take about a quarter of their float32
bytes; Qwix's matmul widens the kernel back to the activations' dtype as it reads it (XLA fuses
that into the matmul), so no float copy of a kernel is kept.

Which weights: the attention projections (``attention/query``, ``key``, ``value``, ``out``), the
feed-forward ones (``ffn/wi``, ``wi_gate``, ``wo``) and an untied output head (``softmax``),
with any low-rank adapters on them. The token embedding stays float: it is a table looked up
by row, not a matmul operand, and a tied model's output head is that same table, so it stays
float too. Norms, biases and positions are a negligible share of the bytes and stay float.

The quantized decoder runs every way the float one does, the KV-cached decode path included
(``apply(..., decode=True, mutable=["cache"])``), and ``init`` still gives its cache. Two
things the model code does that Qwix's linen integration does not cover are handled by the
provider here: a projection casts its kernel (``kernel.astype(dtype)``) and contracts it with
``jnp.tensordot``. A scanned stack (one block over a leading layer axis) is quantized layer by
layer through the same decoder unscanned, so each layer gets its own scales, then restacked.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

from pax_core import UsageError

MODES = ("none", "int8")

# The blocks' projections: attention's four and the dense feed-forward's (module paths,
# ``/``-joined, as Qwix matches them; int8 training quantizes these, ``quantized_training.py``).
BLOCK_PROJECTIONS = r"attention/(query|key|value|out)|ffn/(wi|wi_gate|wo)"
# The modules whose matmul weights become int8 here: those and an untied output head.
PROJECTIONS = rf"(.*/)?({BLOCK_PROJECTIONS}|softmax)"


def quantize(decoder: Any, variables: dict[str, Any], mode: str) -> tuple[Any, dict[str, Any]]:
    """The ``(decoder, variables)`` to run for ``mode``: unchanged for ``"none"``; for
    ``"int8"`` a Qwix-quantized decoder and variables whose projection kernels are int8 with
    per-channel scales (the other collections pass through)."""
    if mode not in MODES:
        raise UsageError(f"--quantize must be one of {', '.join(MODES)}, got {mode!r}")
    if mode == "none":
        return decoder, variables
    if getattr(decoder, "fp8", False):
        raise UsageError("--quantize int8 runs a decoder trained without fp8; this one computes "
                         "its projections in fp8 (leave --quantize at none)")
    import jax
    import qwix

    provider = _int8_provider()
    quantized = qwix.quantize_model(decoder, provider)
    params = _unboxed(variables["params"])
    twin = _unscanned(decoder)
    if twin is None:
        qparams = qwix.quantize_params(params, _abstract_params(quantized))
    else:
        layers = params["stack"]["layers"]
        count = decoder.num_layers
        looped = {f"layer_{i}": jax.tree.map(lambda x, i=i: x[i], layers) for i in range(count)}
        qparams = qwix.quantize_params({**params, "stack": looped},
                                       _abstract_params(qwix.quantize_model(twin, provider)))
        qparams["stack"] = _restack(qparams["stack"], count)
    _check_shapes(qparams, _abstract_params(quantized))
    return quantized, {**variables, "params": qparams}


def weight_bytes(params: Any) -> int:
    """The bytes of every array in ``params`` (int8 values and their scales counted alike)."""
    import jax

    return sum(leaf.nbytes for leaf in jax.tree.leaves(params))


@dataclasses.dataclass(frozen=True)
class _CastKernel:
    """A quantized kernel as a projection reads it: ``astype`` casts its scales (the dtype the
    product comes out in) and keeps the int8 values. Qwix's own wrapper re-boxes the cast
    value, which fails for a kernel that is already unboxed, as linen's are in ``apply``."""

    weight: Any  # Qwix's quantized weight: the QArray with how it was quantized

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.weight.shape)

    @property
    def ndim(self) -> int:
        return len(self.weight.shape)

    def astype(self, dtype: Any) -> _CastKernel:
        return _CastKernel(self.weight.replace(array=self.weight.array.astype(dtype)))


@functools.cache
def _provider_class() -> type:
    """Qwix's PTQ provider with the model code's two extra moves covered: a quantized kernel
    read with ``self.param`` comes back castable (``_CastKernel``), and ``jnp.tensordot`` with
    one goes through Qwix's ``dot_general``, as ``jnp.einsum`` does. Built on first use, so
    that importing this module (for ``MODES``) imports neither JAX nor Qwix."""
    import qwix

    def unwrap(x: Any) -> Any:
        return x.weight if isinstance(x, _CastKernel) else x

    class Int8Provider(TensordotMixin, qwix.PtqProvider):
        def nn_param(self, module: Any, name: str, *args: Any, **kwargs: Any) -> Any:
            value = super().nn_param(module, name, *args, **kwargs)
            quantized = isinstance(getattr(value, "array", None), qwix.QArray)
            return _CastKernel(value) if quantized else value

        def dot_general(self, lhs: Any, rhs: Any, *args: Any, **kwargs: Any) -> Any:
            return super().dot_general(lhs, unwrap(rhs), *args, **kwargs)

        def einsum(self, spec: str, *operands: Any, **kwargs: Any) -> Any:
            return super().einsum(spec, *map(unwrap, operands), **kwargs)

        def tensordot(self, a: Any, b: Any, axes: Any = 2, **kwargs: Any) -> Any:
            # Through dot_general for a float kernel too (TensordotMixin): ``init`` quantizes
            # it there.
            if not isinstance(axes, int) and isinstance(b, _CastKernel):
                raise ValueError("an int8 kernel contracts its leading axes (tensordot with "
                                 f"an int axes count), got axes={axes!r}")
            return super().tensordot(a, b, axes, **kwargs)

    return Int8Provider


class TensordotMixin:
    """For a Qwix provider: ``jnp.tensordot`` goes to the provider's ``dot_general``, as Qwix
    takes ``jnp.einsum`` to it. The projections contract with ``jnp.tensordot``, so the
    provider sees their operands as the projection passes them, not as jnp's own
    ``dot_general`` call would (a post-training int8 kernel is no array jnp could take).
    Plain Python, so that importing this module imports neither JAX nor Qwix."""

    def tensordot(self, a: Any, b: Any, axes: Any = 2, **kwargs: Any) -> Any:
        """``jnp.tensordot``; an int ``axes`` (the last ``axes`` of ``a`` with the first of
        ``b``, how every projection contracts) as the provider's ``dot_general``."""
        if not isinstance(axes, int):
            import jax.numpy as jnp

            return jnp.tensordot(a, b, axes, **kwargs)
        dims = ((tuple(range(a.ndim - axes, a.ndim)), tuple(range(axes))), ((), ()))
        return self.dot_general(a, b, dims, kwargs.get("precision"),  # type: ignore[attr-defined]
                                kwargs.get("preferred_element_type"),
                                out_sharding=kwargs.get("out_sharding"))

    def get_intercept_map(self) -> dict[str, Any]:
        """The provider's map, with ``jax.numpy.tensordot`` added."""
        return super().get_intercept_map() | {  # type: ignore[misc]
            "jax.numpy.tensordot": self.tensordot}


def _int8_provider() -> Any:
    import qwix

    return _provider_class()([qwix.QuantizationRule(module_path=PROJECTIONS,
                                                    weight_qtype="int8")])


def _unscanned(decoder: Any) -> Any | None:
    """The same decoder with a looped stack when its own stack is scanned, else None."""
    if getattr(decoder, "scan_layers", False) and getattr(decoder, "stack", None) is None:
        return decoder.clone(scan_layers=False)
    return None


def _abstract_params(decoder: Any) -> Any:
    """The shapes of ``decoder``'s params as its ``init`` makes them (nothing computed); for a
    Qwix-quantized decoder, with how each kernel is quantized."""
    import flax.linen as nn
    import jax
    import jax.numpy as jnp

    shapes = jax.eval_shape(lambda: decoder.init(jax.random.PRNGKey(0),
                                                 jnp.zeros((1, 1), jnp.int32)))
    return nn.unbox(shapes["params"])


def _unboxed(params: Any) -> Any:
    """Plain JAX arrays, as ``qwix.quantize_params`` takes them."""
    import flax.linen as nn
    import jax
    import jax.numpy as jnp

    return jax.tree.map(jnp.asarray, nn.unbox(params))


def _restack(stack: dict[str, Any], count: int) -> dict[str, Any]:
    """``{"layer_0": ..., "layer_{count-1}": ...}`` -> ``{"layers": ...}``, every int8 value
    and scale stacked on a leading layer axis."""
    from pax_transformer import stack_layer_params

    layers = {f"layer_{i}": stack.pop(f"layer_{i}") for i in range(count)}
    return {**stack, **stack_layer_params(layers)}


def _check_shapes(params: Any, abstract: Any) -> None:
    """Refuse quantized ``params`` that the quantized decoder would not read as they are."""
    import jax

    def shapes(tree: Any) -> list[tuple[str, tuple[int, ...], str]]:
        return [(jax.tree_util.keystr(path), tuple(x.shape), str(x.dtype))
                for path, x in jax.tree_util.tree_leaves_with_path(tree)]

    if shapes(params) != shapes(abstract):
        raise UsageError("--quantize int8 cannot lay out this decoder's weights (its layer "
                         "stack keeps them in a layout other than pax-transformer's own "
                         "stacks); leave --quantize at none")
