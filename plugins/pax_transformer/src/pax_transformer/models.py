"""``TransformerLm``: a decoder-only transformer, ids -> logits, and its analytic parameter count.

Parameter layout (``params`` collection; d = model_dims, f = hidden_dims, V = vocab_size,
N = num_heads, K = num_kv_heads or N, H = dim_per_head or d // N; "+b" marks a bias that exists
only with ``use_bias``, "+qb" one that exists with ``use_bias`` or ``qkv_bias``; logical axis
names in brackets)::

    embedding/embedding         [V, d]            ("vocab", "embed")
    position/embedding          [max_seq_len, d]  (None, "embed")          position="learned"
    stack/layer_{i}/            i = 0 .. num_layers-1 (scan_layers=False), or
    stack/layers/               the same leaves with a leading [num_layers] axis named
                                "layers" (scan_layers=True)
        attention_norm/scale    [d]               ("embed",)
        attention_norm/bias     [d]               ("embed",)               layernorm only
        attention/query/kernel  [d, N, H]         ("embed", "heads", "kv")   +qb [N, H]
        attention/key/kernel    [d, K, H]         ("embed", "heads", "kv")   +qb [K, H]
        attention/value/kernel  [d, K, H]         ("embed", "heads", "kv")   +qb [K, H]
        attention/query_norm/scale  [H]           ("kv",)                  qk_norm only
        attention/query_norm/bias   [H]           ("kv",)                  qk_norm, layernorm
        attention/key_norm/scale, attention/key_norm/bias   as query_norm
        attention/per_dim_scale [H]               ("kv",)                  per_dim_scale only
        attention/out/kernel    [N, H, d]         ("heads", "kv", "embed")   +b [d]
        post_attention_norm/scale, .../bias       as attention_norm        post_norms only
        ffn_norm/scale, ffn_norm/bias             as attention_norm        not with shared_norm
        ffn/wi/kernel           [d, f]            ("embed", "mlp")           +fb [f]
        ffn/wi_gate/kernel      [d, f]            ("embed", "mlp")           +fb [f], gated only
        ffn/wo/kernel           [f, d]            ("mlp", "embed")           +fb [d]
        post_ffn_norm/scale, post_ffn_norm/bias   as attention_norm        post_norms only
    final_norm/scale, final_norm/bias             as attention_norm
    .../lora_a [inputs..., r], .../lora_b [r, outputs...]   beside each kernel lora_targets
                                names (r = lora_rank; axes: the kernel's, None for r)
    softmax/kernel              [d, V]            ("embed", "vocab")         untied only
    softmax/bias                [V]               ("vocab",)                 head bias only

Biases are named ``bias`` beside their kernel and take the kernel's output axis names.
With n = 2d for layernorm (scale and bias) or d for rmsnorm (scale), n_h = 2H or H likewise,
b = 1 if ``use_bias`` else 0, qb = 1 if ``use_bias`` or ``qkv_bias`` else 0, fb = 1 if
``ffn_bias`` (None: ``use_bias``) else 0, hb = 1 if ``head_bias`` (None: ``use_bias`` for an
untied head, no bias for a tied one) else 0, and m norms a
block (2, or 1 with ``shared_norm``; 2 more with ``post_norms``), one layer holds
``m*n + (d + qb)*(N + 2K)*H + [2*n_h if qk_norm] + [H if per_dim_scale] + (N*H + b)*d
+ g*(d + fb)*f + (f + fb)*d`` weights (g = 2 if gated else 1), and the model
``V*d + num_layers*layer + n [+ max_seq_len*d if learned] [+ d*V if untied] + hb*V``.
``count_params`` computes this.
Every norm scale multiplies as ``norm_scale_offset + scale`` and starts at
``1 - norm_scale_offset`` (0 for Gemma's offset 1.0), so a fresh model's norms multiply by one.

The ``cache`` collection (``decode=True``) holds ``index`` (int32 [B]: how many positions each
row has cached, which is where its next token goes) and, per layer, ``attention/cached_key`` and
``attention/cached_value`` of [B, max_seq_len, K, H] in the compute dtype (stacked on a leading
layers axis when scanned). Every row keeps its own index so that rows of different lengths
share one batch (a pool of decoding slots that requests join and leave): a call writes each
row's chunk at that row's index, masks its queries from there, places it at positions
``index + arange(L)`` unless ``positions`` are given, and advances every row's index by the
chunk's length. A batch whose rows all hold the same index decodes as one shared position
would. A caller that moves a row in (a prompt prefilled on its own) copies that row of every
cache entry, its index included, and may set the index back to the prompt's true length after
prefilling a right-padded chunk: slots at and past the index are masked from the row's queries
until its next tokens overwrite them.

With ``fp8=True`` the ``_overwrite_with_gradient`` collection holds, per layer and projection
(``attention/{query,key,value,out}/fp8``, ``ffn/{wi,wi_gate,wo}/fp8``), the float32 scales
``{input,kernel,output_grad}_scale`` [1] and histories ``{input,kernel,output_grad}_amax_history``
[fp8_amax_history] (stacked when scanned); they are not weights and ``count_params`` omits them.
"""

