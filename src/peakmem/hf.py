"""Hugging Face ``config.json`` -> :class:`~peakmem.model.ModelSpec`; the only module that knows HF key names.

Each supported ``model_type`` has a builder that lists every parameter tensor the way transformers
5.23 creates it (module names, shapes, biases, tied heads), so that ``ModelSpec.params`` equals
``sum(p.numel() for p in model.parameters())`` of transformers' own model built from the same config
(checked by ``tests/test_param_counts_torch.py`` on the meta device). The file each builder follows is
named in its docstring (``transformers/models/<family>/modeling_<family>.py``); optional keys take the
defaults of that family's ``configuration_<family>.py``, and a structural default applied to a key the
config does not set is recorded in ``ModelSpec.notes``.

Size keys (vocabulary, width, depth, heads, MLP width, expert counts) are required: a missing one is
a :class:`~peakmem.errors.ConfigError` naming the key, never a silent default.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

from peakmem.errors import ConfigError
from peakmem.model import (
    Attention,
    Component,
    Layer,
    LayerGroup,
    Mlp,
    ModelSpec,
    NormKind,
    PositionKind,
    QkNorm,
    SdpaKv,
    Tensor,
    linear,
    norm,
)
from peakmem.validate import MAX_EXPERTS, MAX_HEADS, MAX_LAYERS, MAX_POSITIONS, MAX_VOCAB, MAX_WIDTH

CONFIG_FILE = "config.json"

# OPT's learned positions have 2 extra rows: OPTLearnedPositionalEmbedding "offset = 2"
# (transformers/models/opt/modeling_opt.py).
OPT_POSITION_OFFSET = 2
# BLOOM uses ALiBi and has no position limit in its config; 2048 is the sequence length it was
# trained with (BigScience, "BLOOM: A 176B-Parameter Open-Access Multilingual Language Model", 2022).
BLOOM_TRAINING_SEQ_LEN = 2048
# GPT-2's MLP is 4x wide when n_inner is None (transformers/models/gpt2/modeling_gpt2.py, GPT2Block:
# "inner_dim = config.n_inner if config.n_inner is not None else 4 * hidden_size"); BLOOM and Falcon
# use the same factor (BloomMLP dense_h_to_4h; FalconConfig.ffn_hidden_size default).
MLP_EXPANSION = 4

_MISSING: Any = object()


# --- reading -----------------------------------------------------------------------------------------
def load_config(path: str | Path) -> dict[str, Any]:
    """Read a ``config.json`` (or the one inside a folder) into a dict, within the bounds of
    :func:`peakmem.validate.read_config_file` (size, nesting); errors name the file."""
    from peakmem.validate import read_config_file

    p = Path(path)
    if p.is_dir():
        p = p / CONFIG_FILE
    if not p.is_file():
        raise ConfigError(f"{p}: no such file")
    return read_config_file(p)


# Integer keys of config.json files and the largest value any model has a use for
# (:mod:`peakmem.validate` limits): a bigger one is refused before any work is done.
CONFIG_INT_LIMITS: dict[str, int] = {
    **dict.fromkeys(
        ("num_hidden_layers", "n_layer", "num_layers", "n_layers", "num_decoder_layers",
         "first_k_dense_replace", "num_nextn_predict_layers"),
        MAX_LAYERS,
    ),
    **dict.fromkeys(
        ("hidden_size", "n_embd", "d_model", "intermediate_size", "n_inner", "d_ff", "ffn_dim",
         "moe_intermediate_size", "shared_expert_intermediate_size", "head_dim", "kv_channels",
         "kv_lora_rank", "q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
         "rotary_dim", "sliding_window"),
        MAX_WIDTH,
    ),
    **dict.fromkeys(
        ("num_attention_heads", "n_head", "num_heads", "num_key_value_heads", "n_head_kv",
         "multi_query_group_num"),
        MAX_HEADS,
    ),
    "vocab_size": MAX_VOCAB,
    **dict.fromkeys(("max_position_embeddings", "n_positions", "n_ctx", "seq_length"), MAX_POSITIONS),
    **dict.fromkeys(
        ("num_experts", "num_local_experts", "n_routed_experts", "n_shared_experts", "num_experts_per_tok",
         "moe_topk", "num_shared_experts"),
        MAX_EXPERTS,
    ),
}  # fmt: skip


class _Reader:
    """Typed reads from a config dict; every error names the key, the value and the model type.

    A key set to ``null`` counts as unset, as transformers' config classes derive such keys
    (``num_key_value_heads``, ``head_dim``, ``n_inner``, ...). Keys where ``null`` means something
    (``sliding_window``, ``q_lora_rank``) are read with :meth:`int_or_none`.
    """

    def __init__(self, raw: Mapping[str, Any], model_type: str, family: str) -> None:
        self.raw = raw
        self.model_type = model_type
        self.family = family  # the transformers config class, for notes: "LlamaConfig"
        self.notes: list[str] = []

    def fail(self, message: str) -> ConfigError:
        return ConfigError(f"{CONFIG_FILE}: {message} (model_type={self.model_type})")

    def _find(self, keys: Sequence[str]) -> tuple[str, Any]:
        for k in keys:
            if self.raw.get(k) is not None:
                return k, self.raw[k]
        return keys[0], _MISSING

    def has(self, key: str) -> bool:
        return self.raw.get(key) is not None

    def _default(self, key: str, default: Any, note: bool) -> Any:
        if default is _MISSING:
            raise self.fail(f"missing key {key!r}")
        if note:
            self.notes.append(f"{key} not set; using {default!r} as transformers' {self.family} does")
        return default

    def get_int(self, *keys: str, default: Any = _MISSING, minimum: int = 1, note: bool = True) -> int:
        key, value = self._find(keys)
        if value is _MISSING:
            return int(self._default(key, default, note))
        if not isinstance(value, int) or isinstance(value, bool):
            raise self.fail(f"{key}={value!r}: must be an integer")
        if value < minimum:
            bound = "positive" if minimum == 1 else f">= {minimum}"
            raise self.fail(f"{key}={value!r}: must be {bound}")
        return value

    def int_or_none(self, key: str, default: int | None, minimum: int = 1) -> int | None:
        """An int where ``null`` is a meaningful value (feature off); absent -> ``default``."""
        if key not in self.raw:
            if default is not None:
                self.notes.append(f"{key} not set; using {default!r} as transformers' {self.family} does")
            return default
        if self.raw[key] is None:
            return None
        return self.get_int(key, minimum=minimum)

    def float_or_none(self, key: str, default: float | None) -> float | None:
        """A positive number where ``null`` is a meaningful value (feature off); absent -> ``default``."""
        if key not in self.raw:
            return default
        value = self.raw[key]
        if value is None:
            return None
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
            raise self.fail(f"{key}={value!r}: must be a positive number or null")
        return float(value)

    def get_bool(self, key: str, default: bool) -> bool:
        value = self.raw.get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise self.fail(f"{key}={value!r}: must be true or false")
        return value

    def get_float(self, *keys: str, default: float = 0.0) -> float:
        key, value = self._find(keys)
        if value is _MISSING:
            return default
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0:
            raise self.fail(f"{key}={value!r}: must be a number >= 0")
        return float(value)

    def get_str(self, *keys: str, default: str) -> str:
        key, value = self._find(keys)
        if value is _MISSING:
            return default
        if not isinstance(value, str):
            raise self.fail(f"{key}={value!r}: must be a string")
        return value

    def int_list(self, key: str) -> tuple[int, ...]:
        value = self.raw.get(key)
        if value is None:
            return ()
        if not isinstance(value, list) or not all(
            isinstance(v, int) and not isinstance(v, bool) for v in value
        ):
            raise self.fail(f"{key}={value!r}: must be a list of integers")
        return tuple(value)

    def str_list(self, key: str, length: int) -> tuple[str, ...] | None:
        value = self.raw.get(key)
        if value is None:
            return None
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise self.fail(f"{key}={value!r}: must be a list of strings")
        if len(value) != length:
            raise self.fail(f"{key} has {len(value)} entries: must have one per layer ({length})")
        return tuple(value)

    def mapping(self, key: str) -> Mapping[str, Any]:
        value = self.raw.get(key)
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise self.fail(f"{key}={value!r}: must be an object")
        return value

    def heads(self, heads: int, kv_heads: int, kv_key: str = "num_key_value_heads") -> None:
        if heads % kv_heads:
            raise self.fail(f"{kv_key}={kv_heads}: must divide num_attention_heads={heads}")

    def derived_head_dim(self, hidden: int, heads: int) -> int:
        if hidden % heads:
            raise self.fail(f"num_attention_heads={heads}: must divide hidden_size={hidden}")
        return hidden // heads


# --- tensor helpers ----------------------------------------------------------------------------------
def _embedding(path: str, rows: int, dim: int, component: Component = "embeddings") -> Tensor:
    module = path.rsplit(".", 1)[-1]
    return Tensor(
        name=f"{path}.weight", module=module, shape=(rows, dim), component=component, kind="embedding"
    )


def _conv1d(path: str, nx: int, nf: int, component: Component) -> tuple[Tensor, ...]:
    """GPT-2's ``Conv1D(nf, nx)``: a Linear whose weight is stored transposed, ``(in, out)``.

    The weight is recorded as a ``linear_weight`` with the shape as stored (transformers/pytorch_utils.py,
    ``Conv1D.weight = nn.Parameter(torch.empty(nx, nf))``); numel is what matters for counts.
    """
    module = path.rsplit(".", 1)[-1]
    return (
        Tensor(
            name=f"{path}.weight", module=module, shape=(nx, nf), component=component, kind="linear_weight"
        ),
        Tensor(name=f"{path}.bias", module=module, shape=(nf,), component=component, kind="linear_bias"),
    )


def _head(vocab: int, dim: int, tied: bool, path: str = "lm_head") -> tuple[Tensor, ...]:
    """The LM head; a tied head shares the embedding, which ``model.parameters()`` yields once."""
    return () if tied else linear(path, dim, vocab, False, "head")


def _rope_buffers(prefix: str, rotary_dim: int, names: Sequence[str] = ("",)) -> tuple[Tensor, ...]:
    """``inv_freq`` and ``original_inv_freq`` (``torch.arange(0, dim, 2)`` long) of a rotary module.

    transformers 5.x keeps both as non-persistent buffers (e.g. ``LlamaRotaryEmbedding``).
    """
    n = (rotary_dim + 1) // 2
    out: list[Tensor] = []
    for name in names:
        for buf in (f"{name}inv_freq", f"{name}original_inv_freq"):
            out.append(
                Tensor(
                    name=f"{prefix}.{buf}",
                    module="rotary_emb",
                    shape=(n,),
                    component="positions",
                    kind="other",
                )
            )
    return tuple(out)


def _groups(layers: Sequence[Layer]) -> tuple[LayerGroup, ...]:
    """One group per run of identical consecutive layers, in order."""
    out: list[LayerGroup] = []
    for layer in layers:
        if out and out[-1].layer == layer:
            out[-1] = LayerGroup(count=out[-1].count + 1, layer=layer)
        else:
            out.append(LayerGroup(count=1, layer=layer))
    return tuple(out)


def _gated_mlp(path: str, hidden: int, width: int, bias: bool, component: Component) -> tuple[Tensor, ...]:
    return (
        *linear(f"{path}.gate_proj", hidden, width, bias, component),
        *linear(f"{path}.up_proj", hidden, width, bias, component),
        *linear(f"{path}.down_proj", width, hidden, bias, component),
    )


def _fused_experts(path: str, experts: int, hidden: int, width: int) -> tuple[Tensor, ...]:
    """transformers 5.x stores a layer's experts as two fused 3-D parameters, not one Linear per expert.

    ``gate_up_proj`` is ``(E, 2*I, H)`` and ``down_proj`` ``(E, H, I)`` (e.g. ``MixtralExperts``,
    ``DeepseekV3Experts``); the owning module is ``experts``, so LoRA reaches them through peft's
    ``target_parameters`` (by these names), not ``target_modules``.
    """
    return (
        Tensor(
            name=f"{path}.gate_up_proj",
            module="experts",
            shape=(experts, 2 * width, hidden),
            component="experts",
            kind="expert_weight",
        ),
        Tensor(
            name=f"{path}.down_proj",
            module="experts",
            shape=(experts, hidden, width),
            component="experts",
            kind="expert_weight",
        ),
    )


@dataclass(frozen=True)
class _Dropout:
    attention: float = 0.0
    hidden: float = 0.0
    embedding: float = 0.0


# Kernels a model class supports in transformers 5.23 (`_supports_sdpa`, `_supports_flash_attn` in
# models/<family>/modeling_<family>.py); families not listed support all three.
ATTENTION_KERNELS: dict[str, tuple[str, ...]] = {
    "bloom": ("eager",),  # BloomPreTrainedModel: neither flag set (ALiBi in a custom baddbmm)
    "gemma2": ("eager", "flash"),  # Gemma2PreTrainedModel._supports_sdpa = False: no logit softcapping
}


def _spec(
    r: _Reader,
    *,
    name: str | None,
    architecture: str,
    vocab: int,
    hidden: int,
    max_pos: int,
    position: PositionKind,
    norm_kind: NormKind,
    layers: Sequence[Layer],
    outer: Sequence[Tensor],
    tied: bool,
    dropout: _Dropout,
    buffers: Sequence[Tensor] = (),
    task: Literal["causal-lm", "sequence-classification"] = "causal-lm",
    num_labels: int = 0,
) -> ModelSpec:
    raw_name = r.raw.get("_name_or_path")
    default_name = raw_name if isinstance(raw_name, str) and raw_name else r.model_type
    return ModelSpec(
        name=name or default_name,
        model_type=r.model_type,
        architecture=architecture,
        task=task,
        vocab_size=vocab,
        hidden_size=hidden,
        max_position_embeddings=max_pos,
        position=position,
        norm=norm_kind,
        groups=_groups(layers),
        outer=tuple(outer),
        tie_word_embeddings=tied,
        num_labels=num_labels,
        attention_dropout=dropout.attention,
        hidden_dropout=dropout.hidden,
        embedding_dropout=dropout.embedding,
        attention_kernels=ATTENTION_KERNELS.get(r.model_type, ("eager", "sdpa", "flash")),
        buffers=tuple(buffers),
        notes=tuple(r.notes),
    )


# --- GPT-2 -------------------------------------------------------------------------------------------
GPT2_CONV1D_MODULES = ("c_attn", "c_proj", "c_fc")  # modeling_gpt2.py GPT2Attention / GPT2MLP: Conv1D


def _gpt2(r: _Reader, name: str | None) -> ModelSpec:
    """transformers/models/gpt2/modeling_gpt2.py: GPT2LMHeadModel (Conv1D projections, learned positions)."""
    vocab = r.get_int("vocab_size")
    hidden = r.get_int("n_embd", "hidden_size")
    n_layers = r.get_int("n_layer", "num_hidden_layers")
    heads = r.get_int("n_head", "num_attention_heads")
    head_dim = r.derived_head_dim(hidden, heads)
    max_pos = r.get_int("n_positions", "max_position_embeddings", default=1024)
    inner = r.get_int("n_inner", default=MLP_EXPANSION * hidden, note=False)
    tied = r.get_bool("tie_word_embeddings", True)
    if r.get_bool("add_cross_attention", False):
        raise r.fail("add_cross_attention=True: GPT-2 cross-attention is not supported")
    tensors = (
        *norm("ln_1", hidden, True),
        *_conv1d("attn.c_attn", hidden, 3 * hidden, "attention"),
        *_conv1d("attn.c_proj", hidden, hidden, "attention"),
        *norm("ln_2", hidden, True),
        *_conv1d("mlp.c_fc", hidden, inner, "mlp"),
        *_conv1d("mlp.c_proj", inner, hidden, "mlp"),
    )
    layer = Layer(
        attention=Attention(num_heads=heads, num_kv_heads=heads, head_dim=head_dim, v_head_dim=head_dim),
        mlp=Mlp(
            intermediate_size=inner,
            gated=False,
            activation=r.get_str("activation_function", default="gelu_new"),
        ),
        tensors=tensors,
    )
    outer = (
        _embedding("transformer.wte", vocab, hidden),
        _embedding("transformer.wpe", max_pos, hidden, "positions"),
        *norm("transformer.ln_f", hidden, True),
        *_head(vocab, hidden, tied),
    )
    dropout = _Dropout(
        r.get_float("attn_pdrop", default=0.1),
        r.get_float("resid_pdrop", default=0.1),
        r.get_float("embd_pdrop", default=0.1),
    )
    spec = _spec(
        r,
        name=name,
        architecture="GPT2LMHeadModel",
        vocab=vocab,
        hidden=hidden,
        max_pos=max_pos,
        position="learned",
        norm_kind="layernorm",
        layers=[layer] * n_layers,
        outer=outer,
        tied=tied,
        dropout=dropout,
    )
    # eager_attention_forward: ``nn.functional.softmax(attn_weights, dim=-1)`` in the scores' dtype (so
    # do GPT-Neo, GPT-J and DistilBERT, not yet families here); c_attn, c_proj, c_fc are
    # transformers/pytorch_utils.py ``Conv1D`` (weight stored in x out).
    return replace(spec, attn_softmax_fp32=False, conv1d_modules=GPT2_CONV1D_MODULES)


# --- GPT-NeoX / Pythia -------------------------------------------------------------------------------
def _partial_rotary(r: _Reader, default: float, legacy_key: str | None = None) -> float:
    """The rotated fraction of each head (rope_parameters / rope_scaling / a legacy top-level key)."""
    for nested in ("rope_parameters", "rope_scaling"):
        value = r.mapping(nested).get("partial_rotary_factor")
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    for key in (legacy_key, "partial_rotary_factor"):
        if key is not None and r.has(key):
            return r.get_float(key)
    return default


def _gpt_neox(r: _Reader, name: str | None) -> ModelSpec:
    """transformers/models/gpt_neox/modeling_gpt_neox.py: GPTNeoXForCausalLM."""
    vocab = r.get_int("vocab_size")
    hidden = r.get_int("hidden_size")
    n_layers = r.get_int("num_hidden_layers")
    heads = r.get_int("num_attention_heads")
    inner = r.get_int("intermediate_size")
    head_dim = r.derived_head_dim(hidden, heads)
    max_pos = r.get_int("max_position_embeddings", default=2048)
    tied = r.get_bool("tie_word_embeddings", False)
    bias = r.get_bool("attention_bias", True)
    parallel = r.get_bool("use_parallel_residual", True)
    rotary = int(head_dim * _partial_rotary(r, 0.25, "rotary_pct"))  # GPTNeoXConfig: rotary_pct=0.25
    tensors = (
        *norm("input_layernorm", hidden, True),
        *norm("post_attention_layernorm", hidden, True),
        *linear("attention.query_key_value", hidden, 3 * hidden, bias, "attention"),
        *linear("attention.dense", hidden, hidden, bias, "attention"),
        *linear("mlp.dense_h_to_4h", hidden, inner, True, "mlp"),
        *linear("mlp.dense_4h_to_h", inner, hidden, True, "mlp"),
    )
    layer = Layer(
        attention=Attention(num_heads=heads, num_kv_heads=heads, head_dim=head_dim, v_head_dim=head_dim),
        mlp=Mlp(intermediate_size=inner, gated=False, activation=r.get_str("hidden_act", default="gelu")),
        tensors=tensors,
        parallel_residual=parallel,
    )
    outer = (
        _embedding("gpt_neox.embed_in", vocab, hidden),
        *norm("gpt_neox.final_layer_norm", hidden, True),
        *_head(vocab, hidden, tied),
    )
    drop = r.get_float("hidden_dropout")
    spec = _spec(
        r,
        name=name,
        architecture="GPTNeoXForCausalLM",
        vocab=vocab,
        hidden=hidden,
        max_pos=max_pos,
        position="rope",
        norm_kind="layernorm",
        layers=[layer] * n_layers,
        outer=outer,
        tied=tied,
        dropout=_Dropout(r.get_float("attention_dropout"), drop, drop),
        buffers=_rope_buffers("gpt_neox.rotary_emb", rotary),
    )
    # modeling_gpt_neox.py apply_rotary_pos_emb: ``torch.cat([q_embed, q_pass], dim=-1)``
    return replace(spec, rope_concat=True)


# --- OPT ---------------------------------------------------------------------------------------------
def _opt(r: _Reader, name: str | None) -> ModelSpec:
    """transformers/models/opt/modeling_opt.py: OPTForCausalLM (position offset 2, optional projections)."""
    vocab = r.get_int("vocab_size")
    hidden = r.get_int("hidden_size")
    n_layers = r.get_int("num_hidden_layers")
    heads = r.get_int("num_attention_heads")
    ffn = r.get_int("ffn_dim")
    head_dim = r.derived_head_dim(hidden, heads)
    max_pos = r.get_int("max_position_embeddings", default=2048)
    proj = r.get_int("word_embed_proj_dim", default=hidden, note=False)
    tied = r.get_bool("tie_word_embeddings", True)
    bias = r.get_bool("enable_bias", True)
    affine = r.get_bool("layer_norm_elementwise_affine", True)
    pre_norm = r.get_bool("do_layer_norm_before", True)
    final_norm = pre_norm and not r.get_bool("_remove_final_layer_norm", False)

    def ln(path: str) -> tuple[Tensor, ...]:  # nn.LayerNorm(elementwise_affine=...): weight+bias or nothing
        return norm(path, hidden, True) if affine else ()

    tensors = (
        *linear("self_attn.k_proj", hidden, hidden, bias, "attention"),
        *linear("self_attn.v_proj", hidden, hidden, bias, "attention"),
        *linear("self_attn.q_proj", hidden, hidden, bias, "attention"),
        *linear("self_attn.out_proj", hidden, hidden, bias, "attention"),
        *ln("self_attn_layer_norm"),
        *linear("fc1", hidden, ffn, bias, "mlp"),
        *linear("fc2", ffn, hidden, bias, "mlp"),
        *ln("final_layer_norm"),
    )
    layer = Layer(
        attention=Attention(num_heads=heads, num_kv_heads=heads, head_dim=head_dim, v_head_dim=head_dim),
        mlp=Mlp(
            intermediate_size=ffn, gated=False, activation=r.get_str("activation_function", default="relu")
        ),
        tensors=tensors,
    )
    outer: list[Tensor] = [
        _embedding("model.decoder.embed_tokens", vocab, proj),
        _embedding("model.decoder.embed_positions", max_pos + OPT_POSITION_OFFSET, hidden, "positions"),
    ]
    if final_norm:
        outer += ln("model.decoder.final_layer_norm")
    if proj != hidden:
        outer += linear("model.decoder.project_out", hidden, proj, False, "head")
        outer += linear("model.decoder.project_in", proj, hidden, False, "embeddings")
    outer += _head(vocab, proj, tied)
    if not pre_norm:
        r.notes.append("do_layer_norm_before=false: post-LayerNorm layers (OPT-350m style)")
    drop = r.get_float("dropout", default=0.1)
    return _spec(
        r,
        name=name,
        architecture="OPTForCausalLM",
        vocab=vocab,
        hidden=hidden,
        max_pos=max_pos,
        position="learned",
        norm_kind="layernorm",
        layers=[layer] * n_layers,
        outer=outer,
        tied=tied,
        dropout=_Dropout(r.get_float("attention_dropout"), drop, drop),
    )


# --- BLOOM -------------------------------------------------------------------------------------------
def _bloom(r: _Reader, name: str | None) -> ModelSpec:
    """transformers/models/bloom/modeling_bloom.py: BloomForCausalLM (ALiBi, embedding LayerNorm)."""
    vocab = r.get_int("vocab_size")
    hidden = r.get_int("hidden_size", "n_embed")
    n_layers = r.get_int("n_layer", "num_hidden_layers")
    heads = r.get_int("n_head", "num_attention_heads")
    head_dim = r.derived_head_dim(hidden, heads)
    tied = r.get_bool("tie_word_embeddings", True)
    inner = MLP_EXPANSION * hidden
    max_pos = r.get_int("seq_length", "max_position_embeddings", default=BLOOM_TRAINING_SEQ_LEN, note=False)
    if not (r.has("seq_length") or r.has("max_position_embeddings")):
        r.notes.append(
            f"BLOOM uses ALiBi (no position limit); assuming a {BLOOM_TRAINING_SEQ_LEN}-token context"
        )
    tensors = (
        *norm("input_layernorm", hidden, True),
        *linear("self_attention.query_key_value", hidden, 3 * hidden, True, "attention"),
        *linear("self_attention.dense", hidden, hidden, True, "attention"),
        *norm("post_attention_layernorm", hidden, True),
        *linear("mlp.dense_h_to_4h", hidden, inner, True, "mlp"),
        *linear("mlp.dense_4h_to_h", inner, hidden, True, "mlp"),
    )
    layer = Layer(
        attention=Attention(num_heads=heads, num_kv_heads=heads, head_dim=head_dim, v_head_dim=head_dim),
        mlp=Mlp(intermediate_size=inner, gated=False, activation="bloom_gelu"),
        tensors=tensors,
    )
    outer = (
        _embedding("transformer.word_embeddings", vocab, hidden),
        *norm("transformer.word_embeddings_layernorm", hidden, True),
        *norm("transformer.ln_f", hidden, True),
        *_head(vocab, hidden, tied),
    )
    drop = r.get_float("hidden_dropout")
    return _spec(
        r,
        name=name,
        architecture="BloomForCausalLM",
        vocab=vocab,
        hidden=hidden,
        max_pos=max_pos,
        position="alibi",
        norm_kind="layernorm",
        layers=[layer] * n_layers,
        outer=outer,
        tied=tied,
        dropout=_Dropout(r.get_float("attention_dropout"), drop, 0.0),
    )


# --- Falcon ------------------------------------------------------------------------------------------
def _falcon(r: _Reader, name: str | None) -> ModelSpec:
    """transformers/models/falcon/modeling_falcon.py: FalconForCausalLM (multi-query or grouped fused QKV)."""
    vocab = r.get_int("vocab_size")
    hidden = r.get_int("hidden_size", "n_embed")
    n_layers = r.get_int("num_hidden_layers")
    heads = r.get_int("num_attention_heads")
    head_dim = r.derived_head_dim(hidden, heads)
    tied = r.get_bool("tie_word_embeddings", True)
    bias = r.get_bool("bias", False)
    new_arch = r.get_bool("new_decoder_architecture", False)
    multi_query = r.get_bool("multi_query", True)
    parallel = r.get_bool("parallel_attn", True)
    alibi = r.get_bool("alibi", False)
    ffn = r.get_int("ffn_hidden_size", default=MLP_EXPANSION * hidden, note=False)
    max_pos = r.get_int("max_position_embeddings", default=2048)
    if new_arch:
        kv = r.get_int("num_kv_heads", default=heads, note=False)
        qkv_out = (2 * kv + heads) * head_dim
    elif multi_query:
        kv = 1
        qkv_out = hidden + 2 * head_dim
    else:
        kv = heads
        qkv_out = 3 * hidden
    r.heads(heads, kv, "num_kv_heads")
    num_ln = r.get_int("num_ln_in_parallel_attn", default=2 if new_arch else 1, note=False)
    if not parallel:
        norms = (*norm("post_attention_layernorm", hidden, True), *norm("input_layernorm", hidden, True))
    elif num_ln == 2:
        norms = (*norm("ln_attn", hidden, True), *norm("ln_mlp", hidden, True))
    else:
        norms = norm("input_layernorm", hidden, True)
    tensors = (
        *linear("self_attention.query_key_value", hidden, qkv_out, bias, "attention"),
        *linear("self_attention.dense", hidden, hidden, bias, "attention"),
        *linear("mlp.dense_h_to_4h", hidden, ffn, bias, "mlp"),
        *linear("mlp.dense_4h_to_h", ffn, hidden, bias, "mlp"),
        *norms,
    )
    layer = Layer(
        attention=Attention(num_heads=heads, num_kv_heads=kv, head_dim=head_dim, v_head_dim=head_dim),
        mlp=Mlp(intermediate_size=ffn, gated=False, activation=r.get_str("activation", default="gelu")),
        tensors=tensors,
        parallel_residual=parallel,
    )
    outer = (
        _embedding("transformer.word_embeddings", vocab, hidden),
        *norm("transformer.ln_f", hidden, True),
        *_head(vocab, hidden, tied),
    )
    # FalconModel always builds its rotary module, even with alibi=True.
    spec = _spec(
        r,
        name=name,
        architecture="FalconForCausalLM",
        vocab=vocab,
        hidden=hidden,
        max_pos=max_pos,
        position="alibi" if alibi else "rope",
        norm_kind="layernorm",
        layers=[layer] * n_layers,
        outer=outer,
        tied=tied,
        dropout=_Dropout(r.get_float("attention_dropout"), r.get_float("hidden_dropout"), 0.0),
        buffers=_rope_buffers("transformer.rotary_emb", head_dim),
    )
    # FalconAttention eager: ``F.softmax(scores + mask, dim=-1, dtype=hidden_states.dtype)``. Its SDPA call
    # (``FalconAttention.forward``) gets the mask FalconModel materialises (``create_causal_mask(...,
    # allow_is_causal_skip=False)``) and k/v as ``_split_heads`` makes them: copied to every head (new
    # decoder architecture), one head without ``enable_gqa`` (multi-query), or all heads.
    sdpa_kv: SdpaKv = "repeated" if new_arch else "broadcast" if multi_query else "shared"
    return replace(spec, attn_softmax_fp32=False, sdpa_kv=sdpa_kv, sdpa_mask=True)


# --- Llama-style decoders ----------------------------------------------------------------------------
NormLayout = Literal["pre", "sandwich", "post", "nonparametric"]


@dataclass(frozen=True, kw_only=True)
class _Moe:
    """Which layers are sparse and what a sparse layer holds."""

    sparse: tuple[bool, ...]  # per layer
    experts: int
    top_k: int
    width: int  # per expert
    shared_width: int = 0
    shared_path: str = "mlp.shared_experts"
    shared_gate: bool = False  # Qwen2-MoE: shared_expert_gate, a (1, H) Linear
    router_buffer: bool = False  # DeepSeek-V3: gate.e_score_correction_bias is an nn.Buffer
    router_fp32: bool = False  # DeepSeek-V2/V3 routers: an fp32 Linear over upcast input and weight
    norm_topk: bool = False  # top-k weights renormalised in place (Mixtral always; norm_topk_prob)
    group_mask: bool = False  # DeepSeek-V2 topk_method group_limited_greedy masks the scores
    weights_fp32: bool = True  # Qwen-MoE routers cast the top-k weights back to the logits' dtype
    shared_after_routed: bool = False  # DeepSeek: hidden_states + self.shared_experts(residuals), last


@dataclass(frozen=True, kw_only=True)
class _Decoder:
    """A Llama-style decoder: embed_tokens, layers of self_attn + mlp, a final norm, lm_head."""

    architecture: str
    vocab: int
    hidden: int
    n_layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    activation: str
    tied: bool
    max_pos: int
    windows: tuple[int | None, ...]  # sliding window per layer
    rotary_dim: int
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: QkNorm = "none"
    norm_kind: NormKind = "rmsnorm"
    norm_bias: bool = False  # a LayerNorm with a bias (StarCoder2)
    layout: NormLayout = "pre"
    fused: bool = False  # Phi-3: qkv_proj and gate_up_proj
    gated: bool = True  # False: StarCoder2's c_fc / c_proj
    moe: _Moe | None = None
    rope_names: tuple[str, ...] = ("",)  # Gemma 3: one rotary table per layer type
    embed_scale: bool = False  # Gemma: embed_tokens.embed_scale, a 0-d buffer
    dropout: _Dropout = _Dropout()


def _attention_tensors(d: _Decoder) -> tuple[Tensor, ...]:
    q, kv = d.heads * d.head_dim, d.kv_heads * d.head_dim
    if d.fused:
        proj: tuple[Tensor, ...] = (
            *linear("self_attn.o_proj", q, d.hidden, d.o_bias, "attention"),
            *linear("self_attn.qkv_proj", d.hidden, q + 2 * kv, d.qkv_bias, "attention"),
        )
    else:
        proj = (
            *linear("self_attn.q_proj", d.hidden, q, d.qkv_bias, "attention"),
            *linear("self_attn.k_proj", d.hidden, kv, d.qkv_bias, "attention"),
            *linear("self_attn.v_proj", d.hidden, kv, d.qkv_bias, "attention"),
            *linear("self_attn.o_proj", q, d.hidden, d.o_bias, "attention"),
        )
    if d.qk_norm == "per_head":  # Qwen3, Gemma 3: RMSNorm(head_dim) shared by all heads
        return (
            *proj,
            *norm("self_attn.q_norm", d.head_dim, False),
            *norm("self_attn.k_norm", d.head_dim, False),
        )
    if d.qk_norm == "full":  # OLMo 2: RMSNorm over all heads at once
        return (*proj, *norm("self_attn.q_norm", q, False), *norm("self_attn.k_norm", kv, False))
    return proj


def _dense_mlp_tensors(d: _Decoder, width: int) -> tuple[Tensor, ...]:
    if d.fused:
        return (
            *linear("mlp.gate_up_proj", d.hidden, 2 * width, d.mlp_bias, "mlp"),
            *linear("mlp.down_proj", width, d.hidden, d.mlp_bias, "mlp"),
        )
    if not d.gated:
        return (
            *linear("mlp.c_fc", d.hidden, width, d.mlp_bias, "mlp"),
            *linear("mlp.c_proj", width, d.hidden, d.mlp_bias, "mlp"),
        )
    return _gated_mlp("mlp", d.hidden, width, d.mlp_bias, "mlp")


def _moe_tensors(d: _Decoder, m: _Moe) -> tuple[Tensor, ...]:
    out = (
        *linear("mlp.gate", d.hidden, m.experts, False, "router"),
        *_fused_experts("mlp.experts", m.experts, d.hidden, m.width),
    )
    if m.shared_width:
        out += _gated_mlp(m.shared_path, d.hidden, m.shared_width, d.mlp_bias, "shared_experts")
    if m.shared_gate:
        out += linear("mlp.shared_expert_gate", d.hidden, 1, False, "shared_experts")
    return out


def _norm_tensors(d: _Decoder) -> tuple[Tensor, ...]:
    names = {
        "pre": ("input_layernorm", "post_attention_layernorm"),
        "sandwich": (
            "input_layernorm",
            "post_attention_layernorm",
            "pre_feedforward_layernorm",
            "post_feedforward_layernorm",
        ),
        "post": ("post_attention_layernorm", "post_feedforward_layernorm"),
        "nonparametric": (),  # OLMo: LayerNorm without weight or bias
    }[d.layout]
    return tuple(t for n in names for t in norm(n, d.hidden, d.norm_bias))


def _decoder_layer(d: _Decoder, i: int, attention: Attention, attn_tensors: tuple[Tensor, ...]) -> Layer:
    m = d.moe
    if m is not None and m.sparse[i]:
        mlp = Mlp(
            intermediate_size=m.width,
            gated=True,
            activation=d.activation,
            num_experts=m.experts,
            experts_per_token=m.top_k,
            shared_intermediate_size=m.shared_width,
            router_fp32=m.router_fp32,
            router_norm_topk=m.norm_topk,
            router_group_mask=m.group_mask,
            routing_weights_fp32=m.weights_fp32,
            shared_gate=m.shared_gate,
            shared_after_routed=m.shared_after_routed,
        )
        mlp_tensors = _moe_tensors(d, m)
    else:
        mlp = Mlp(
            intermediate_size=d.intermediate, gated=d.gated, activation=d.activation, fused_gate_up=d.fused
        )
        mlp_tensors = _dense_mlp_tensors(d, d.intermediate)
    return Layer(attention=attention, mlp=mlp, tensors=(*attn_tensors, *mlp_tensors, *_norm_tensors(d)))


def _decoder_spec(
    r: _Reader,
    d: _Decoder,
    name: str | None,
    attention_for: Callable[[int], Attention] | None = None,
    attn_tensors: tuple[Tensor, ...] | None = None,
) -> ModelSpec:
    if attention_for is None:
        r.heads(d.heads, d.kv_heads)

        def attention_for(i: int) -> Attention:
            return Attention(
                num_heads=d.heads,
                num_kv_heads=d.kv_heads,
                head_dim=d.head_dim,
                v_head_dim=d.head_dim,
                qk_norm=d.qk_norm,
                sliding_window=d.windows[i],
            )

    tensors = _attention_tensors(d) if attn_tensors is None else attn_tensors
    layers = [_decoder_layer(d, i, attention_for(i), tensors) for i in range(d.n_layers)]
    outer = (
        _embedding("model.embed_tokens", d.vocab, d.hidden),
        *(() if d.layout == "nonparametric" else norm("model.norm", d.hidden, d.norm_bias)),
        *_head(d.vocab, d.hidden, d.tied),
    )
    buffers: list[Tensor] = []
    if d.embed_scale:
        buffers.append(
            Tensor(
                name="model.embed_tokens.embed_scale",
                module="embed_tokens",
                shape=(),
                component="embeddings",
                kind="other",
            )
        )
    buffers += _rope_buffers("model.rotary_emb", d.rotary_dim, d.rope_names)
    if d.moe is not None and d.moe.router_buffer:
        for i, sparse in enumerate(d.moe.sparse):
            if sparse:
                buffers.append(
                    Tensor(
                        name=f"model.layers.{i}.mlp.gate.e_score_correction_bias",
                        module="gate",
                        shape=(d.moe.experts,),
                        component="router",
                        kind="other",
                    )
                )
    return _spec(
        r,
        name=name,
        architecture=d.architecture,
        vocab=d.vocab,
        hidden=d.hidden,
        max_pos=d.max_pos,
        position="rope",
        norm_kind=d.norm_kind,
        layers=layers,
        outer=outer,
        tied=d.tied,
        dropout=d.dropout,
        buffers=buffers,
    )


@dataclass(frozen=True, kw_only=True)
class _Defaults:
    """A family's config-class defaults for the keys a Llama-style builder reads."""

    architecture: str
    kv_heads: int | None = None  # None: num_attention_heads
    head_dim: int | None = None  # None: hidden_size // num_attention_heads
    tied: bool = False
    max_pos: int = 2048
    activation: str = "silu"
    vocab: int | None = None  # None: vocab_size is required
    heads: int | None = None  # None: num_attention_heads is required


