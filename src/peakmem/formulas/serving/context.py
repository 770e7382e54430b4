"""What every serving engine's model shares: the resolved request (context, prompt, compute and
KV-cache dtypes), and the pieces of a breakdown built from it (weights on a tensor-parallel rank,
KV cache, recurrent state, CUDA context)."""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from peakmem.breakdown import BandTerm, Category, MemoryItem
from peakmem.errors import InputError, require
from peakmem.formulas.kv_cache import cache_kind, kv_cache_bytes, layer_kv_bytes
from peakmem.formulas.overhead import CONTEXT_SIZES
from peakmem.formulas.overhead import DEFAULT_CONTEXT as DEFAULT_CONTEXT_SIZE
from peakmem.formulas.recurrent_state import HybridBlock, StateBytes, engine_state, vllm_hybrid_block
from peakmem.formulas.weights import WeightRow
from peakmem.inference import KV_BITS, Engine, InferenceSetup, KvDtype
from peakmem.model import ModelSpec
from peakmem.serving_layout import ServingLayout
from peakmem.weight_formats import Scheme

# CUDA context (formulas/overhead.py, the training side's table: 512 MiB with CUDA 12 lazy loading).
CUDA_CONTEXT_BYTES = CONTEXT_SIZES[DEFAULT_CONTEXT_SIZE].bytes
CUDA_CONTEXT_SOURCE = "formulas/overhead.py " + DEFAULT_CONTEXT_SIZE


# SGLang takes mem_fraction_static of the memory free once CUDA and the process groups are up, not of
# the GPU: ModelRunner.init_torch_distributed returns get_available_gpu_memory (torch.cuda.mem_get_info
# after empty_cache) as min_per_gpu_memory, and profile_max_num_token sizes the pool as the memory free
# after the weights load less min_per_gpu_memory x (1 - mem_fraction_static) (python/sglang/srt/
# model_executor/model_runner.py, read in sglang 0.4.3 and 0.5.6). What is free then is the GPU less the
# CUDA context (the context's kernels loaded later, NCCL buffers at tp > 1 are not counted here).
def fraction_base(engine: Engine, gpu_bytes: int) -> int:
    """The memory a pooled engine's fraction is taken of on a GPU of ``gpu_bytes`` (torch's total): vLLM's
    gpu_memory_utilization of all of it, SGLang's mem_fraction_static of what the CUDA context leaves."""
    if engine is Engine.SGLANG:
        return max(0, gpu_bytes - CUDA_CONTEXT_BYTES)
    return gpu_bytes


# Default context when neither the user nor the engine fixes one: llama.cpp common.h n_ctx = 4096;
# transformers has no limit, so we use the same. vLLM/SGLang default max_model_len = the model's.
DEFAULT_CONTEXT = 4096


@dataclass(frozen=True, kw_only=True)
class ServingContext:
    """Resolved inputs shared by the engine models."""

    spec: ModelSpec
    setup: InferenceSetup
    context: int
    prompt: int
    act_bytes: int  # bytes per activation element (compute dtype)
    compute_dtype: str  # its name: bf16, fp16 or fp32
    kv_bits: Fraction
    kv_name: str
    latent: bool
    assumptions: tuple[str, ...]


def _compute_dtype(setup: InferenceSetup) -> tuple[str, int]:
    fmt = setup.weight_format
    if fmt.scheme is Scheme.FLOAT:
        return fmt.float_dtype, 4 if fmt.float_dtype == "fp32" else 2
    if fmt.scheme is Scheme.BNB_INT8 and setup.engine is Engine.LITGPT:
        # lightning fabric BitsandbytesPrecision: "'int8' only works with dtype=torch.float16" (@71aed751)
        return "fp16", 2
    if fmt.scheme in (Scheme.GPTQ, Scheme.AWQ, Scheme.GGUF):
        return "fp16", 2  # AutoAWQ / auto-gptq run in fp16; llama.cpp CUDA kernels use f16/f32
    return "bf16", 2


