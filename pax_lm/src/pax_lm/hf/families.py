"""The open decoder families, as data: how a Hugging Face ``config.json`` of each becomes the
constants of a Pax LM experiment, and back.

A family names its ``model_type``s, its tensor naming (``names``: one of ``tensors.NAMINGS``)
and the settings its architecture fixes; what varies between checkpoints (sizes, rotary base
and scaling, windows, caps) is read from the configuration. Anything the configuration asks
for that Pax's layers do not compute (a rope scaling kind, a per-layer-index attention scale,
an activation) is refused by name, never approximated.

Mixtral is the one sparse family: its layers' feed-forwards are Mixture-of-Experts parts
(pax-transformer's ``MoeFeedForward``), every layer sparse, each token going to
``num_experts_per_tok`` of ``num_local_experts`` gated experts with the top-k weights
renormalised and no token dropped: Pax's routing with no capacity factor, exactly. A dense
family never claims a sparse model on export, nor Mixtral a dense one; a sparse model whose
routing Mixtral does not compute (a capacity, shared experts, dense layers among the sparse
ones, unnormalised weights) is refused, naming each setting.

Both spellings of the configuration are read: the one most published checkpoints carry
(``rope_theta``, ``rope_scaling``, ``torch_dtype``) and the one transformers 5 writes
(``rope_parameters``, ``dtype``). Exports write the first, which every version reads.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pax_core import UsageError

if TYPE_CHECKING:  # a model is built, and JAX imported, before a part is asked for
    from pax_transformer import MoeFeedForward

# Hugging Face activation names -> Pax's.
_ACTIVATIONS = {"silu": "silu", "swish": "silu", "gelu": "gelu", "gelu_new": "gelu_tanh",
                "gelu_pytorch_tanh": "gelu_tanh", "gelu_fast": "gelu_tanh", "relu": "relu"}
# The longest rows a job built from an import trains on by default (its MAX_SEQ_LEN): the
# model's own limit, when shorter.
DEFAULT_TRAIN_LEN = 2048


@dataclasses.dataclass(frozen=True)
class Family:
    """One architecture family: ``settings`` are the constants it fixes; ``read`` gives the
    constants a configuration varies; ``write`` the configuration entries of a model; ``fits``
    says whether a model with the family's settings is one of it (Llama and Mistral differ
    only by the sliding window); ``sparse``: its models' feed-forwards are Mixture-of-Experts
    parts, whose fixed settings are among ``settings`` (``_SPARSE_SETTINGS``)."""

    name: str
    model_types: tuple[str, ...]
    names: str
    settings: dict[str, Any]
    read: Callable[[dict[str, Any]], dict[str, Any]]
    write: Callable[[Any], dict[str, Any]]
    fits: Callable[[Any], bool] = lambda model: True
    sparse: bool = False


def _need(cfg: dict[str, Any], key: str) -> Any:
    if cfg.get(key) is None:
        raise UsageError(f"config.json has no {key!r}, which a {cfg.get('model_type')} model "
                         f"needs")
    return cfg[key]


def _activation(cfg: dict[str, Any], *keys: str) -> str:
    for key in keys:
        if cfg.get(key):
            name = cfg[key]
            if name not in _ACTIVATIONS:
                raise UsageError(f"config.json: activation {key}={name!r} is not supported "
                                 f"(supported: {', '.join(sorted(_ACTIVATIONS))})")
            return _ACTIVATIONS[name]
    raise UsageError(f"config.json names no activation ({' or '.join(keys)})")


def _rope(cfg: dict[str, Any], layer_type: str | None = None) -> dict[str, Any]:
    """The rotary settings, from ``rope_parameters`` (transformers 5; per layer type for
    Gemma 3) or ``rope_theta`` / ``rope_scaling``."""
    params = cfg.get("rope_parameters")
    if isinstance(params, dict) and layer_type is not None and layer_type in params:
        params = params[layer_type]
    if isinstance(params, dict) and params:
        theta = params.get("rope_theta", cfg.get("rope_theta", 10000.0))
        scaling = params if params.get("rope_type", "default") != "default" else None
    else:
        theta = cfg.get("rope_theta", cfg.get("rotary_emb_base", 10000.0))
        scaling = cfg.get("rope_scaling")
    out: dict[str, Any] = {"ROTARY_BASE": float(theta)}
    kind = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))
    if kind == "default":
        return out
    if kind == "linear":
        return {**out, "ROTARY_SCALING": "linear",
                "ROTARY_SCALING_FACTOR": float(scaling["factor"])}
    if kind == "llama3":
        return {**out, "ROTARY_SCALING": "llama3",
                "ROTARY_SCALING_FACTOR": float(scaling["factor"]),
                "ROTARY_LOW_FREQ_FACTOR": float(scaling["low_freq_factor"]),
                "ROTARY_HIGH_FREQ_FACTOR": float(scaling["high_freq_factor"]),
                "ROTARY_ORIGINAL_MAX_LEN": int(scaling["original_max_position_embeddings"])}
    raise UsageError(f"config.json: rope scaling {kind!r} is not supported (supported: "
                     f"default, linear, llama3)")


def _rope_entries(m: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"rope_theta": m.rotary_base}
    if m.rotary_scaling == "linear":
        out["rope_scaling"] = {"rope_type": "linear", "factor": m.rotary_scaling_factor}
    elif m.rotary_scaling == "llama3":
        out["rope_scaling"] = {"rope_type": "llama3", "factor": m.rotary_scaling_factor,
                               "low_freq_factor": m.rotary_low_freq_factor,
                               "high_freq_factor": m.rotary_high_freq_factor,
                               "original_max_position_embeddings": m.rotary_original_max_len}
    return out


def _layer_pattern(cfg: dict[str, Any], default_every: int) -> dict[str, Any]:
    """Sliding and full layers, as Pax's ``GLOBAL_EVERY``: every n-th layer full."""
    window = cfg.get("sliding_window")
    types = cfg.get("layer_types")
    if not window:
        if types and any(t != "full_attention" for t in types):
            raise UsageError("config.json: sliding layers without a sliding_window")
        return {}
    if types is None:
        return {"SLIDING_WINDOW": int(window), "GLOBAL_EVERY": default_every}
    full = [i for i, t in enumerate(types) if t == "full_attention"]
    if not full:
        return {"SLIDING_WINDOW": int(window), "GLOBAL_EVERY": 0}
    every = full[0] + 1
    if full != list(range(every - 1, len(types), every)):
        raise UsageError(f"config.json: layer_types put full attention at layers {full}; Pax "
                         f"takes every n-th layer full (global_every), not this pattern")
    return {"SLIDING_WINDOW": int(window), "GLOBAL_EVERY": every}