def _common(r: _Reader, f: _Defaults) -> dict[str, Any]:
    """The keys every Llama-style family reads, with that family's defaults."""
    hidden = r.get_int("hidden_size")
    heads = r.get_int("num_attention_heads", default=_MISSING if f.heads is None else f.heads)
    vocab = r.get_int("vocab_size", default=_MISSING if f.vocab is None else f.vocab)
    if f.kv_heads is None:
        kv = r.get_int("num_key_value_heads", default=heads, note=False)
        if not r.has("num_key_value_heads"):
            r.notes.append(f"num_key_value_heads not set; using num_attention_heads={heads} (no GQA)")
    else:
        kv = r.get_int("num_key_value_heads", default=f.kv_heads)
    if f.head_dim is None:
        head_dim = r.get_int("head_dim") if r.has("head_dim") else r.derived_head_dim(hidden, heads)
    else:
        head_dim = r.get_int("head_dim", default=f.head_dim)
    r.heads(heads, kv)
    return {
        "architecture": f.architecture,
        "vocab": vocab,
        "hidden": hidden,
        "n_layers": r.get_int("num_hidden_layers"),
        "heads": heads,
        "kv_heads": kv,
        "head_dim": head_dim,
        "intermediate": r.get_int("intermediate_size"),
        "activation": r.get_str("hidden_activation", "hidden_act", default=f.activation),
        "tied": r.get_bool("tie_word_embeddings", f.tied),
        "max_pos": r.get_int("max_position_embeddings", default=f.max_pos),
        "rotary_dim": head_dim,
        "dropout": _Dropout(attention=r.get_float("attention_dropout")),
    }