from __future__ import annotations

import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from pax_core import axes
from pax_transformer.layers.attention import PROJECTIONS as ATTENTION_PROJECTIONS
from pax_transformer.layers.block import (
    ACTIVATION_AXES,
    BlockConfig,
    block_active_weights,
    block_train_flops_per_token,
    block_weights,
)
from pax_transformer.layers.cross_entropy import TokenLoss
from pax_transformer.layers.embedding import LogitsBias, Softmax, TokenEmbedding
from pax_transformer.layers.feedforward import ACTIVATIONS
from pax_transformer.layers.initializers import table_init
from pax_transformer.layers.lora import Lora
from pax_transformer.layers.normalization import NORMS, Norm
from pax_transformer.layers.positions import (
    POSITIONS,
    ROTARY_POSITIONS,
    ROTARY_SCALINGS,
    LearnedPositions,
    RotaryScaling,
    sinusoidal,
)
from pax_transformer.layers.remat import POLICIES
from pax_transformer.layers.stack import TransformerStack
from pax_transformer.layers.validation import check_choice

DTYPES = ("float32", "bfloat16")


class TransformerLm(nn.Module):
    """Decoder-only transformer: ids -> logits.

    Pre-norm blocks (attention, then feed-forward) over token embeddings (scaled by sqrt(d) when
    ``scale_embedding``) plus absolute positions (sinusoidal or learned) if chosen, or rotary
    positions inside attention; a final norm; logits from the embedding transpose (tied) or a
    separate softmax projection, optionally soft-capped. Weights are float32 (``param_dtype``),
    computation runs in ``dtype``, norms and softmaxes take float32 statistics, and the logits
    come back float32. Every weight carries logical axis names (see the module docstring) and
    the activations are constrained to ("batch", "length", "embed"), ("batch", "length",
    "mlp"), ("batch", "length", "heads", "kv") and ("batch", "length", "vocab"); without axis
    rules in context those constraints do nothing. ``stack`` builds the layer stack in place of
    ``TransformerStack`` (called with the same arguments; pax-pipeline's ``Pipeline`` runs the
    layers as a pipeline over stages; its ``check(num_layers)``, if any, validates the config).
    ``attention`` and ``feed_forward`` are the blocks' parts (``layers/parts.py``: a module class
    or an ``fdl.Partial`` of one, completed with the settings above; None: ``Attention`` and
    ``FeedForward``); the layout below is theirs, and a part of its own names its weights.
    Dropout (``dropout_rate``, ``train=True``,
    a "dropout" rng) applies to the input embeddings and to each residual branch.

    The settings below express the open decoder families (Llama, Mistral, Qwen, Gemma,
    GPT-NeoX, Phi, GPT-2) as they compute, so that their checkpoints map onto these weights;
    the defaults are the plain model above:

    * ``qkv_bias``: a bias on the query, key and value projections only (Qwen 2);
      ``use_bias`` puts one on every projection, and on the untied output projection unless
      ``head_bias`` says otherwise (GPT-NeoX: biases everywhere but its head; None: as
      ``use_bias``).
    * ``qk_norm``: each head's queries and keys normalised over dim_per_head (``norm``,
      ``norm_epsilon``, ``norm_scale_offset``) after the projection, before rotary (Qwen 3,
      Gemma 3).
    * ``norm_scale_offset``: every norm multiplies by ``offset + scale`` (Gemma: 1.0, its
      scales stored as ``scale - 1``); scales start at ``1 - offset``.
    * ``post_norms``: each residual branch's output normalised before it is added (Gemma 2, 3).
    * ``parallel_residual``: ``x + attention(attention_norm(x)) + ffn(ffn_norm(x))``
      (GPT-NeoX); with ``shared_norm`` one norm feeds both branches (Phi, GPT-J).
    * ``query_scale``: the factor on the query-key logits (None: dim_per_head ** -0.5; Gemma 2
      and 3: query_pre_attn_scalar ** -0.5).
    * ``rotary_fraction``: only the first ``int(dim_per_head * rotary_fraction)`` dimensions
      of each head rotate, with frequencies ``base**(-2i / rotary_dims)`` (GPT-NeoX's
      rotary_pct, Phi's partial_rotary_factor).
    * ``rotary_scaling`` ("none", "linear", "llama3") with ``rotary_scaling_factor``,
      ``rotary_low_freq_factor``, ``rotary_high_freq_factor`` and ``rotary_original_max_len``:
      Hugging Face's rope types of those names (``layers/positions.py``).
    * ``sliding_window``: a token attends only to the last ``sliding_window`` positions,
      itself included (0: all; Mistral, Gemma 2 and 3's local layers). With packed segments
      a window never reaches past its segment; when decoding the cache still holds
      ``max_seq_len`` positions and the mask does the windowing.
    * ``global_every``: with a sliding window, layer i attends to every position when
      (i + 1) % global_every == 0 and slides otherwise (Gemma 2: 2, Gemma 3: 6; 0: every
      layer slides). The layers then differ, in a scanned stack as data.
    * ``local_rotary_base``: the rotary base of the sliding layers (between the global ones
      when global_every > 0, every layer otherwise), which then take no ``rotary_scaling``
      (Gemma 3: 10000 local, 1e6 scaled global); None: the sliding layers rotate as the
      global ones.

    And the ones praxis computes by default, so that paxml's checkpoints map on too:

    * ``per_dim_scale``: queries multiplied per dimension by ``softplus(w) / softplus(0)``
      after rotary, on top of ``query_scale`` (praxis's ``PerDimScale``).
    * ``ffn_bias``: biases on the feed-forward projections (None: as ``use_bias``; praxis:
      biases there and none in attention).
    * ``head_bias`` on a tied model: a bias added to the logits against the embedding table
      (praxis's shared embedding-softmax).
    * ``position="sinusoidal_rotary"``: the sinusoid added to the inputs and rotary in
      attention both (what praxis computes when its attention's rotary is turned on).

    ``lora_rank`` > 0 puts low-rank adapters (``layers/lora.py``: ``lora_a`` [inputs...,
    rank] and ``lora_b`` [rank, outputs...] beside each adapted kernel, the update scaled by
    ``lora_alpha / lora_rank``, ``lora_dropout`` on its inputs in training) on the
    projections ``lora_targets`` names (query, key, value, output, gate, up, down, or regular
    expressions over paths such as ``attention/query``); a fresh adapter changes nothing.

    A Mixture-of-Experts model takes ``feed_forward=fdl.Partial(MoeFeedForward, ...)``
    (``layers/moe.py``: its weights, routing and expert parallelism). ``moe_every`` and
    ``first_dense_layers`` then make only some layers sparse: past the first
    ``first_dense_layers`` (DeepSeek's dense first layers), every ``moe_every``-th (GLaM: 2),
    the others taking the dense ``FeedForward`` of ``hidden_dims``. The scanned stack then
    repeats a group of ``moe_every`` layers (``layers/stack.py``). ``__call__`` with
    ``with_stats`` also returns what the sparse layers report of their routing.

    ``fp8`` runs the blocks' attention and feed-forward projections in FP8 with delayed scaling
    (Flax's, e4m3 forward and e5m2 gradients, each tensor's scale from its largest magnitude
    over the last ``fp8_amax_history`` steps), as NVIDIA's recipe does on Hopper GPUs; the
    embedding, the logits and attention's own products stay in ``dtype``. The scales and
    histories live in the ``_overwrite_with_gradient`` collection (stacked like the weights),
    which Pax's train step carries as model state.
    """

    vocab_size: int = 32000
    num_layers: int = 2
    model_dims: int = 512
    hidden_dims: int = 2048
    num_heads: int = 8
    dim_per_head: int | None = None
    num_kv_heads: int | None = None
    activation: str = "relu"
    gated: bool = False
    norm: str = "layernorm"
    norm_epsilon: float = 1e-6
    position: str = "rotary"
    max_seq_len: int = 2048
    rotary_base: float = 10000.0
    tied_embedding: bool = True
    scale_embedding: bool = True
    attention_logit_cap: float = 0.0
    logits_soft_cap: float = 0.0
    use_bias: bool = False
    head_bias: bool | None = None
    dropout_rate: float = 0.0
    init_std: float | None = None
    scan_layers: bool = False
    remat_policy: str | None = None
    dtype: str = "float32"
    param_dtype: str = "float32"
    fp8: bool = False
    fp8_amax_history: int = 1024
    stack: Any = None
    attention: Any = None
    feed_forward: Any = None
    qkv_bias: bool = False
    qk_norm: bool = False
    norm_scale_offset: float = 0.0
    post_norms: bool = False
    parallel_residual: bool = False
    shared_norm: bool = False
    query_scale: float | None = None
    rotary_fraction: float = 1.0
    rotary_scaling: str = "none"
    rotary_scaling_factor: float = 1.0
    rotary_low_freq_factor: float = 1.0
    rotary_high_freq_factor: float = 4.0
    rotary_original_max_len: int = 8192
    sliding_window: int = 0
    global_every: int = 0
    local_rotary_base: float | None = None
    per_dim_scale: bool = False
    ffn_bias: bool | None = None
    lora_rank: int = 0
    lora_alpha: float = 16.0
    lora_targets: tuple[str, ...] = ("query", "value")
    lora_dropout: float = 0.0
    moe_every: int = 1
    first_dense_layers: int = 0

    def __post_init__(self) -> None:
        _validate(self)
        super().__post_init__()

    @property
    def head_dims(self) -> int:
        """Dimensions per attention head, resolved."""
        return self.dim_per_head or self.model_dims // self.num_heads

    @property
    def output_bias(self) -> bool:
        """Whether the logits have a bias, resolved: by default an untied head has one with
        ``use_bias`` and a tied head none (GPT-2's biases stop at its tied head)."""
        if self.head_bias is not None:
            return self.head_bias
        return self.use_bias and not self.tied_embedding

    @property
    def kv_heads(self) -> int:
        """Number of key/value heads, resolved."""
        return self.num_kv_heads or self.num_heads

    def block_config(self) -> BlockConfig:
        """The settings every block of the stack shares."""
        return BlockConfig(
            hidden_dims=self.hidden_dims,
            num_heads=self.num_heads,
            num_kv_heads=self.kv_heads,
            dim_per_head=self.head_dims,
            activation=self.activation,
            gated=self.gated,
            norm=self.norm,
            norm_epsilon=self.norm_epsilon,
            rotary=self.position in ROTARY_POSITIONS,
            rotary_base=self.rotary_base,
            max_seq_len=self.max_seq_len,
            attention_logit_cap=self.attention_logit_cap,
            use_bias=self.use_bias,
            dropout_rate=self.dropout_rate,
            init_std=self.init_std,
            dtype=jnp.dtype(self.dtype),
            param_dtype=jnp.dtype(self.param_dtype),
            fp8_amax_history=self.fp8_amax_history if self.fp8 else 0,
            attention=self.attention,
            feed_forward=self.feed_forward,
            qkv_bias=self.qkv_bias,
            qk_norm=self.qk_norm,
            norm_scale_offset=self.norm_scale_offset,
            post_norms=self.post_norms,
            parallel_residual=self.parallel_residual,
            shared_norm=self.shared_norm,
            query_scale=self.query_scale,
            rotary_fraction=self.rotary_fraction,
            rotary_scaling=RotaryScaling(
                self.rotary_scaling, self.rotary_scaling_factor, self.rotary_low_freq_factor,
                self.rotary_high_freq_factor, self.rotary_original_max_len),
            sliding_window=self.sliding_window,
            global_every=self.global_every,
            local_rotary_base=self.local_rotary_base,
            per_dim_scale=self.per_dim_scale,
            ffn_bias=self.ffn_bias,
            lora=self.lora(),
            moe_every=self.moe_every,
            first_dense_layers=self.first_dense_layers,
        )

    def lora(self) -> Lora | None:
        """The adapters' settings (None without ``lora_rank``)."""
        if not self.lora_rank:
            return None
        return Lora(self.lora_rank, self.lora_alpha, tuple(self.lora_targets), self.lora_dropout)

    @nn.compact
    def __call__(
        self,
        ids: jax.Array,
        *,
        segment_ids: jax.Array | None = None,
        positions: jax.Array | None = None,
        train: bool = False,
        decode: bool = False,
        with_stats: bool = False,
        labels: jax.Array | None = None,
        weights: jax.Array | None = None,
    ) -> jax.Array | TokenLoss | tuple[jax.Array | TokenLoss, dict[str, jax.Array]]:
        """ids [B, L] int32 -> logits [B, L, vocab_size] float32; with ``with_stats``,
        ``(logits, stats)``: what the sparse feed-forward parts (``layers/moe.py``) report, each
        entry stacked over the layers, ``{}`` for a dense model.

        labels [B, L] (int; with per-token ``weights`` [B, L], every weight 1 without): their
        ``TokenLoss`` in place of the logits, the next-token loss computed a chunk of positions
        at a time from the final hidden states, so that a train step never holds the float32
        logits whole (``layers/cross_entropy.py``).

        segment_ids [B, L]: packed sequences; a token attends only to earlier tokens of its own
        segment. positions [B, L] (or [1, L], the same for every row): each token's position
        within its segment, used by rotary, sinusoidal and learned positions; defaults to
        arange(L) as [1, L], or when decoding to each row's cache index plus arange(L).

        decode=True: autoregressive decoding with a KV cache in the "cache" collection. Create
        it with ``model.init(rng, ids, decode=True)`` (``ids`` gives the batch size; the cache
        holds max_seq_len positions and starts empty), then feed a prompt chunk of any length,
        then single tokens: ``model.apply({"params": p, "cache": c}, chunk, decode=True,
        mutable=["cache"])``. Each call attends to every cached position up to its own; each
        row decodes from its own cache index (the module docstring's ``cache``).
        """
        length = ids.shape[1]
        if decode and segment_ids is not None:
            raise ValueError("segment_ids are not supported with decode=True (one sequence a row)")
        if length > self.max_seq_len and (decode or self.position == "learned"):
            raise ValueError(
                f"sequence length {length} exceeds max_seq_len={self.max_seq_len} "
                f"(the size of the {'KV cache' if decode else 'learned position table'})"
            )
        config = self.block_config()
        embedding = TokenEmbedding(
            self.vocab_size,
            self.model_dims,
            table_init(self.model_dims, self.init_std),
            self.scale_embedding,
            config.dtype,
            config.param_dtype,
            name="embedding",
        )
        x = embedding(ids)

        decode_start = None
        if decode:
            index = self.variable("cache", "index", lambda: jnp.zeros(ids.shape[:1], jnp.int32))
            decode_start = index.value
            if not self.is_initializing():
                index.value = decode_start + length
        if positions is None and decode_start is not None:
            positions = decode_start[:, None] + jnp.arange(length)
        elif positions is None:  # one row every row shares: its rotary angles computed once
            positions = jnp.arange(length)[None, :]
        if self.position in ("sinusoidal", "sinusoidal_rotary"):
            x = x + sinusoidal(positions, self.model_dims, config.dtype)
        elif self.position == "learned":
            x = x + LearnedPositions(
                self.max_seq_len,
                self.model_dims,
                table_init(self.model_dims, self.init_std),
                config.dtype,
                config.param_dtype,
                name="position",
            )(positions)
        x = nn.Dropout(self.dropout_rate, deterministic=not train)(x)
        x = nn.with_logical_constraint(x, ACTIVATION_AXES)

        make_stack = self.stack or TransformerStack
        x, stats = make_stack(
            config, self.num_layers, self.scan_layers, self.remat_policy, train, decode,
            name="stack",
        )(x, positions, segment_ids, decode_start)
        x = Norm(self.norm, self.norm_epsilon, config.dtype, config.param_dtype,
                 self.norm_scale_offset, name="final_norm")(x)

        head = {"labels": labels, "weights": weights, "soft_cap": self.logits_soft_cap}
        if self.tied_embedding:
            bias = (LogitsBias(config.param_dtype, name="softmax")(self.vocab_size)
                    if self.output_bias else None)
            out = embedding.attend(x, bias=bias, **head)
        else:
            out = Softmax(
                self.vocab_size,
                table_init(self.model_dims, self.init_std),
                self.output_bias,
                config.dtype,
                config.param_dtype,
                name="softmax",
            )(x, **head)
        if labels is None:
            out = nn.with_logical_constraint(out, (axes.BATCH, axes.LENGTH, axes.VOCAB))
        return (out, stats) if with_stats else out