def _layer_types(m: Any) -> list[str]:
    every = m.global_every
    return ["full_attention" if every and (i + 1) % every == 0 else "sliding_attention"
            for i in range(m.num_layers)]


def _decoder_sizes(cfg: dict[str, Any]) -> dict[str, Any]:
    """Sizes in the naming of most decoder configurations (Llama's)."""
    heads = int(_need(cfg, "num_attention_heads"))
    dims = int(_need(cfg, "hidden_size"))
    return {
        "VOCAB_SIZE": int(_need(cfg, "vocab_size")),
        "NUM_LAYERS": int(_need(cfg, "num_hidden_layers")),
        "MODEL_DIMS": dims,
        "HIDDEN_DIMS": int(_need(cfg, "intermediate_size")),
        "NUM_HEADS": heads,
        "DIMS_PER_HEAD": int(cfg.get("head_dim") or dims // heads),
        "NUM_KV_HEADS": int(cfg.get("num_key_value_heads") or heads),
        "NORM_EPSILON": float(cfg.get("rms_norm_eps", cfg.get("layer_norm_eps", 1e-6))),
        "SEPARATE_EMBEDDING": not cfg.get("tie_word_embeddings", False),
        "MAX_SEQ_LEN": min(int(cfg.get("max_position_embeddings", DEFAULT_TRAIN_LEN)),
                           DEFAULT_TRAIN_LEN),
    }


def _decoder_entries(m: Any, eps_key: str = "rms_norm_eps") -> dict[str, Any]:
    return {"vocab_size": m.vocab_size, "num_hidden_layers": m.num_layers,
            "hidden_size": m.model_dims, "intermediate_size": m.hidden_dims,
            "num_attention_heads": m.num_heads, "num_key_value_heads": m.kv_heads,
            "head_dim": m.head_dims, eps_key: m.norm_epsilon,
            "tie_word_embeddings": m.tied_embedding}


def _llama(cfg: dict[str, Any]) -> dict[str, Any]:
    if cfg.get("attention_bias") or cfg.get("mlp_bias"):
        raise UsageError("config.json: attention_bias and mlp_bias are not supported for "
                         f"{cfg['model_type']} models")
    return {**_decoder_sizes(cfg), **_rope(cfg), **_layer_pattern(cfg, 0),
            "ACTIVATION": _activation(cfg, "hidden_act")}


def _llama_out(m: Any) -> dict[str, Any]:
    out = {**_decoder_entries(m), **_rope_entries(m), "hidden_act": _hf_activation(m),
           "attention_bias": False, "mlp_bias": False}
    if m.sliding_window:
        out["sliding_window"] = m.sliding_window
    return out


def _qwen(cfg: dict[str, Any]) -> dict[str, Any]:
    out = {**_decoder_sizes(cfg), **_rope(cfg), "ACTIVATION": _activation(cfg, "hidden_act")}
    if cfg.get("use_sliding_window"):
        raise UsageError("config.json: use_sliding_window is not supported for Qwen models")
    return out


def _qwen_out(m: Any) -> dict[str, Any]:
    return {**_decoder_entries(m), **_rope_entries(m), "hidden_act": _hf_activation(m),
            "use_sliding_window": False}


def _gemma(cfg: dict[str, Any]) -> dict[str, Any]:
    out = {**_decoder_sizes(cfg), "SEPARATE_EMBEDDING": not cfg.get("tie_word_embeddings", True),
           "ACTIVATION": _activation(cfg, "hidden_activation", "hidden_act")}
    if cfg["model_type"] == "gemma":
        return {**out, **_rope(cfg)}
    # Gemma 3 configurations written before ``layer_types`` give the period instead.
    out.update(_layer_pattern(cfg, cfg.get("sliding_window_pattern", 2)))
    out.update({"QUERY_SCALE": float(_need(cfg, "query_pre_attn_scalar")) ** -0.5,
                "ATTEN_LOGIT_CAP": float(cfg.get("attn_logit_softcapping") or 0.0),
                "SOFTMAX_CAP": float(cfg.get("final_logit_softcapping") or 0.0)})
    if cfg["model_type"] == "gemma2":
        return {**out, **_rope(cfg)}
    local = _rope(cfg, "sliding_attention")
    if "rope_local_base_freq" in cfg:
        local = {"ROTARY_BASE": float(cfg["rope_local_base_freq"])}
    if set(local) != {"ROTARY_BASE"}:
        raise UsageError("config.json: rope scaling on Gemma 3's sliding layers is not supported")
    return {**out, **_rope(cfg, "full_attention"), "LOCAL_ROTARY_BASE": local["ROTARY_BASE"]}


def _gemma_out(m: Any) -> dict[str, Any]:
    out = {**_decoder_entries(m), **_rope_entries(m), "hidden_activation": _hf_activation(m)}
    if m.global_every:
        out.update(sliding_window=m.sliding_window, layer_types=_layer_types(m),
                   query_pre_attn_scalar=_integral(m.query_scale ** -2),
                   attn_logit_softcapping=m.attention_logit_cap or None,
                   final_logit_softcapping=m.logits_soft_cap or None)
    if m.local_rotary_base is not None:
        out["rope_local_base_freq"] = m.local_rotary_base
    return out


def _integral(value: float) -> float | int:
    """``value`` as the int it is up to round-off (a configuration's integer field)."""
    nearest = round(value)
    return nearest if abs(value - nearest) < 1e-6 * max(1.0, abs(value)) else value


def _gpt2(cfg: dict[str, Any]) -> dict[str, Any]:
    for flag in ("scale_attn_by_inverse_layer_idx", "add_cross_attention"):
        if cfg.get(flag):
            raise UsageError(f"config.json: {flag} is not supported for GPT-2 models")
    if cfg.get("scale_attn_weights") is False:
        raise UsageError("config.json: scale_attn_weights=false is not supported")
    dims = int(_need(cfg, "n_embd"))
    positions = int(_need(cfg, "n_positions"))
    return {"VOCAB_SIZE": int(_need(cfg, "vocab_size")), "NUM_LAYERS": int(_need(cfg, "n_layer")),
            "MODEL_DIMS": dims, "HIDDEN_DIMS": int(cfg.get("n_inner") or 4 * dims),
            "NUM_HEADS": int(_need(cfg, "n_head")),
            "DIMS_PER_HEAD": dims // int(cfg["n_head"]),
            "NORM_EPSILON": float(cfg.get("layer_norm_epsilon", 1e-5)),
            "ACTIVATION": _activation(cfg, "activation_function"),
            "TRAINABLE_PE_MAX_SEQ_LEN": positions,
            "MAX_SEQ_LEN": min(positions, DEFAULT_TRAIN_LEN)}


def _gpt2_out(m: Any) -> dict[str, Any]:
    return {"vocab_size": m.vocab_size, "n_layer": m.num_layers, "n_embd": m.model_dims,
            "n_inner": m.hidden_dims, "n_head": m.num_heads, "n_positions": m.max_seq_len,
            "layer_norm_epsilon": m.norm_epsilon, "activation_function": _hf_activation(m),
            "tie_word_embeddings": True, "scale_attn_weights": True}


def _neox(cfg: dict[str, Any]) -> dict[str, Any]:
    rope = cfg.get("rope_parameters") or {}
    fraction = rope.get("partial_rotary_factor", cfg.get("rotary_pct", 1.0))
    if not cfg.get("use_parallel_residual", True):
        raise UsageError("config.json: use_parallel_residual=false is not supported")
    if cfg.get("attention_bias") is False:
        raise UsageError("config.json: attention_bias=false is not supported for GPT-NeoX")
    return {**_decoder_sizes({**cfg, "head_dim": None}), **_rope(cfg),
            "NORM_EPSILON": float(cfg.get("layer_norm_eps", 1e-5)),
            "ROTARY_FRACTION": float(fraction), "ACTIVATION": _activation(cfg, "hidden_act")}


def _neox_out(m: Any) -> dict[str, Any]:
    out = {**_decoder_entries(m, "layer_norm_eps"), **_rope_entries(m),
           "hidden_act": _hf_activation(m), "rotary_pct": m.rotary_fraction,
           "use_parallel_residual": True, "attention_bias": True}
    del out["head_dim"], out["num_key_value_heads"]
    return out


def _phi(cfg: dict[str, Any]) -> dict[str, Any]:
    if cfg.get("qk_layernorm"):
        raise UsageError("config.json: qk_layernorm is not supported for Phi models")
    rope = cfg.get("rope_parameters") or {}
    fraction = rope.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 0.5))
    return {**_decoder_sizes({**cfg, "head_dim": None}), **_rope(cfg),
            "NORM_EPSILON": float(cfg.get("layer_norm_eps", 1e-5)),
            "ROTARY_FRACTION": float(fraction), "ACTIVATION": _activation(cfg, "hidden_act")}