def _windows_all(r: _Reader, n_layers: int, default: int | None) -> tuple[int | None, ...]:
    """Mistral / Mixtral / Phi-3 / StarCoder2: one ``sliding_window`` for every layer (null: none)."""
    return (r.int_or_none("sliding_window", default),) * n_layers


def _sliding_flags(r: _Reader, n_layers: int, fallback: Sequence[bool]) -> tuple[bool, ...]:
    """Which layers slide: ``layer_types`` when the config has it, else the config class's own rule."""
    types = r.str_list("layer_types", n_layers)
    return tuple(t == "sliding_attention" for t in types) if types is not None else tuple(fallback)


def _windows_typed(
    r: _Reader, n_layers: int, window: int | None, fallback: Sequence[bool]
) -> tuple[int | None, ...]:
    """Per-layer windows: ``window`` on the sliding layers, None on the others."""
    return tuple(window if s else None for s in _sliding_flags(r, n_layers, fallback))


def _qwen_windows(r: _Reader, n_layers: int) -> tuple[int | None, ...]:
    """Qwen2/Qwen3Config: sliding only with use_sliding_window, on layers >= max_window_layers."""
    use = r.get_bool("use_sliding_window", False)
    window = r.int_or_none("sliding_window", 4096) if use else None
    first = r.get_int("max_window_layers", default=28, minimum=0, note=False)
    return _windows_typed(r, n_layers, window, [window is not None and i >= first for i in range(n_layers)])


