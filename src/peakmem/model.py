"""ModelSpec: the architecture of a transformer, and nothing about how it is run.

A spec has two faces that :mod:`peakmem.hf` fills in together from one ``config.json``:

* the **semantics** that activation and KV-cache formulas need (heads, head sizes, MLP kind,
  experts, norms, residual layout, dropout), per layer group;
* the **tensor inventory**: every parameter tensor with its module name (as transformers names
  it, so LoRA targets and quantization rules can match it), shape and component. Parameter
  counts are sums over the inventory, never a closed-form guess, so they are exact by
  construction once the inventory matches transformers' own model (a torch-tier test checks).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import cached_property
from typing import Literal, Protocol

from peakmem.errors import require

Component = Literal[
    "embeddings", "positions", "attention", "mlp", "experts", "router", "shared_experts",
    "norms", "head", "pooler", "classifier", "other",
]  # fmt: skip
TensorKind = Literal["linear_weight", "linear_bias", "norm", "embedding", "expert_weight", "other"]
NormKind = Literal["layernorm", "rmsnorm"]
PositionKind = Literal["learned", "rope", "alibi"]
# "token-value": a causal decoder with a one-output token-classification head (a PPO critic, peakmem.ppo)
Task = Literal["causal-lm", "sequence-classification", "masked-lm", "token-value"]
DECODER_TASKS: tuple[Task, ...] = ("causal-lm", "token-value")  # causal attention, decoder masks
QkNorm = Literal["none", "per_head", "full"]
SdpaKv = Literal["shared", "repeated", "broadcast"]

COMPONENTS: tuple[Component, ...] = (
    "embeddings", "positions", "attention", "mlp", "experts", "router", "shared_experts",
    "norms", "head", "pooler", "classifier", "other",
)  # fmt: skip
# The dtypes a recurrent (SSM / delta-rule) state may be kept in, as configs (``mamba_ssm_dtype``) and the
# serving engines (vLLM MambaDType, SGLang --mamba-ssm-dtype) name them (formulas/recurrent_state.py).
STATE_DTYPES = ("float32", "bfloat16", "float16")
# Block kinds of a derived spec (peakmem.simulate.derive): what a repeated block computes.
BLOCK_KINDS = (
    "attention", "sliding_attention", "chunked_attention", "linear_attention", "ssm", "other",
)  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class Tensor:
    """One parameter tensor, or ``copies`` identical ones (experts kept as separate modules)."""

    name: str  # path inside a layer or the model, e.g. "self_attn.q_proj.weight"
    module: str  # leaf module name, e.g. "q_proj"; what LoRA's target_modules matches
    shape: tuple[int, ...]
    component: Component
    kind: TensorKind
    copies: int = 1

    @property
    def numel(self) -> int:
        return math.prod(self.shape) * self.copies


def linear(
    path: str, in_features: int, out_features: int, bias: bool, component: Component
) -> tuple[Tensor, ...]:
    """The weight (``out x in``, as ``nn.Linear`` stores it) and optional bias of a Linear."""
    module = path.rsplit(".", 1)[-1]
    weight = Tensor(
        name=f"{path}.weight", module=module, shape=(out_features, in_features),
        component=component, kind="linear_weight",
    )  # fmt: skip
    if not bias:
        return (weight,)
    return weight, Tensor(
        name=f"{path}.bias", module=module, shape=(out_features,),
        component=component, kind="linear_bias",
    )  # fmt: skip


def norm(path: str, dim: int, bias: bool, component: Component = "norms") -> tuple[Tensor, ...]:
    """A LayerNorm (weight and bias) or an RMSNorm / bias-free LayerNorm (weight only)."""
    module = path.rsplit(".", 1)[-1]
    weight = Tensor(name=f"{path}.weight", module=module, shape=(dim,), component=component, kind="norm")
    if not bias:
        return (weight,)
    return weight, Tensor(name=f"{path}.bias", module=module, shape=(dim,), component=component, kind="norm")


@dataclass(frozen=True, kw_only=True)
class Attention:
    """What attention computes and caches in one layer."""

    num_heads: int
    num_kv_heads: int
    head_dim: int  # query/key head size (MLA: qk_nope_head_dim + qk_rope_head_dim)
    v_head_dim: int  # value head size; equals head_dim except in MLA
    qk_norm: QkNorm = "none"
    sliding_window: int | None = None  # None: attends to the whole context
    # Multi-head latent attention (DeepSeek-V2/V3); zero when not MLA.
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0

    def __post_init__(self) -> None:
        require(self.num_heads > 0, "num_attention_heads", self.num_heads, "must be positive")
        require(self.num_kv_heads > 0, "num_key_value_heads", self.num_kv_heads, "must be positive")
        require(
            self.num_heads % self.num_kv_heads == 0, "num_key_value_heads", self.num_kv_heads,
            f"must divide num_attention_heads={self.num_heads}",
        )  # fmt: skip
        require(self.head_dim > 0, "head_dim", self.head_dim, "must be positive")

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def caches_tokens(self) -> bool:
        """Whether the layer keeps a KV cache: a window of 0 tokens marks a derived spec's SSM /
        linear-attention block, whose placeholder attention caches nothing."""
        return self.sliding_window != 0

    @property
    def q_width(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_width(self) -> int:
        """Elements of K plus V per token as the attention kernel sees them (expanded in MLA)."""
        return self.num_kv_heads * (self.head_dim + self.v_head_dim)


@dataclass(frozen=True, kw_only=True)
class Mlp:
    """The feed-forward part of a layer: dense, or a mixture of experts."""

    intermediate_size: int  # per expert for MoE
    gated: bool  # SwiGLU/GeGLU: act(gate(x)) * up(x)
    activation: str  # as the config names it: "gelu_new", "silu", "gelu_pytorch_tanh", ...
    num_experts: int = 0  # 0: dense
    experts_per_token: int = 0
    shared_intermediate_size: int = 0  # total width of always-on shared experts
    fused_gate_up: bool = False  # Phi-3: one gate_up_proj
    # MoE router, as each family's transformers code writes it (what its backward keeps differs):
    router_fp32: bool = False  # DeepSeek-V2/V3: F.linear(x.type(float32), weight.type(float32))
    router_norm_topk: bool = False  # top-k weights renormalised in place (``/=`` their sum)
    router_group_mask: bool = False  # DeepSeek-V2 group_limited_greedy: scores.masked_fill(mask)
    routing_weights_fp32: bool = True  # False: Qwen-MoE cast them back to the logits' dtype
    shared_gate: bool = False  # Qwen2-MoE: sigmoid(shared_expert_gate(x)) * shared_expert(x)
    shared_after_routed: bool = False  # DeepSeek: shared experts run after the routed ones in forward

    def __post_init__(self) -> None:
        require(self.intermediate_size > 0, "intermediate_size", self.intermediate_size, "must be positive")
        if self.num_experts:
            require(
                0 < self.experts_per_token <= self.num_experts, "num_experts_per_tok",
                self.experts_per_token, f"must be in 1..{self.num_experts}",
            )  # fmt: skip

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0


@dataclass(frozen=True, kw_only=True)
class DerivedBlock:
    """A block the formulas do not describe: its activation bytes are measured, not computed.

    Set on the layers of a spec derived from transformers' own modules (:mod:`peakmem.simulate.derive`);
    ``None`` on every spec :mod:`peakmem.hf` builds. ``key`` names the block's measured costs in
    :mod:`peakmem.block_costs` (config hash and kind signature); ``mixer`` is what mixes tokens (one of
    ``BLOCK_KINDS``), ``ffn`` "dense", "moe" or "none". KV cache: attention mixers cache
    ``kv_elements_per_token`` elements per token (from their ``Attention``); SSM and linear attention
    keep a recurrent state per sequence instead, whatever the context: ``state_elements`` in the model's
    dtype (conv states) and ``state_fp32_elements`` kept in fp32 (SSM / delta-rule states), as
    transformers' cache allocates them after a prefill (measured: ``simulate/derive/spec.py measure_state``).
    ``conv_kernel``: the window of those conv states, the inputs transformers keeps per channel (the
    conv states' last dimension: the config's conv kernel); serving engines keep one fewer
    (formulas/recurrent_state.py). 0: no conv state, or measured before it was recorded.
    """

    key: str
    mixer: str
    ffn: str
    kv_elements_per_token: int = 0
    state_elements: int = 0
    state_fp32_elements: int = 0
    conv_kernel: int = 0

    def __post_init__(self) -> None:
        require(self.state_elements >= 0, "state_elements", self.state_elements, "must be >= 0")
        fp32 = self.state_fp32_elements
        require(fp32 >= 0, "state_fp32_elements", fp32, "must be >= 0")
        require(self.conv_kernel >= 0, "conv_kernel", self.conv_kernel, "must be >= 0")
        if self.conv_kernel:
            require(self.state_elements % self.conv_kernel == 0, "state_elements", self.state_elements,
                    f"must be a multiple of conv_kernel={self.conv_kernel} (channels x window)")  # fmt: skip
        require(self.mixer in BLOCK_KINDS, "mixer", self.mixer, f"must be one of {', '.join(BLOCK_KINDS)}")
        require(self.ffn in ("dense", "moe", "none"), "ffn", self.ffn, "must be dense, moe or none")


@dataclass(frozen=True, kw_only=True)
class Layer:
    """One transformer block: semantics plus its parameter tensors (paths relative to the block)."""

    attention: Attention
    mlp: Mlp
    tensors: tuple[Tensor, ...]
    parallel_residual: bool = False  # GPT-NeoX, Falcon, Phi-2: attention and MLP read the same input
    derived: DerivedBlock | None = None  # measured costs instead of the formulas (derived specs only)

    @property
    def params(self) -> int:
        return sum(t.numel for t in self.tensors)


@dataclass(frozen=True, kw_only=True)
class LayerGroup:
    count: int
    layer: Layer


@dataclass(frozen=True, kw_only=True)
class Tower:
    """An encoder beside the language model (a vision or audio tower) in a derived spec, as
    :mod:`peakmem.simulate.derive` reads it: the outermost module built from one of the config's
    sub-configs other than the text model's (``model.visual`` from ``vision_config``), with that
    sub-config's sizes as transformers resolves them (its defaults filled in). Its parameters are the
    outer tensors under ``prefix`` and the layers whose block key is one of ``block_keys``
    (:meth:`ModelSpec.tower_of`). A size the sub-config does not name is 0."""

    kind: str  # the sub-config's key less "_config": "vision", "audio"
    prefix: str  # the tower's module path, e.g. "model.visual"
    num_layers: int  # the sub-config's depth / num_hidden_layers (else its main block list's length)
    hidden_size: int
    num_heads: int
    intermediate_size: int
    block_keys: tuple[str, ...]  # DerivedBlock keys of the tower's blocks
    patch_size: int = 0  # pixels per patch side
    temporal_patch_size: int = 0  # video frames per patch (Qwen-VL)
    spatial_merge_size: int = 0  # patches merged per side before the language model (Qwen-VL)
    image_size: int = 0  # the input resolution the tower is built for (fixed-size towers)
    out_hidden_size: int = 0  # the width the tower hands to the language model


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """A transformer architecture. Build it with :func:`peakmem.hf.spec_from_config`."""

    name: str
    model_type: str  # config.json's model_type
    architecture: str  # the transformers class the counts match, e.g. "LlamaForCausalLM"
    task: Task
    vocab_size: int
    hidden_size: int
    max_position_embeddings: int
    position: PositionKind
    norm: NormKind
    groups: tuple[LayerGroup, ...]
    outer: tuple[Tensor, ...]  # embeddings, positions, final norm, head, pooler, classifier
    tie_word_embeddings: bool  # the LM head shares the token embedding (counted once)
    num_labels: int = 0  # sequence classification heads
    attention_dropout: float = 0.0
    hidden_dropout: float = 0.0  # residual/MLP dropout
    embedding_dropout: float = 0.0
    # The attention kernels transformers implements for this architecture ("eager", "sdpa", "flash").
    attention_kernels: tuple[str, ...] = ("eager", "sdpa", "flash")
    # How the model calls SDPA (which kernel CUDA then runs: formulas/activations/ sdpa_call_backend).
    # ``sdpa_kv``: how k/v with fewer heads than q reach it. "shared": transformers'
    # ``sdpa_attention_forward`` (integrations/sdpa_attention.py: the kv heads with
    # ``enable_gqa=True`` when ``use_gqa_in_sdpa``, else ``repeat_kv`` copies); "repeated": copied
    # to every query head by the model (modeling_falcon.py ``_split_heads``, new decoder
    # architecture: ``broadcast_to`` + ``flatten``); "broadcast": the kv heads without
    # ``enable_gqa`` (modeling_falcon.py multi-query: 1 k/v head), which only the math kernel takes.
    sdpa_kv: SdpaKv = "shared"
    # An explicit ``attn_mask`` is passed (Falcon: ``create_causal_mask(..., allow_is_causal_skip=False)``
    # materialises it); False: causal LMs get None and the kernel's ``is_causal`` (masking_utils.py).
    sdpa_mask: bool = False
    # --- how transformers computes it: behaviours the activation formulas need, set per family by
    # peakmem.hf (the one module that knows model types). Defaults are the Llama-style standard.
    # Eager attention's softmax runs in fp32: ``softmax(attn_weights, dim=-1, dtype=torch.float32)``
    # (modeling_llama.py ``eager_attention_forward``); False: in the scores' dtype (modeling_gpt2.py
    # ``nn.functional.softmax(attn_weights, dim=-1)``; BERT, Falcon likewise).
    attn_softmax_fp32: bool = True
    # Eager attention drops out the softmax output before casting it back to the compute dtype
    # (modeling_bert.py ``eager_attention_forward``); False: cast first (GPT-2 ``.type(value.dtype)``,
    # Llama ``.to(query.dtype)``).
    attn_dropout_before_cast: bool = False
    # Attention logit soft-capping ``tanh(scores / cap) * cap`` (modeling_gemma2.py, config
    # ``attn_logit_softcapping``): tanh saves its output. None: no capping.
    attn_logit_softcap: float | None = None
    # LM-head logit soft-capping ``tanh(logits / cap) * cap`` (modeling_gemma2.py, config
    # ``final_logit_softcapping``): tanh saves its T x V output. None: no capping.
    final_logit_softcap: float | None = None
    # RMSNorm computed as ``(x.float() * rsqrt(...)) * (1 + weight.float())`` and cast after, so the
    # normalised x saved for backward is fp32 (modeling_gemma*.py ``GemmaRMSNorm``); False: LlamaRMSNorm
    # casts the normalised x to the input dtype before the weight multiply.
    rmsnorm_normed_fp32: bool = False
    # LayerNorm run on an fp32 upcast and cast back (modeling_olmo.py ``OlmoLayerNorm``:
    # ``F.layer_norm(hidden_states.to(torch.float32), ...).to(orig_dtype)``): it saves the fp32 copy.
    layernorm_fp32: bool = False
    # ``apply_rotary_pos_emb`` ends in ``torch.cat([rotated, pass-through], dim=-1)`` (modeling_phi3.py,
    # modeling_gpt_neox.py: partial rotary), so q and k come out contiguous in [b, heads, s, d]; SDPA's
    # output takes q's layout (``empty_like(query)``), and ``attn_output.transpose(1, 2).contiguous()``
    # (integrations/sdpa_attention.py) copies it for o_proj. False: q, k keep the projection's layout.
    rope_concat: bool = False
    # Post-norm blocks (modeling_bert.py ``BertLayer``): the block's input feeds attention directly and
    # the norms follow each residual sum; False: pre-norm blocks.
    post_norm: bool = False
    # A norm over the last hidden state before the head (``model.norm``); post-norm encoders have none.
    final_norm: bool = True
    # A LayerNorm over the summed embeddings (modeling_bert.py ``BertEmbeddings.LayerNorm``).
    embedding_norm: bool = False
    # Leaf modules that are transformers' ``Conv1D`` (weight stored ``in x out``; pytorch_utils.py),
    # not ``nn.Linear`` (``out x in``): GPT-2's c_attn, c_proj, c_fc.
    conv1d_modules: tuple[str, ...] = ()
    buffers: tuple[Tensor, ...] = field(default=())  # persistent/non-persistent buffers (e.g. RoPE inv_freq)
    notes: tuple[str, ...] = field(default=())  # what peakmem.hf assumed, echoed in estimates
    # The hash of the config a derived spec was built from (peakmem.block_costs.config_hash); "" for
    # specs of the formulas (peakmem.hf). Its blocks' measured costs are looked up under it.
    derived_from: str = ""
    # Derived specs: the buffers' bytes as transformers stores them (a bool causal-mask buffer is one
    # byte per element); 0: every buffer fp32 (formulas/model_states.py ``buffer_bytes``).
    derived_buffer_bytes: int = 0
    # Derived specs of vision-language (and audio) models: the encoders beside the language model.
    towers: tuple[Tower, ...] = field(default=())
    # Derived specs with a recurrent state: the dtype the checkpoint's config asks the serving engines
    # to keep the SSM / delta-rule state in (config ``mamba_ssm_dtype``, e.g. Qwen3.5's "float32"; read
    # by SGLang and by vLLM's Qwen3.5 hook: formulas/recurrent_state.py); None: the config says nothing.
    mamba_ssm_dtype: str | None = None

    def __post_init__(self) -> None:
        require(self.vocab_size > 0, "vocab_size", self.vocab_size, "must be positive")
        require(self.mamba_ssm_dtype is None or self.mamba_ssm_dtype in STATE_DTYPES, "mamba_ssm_dtype",
                self.mamba_ssm_dtype, "must be float32, bfloat16 or float16")  # fmt: skip
        require(self.hidden_size > 0, "hidden_size", self.hidden_size, "must be positive")
        require(bool(self.groups), "num_hidden_layers", 0, "must be positive")
        for g in self.groups:
            require(g.count > 0, "num_hidden_layers", g.count, "must be positive")

    # --- sizes -------------------------------------------------------------------------------
    @property
    def num_layers(self) -> int:
        return sum(g.count for g in self.groups)

    def layers(self) -> Iterator[Layer]:
        """Each layer in order (a group of n yields its layer n times)."""
        for g in self.groups:
            for _ in range(g.count):
                yield g.layer

    def tensors(self) -> Iterator[tuple[Tensor, int]]:
        """Every parameter tensor with how many times it occurs (layers of a group share one)."""
        for t in self.outer:
            yield t, 1
        for g in self.groups:
            for t in g.layer.tensors:
                yield t, g.count

    @cached_property  # a frozen spec never changes; planners read it thousands of times
    def params(self) -> int:
        """Exactly ``sum(p.numel() for p in model.parameters())`` in transformers."""
        return sum(t.numel * n for t, n in self.tensors())

    def params_by_component(self) -> dict[Component, int]:
        out: dict[Component, int] = {}
        for t, n in self.tensors():
            out[t.component] = out.get(t.component, 0) + t.numel * n
        return {c: out[c] for c in COMPONENTS if c in out}

    @property
    def active_params(self) -> int:
        """Parameters used per token: MoE layers count ``experts_per_token`` routed experts."""
        total = 0
        for t, n in self.tensors():
            total += t.numel * n
        for g in self.groups:
            mlp = g.layer.mlp
            if not mlp.is_moe:
                continue
            expert = sum(t.numel for t in g.layer.tensors if t.component == "experts")
            total -= g.count * expert * (mlp.num_experts - mlp.experts_per_token) // mlp.num_experts
        return total

    @property
    def buffer_numel(self) -> int:
        return sum(t.numel for t in self.buffers)

    @property
    def is_moe(self) -> bool:
        return any(g.layer.mlp.is_moe for g in self.groups)

    @property
    def first_layer(self) -> Layer:
        return self.groups[0].layer

    def tower_of(self, layer: Layer) -> Tower | None:
        """The tower whose block ``layer`` is (its key, or an edge block's key with a suffix: FIRST_BLOCK,
        LAST_BLOCK); None for the language model's layers."""
        key = layer.derived.key if layer.derived is not None else ""
        for tower in self.towers:
            if any(key == k or key.startswith(k + ":") for k in tower.block_keys):
                return tower
        return None

    def tower_params(self, tower: Tower) -> int:
        """The parameters of ``tower``: its layers' and the outer tensors under its module path."""
        inner = sum(t.numel * g.count for g in self.groups if self.tower_of(g.layer) is tower
                    for t in g.layer.tensors)  # fmt: skip
        return inner + sum(t.numel for t in self.outer if t.name.startswith(tower.prefix + "."))

    @property
    def language_groups(self) -> tuple[LayerGroup, ...]:
        """The layer groups of the language model: every group outside the towers."""
        return tuple(g for g in self.groups if self.tower_of(g.layer) is None)

    @property
    def head_in_features(self) -> int:
        """Width of the tensor the LM head (or classifier) reads."""
        for t in self.outer:
            if t.component in ("head", "classifier") and t.kind == "linear_weight":
                return t.shape[1]
        return self.hidden_size