def resolve_context(spec: ModelSpec, setup: InferenceSetup) -> ServingContext:
    notes: list[str] = []
    limit = spec.max_position_embeddings
    if setup.context is not None:
        context = setup.context
    elif setup.engine in (Engine.VLLM, Engine.SGLANG):
        context = limit
        notes.append(f"context = the model's limit {limit} (max_model_len default)")
    else:
        context = min(limit, DEFAULT_CONTEXT)
        notes.append(f"context = {context} tokens (default)")
    if context > limit:
        msg = f"context={context}: beyond the model's limit max_position_embeddings={limit}"
        if setup.strict:
            raise InputError(msg)
        notes.append(f"warning: {msg}; quality degrades unless RoPE scaling extends it")
    prompt = setup.prompt if setup.prompt is not None else context
    prompt = min(prompt, context)
    dtype_name, act_bytes = _compute_dtype(setup)
    kv = setup.kv_cache
    if kv is KvDtype.AUTO:
        kv = KvDtype.FP16 if setup.engine is Engine.LLAMACPP else KvDtype(dtype_name)
    latent = setup.mla_cache != "expanded"
    kind = cache_kind(spec, latent=latent)
    if kind != "standard":
        if setup.mla_cache == "auto" and setup.engine is Engine.HF:
            notes.append(
                "MLA cache: transformers 5.x caches the latent (modeling_deepseek_v3.py updates the cache "
                "with kv_nope, k_rot); transformers 4.x cached expanded K/V: mla_cache='expanded'"
            )
        notes.append(f"MLA cache kind: {kind}")
    if any(g.layer.attention.sliding_window for g in spec.groups) and setup.engine is not Engine.LLAMACPP:
        notes.append("sliding-window layers keep at most their window of tokens")
    if setup.kv_cache in (KvDtype.INT8, KvDtype.INT4) and setup.engine is Engine.HF:
        notes.append(
            "quantized KV cache: the residual_length (128) newest tokens of QuantizedCache stay 16-bit"
        )
    # the heads of the layers that attend (a derived hybrid's SSM / linear-attention blocks carry a
    # placeholder attention of one head and a 0-token window: Qwen3-Next's first layer is one)
    attending = [g.layer.attention for g in spec.groups if g.layer.attention.caches_tokens]
    heads = (attending[0] if attending else spec.first_layer.attention).num_heads
    if heads % setup.tp:
        raise InputError(f"tp={setup.tp}: must divide num_attention_heads={heads}")
    return ServingContext(
        spec=spec,
        setup=setup,
        context=context,
        prompt=prompt,
        act_bytes=act_bytes,
        compute_dtype=dtype_name,
        kv_bits=KV_BITS[kv],
        kv_name=kv.value,
        latent=latent,
        assumptions=tuple(notes),
    )


def check_layout(spec: ModelSpec, layout: ServingLayout) -> None:
    """What a layout needs of the model: at most one pipeline stage per layer (vLLM ``get_pp_indices``
    gives each stage at least one), experts for ``ep`` and an even split of them (an uneven one is
    not modelled), attention heads that the attention ranks divide."""
    layers = spec.num_layers
    require(layout.pp <= layers, "pp", layout.pp, f"must not exceed num_hidden_layers={layers}")
    experts = max((g.layer.mlp.num_experts for g in spec.groups), default=0)
    if layout.ep > 1:
        require(experts > 0, "ep", layout.ep, f"expert parallelism needs a MoE model, not {spec.name}")
        require(experts % layout.ep == 0, "ep", layout.ep, f"must divide the {experts} experts")
    heads = spec.first_layer.attention.num_heads
    ranks = layout.attention_tp
    require(heads % ranks == 0, "dp", layout.dp,
            f"tp / dp = {ranks} attention ranks must divide num_attention_heads={heads}")  # fmt: skip