def _llama(r: _Reader, name: str | None) -> ModelSpec:
    """transformers/models/llama/modeling_llama.py: LlamaForCausalLM (Llama 1/2/3/3.1/3.2)."""
    c = _common(r, _Defaults(architecture="LlamaForCausalLM"))
    bias = r.get_bool("attention_bias", False)
    d = _Decoder(
        **c,
        windows=(None,) * c["n_layers"],
        qkv_bias=bias,
        o_bias=bias,
        mlp_bias=r.get_bool("mlp_bias", False),
    )
    return _decoder_spec(r, d, name)


def _mistral(r: _Reader, name: str | None) -> ModelSpec:
    """transformers/models/mistral/modeling_mistral.py: MistralForCausalLM (GQA, sliding window)."""
    c = _common(r, _Defaults(architecture="MistralForCausalLM", kv_heads=8, max_pos=131072))
    return _decoder_spec(r, _Decoder(**c, windows=_windows_all(r, c["n_layers"], 4096)), name)


def _mixtral(r: _Reader, name: str | None) -> ModelSpec:
    """transformers/models/mixtral/modeling_mixtral.py: MixtralForCausalLM (every layer a sparse MoE)."""
    c = _common(r, _Defaults(architecture="MixtralForCausalLM", kv_heads=8, max_pos=131072))
    n = c["n_layers"]
    moe = _Moe(
        sparse=(True,) * n,
        experts=r.get_int("num_local_experts", "num_experts"),
        top_k=r.get_int("num_experts_per_tok"),
        width=c["intermediate"],
        norm_topk=True,  # MixtralTopKRouter: router_top_value /= router_top_value.sum(...), always
    )
    return _decoder_spec(r, _Decoder(**c, windows=_windows_all(r, n, None), moe=moe), name)