def _phi_out(m: Any) -> dict[str, Any]:
    out = {**_decoder_entries(m, "layer_norm_eps"), **_rope_entries(m),
           "hidden_act": _hf_activation(m), "partial_rotary_factor": m.rotary_fraction,
           "qk_layernorm": False}
    del out["head_dim"]
    return out


def _mixtral(cfg: dict[str, Any]) -> dict[str, Any]:
    """Llama's reading and the experts'. Hugging Face's load-balancing loss is ``top_k`` times
    Pax's (it counts each token's choices without dividing by their number: a balanced router
    scores ``top_k`` there, 1 here), so the weight is ``router_aux_loss_coef * top_k`` for the
    same pull on the router (Hugging Face pools every layer's choices before taking the
    product, Pax averages the layers' losses: the same when the router is balanced)."""
    jitter = float(cfg.get("router_jitter_noise") or 0.0)
    if jitter > 0:
        raise UsageError(f"config.json: router_jitter_noise={jitter} is not supported (Pax's "
                         f"router takes no noise while training); set it to 0.0 to import "
                         f"the model, whose outputs it does not change")
    experts = int(_need(cfg, "num_local_experts"))
    top_k = int(_need(cfg, "num_experts_per_tok"))
    if not 1 <= top_k <= experts:
        raise UsageError(f"config.json: num_experts_per_tok={top_k} must be between 1 and "
                         f"num_local_experts={experts}")
    return {**_llama(cfg), "NUM_EXPERTS": experts, "NUM_EXPERTS_PER_TOKEN": top_k,
            "MOE_HIDDEN_DIMS": int(_need(cfg, "intermediate_size")),
            "MOE_LOAD_BALANCING_WEIGHT": float(cfg.get("router_aux_loss_coef", 0.001)) * top_k}