def _validate(m: TransformerLm) -> None:
    """Raise ValueError for a configuration that cannot build, saying what would."""
    for field in ("vocab_size", "num_layers", "model_dims", "hidden_dims", "num_heads",
                  "max_seq_len"):
        if getattr(m, field) < 1:
            raise ValueError(f"{field} must be a positive integer, got {getattr(m, field)}")
    check_choice("activation", m.activation, ACTIVATIONS)
    check_choice("norm", m.norm, NORMS)
    check_choice("position", m.position, POSITIONS)
    check_choice("dtype", m.dtype, DTYPES)
    check_choice("param_dtype", m.param_dtype, DTYPES)
    if hasattr(m.stack, "check"):
        m.stack.check(m.num_layers)
    if m.remat_policy is not None:
        check_choice("remat_policy", m.remat_policy, [None, *POLICIES])
    if m.dim_per_head is None and m.model_dims % m.num_heads:
        raise ValueError(
            f"model_dims={m.model_dims} is not divisible by num_heads={m.num_heads}; "
            "set dim_per_head explicitly"
        )
    if m.dim_per_head is not None and m.dim_per_head < 1:
        raise ValueError(f"dim_per_head must be a positive integer, got {m.dim_per_head}")
    if m.num_kv_heads is not None and (m.num_kv_heads < 1 or m.num_heads % m.num_kv_heads):
        raise ValueError(
            f"num_kv_heads={m.num_kv_heads} must be a positive divisor of num_heads="
            f"{m.num_heads} (1: multi-query; num_heads or None: multi-head)"
        )
    if m.position in ROTARY_POSITIONS and m.rotary_fraction == 1.0 and m.head_dims % 2:
        raise ValueError(f"rotary positions need an even dim_per_head, got {m.head_dims}")
    for field in ("norm_epsilon", "rotary_base"):
        if getattr(m, field) <= 0:
            raise ValueError(f"{field} must be positive, got {getattr(m, field)}")
    for field in ("attention_logit_cap", "logits_soft_cap"):
        if getattr(m, field) < 0:
            raise ValueError(f"{field} must be 0 (off) or positive, got {getattr(m, field)}")
    if m.fp8 and m.fp8_amax_history < 1:
        raise ValueError(f"fp8_amax_history must be a positive number of steps, got "
                         f"{m.fp8_amax_history}")
    if m.fp8 and m.stack is not None:
        raise ValueError("fp8 runs in pax-transformer's own layer stack only, not in a custom "
                         "stack such as a pipeline's; turn one of them off")
    if not 0.0 <= m.dropout_rate < 1.0:
        raise ValueError(f"dropout_rate must be in [0, 1), got {m.dropout_rate}")
    if m.init_std is not None and m.init_std <= 0:
        raise ValueError(f"init_std must be positive or None, got {m.init_std}")
    _validate_families(m)