def _qwen2(r: _Reader, name: str | None) -> ModelSpec:
    """transformers/models/qwen2/modeling_qwen2.py: Qwen2ForCausalLM (Qwen2/2.5: q/k/v biases)."""
    c = _common(r, _Defaults(architecture="Qwen2ForCausalLM", kv_heads=32, max_pos=32768))
    d = _Decoder(**c, windows=_qwen_windows(r, c["n_layers"]), qkv_bias=True)
    return _decoder_spec(r, d, name)


def _qwen3(r: _Reader, name: str | None) -> ModelSpec:
    """transformers/models/qwen3/modeling_qwen3.py: Qwen3ForCausalLM (per-head q_norm / k_norm)."""
    c = _common(r, _Defaults(architecture="Qwen3ForCausalLM", kv_heads=32, head_dim=128, max_pos=32768))
    bias = r.get_bool("attention_bias", False)
    d = _Decoder(**c, windows=_qwen_windows(r, c["n_layers"]), qkv_bias=bias, o_bias=bias, qk_norm="per_head")
    return _decoder_spec(r, d, name)


def _qwen_sparse(r: _Reader, n_layers: int) -> tuple[bool, ...]:
    """Qwen2/3-MoE decoder layers: sparse unless in mlp_only_layers or off the decoder_sparse_step grid."""
    dense = set(r.int_list("mlp_only_layers"))
    step = r.get_int("decoder_sparse_step", default=1, note=False)
    return tuple(i not in dense and (i + 1) % step == 0 for i in range(n_layers))