def _mixtral_out(m: Any) -> dict[str, Any]:
    """Every layer is sparse, so the experts' width and activation are the feed-forward's."""
    experts = sparse_part(m)
    return {**_decoder_entries(m), **_rope_entries(m), "intermediate_size": experts.hidden_dims,
            "hidden_act": _HF_ACTIVATIONS[experts.activation],
            "num_local_experts": experts.num_experts, "num_experts_per_tok": experts.top_k,
            "router_aux_loss_coef": experts.load_balancing_weight / experts.top_k,
            "router_jitter_noise": 0.0, "output_router_logits": False,
            "sliding_window": m.sliding_window or None}


_HF_ACTIVATIONS = {"silu": "silu", "gelu": "gelu", "gelu_tanh": "gelu_pytorch_tanh",
                   "relu": "relu"}


def _hf_activation(m: Any) -> str:
    return _HF_ACTIVATIONS[m.activation]


# What every family fixes, unless it says otherwise: so that each family's settings tell it
# from every other when a model is exported.
_PLAIN = {"NORM_SCALE_OFFSET": 0.0, "QKV_BIAS": False, "QK_NORM": False, "POST_NORMS": False,
          "PARALLEL_RESIDUAL": False, "SHARED_NORM": False}
_RMS = {**_PLAIN, "NORMALIZATION": "rmsnorm", "USE_ROTARY_POSITION_EMB": True,
        "SCALE_EMBEDDING": False,
        "USE_GATED_ACTIVATION": True, "USE_BIAS": False, "ATTEN_LOGIT_CAP": 0.0,
        "SOFTMAX_CAP": 0.0}