def _validate_families(m: TransformerLm) -> None:
    """The checks of the settings that express the open decoder families."""
    if m.shared_norm and not m.parallel_residual:
        raise ValueError("shared_norm (one norm feeding both branches) needs "
                         "parallel_residual=True; set it, or shared_norm=False")
    if m.query_scale is not None and not m.query_scale > 0:
        raise ValueError(f"query_scale must be positive or None (dim_per_head ** -0.5), got "
                         f"{m.query_scale}")
    if not math.isfinite(m.norm_scale_offset):
        raise ValueError(f"norm_scale_offset must be a finite number (0.0, or 1.0 for Gemma's "
                         f"stored scale - 1), got {m.norm_scale_offset}")
    check_choice("rotary_scaling", m.rotary_scaling, ROTARY_SCALINGS)
    rotary_settings = {"rotary_fraction": (m.rotary_fraction, 1.0),
                       "rotary_scaling": (m.rotary_scaling, "none"),
                       "local_rotary_base": (m.local_rotary_base, None)}
    for field, (value, default) in rotary_settings.items():
        if m.position not in ROTARY_POSITIONS and value != default:
            raise ValueError(f"{field}={value!r} needs position='rotary' (position is "
                             f"{m.position!r}); set position='rotary' or leave {field} at "
                             f"{default!r}")
    if not 0.0 < m.rotary_fraction <= 1.0:
        raise ValueError(f"rotary_fraction must be in (0, 1], got {m.rotary_fraction}")
    rotary_dims = int(m.head_dims * m.rotary_fraction)
    if m.position in ROTARY_POSITIONS and (rotary_dims < 2 or rotary_dims % 2):
        raise ValueError(f"rotary_fraction={m.rotary_fraction} of dim_per_head={m.head_dims} "
                         f"rotates {rotary_dims} dimensions; it must be an even number above 0")
    if m.rotary_scaling != "none":
        for field in ("rotary_scaling_factor", "rotary_low_freq_factor",
                      "rotary_high_freq_factor", "rotary_original_max_len"):
            if not getattr(m, field) > 0:
                raise ValueError(f"{field} must be positive, got {getattr(m, field)}")
    if m.rotary_scaling == "llama3" and not m.rotary_high_freq_factor > m.rotary_low_freq_factor:
        raise ValueError(f"rotary_high_freq_factor={m.rotary_high_freq_factor} must exceed "
                         f"rotary_low_freq_factor={m.rotary_low_freq_factor} for "
                         f"rotary_scaling='llama3' (Llama 3.1: 4.0 and 1.0)")
    for field in ("sliding_window", "global_every"):
        if getattr(m, field) < 0:
            raise ValueError(f"{field} must be 0 (off) or a positive number of "
                             f"{'positions' if field == 'sliding_window' else 'layers'}, got "
                             f"{getattr(m, field)}")
    if m.global_every and not m.sliding_window:
        raise ValueError(f"global_every={m.global_every} alternates sliding and global layers "
                         "but sliding_window is 0; set sliding_window, or global_every=0")
    if m.local_rotary_base is not None and not m.sliding_window:
        raise ValueError("local_rotary_base is the rotary base of the sliding layers, but "
                         "sliding_window is 0; set sliding_window (and global_every), or "
                         "local_rotary_base=None")
    if m.local_rotary_base is not None and not m.local_rotary_base > 0:
        raise ValueError(f"local_rotary_base must be positive or None, got "
                         f"{m.local_rotary_base}")
    if m.lora_rank < 0:
        raise ValueError(f"lora_rank must be 0 (no adapters) or positive, got {m.lora_rank}")
    lora = m.lora()
    if lora is not None and m.attention is None and m.feed_forward is None:
        ffn = ("wi", "wi_gate", "wo") if m.gated else ("wi", "wo")
        lora.check([*ATTENTION_PROJECTIONS, *(f"ffn/{name}" for name in ffn)])
    m.block_config().feed_forward_part()  # a part's own settings are checked as it is made
    _validate_alternation(m)
    if m.global_every and m.stack is not None:
        raise ValueError("global_every (layers that differ: sliding or global) runs in "
                         "pax-transformer's own layer stack only, not in a custom stack such "
                         "as a pipeline's; set global_every=0 or stack=None")