def _qwen2_moe(r: _Reader, name: str | None) -> ModelSpec:
    """transformers/models/qwen2_moe/modeling_qwen2_moe.py: Qwen2MoeForCausalLM (shared expert + its gate)."""
    c = _common(r, _Defaults(architecture="Qwen2MoeForCausalLM", kv_heads=16, max_pos=32768))
    n = c["n_layers"]
    moe = _Moe(
        sparse=_qwen_sparse(r, n),
        experts=r.get_int("num_experts"),
        top_k=r.get_int("num_experts_per_tok"),
        width=r.get_int("moe_intermediate_size"),
        shared_width=r.get_int("shared_expert_intermediate_size"),
        shared_path="mlp.shared_expert",
        shared_gate=True,
        norm_topk=r.get_bool("norm_topk_prob", False),  # Qwen2MoeConfig default
        weights_fp32=False,  # Qwen2MoeTopKRouter: router_top_value.to(router_logits.dtype)
    )
    use = r.get_bool("use_sliding_window", False)
    window = r.int_or_none("sliding_window", 4096) if use else None
    first = r.get_int("max_window_layers", default=28, minimum=0, note=False)
    # Qwen2MoeConfig's own rule: odd layers below max_window_layers slide, when use_sliding_window.
    windows = _windows_typed(
        r, n, window, [window is not None and i % 2 == 0 and i < first for i in range(n)]
    )
    d = _Decoder(**c, windows=windows, qkv_bias=r.get_bool("qkv_bias", True), moe=moe)
    return _decoder_spec(r, d, name)


def _qwen3_moe(r: _Reader, name: str | None) -> ModelSpec:
    """transformers/models/qwen3_moe/modeling_qwen3_moe.py: Qwen3MoeForCausalLM (no shared expert)."""
    c = _common(r, _Defaults(architecture="Qwen3MoeForCausalLM", kv_heads=4, max_pos=32768))
    n = c["n_layers"]
    moe = _Moe(
        sparse=_qwen_sparse(r, n),
        experts=r.get_int("num_experts", "num_local_experts"),
        top_k=r.get_int("num_experts_per_tok"),
        width=r.get_int("moe_intermediate_size"),
        norm_topk=r.get_bool("norm_topk_prob", False),  # Qwen3MoeConfig default
        weights_fp32=False,  # Qwen3MoeTopKRouter: router_top_value.to(router_logits.dtype)
    )
    window = r.int_or_none("sliding_window", 4096) if r.get_bool("use_sliding_window", False) else None
    bias = r.get_bool("attention_bias", False)
    d = _Decoder(**c, windows=(window,) * n, qkv_bias=bias, o_bias=bias, qk_norm="per_head", moe=moe)
    return _decoder_spec(r, d, name)


# Gemma2Config defaults (configuration_gemma2.py): attn_logit_softcapping, final_logit_softcapping.
GEMMA2_ATTN_SOFTCAP = 50.0
GEMMA2_FINAL_SOFTCAP = 30.0


def _gemma_like(r: _Reader, name: str | None, version: int) -> ModelSpec:
    """transformers/models/gemma{,2,3}/modeling_gemma*.py: Gemma/Gemma2/Gemma3ForCausalLM.

    head_dim is its own key (256 by default), the head is tied, the embedding is scaled by a 0-d
    buffer; Gemma 2/3 add pre/post feed-forward norms and alternate local (sliding) and global layers;
    Gemma 3 adds per-head q/k norms and one rotary table per layer type.
    """
    arch, kv_default, vocab_default, max_pos = {
        1: ("GemmaForCausalLM", 16, 256000, 8192),
        2: ("Gemma2ForCausalLM", 4, 256000, 8192),
        3: ("Gemma3ForCausalLM", 4, 262208, 131072),
    }[version]
    # Gemma3TextConfig defaults vocab_size and num_attention_heads too; multimodal gemma3 text_configs
    # often omit them.
    f = _Defaults(
        architecture=arch,
        kv_heads=kv_default,
        head_dim=256,
        tied=True,
        max_pos=max_pos,
        activation="gelu_pytorch_tanh",
        vocab=vocab_default if version == 3 else None,
        heads=8 if version == 3 else None,
    )
    c = _common(r, f)
    n = c["n_layers"]
    bias = r.get_bool("attention_bias", False)
    if version == 1:
        windows: tuple[int | None, ...] = (None,) * n
    else:
        window = r.int_or_none("sliding_window", 4096)
        # Gemma2Config alternates (every 2nd layer global); Gemma3TextConfig reads the legacy
        # sliding_window_pattern (default 6: five local layers, then one global).
        pattern = 2 if version == 2 else r.get_int("sliding_window_pattern", default=6, note=False)
        flags = _sliding_flags(r, n, [bool((i + 1) % pattern) for i in range(n)])
        windows = tuple(window if f else None for f in flags)
    rope_names: tuple[str, ...] = ("",)
    if version == 3:  # Gemma3RotaryEmbedding: one table per layer type present, sorted
        types = {"sliding_attention" if f else "full_attention" for f in flags}
        rope_names = tuple(f"{t}_" for t in sorted(types))
    d = _Decoder(
        **c,
        windows=windows,
        qkv_bias=bias,
        o_bias=bias,
        layout="pre" if version == 1 else "sandwich",
        qk_norm="per_head" if version == 3 else "none",
        rope_names=rope_names,
        embed_scale=True,
    )
    # GemmaRMSNorm: ``(x.float() * rsqrt(...)) * (1 + weight.float())``, cast after: the normalised x
    # saved for backward is fp32. Gemma 2 soft-caps attention and head logits (Gemma2Config defaults
    # attn_logit_softcapping=50.0, final_logit_softcapping=30.0; modeling_gemma2.py applies each when
    # not None); Gemma 3 passes the same keys (Gemma3TextConfig defaults None: no capping).
    attn_cap = final_cap = None  # Gemma (1) has no capping
    if version > 1:
        v2 = version == 2
        attn_cap = r.float_or_none("attn_logit_softcapping", GEMMA2_ATTN_SOFTCAP if v2 else None)
        final_cap = r.float_or_none("final_logit_softcapping", GEMMA2_FINAL_SOFTCAP if v2 else None)
    return replace(
        _decoder_spec(r, d, name), rmsnorm_normed_fp32=True, attn_logit_softcap=attn_cap,
        final_logit_softcap=final_cap,
    )  # fmt: skip