_GEMMA = {**_RMS, "SCALE_EMBEDDING": True, "NORM_SCALE_OFFSET": 1.0}
_LAYERNORM = {**_PLAIN, "NORMALIZATION": "layernorm", "USE_BIAS": True, "SCALE_EMBEDDING": False,
              "USE_GATED_ACTIVATION": False, "ATTEN_LOGIT_CAP": 0.0, "SOFTMAX_CAP": 0.0}

# Mixtral's routing in Pax's constants: every choice computed (dropless), no shared experts,
# every layer sparse, the top-k weights renormalised.
_MIXTRAL_ROUTING = {"EXPERT_CAPACITY_FACTOR": None, "NUM_SHARED_EXPERTS": 0,
                    "NORMALIZE_EXPERT_WEIGHTS": True, "MOE_EVERY": 1, "FIRST_DENSE_LAYERS": 0}

FAMILIES = (
    Family("Llama", ("llama",), "llama", _RMS, _llama, _llama_out,
           lambda m: not m.sliding_window),
    Family("Mistral", ("mistral",), "llama", _RMS, _llama, _llama_out,
           lambda m: not m.global_every),
    Family("Qwen 2", ("qwen2",), "llama", {**_RMS, "QKV_BIAS": True}, _qwen, _qwen_out),
    Family("Qwen 3", ("qwen3",), "llama", {**_RMS, "QK_NORM": True}, _qwen, _qwen_out),
    Family("Gemma", ("gemma",), "llama", _GEMMA, _gemma, _gemma_out),
    Family("Gemma 2", ("gemma2",), "gemma2", {**_GEMMA, "POST_NORMS": True}, _gemma, _gemma_out),
    Family("Gemma 3", ("gemma3_text",), "gemma2",
           {**_GEMMA, "POST_NORMS": True, "QK_NORM": True}, _gemma, _gemma_out),
    Family("GPT-2", ("gpt2",), "gpt2",
           {**_LAYERNORM, "TRAINABLE_POSITION_EMB": True, "SEPARATE_EMBEDDING": False},
           _gpt2, _gpt2_out),
    Family("GPT-NeoX", ("gpt_neox",), "gpt_neox",
           {**_LAYERNORM, "USE_ROTARY_POSITION_EMB": True, "PARALLEL_RESIDUAL": True,
            "HEAD_BIAS": False}, _neox, _neox_out),
    Family("Phi", ("phi",), "phi",
           {**_LAYERNORM, "USE_ROTARY_POSITION_EMB": True, "PARALLEL_RESIDUAL": True,
            "SHARED_NORM": True, "SEPARATE_EMBEDDING": True}, _phi, _phi_out),
    Family("Mixtral", ("mixtral",), "mixtral", {**_RMS, **_MIXTRAL_ROUTING}, _mixtral,
           _mixtral_out, lambda m: not m.global_every, sparse=True),
)
_BY_TYPE = {t: f for f in FAMILIES for t in f.model_types}