# --- a derived spec's measured block costs, as the formulas read them -----------------------------------
# Under LoRA/QLoRA nothing before the first adapter requires grad (frozen embeddings), so the model's first
# block saves less than the others (its first norm keeps nothing for backward): measured on that block
# itself, its costs are kept under its key plus this suffix (formulas/lora split_first_layer puts the
# first layer in a group of its own with that key; costs without it fall back to the key's)
FIRST_BLOCK = ":first"
# The model's last block runs its backward first, with every other block's activations alive (where the
# backward usually peaks), and its output feeds the final norm or a classifier's pooler instead of a block:
# its gradient arrives, and its saved output is released, differently (BERT's pooler: the incoming gradient
# lives through the top block's backward, 32 kB more at its peak on the tiny config). Measured on that block
# itself, under its key plus this suffix (:func:`split_last_block`), where it differs from the others.
LAST_BLOCK = ":last"


def split_last_block(spec: ModelSpec) -> ModelSpec:
    """A derived spec with its last layer in a group of its own, keyed :data:`LAST_BLOCK` (its own
    measured costs; the block-cost store falls back to the key's); other specs unchanged."""
    last = spec.groups[-1] if spec.groups else None
    info = last.layer.derived if last is not None else None
    if not spec.derived_from or last is None or info is None:
        return spec
    layer = dataclasses.replace(last.layer, derived=dataclasses.replace(info, key=info.key + LAST_BLOCK))
    tail: tuple[LayerGroup, ...] = (dataclasses.replace(last, count=1, layer=layer),)
    if last.count > 1:
        tail = (dataclasses.replace(last, count=last.count - 1), *tail)
    return dataclasses.replace(spec, groups=(*spec.groups[:-1], *tail))


class BlockCostAt(Protocol):
    """A derived block's measured bytes at one shape (:class:`peakmem.block_costs.CostAt`)."""

    @property
    def saved(self) -> int: ...
    @property
    def forward_transient(self) -> int: ...
    @property
    def backward_transient(self) -> int: ...
    @property
    def freed(self) -> int: ...
    @property
    def grads_in_flight(self) -> int: ...
    @property
    def output_kept(self) -> int | None: ...


class BlockCosts(Protocol):
    """A derived block kind's measured costs in one setup family (:class:`peakmem.block_costs.BlockCost`)."""

    def at(self, batch: int, seq: int, grad_bytes: int = 0) -> BlockCostAt: ...


# (derived spec, setup family, DerivedBlock.key) -> that block's costs, or None where the family's costs
# hold no such block; an error where the family has none. The estimator's caller hands one in
# (:func:`peakmem.block_costs.stored_lookup` reads the shipped files and the disk cache;
# :func:`peakmem.simulate.measuring_lookup` measures what is missing): formulas never look costs up.
CostLookup = Callable[[ModelSpec, str, str], BlockCosts | None]