def _validate_alternation(m: TransformerLm) -> None:
    """The checks of the dense and sparse layers' pattern."""
    if m.moe_every < 1 or m.first_dense_layers < 0:
        raise ValueError(f"moe_every must be a positive number of layers and "
                         f"first_dense_layers 0 or more, got {m.moe_every} and "
                         f"{m.first_dense_layers}")
    if not (m.moe_every > 1 or m.first_dense_layers):
        return
    if m.feed_forward is None:
        raise ValueError("moe_every and first_dense_layers place the feed_forward part (an "
                         "MoeFeedForward) among dense layers, but feed_forward is not set")
    if m.stack is not None:
        raise ValueError("dense and sparse layers alternate in pax-transformer's own layer "
                         "stack only, not in a custom stack such as a pipeline's")
    sparse = m.num_layers - m.first_dense_layers
    if sparse < m.moe_every or sparse % m.moe_every:
        raise ValueError(f"the {sparse} layers after first_dense_layers="
                         f"{m.first_dense_layers} must be a positive multiple of moe_every="
                         f"{m.moe_every} (num_layers={m.num_layers})")


def count_params(**fields: Any) -> int:
    """The number of weights of ``TransformerLm(**fields)``, from the layout above (no tracing).

    Takes exactly TransformerLm's fields (unset ones take its defaults) and validates them the
    same way.
    """
    return _weights(TransformerLm(**fields))