def family_of(cfg: dict[str, Any]) -> Family:
    """The family of a configuration, by its ``model_type``."""
    model_type = cfg.get("model_type")
    if model_type not in _BY_TYPE:
        raise UsageError(f"config.json: model_type {model_type!r} is not supported (supported: "
                         f"{', '.join(sorted(_BY_TYPE))})")
    return _BY_TYPE[model_type]


def constants(cfg: dict[str, Any]) -> dict[str, Any]:
    """The experiment constants that rebuild a configuration's model in Pax."""
    family = family_of(cfg)
    return {**family.settings, **family.read(cfg)}


def sparse_part(model: Any) -> MoeFeedForward | None:
    """The Mixture-of-Experts part of a pax-transformer ``TransformerLm``'s sparse layers, as
    its blocks complete it (its experts' width, activation, gate); None for a dense model."""
    from pax_transformer import MoeFeedForward

    part = model.block_config().feed_forward_part()
    return part if isinstance(part, MoeFeedForward) else None


def model_type_of(model: Any) -> tuple[Family, str]:
    """The family (and its ``model_type``) a Pax decoder is exported as: the one whose fixed
    settings it has, among the sparse families for a sparse model and the dense ones for a
    dense model."""
    foreign = [name for name, held in (
        ("per-dimension query scaling", model.per_dim_scale),
        ("a sinusoid beside rotary", model.position == "sinusoidal_rotary"),
        ("feed-forward biases without attention biases",
         model.ffn_bias is not None and model.ffn_bias != model.use_bias),
        ("a bias on a tied head", model.tied_embedding and model.output_bias)) if held]
    if foreign:
        raise UsageError(f"this model computes {foreign[0]} (praxis's layers), which no Hugging "
                         f"Face family holds; {_OWN_FORMAT}")
    experts = sparse_part(model)
    for family in FAMILIES:
        if family.sparse != (experts is not None) or not family.fits(model):
            continue
        if all(_matches(model, key, value) for key, value in family.settings.items()
               if key in _FIELDS):
            if experts is not None:
                _check_routing(family, model, experts)
            return family, family.model_types[0]
    kind = "sparse" if experts is not None else "dense"
    names = ", ".join(f.name for f in FAMILIES if f.sparse == (experts is not None))
    raise UsageError(f"this model's architecture matches none of the {kind} Hugging Face "
                     f"families Pax exports ({names})")