def _phi3(r: _Reader, name: str | None) -> ModelSpec:
    """transformers/models/phi3/modeling_phi3.py: Phi3ForCausalLM (fused qkv_proj and gate_up_proj)."""
    c = _common(r, _Defaults(architecture="Phi3ForCausalLM", max_pos=4096))
    c["rotary_dim"] = int(c["head_dim"] * _partial_rotary(r, 1.0))
    drop = r.get_float("resid_pdrop")
    c["dropout"] = _Dropout(r.get_float("attention_dropout"), drop, r.get_float("embd_pdrop"))
    spec = _decoder_spec(r, _Decoder(**c, windows=_windows_all(r, c["n_layers"], None), fused=True), name)
    # modeling_phi3.py apply_rotary_pos_emb: ``torch.cat([(q_rot * cos) + ..., q_pass], dim=-1)``
    return replace(spec, rope_concat=True)


def _starcoder2(r: _Reader, name: str | None) -> ModelSpec:
    """transformers/models/starcoder2/modeling_starcoder2.py: Starcoder2ForCausalLM (biases, LayerNorm)."""
    c = _common(
        r,
        _Defaults(
            architecture="Starcoder2ForCausalLM",
            kv_heads=2,
            tied=True,
            max_pos=4096,
            activation="gelu_pytorch_tanh",
        ),
    )
    bias = r.get_bool("use_bias", True)
    c["dropout"] = _Dropout(
        r.get_float("attention_dropout"), r.get_float("residual_dropout"), r.get_float("embedding_dropout")
    )
    d = _Decoder(
        **c,
        windows=_windows_all(r, c["n_layers"], None),
        qkv_bias=bias,
        o_bias=bias,
        mlp_bias=bias,
        norm_kind="layernorm",
        norm_bias=True,
        gated=False,
    )
    return _decoder_spec(r, d, name)


def _olmo(r: _Reader, name: str | None, version: int) -> ModelSpec:
    """transformers/models/olmo{,2}/modeling_olmo*.py: OLMo (LayerNorm without parameters) and OLMo 2
    (RMSNorm after attention and MLP, q_norm / k_norm over all heads)."""
    arch = "OlmoForCausalLM" if version == 1 else "Olmo2ForCausalLM"
    c = _common(r, _Defaults(architecture=arch))
    bias = r.get_bool("attention_bias", False)
    if version == 1:
        d = _Decoder(
            **c,
            windows=(None,) * c["n_layers"],
            qkv_bias=bias,
            o_bias=bias,
            norm_kind="layernorm",
            layout="nonparametric",
        )
        # OlmoLayerNorm (modeling_olmo.py) normalises an fp32 upcast: that is what layer_norm saves
        return replace(_decoder_spec(r, d, name), layernorm_fp32=True)
    d = _Decoder(
        **c, windows=(None,) * c["n_layers"], qkv_bias=bias, o_bias=bias, qk_norm="full", layout="post"
    )
    # Olmo2RMSNorm (modeling_olmo2.py): ``(self.weight * hidden_states).to(input_dtype)``: the weight
    # multiplies the fp32 normalised x, which is what it saves
    return replace(_decoder_spec(r, d, name), rmsnorm_normed_fp32=True)


def _deepseek(r: _Reader, name: str | None, version: int) -> ModelSpec:
    """transformers/models/deepseek_v{2,3}/modeling_deepseek_v*.py: multi-head latent attention + MoE.

    Layers below ``first_k_dense_replace`` are dense; the rest hold fused routed experts, a router
    (``mlp.gate``) and ``n_shared_experts`` always-on experts fused into one MLP. In V3 the router's
    ``e_score_correction_bias`` is an ``nn.Buffer``, not a parameter.
    """
    arch = "DeepseekV2ForCausalLM" if version == 2 else "DeepseekV3ForCausalLM"
    heads = r.get_int("num_attention_heads")
    kv = r.get_int("num_key_value_heads", default=heads if version == 2 else 128, note=False)
    hidden = r.get_int("hidden_size")
    n = r.get_int("num_hidden_layers")
    q_rank = r.int_or_none("q_lora_rank", 1536)
    kv_rank = r.get_int("kv_lora_rank", default=512)
    nope = r.get_int("qk_nope_head_dim", default=128)
    rope = r.get_int("qk_rope_head_dim", default=64)
    v_dim = r.get_int("v_head_dim", default=128)
    bias = r.get_bool("attention_bias", False)
    mlp_bias = r.get_bool("mlp_bias", False) if version == 2 else False
    qk = nope + rope
    if q_rank is None:
        q: tuple[Tensor, ...] = linear("self_attn.q_proj", hidden, heads * qk, False, "attention")
    else:
        q = (
            *linear("self_attn.q_a_proj", hidden, q_rank, bias, "attention"),
            *norm("self_attn.q_a_layernorm", q_rank, False),
            *linear("self_attn.q_b_proj", q_rank, heads * qk, False, "attention"),
        )
    attn = (
        *q,
        *linear("self_attn.kv_a_proj_with_mqa", hidden, kv_rank + rope, bias, "attention"),
        *norm("self_attn.kv_a_layernorm", kv_rank, False),
        *linear("self_attn.kv_b_proj", kv_rank, heads * (nope + v_dim), False, "attention"),
        *linear("self_attn.o_proj", heads * v_dim, hidden, bias, "attention"),
    )
    dense = r.get_int("first_k_dense_replace", default=0 if version == 2 else 3, minimum=0)
    width = r.get_int("moe_intermediate_size")
    shared = r.get_int("n_shared_experts", default=2 if version == 2 else 1, minimum=0)
    moe = _Moe(
        sparse=tuple(i >= dense for i in range(n)),
        experts=r.get_int("n_routed_experts", "num_local_experts"),
        top_k=r.get_int("num_experts_per_tok"),
        width=width,
        shared_width=width * shared,
        router_buffer=version == 3,
        router_fp32=True,  # DeepseekV{2,3}TopkRouter: F.linear(x.type(float32), weight.type(float32))
        # DeepseekV3Config norm_topk_prob defaults to True; V2's router never renormalises
        norm_topk=version == 3 and r.get_bool("norm_topk_prob", True),
        group_mask=version == 2 and r.get_str("topk_method", default="greedy") == "group_limited_greedy",
        shared_after_routed=True,  # DeepseekV{2,3}Moe.forward: experts(...), then + shared_experts(residuals)
    )
    freq = r.raw.get("moe_layer_freq", 1)
    if freq != 1:
        r.notes.append(
            f"moe_layer_freq={freq!r} is ignored: transformers makes every layer from "
            f"first_k_dense_replace={dense} on sparse"
        )
    mtp = r.get_int("num_nextn_predict_layers", default=0, minimum=0, note=False)
    if mtp:
        r.notes.append(
            f"num_nextn_predict_layers={mtp}: the multi-token-prediction layer is in the checkpoint "
            "but transformers does not build it; not counted"
        )
    d = _Decoder(
        architecture=arch,
        vocab=r.get_int("vocab_size"),
        hidden=hidden,
        n_layers=n,
        heads=heads,
        kv_heads=kv,
        head_dim=qk,
        intermediate=r.get_int("intermediate_size"),
        activation=r.get_str("hidden_act", default="silu"),
        tied=r.get_bool("tie_word_embeddings", False),
        max_pos=r.get_int("max_position_embeddings", default=2048 if version == 2 else 4096),
        windows=(None,) * n,
        rotary_dim=rope,
        mlp_bias=mlp_bias,
        moe=moe,
        dropout=_Dropout(attention=r.get_float("attention_dropout")),
    )

    def attention_for(i: int) -> Attention:
        return Attention(
            num_heads=heads,
            num_kv_heads=heads,
            head_dim=qk,
            v_head_dim=v_dim,
            q_lora_rank=q_rank or 0,
            kv_lora_rank=kv_rank,
            qk_rope_head_dim=rope,
        )

    return _decoder_spec(r, d, name, attention_for, attn)