def _weights(m: TransformerLm) -> int:
    """``count_params`` of a built model."""
    d, vocab, bias = m.model_dims, m.vocab_size, int(m.output_bias)
    config = m.block_config()
    blocks = sum(block_weights(layer, d) for layer in _layer_configs(m))
    total = vocab * d + blocks + config.norm_weights(d)
    if m.position == "learned":
        total += m.max_seq_len * d
    if not m.tied_embedding:
        total += d * vocab
    return total + bias * vocab


def count_active_params(model: TransformerLm) -> int:
    """The weights one token multiplies in ``model``: all of them but the experts a sparse
    feed-forward leaves unchosen (every weight of a dense model)."""
    d = model.model_dims
    unchosen = sum(block_weights(layer, d) - block_active_weights(layer, d)
                   for layer in _layer_configs(model))
    return _weights(model) - unchosen


def _layer_configs(model: TransformerLm) -> list[BlockConfig]:
    """Each layer's block settings (they differ where dense and sparse layers alternate)."""
    config = model.block_config()
    return [config.layer_config(i) for i in range(model.num_layers)]


FLOPS_FORMULA_VERSION = 1


def train_flops_per_token(model: TransformerLm, seq_len: int) -> float:
    """Training FLOPs (forward and backward) per token, formula version 1.

    6 per weight a token multiplies (every weight except the input-embedding table and learned
    positions, which are looked up, plus the output projection, which a tied model takes from the
    embedding table), with each block's attention and feed-forward answering for themselves
    (``layers/parts.py``): for pax-transformer's, 6 per weight plus attention's scores and
    weighted values, ``12 x num_heads x dim_per_head x seq_len`` a layer (PaLM's convention:
    full attention, the causal mask's saving is not discounted, and remat's recomputation is not
    counted). Sliding-window layers are counted the same way, as full attention over
    ``seq_len``: the window's saving is not discounted either. Every norm weight (the blocks',
    the query and key norms', the post norms', the final norm's) counts 6.
    """
    d, vocab, bias = model.model_dims, model.vocab_size, int(model.output_bias)
    config = model.block_config()
    head = (d + bias) * vocab
    outside_blocks = 6.0 * (config.norm_weights(d) + head)  # the final norm and the logits
    return outside_blocks + sum(block_train_flops_per_token(layer, d, seq_len)
                                for layer in _layer_configs(model))