_OWN_FORMAT = "it exports as Pax's own format (pax export without --format)"
# Sparse constant -> its value in a model, from the decoder and its MoE part.
_SPARSE_SETTINGS: dict[str, Callable[[Any, MoeFeedForward], Any]] = {
    "EXPERT_CAPACITY_FACTOR": lambda m, experts: experts.capacity_factor,
    "NUM_SHARED_EXPERTS": lambda m, experts: experts.shared_experts,
    "NORMALIZE_EXPERT_WEIGHTS": lambda m, experts: experts.normalize_top_k,
    "MOE_EVERY": lambda m, experts: m.moe_every,
    "FIRST_DENSE_LAYERS": lambda m, experts: m.first_dense_layers,
}


def _check_routing(family: Family, model: Any, experts: MoeFeedForward) -> None:
    """Refuse, naming each, the sparse settings of ``model`` that ``family`` does not hold."""
    unheld = [f"{key}={read(model, experts)!r} ({family.name}: {family.settings[key]!r})"
              for key, read in _SPARSE_SETTINGS.items()
              if key in family.settings and read(model, experts) != family.settings[key]]
    if not experts.gated:
        unheld.append(f"experts without a gate ({family.name}'s are gated)")
    if unheld:
        raise UsageError(f"this model's Mixture-of-Experts settings are not {family.name}'s: "
                         f"{', '.join(unheld)}; {_OWN_FORMAT}")


# Constant -> (TransformerLm field, how the constant's value reads there).
_FIELDS: dict[str, tuple[str, Callable[[Any], Any]]] = {
    "NORMALIZATION": ("norm", lambda v: v),
    "USE_ROTARY_POSITION_EMB": ("position", lambda v: "rotary" if v else None),
    "TRAINABLE_POSITION_EMB": ("position", lambda v: "learned" if v else None),
    "SCALE_EMBEDDING": ("scale_embedding", bool),
    "USE_GATED_ACTIVATION": ("gated", bool),
    "USE_BIAS": ("use_bias", bool),
    "SEPARATE_EMBEDDING": ("tied_embedding", lambda v: not v),
    "NORM_SCALE_OFFSET": ("norm_scale_offset", float),
    "QKV_BIAS": ("qkv_bias", bool),
    "HEAD_BIAS": ("output_bias", bool),
    "QK_NORM": ("qk_norm", bool),
    "POST_NORMS": ("post_norms", bool),
    "PARALLEL_RESIDUAL": ("parallel_residual", bool),
    "SHARED_NORM": ("shared_norm", bool),
    "ATTEN_LOGIT_CAP": ("attention_logit_cap", None),
    "SOFTMAX_CAP": ("logits_soft_cap", None),
}


def _matches(model: Any, key: str, value: Any) -> bool:
    field, read = _FIELDS[key]
    if read is None:  # a setting the family varies by configuration: any value
        return True
    wanted = read(value)
    return wanted is None or getattr(model, field) == wanted