# --- BERT --------------------------------------------------------------------------------------------
def _bert(r: _Reader, name: str | None) -> ModelSpec:
    """transformers/models/bert/modeling_bert.py: BertForSequenceClassification (pooler + classifier)."""
    vocab = r.get_int("vocab_size")
    hidden = r.get_int("hidden_size")
    n = r.get_int("num_hidden_layers")
    heads = r.get_int("num_attention_heads")
    inner = r.get_int("intermediate_size")
    head_dim = r.derived_head_dim(hidden, heads)
    max_pos = r.get_int("max_position_embeddings", default=512)
    types = r.get_int("type_vocab_size", default=2)
    labels = _num_labels(r)
    if r.get_bool("is_decoder", False) or r.get_bool("add_cross_attention", False):
        raise r.fail("is_decoder/add_cross_attention=true: BERT as a decoder is not supported")
    archs = r.raw.get("architectures")
    if isinstance(archs, list) and archs and "BertForSequenceClassification" not in archs:
        r.notes.append(
            f"architectures={archs}: counting BertForSequenceClassification with {labels} labels "
            "(a fine-tuning head on the encoder) instead"
        )
    tensors = (
        *linear("attention.self.query", hidden, hidden, True, "attention"),
        *linear("attention.self.key", hidden, hidden, True, "attention"),
        *linear("attention.self.value", hidden, hidden, True, "attention"),
        *linear("attention.output.dense", hidden, hidden, True, "attention"),
        *norm("attention.output.LayerNorm", hidden, True),
        *linear("intermediate.dense", hidden, inner, True, "mlp"),
        *linear("output.dense", inner, hidden, True, "mlp"),
        *norm("output.LayerNorm", hidden, True),
    )
    layer = Layer(
        attention=Attention(num_heads=heads, num_kv_heads=heads, head_dim=head_dim, v_head_dim=head_dim),
        mlp=Mlp(intermediate_size=inner, gated=False, activation=r.get_str("hidden_act", default="gelu")),
        tensors=tensors,
    )
    outer = (
        _embedding("bert.embeddings.word_embeddings", vocab, hidden),
        _embedding("bert.embeddings.position_embeddings", max_pos, hidden, "positions"),
        _embedding("bert.embeddings.token_type_embeddings", types, hidden),
        *norm("bert.embeddings.LayerNorm", hidden, True),
        *linear("bert.pooler.dense", hidden, hidden, True, "pooler"),
        *linear("classifier", hidden, labels, True, "classifier"),
    )
    buffers = tuple(
        Tensor(
            name=f"bert.embeddings.{b}",
            module="embeddings",
            shape=(1, max_pos),
            component="positions",
            kind="other",
        )
        for b in ("position_ids", "token_type_ids")
    )
    drop = r.get_float("hidden_dropout_prob", default=0.1)
    spec = _spec(
        r,
        name=name,
        architecture="BertForSequenceClassification",
        vocab=vocab,
        hidden=hidden,
        max_pos=max_pos,
        position="learned",
        norm_kind="layernorm",
        layers=[layer] * n,
        outer=outer,
        tied=False,
        dropout=_Dropout(r.get_float("attention_probs_dropout_prob", default=0.1), drop, drop),
        buffers=buffers,
        task="sequence-classification",
        num_labels=labels,
    )
    # modeling_bert.py: a post-norm encoder (BertLayer: attention reads the block input, LayerNorm after
    # each residual sum; no norm before the head; BertEmbeddings.LayerNorm over the summed embeddings);
    # eager_attention_forward runs softmax in the scores' dtype and drops out the probabilities before
    # the matmul with v casts them. (RoBERTa, not yet a family here, is the same.)
    return replace(
        spec, attn_softmax_fp32=False, attn_dropout_before_cast=True, post_norm=True, final_norm=False,
        embedding_norm=True,
    )  # fmt: skip


def _num_labels(r: _Reader) -> int:
    """PretrainedConfig: ``num_labels`` (default 2), or the length of ``id2label`` when given."""
    id2label = r.raw.get("id2label")
    if isinstance(id2label, dict) and id2label and not r.has("num_labels"):
        return len(id2label)
    return r.get_int("num_labels", default=2, note=False)


# --- dispatch ----------------------------------------------------------------------------------------
_Builder = Callable[[_Reader, "str | None"], ModelSpec]

_FAMILIES: dict[str, tuple[str, _Builder]] = {
    "gpt2": ("GPT2Config", _gpt2),
    "gpt_neox": ("GPTNeoXConfig", _gpt_neox),
    "opt": ("OPTConfig", _opt),
    "bloom": ("BloomConfig", _bloom),
    "falcon": ("FalconConfig", _falcon),
    "llama": ("LlamaConfig", _llama),
    "mistral": ("MistralConfig", _mistral),
    "mixtral": ("MixtralConfig", _mixtral),
    "qwen2": ("Qwen2Config", _qwen2),
    "qwen3": ("Qwen3Config", _qwen3),
    "qwen2_moe": ("Qwen2MoeConfig", _qwen2_moe),
    "qwen3_moe": ("Qwen3MoeConfig", _qwen3_moe),
    "gemma": ("GemmaConfig", lambda r, n: _gemma_like(r, n, 1)),
    "gemma2": ("Gemma2Config", lambda r, n: _gemma_like(r, n, 2)),
    "gemma3_text": ("Gemma3TextConfig", lambda r, n: _gemma_like(r, n, 3)),
    "phi3": ("Phi3Config", _phi3),
    "starcoder2": ("Starcoder2Config", _starcoder2),
    "olmo": ("OlmoConfig", lambda r, n: _olmo(r, n, 1)),
    "olmo2": ("Olmo2Config", lambda r, n: _olmo(r, n, 2)),
    "deepseek_v2": ("DeepseekV2Config", lambda r, n: _deepseek(r, n, 2)),
    "deepseek_v3": ("DeepseekV3Config", lambda r, n: _deepseek(r, n, 3)),
    # Kimi-K2's config.json (moonshotai/Kimi-K2-Instruct) says model_type "kimi_k2", maps AutoConfig to
    # remote code whose class is DeepseekV3Config and names DeepseekV3ForCausalLM: DeepSeek-V3's modules
    "kimi_k2": ("DeepseekV3Config", lambda r, n: _deepseek(r, n, 3)),
    "bert": ("BertConfig", _bert),
}
MULTIMODAL = ("gemma3",)  # read through their text_config
SUPPORTED_MODEL_TYPES: tuple[str, ...] = (*_FAMILIES, *MULTIMODAL)


def spec_from_config(config: Mapping[str, Any], *, name: str | None = None) -> ModelSpec:
    """Build the :class:`ModelSpec` of the transformers model a ``config.json`` dict describes (its
    keys' types and sizes checked first: every caller, the web's posted configs too)."""
    from peakmem.validate import check_config

    check_config(config)
    model_type = config.get("model_type")
    if not isinstance(model_type, str):
        raise ConfigError(
            f"{CONFIG_FILE}: missing key 'model_type' (supported: {', '.join(SUPPORTED_MODEL_TYPES)})"
        )
    notes: list[str] = []
    family_type = model_type
    if model_type == "gemma3":
        text = config.get("text_config")
        if text is None:
            text = {}
        if not isinstance(text, dict):
            raise ConfigError(f"{CONFIG_FILE}: text_config={text!r}: must be an object (model_type=gemma3)")
        notes.append(
            "gemma3 is multimodal: counting the text-only Gemma3ForCausalLM built from text_config "
            "(vision tower and projector not included)"
        )
        name = name or _str_or_none(config.get("_name_or_path"))
        config = text
        family_type = "gemma3_text"
    entry = _FAMILIES.get(family_type)
    if entry is None:
        raise ConfigError(
            f"{CONFIG_FILE}: model_type={model_type!r} is not supported; "
            f"supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
        )
    family, build = entry
    reader = _Reader(config, model_type, family)
    reader.notes.extend(notes)
    return build(reader, name)


def _str_or_none(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "seq_length", "n_ctx", "max_sequence_length")


def context_length(config: dict[str, Any]) -> int | None:
    """The context a config declares under any common key, for architectures peakmem's formulas do not
    know (``peakmem simulate`` still runs them); None when no key is there."""
    for key in CONTEXT_KEYS:
        value = config.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None