def _shard(nbytes: int, tp: int) -> int:
    return -(-nbytes // tp)


# MLA's down-projections run whole on every tensor-parallel rank of the serving engines: vLLM
# model_executor/models/deepseek_v2.py DeepseekV2MLAAttention (q_a_proj and kv_a_proj_with_mqa
# ReplicatedLinear, or fused_qkv_a_proj MergedColumnParallelLinear(disable_tp=True); read in 0.13.0 and
# 0.18.0), SGLang models/deepseek_v2.py (fused_qkv_a_proj_with_mqa = ReplicatedLinear). DeepSeek-V3 at TP 8:
# 0.75 GiB more a rank than an even split.
MLA_REPLICATED_MODULES = frozenset({"q_a_proj", "kv_a_proj_with_mqa"})
REPLICATING_ENGINES = (Engine.VLLM, Engine.SGLANG)


def sharded_weight_bytes(
    rows: tuple[WeightRow, ...], tp: int, layout: ServingLayout | None = None, *, mla_replicated: bool = False
) -> int:
    """Weights on one tensor-parallel rank: linears, embeddings, head and experts split ``tp`` ways
    (Megatron-style column/row parallel, vocab-parallel embedding); norms and routers replicated, and
    with ``mla_replicated`` (vLLM, SGLang) MLA's down-projections (:data:`MLA_REPLICATED_MODULES`).
    ``layout``: the deployment's (peakmem.serving_layout): attention split ``attention_tp`` ways, the
    token embedding ``embedding_tp``, experts ``expert_ways``."""
    total = 0
    for r in rows:
        replicated = r.component in ("norms", "router") or "norm" in r.name
        if mla_replicated and r.component == "attention":
            replicated |= _module(r.name) in MLA_REPLICATED_MODULES
        ways = 1 if replicated else _ways(r, tp, layout)
        total += r.bytes if ways == 1 else _shard(r.bytes, ways)
    return total


def _module(name: str) -> str:
    """The module of a parameter's name ("self_attn.q_a_proj.weight" -> "q_a_proj")."""
    parts = name.split(".")
    return parts[-2] if len(parts) > 1 else name


def mla_absorbed_bytes(c: ServingContext) -> int:
    """vLLM's MLA keeps ``W_UK`` / ``W_UV`` as views of a compute-dtype copy of ``kv_b_proj`` when its
    weight is quantized (layers/attention/mla_attention.py ``process_weights_after_loading``:
    ``get_and_maybe_dequant_weights(self.kv_b_proj, out_dtype=act_dtype)``, which returns the 16-bit weight
    itself when unquantized; read in 0.18.0), and keeps ``kv_b_proj`` for prefill: kv_lora_rank x the rank's
    heads x (qk_nope + v_head) elements a layer. 0 for other engines and 16-bit weights."""
    if c.setup.engine is not Engine.VLLM or not c.setup.weight_format.is_quantized:
        return 0
    total = 0
    for g in c.spec.groups:
        att = g.layer.attention
        if att.is_mla:
            heads = -(-att.num_heads // c.setup.layout.attention_tp)
            nope = att.head_dim - att.qk_rope_head_dim
            total += g.count * att.kv_lora_rank * heads * (nope + att.v_head_dim) * c.act_bytes
    return total


def _ways(row: WeightRow, tp: int, layout: ServingLayout | None) -> int:
    if layout is None:
        return tp
    if row.component == "experts":
        return layout.expert_ways
    if row.component == "attention":
        return layout.attention_tp
    if row.component == "embeddings":
        return layout.embedding_tp
    return tp


def cache_bytes(c: ServingContext, tokens: int, batch: int, block: int = 1) -> int:
    """KV cache of ``batch`` sequences of ``tokens`` tokens on one rank, in ``block``-token pages."""
    return kv_cache_bytes(
        c.spec,
        tokens=tokens,
        batch=batch,
        bits=c.kv_bits,
        latent=c.latent,
        tp=c.setup.layout.attention_tp,
        block_size=block,
    )


def largest_layer_kv(c: ServingContext, tokens: int, batch: int) -> int:
    """The largest one layer's KV cache (what ``torch.cat`` copies when the cache grows)."""
    return max(
        layer_kv_bytes(
            g.layer.attention,
            tokens=tokens,
            batch=batch,
            bits=c.kv_bits,
            latent=c.latent,
            tp=c.setup.layout.attention_tp,
        )
        for g in c.spec.groups
    )


def _vllm_spec_tokens(c: ServingContext) -> int:
    """vLLM's num_speculative_tokens when a draft is set (0 otherwise, and for other engines)."""
    s = c.setup
    return (s.num_speculative_tokens or 0) if s.engine is Engine.VLLM and s.draft is not None else 0


def serving_state(c: ServingContext) -> StateBytes:
    """One sequence's recurrent state on one rank as ``c``'s engine allocates it
    (formulas/recurrent_state.py ``engine_state``: transformers' cache for HF; vLLM's, SGLang's and
    llama.cpp's own shapes and dtypes, with the user's ``ssm_cache_dtype`` / ``conv_cache_dtype``);
    vLLM's conv window grows by the speculative tokens."""
    s = c.setup
    return engine_state(
        c.spec, s.engine, act_bytes=c.act_bytes, tp=s.layout.attention_tp, spec_tokens=_vllm_spec_tokens(c),
        ssm_dtype=s.ssm_cache_dtype, conv_dtype=s.conv_cache_dtype,
    )  # fmt: skip


def attention_token_bytes(c: ServingContext) -> int:
    """One attention layer's KV bytes per token on one rank (vLLM's ``FullAttentionSpec(block_size=1)``
    page): the largest over the layers that cache tokens."""
    return max(
        (
            layer_kv_bytes(
                g.layer.attention,
                tokens=1,
                batch=1,
                bits=c.kv_bits,
                latent=c.latent,
                tp=c.setup.layout.attention_tp,
            )
            for g in c.spec.groups
            if g.layer.attention.caches_tokens
        ),
        default=0,
    )


def hybrid_block(c: ServingContext) -> HybridBlock | None:
    """vLLM's pages for a model with a recurrent state (formulas/recurrent_state.py ``vllm_hybrid_block``:
    the attention block raised to hold one layer's state, each state padded to a page); None for other
    engines and for models without one."""
    if c.setup.engine is not Engine.VLLM:
        return None
    state = serving_state(c)
    if not state.total:
        return None
    return vllm_hybrid_block(
        state,
        attention_token_bytes=attention_token_bytes(c),
        block_size=c.setup.effective_block_size,
        spec_blocks=_vllm_spec_tokens(c),
    )


def state_per_sequence(c: ServingContext) -> int:
    """One sequence's recurrent state on one rank as the engine holds it: vLLM's padded pages, else
    :func:`serving_state`."""
    block = hybrid_block(c)
    return block.state_per_sequence if block is not None else serving_state(c).total


_HF_STATE_SOURCE = "formulas/recurrent_state.py; transformers cache_utils.py LinearAttentionLayer"
_STATE_SOURCES = {
    Engine.VLLM: "formulas/recurrent_state.py; vllm mamba_utils.py MambaStateShapeCalculator, config.py "
    "HybridAttentionMambaModelConfig (padded pages)",
    Engine.SGLANG: "formulas/recurrent_state.py; sglang configs/mamba_utils.py Mamba2StateShape, "
    "mamba2_state_dtype (MambaPool)",
    Engine.LLAMACPP: "formulas/recurrent_state.py; llama.cpp llama-hparams.cpp n_embd_r / n_embd_s, "
    "llama-memory-recurrent.cpp (fp32 cells)",
}


def state_items(c: ServingContext, batch: int) -> list[MemoryItem]:
    """The recurrent state of SSM / linear-attention blocks for ``batch`` sequences, as its own item
    (none for models without such blocks): constant per sequence, whatever the context."""
    nbytes = batch * state_per_sequence(c)
    if not nbytes:
        return []
    return [
        MemoryItem(
            path=f"recurrent state (SSM / linear attention, {batch} sequences)",
            category=Category.KV_CACHE,
            bytes=nbytes,
            source=_STATE_SOURCES.get(c.setup.engine, _HF_STATE_SOURCE),
        )
    ]


@dataclass(frozen=True, kw_only=True)
class EngineMemory:
    """One engine's model of a request: the items at prefill and at decode, what sits above allocated."""

    prefill: list[MemoryItem]
    decode: list[MemoryItem]
    overhead: list[MemoryItem]  # above allocated: CUDA context, engine reserve
    extra: dict[str, object]
    notes: tuple[str, ...] = ()
    band_terms: tuple[BandTerm, ...] = ()  # the engine's own unknowns (CUDA graphs' spread)
    load: list[MemoryItem] | None = None  # the model load, where it holds more than its weights (Lit-GPT)
    # transformers generate: the prefill's and decode steps' requests above 1 MiB replayed through the
    # caching-allocator model, their peak reserved (formulas/serving/cache_growth.py; 0: not replayed)
    replayed_reserved: int = 0


WEIGHTS_ITEM_PREFIX = "weights ("  # the path of the model's own weights item (its format follows)


def weights_item(c: ServingContext, rows: tuple[WeightRow, ...]) -> MemoryItem:
    fmt = c.setup.weight_format
    return MemoryItem(
        path=f"{WEIGHTS_ITEM_PREFIX}{fmt.name})",
        category=Category.PARAMETERS,
        bytes=sharded_weight_bytes(
            rows, c.setup.tp, c.setup.layout, mla_replicated=c.setup.engine in REPLICATING_ENGINES
        ),
        source="formulas/weights.py",
    )
