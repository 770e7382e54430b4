"""Recurrent state of SSM and linear-attention blocks at inference: constant per sequence.

A Mamba / Mamba-2 mixer (Jamba, Falcon-H1, Granite 4.0-H, Bamba, Nemotron-H, ...), a gated
delta-net (Qwen3-Next, Qwen3.5) or a short convolution (LFM2) keeps no per-token KV cache. It keeps,
per sequence and whatever the context, the last inputs of its causal convolution (``conv_states``)
and the recurrent state of its scan (``recurrent_states``: the SSM state ``heads x head_dim x
d_state``, or the delta-rule state ``v_heads x k_head_dim x v_head_dim``).

transformers allocates both lazily from the first prefill's tensors (``cache_utils.py``
``LinearAttentionLayer.lazy_initialization``): ``conv_kernel`` inputs per channel in the model's dtype,
the scan's state as its kernel returns it, fp32 (``torch_chunk_gated_delta_rule``, Mamba-2
``torch_forward``; the fla / mamba-ssm kernels return fp32 final states too). The element counts come
from that cache, measured once per derived spec (:class:`~peakmem.model.DerivedBlock`
``state_elements`` / ``state_fp32_elements`` / ``conv_kernel``).

The serving engines allocate the same two tensors with other shapes and dtypes (:func:`engine_state`):

* **vLLM** (``vllm/model_executor/layers/mamba/mamba_utils.py`` at 02d71083, ``MambaStateShapeCalculator``
  ``mamba1/mamba2/gated_delta_net/kda/short_conv_state_shape``): the conv state keeps ``conv_kernel - 1``
  inputs (``+ num_spec`` with speculative decoding, Mamba-2 / GDN / KDA); ``MambaStateDtypeCalculator
  ._mamba_state_dtype``: the conv state in ``mamba_cache_dtype`` ("auto" = the model dtype), the temporal
  (SSM / delta-rule) state in ``mamba_ssm_cache_dtype``, whose "auto" is the conv state's dtype - so the
  model dtype, not fp32 - unless a per-model hook sets it (``vllm/model_executor/models/config.py``
  ``MODELS_CONFIG_MAP`` on vLLM main of 2026, the copy with DeepseekV4 / Gemma4 entries, read without its
  commit: ``Qwen3_5ForConditionalGenerationConfig`` takes the config's ``mamba_ssm_dtype``;
  ``NemotronHForCausalLMConfig`` the config's ``mamba_ssm_cache_dtype``, else float32; at 1936cf38
  (late 2025) neither hook existed). The pool holds one state per running
  request per layer as a page of the hybrid KV-cache manager, padded to the attention page
  (:func:`vllm_hybrid_block`; the rule read at 1936cf38).
* **SGLang** (``python/sglang/srt/configs/mamba_utils.py`` at 02e208de, ``Mamba2StateShape.create``,
  ``mamba2_state_dtype``, ``BaseLinearStateParams.mamba_cache_per_req``): conv ``(conv_dim, conv_kernel -
  1)`` in bf16 (``SGLANG_MAMBA_CONV_DTYPE``, default bfloat16), the temporal state in fp32 unless the
  config's ``mamba_ssm_dtype`` or ``SGLANG_MAMBA_SSM_DTYPE`` / ``--mamba-ssm-dtype`` says otherwise; held in
  a pool of its own (formulas/serving/paged.py ``sglang_mamba_slots``).

* **llama.cpp** (``src/llama-hparams.cpp`` ``n_embd_r`` / ``n_embd_s``, ggml-org/llama.cpp master of 2026,
  read without its commit: "since the first column of the conv_state is shifted out each time, it's not
  actually needed": ``(ssm_d_conv - 1) x (d_inner + 2 x n_group x d_state)`` conv inputs and ``d_state x
  d_inner`` scan elements per layer; ``src/llama-model.cpp`` ``create_memory`` builds the
  ``llama_memory_recurrent`` / ``llama_memory_hybrid`` with ``recurrent_type_k`` / ``recurrent_type_v``
  ``GGML_TYPE_F32``): both states in fp32, one cell per sequence (``max(1, n_seq_max)``).

The user's flags (InferenceSetup ``ssm_cache_dtype`` / ``conv_cache_dtype``): vLLM
``--mamba-ssm-cache-dtype`` and ``--mamba-cache-dtype`` (``vllm/config/cache.py`` ``MambaDType``); the
per-model hooks set ``mamba_ssm_cache_dtype`` only while it is "auto"
(``NemotronHForCausalLMConfig.update_mamba_ssm_cache_dtype``), so the flag wins. SGLang
``--mamba-ssm-dtype`` (``server_args.py``, choices float32 / bfloat16 / float16,
default None) reaches ``mamba2_state_dtype`` as ``SGLANG_MAMBA_SSM_DTYPE``, which it ranks above the
config's ``mamba_ssm_dtype`` ("Priority (from highest to lowest): 1. Environment variable"); SGLang's conv
dtype is the environment's ``SGLANG_MAMBA_CONV_DTYPE``.

Tensor parallelism splits the state by heads (vLLM ``MambaMixer2`` shards conv and SSM state per
rank): ceiling division, the most loaded rank. The groups vLLM adds for ``n_groups % tp != 0``
(``extra_groups_for_head_shards``) are not modelled.
"""

from __future__ import annotations

from dataclasses import dataclass

from peakmem.errors import require
from peakmem.inference import Engine
from peakmem.model import ModelSpec

FP32_BYTES = 4
# bytes per element of the state dtypes the engines accept (vLLM MambaDType, SGLang's dtype_map)
STATE_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
# SGLang's conv state: ``SGLANG_MAMBA_CONV_DTYPE`` default bfloat16 (mamba_utils.py mamba2_state_dtype)
SGLANG_CONV_BYTES = 2
# llama.cpp's recurrent memory: recurrent_type_k / recurrent_type_v GGML_TYPE_F32 (llama-model.cpp)
LLAMACPP_STATE_BYTES = 4
# SGLang's temporal state without a config or flag: float32 (mamba2_state_dtype "Step 1: Default value")
SGLANG_DEFAULT_SSM_DTYPE = "float32"
# vLLM's per-model hooks on the temporal state's dtype (vllm/model_executor/models/config.py
# MODELS_CONFIG_MAP):
# the Qwen3.5 architectures take the config's ``mamba_ssm_dtype`` (Qwen3_5ForConditionalGenerationConfig)
VLLM_QWEN3_5_ARCHITECTURES = ("Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForConditionalGeneration")
# NemotronHForCausalLMConfig: the config's ``mamba_ssm_cache_dtype``, else DEFAULT_MAMBA_SSM_CACHE_DTYPE
# "float32" (float16 in the releases of late 2025); the config key is not read here: float32
VLLM_NEMOTRON_H_ARCHITECTURES = ("NemotronHForCausalLM", "NemotronHPuzzleForCausalLM")
VLLM_NEMOTRON_H_SSM_DTYPE = "float32"
# vllm/model_executor/models/config.py HybridAttentionMambaModelConfig: the attention block is a multiple
# of the kernel's alignment, 16 tokens (FlashAttention / FlashInfer; 32 on Blackwell with head size 256,
# 64 / 128 for MLA: not modelled)
VLLM_HYBRID_BLOCK_ALIGNMENT = 16


@dataclass(frozen=True, kw_only=True)
class StateBytes:
    """One sequence's recurrent state on one tensor-parallel rank, as one engine allocates it."""

    conv: int  # the conv states of every stateful layer
    temporal: int  # the SSM / delta-rule (scan) states of every stateful layer
    layers: int  # how many layers keep a state
    largest_layer: int  # the largest one layer's conv + temporal bytes (vLLM's MambaSpec page)
    conv_dtype_bytes: int = 0  # bytes per element of the conv state (0: not said)
    temporal_dtype_bytes: int = 0  # bytes per element of the scan state (0: not said)

    def __post_init__(self) -> None:
        for name in (
            "conv",
            "temporal",
            "layers",
            "largest_layer",
            "conv_dtype_bytes",
            "temporal_dtype_bytes",
        ):
            require(getattr(self, name) >= 0, name, getattr(self, name), "must be >= 0")

    @property
    def total(self) -> int:
        return self.conv + self.temporal


def state_dtype_bytes(name: str, *, field: str = "mamba_ssm_cache_dtype") -> int:
    """Bytes per element of a state dtype named as the engines name it."""
    require(name in STATE_DTYPE_BYTES, field, name, f"must be one of {', '.join(STATE_DTYPE_BYTES)}")
    return STATE_DTYPE_BYTES[name]


def conv_dtype_bytes(engine: Engine, *, act_bytes: int, conv_dtype: str | None = None) -> int:
    """Bytes per element of the conv state: ``conv_dtype`` when the user sets it (vLLM
    ``--mamba-cache-dtype``, SGLang ``SGLANG_MAMBA_CONV_DTYPE``), else vLLM's "auto" (the model dtype),
    SGLang's bf16, llama.cpp's fp32, transformers' compute dtype."""
    if conv_dtype is not None and conv_dtype != "auto":
        return state_dtype_bytes(conv_dtype, field="conv_cache_dtype")
    if engine is Engine.SGLANG:
        return SGLANG_CONV_BYTES
    if engine is Engine.LLAMACPP:
        return LLAMACPP_STATE_BYTES
    return act_bytes


def temporal_dtype_bytes(
    spec: ModelSpec,
    engine: Engine,
    *,
    act_bytes: int,
    ssm_dtype: str | None = None,
    conv_dtype: str | None = None,
) -> int:
    """Bytes per element of the SSM / delta-rule state: ``ssm_dtype`` when the user sets it (vLLM
    ``--mamba-ssm-cache-dtype``, SGLang ``--mamba-ssm-dtype``: both win over the model's), else the
    engine's default for the model (vLLM's "auto": the per-model hook's, else the conv state's dtype)."""
    if ssm_dtype is not None and ssm_dtype != "auto":
        return state_dtype_bytes(ssm_dtype)
    if engine is Engine.VLLM:
        if spec.architecture in VLLM_QWEN3_5_ARCHITECTURES and spec.mamba_ssm_dtype is not None:
            return STATE_DTYPE_BYTES[spec.mamba_ssm_dtype]
        if spec.architecture in VLLM_NEMOTRON_H_ARCHITECTURES:
            return STATE_DTYPE_BYTES[VLLM_NEMOTRON_H_SSM_DTYPE]
        # "auto": the conv state's dtype (--mamba-cache-dtype, itself "auto": the model's)
        return conv_dtype_bytes(engine, act_bytes=act_bytes, conv_dtype=conv_dtype)
    if engine is Engine.SGLANG:
        return STATE_DTYPE_BYTES[spec.mamba_ssm_dtype or SGLANG_DEFAULT_SSM_DTYPE]
    if engine is Engine.LLAMACPP:
        return LLAMACPP_STATE_BYTES
    return FP32_BYTES  # transformers: as the kernels return it


def engine_state(
    spec: ModelSpec,
    engine: Engine,
    *,
    act_bytes: int,
    tp: int = 1,
    ssm_dtype: str | None = None,
    conv_dtype: str | None = None,
    spec_tokens: int = 0,
) -> StateBytes:
    """One sequence's recurrent state as ``engine`` allocates it (see the module doc): the measured conv
    elements rescaled from transformers' ``conv_kernel`` inputs to the engine's window (``conv_kernel -
    1`` in vLLM, SGLang and llama.cpp), in :func:`conv_dtype_bytes`; the measured scan elements in
    :func:`temporal_dtype_bytes`. ``spec_tokens``: vLLM's ``num_speculative_tokens`` (the conv window grows by
    it). ``ssm_dtype`` / ``conv_dtype``: the user's flags ("auto" or None: the engine's default). HF keeps
    transformers' cache (``conv_kernel`` inputs in the compute dtype, the scan state in fp32)."""
    conv = temporal = layers = largest = 0
    shifted = engine is not Engine.HF  # the engines drop the conv input that is shifted out
    conv_bytes = conv_dtype_bytes(engine, act_bytes=act_bytes, conv_dtype=conv_dtype)
    temporal_bytes = temporal_dtype_bytes(
        spec, engine, act_bytes=act_bytes, ssm_dtype=ssm_dtype, conv_dtype=conv_dtype
    )
    for g in spec.groups:
        info = g.layer.derived
        if info is None or not (info.state_elements or info.state_fp32_elements):
            continue
        # conv_kernel 0: the model-dtype state is no conv window (MiniMax's lightning-attention
        # state: vLLM linear_attention_state_shape, in the model dtype) and is kept whole
        elements = info.state_elements
        if shifted and info.conv_kernel:
            window = info.conv_kernel - 1 + (spec_tokens if engine is Engine.VLLM else 0)
            elements = info.state_elements // info.conv_kernel * window
        layer_conv = -(-elements // tp) * conv_bytes
        layer_temporal = -(-info.state_fp32_elements // tp) * temporal_bytes
        conv += g.count * layer_conv
        temporal += g.count * layer_temporal
        layers += g.count
        largest = max(largest, layer_conv + layer_temporal)
    return StateBytes(conv=conv, temporal=temporal, layers=layers, largest_layer=largest,
                      conv_dtype_bytes=conv_bytes, temporal_dtype_bytes=temporal_bytes)  # fmt: skip


def state_bytes_per_sequence(spec: ModelSpec, *, act_bytes: int, tp: int = 1) -> int:
    """Bytes one sequence's recurrent state takes over all layers on one tensor-parallel rank in
    transformers' cache: ``state_elements`` at ``act_bytes`` (the compute dtype) plus
    ``state_fp32_elements`` at 4 bytes."""
    return engine_state(spec, Engine.HF, act_bytes=act_bytes, tp=tp).total


def recurrent_state_bytes(spec: ModelSpec, *, batch: int, act_bytes: int, tp: int = 1) -> int:
    """The recurrent state of ``batch`` sequences in transformers' cache (independent of their length)."""
    return batch * state_bytes_per_sequence(spec, act_bytes=act_bytes, tp=tp)


@dataclass(frozen=True, kw_only=True)
class HybridBlock:
    """vLLM's hybrid KV-cache pages (vllm/model_executor/models/config.py
    ``HybridAttentionMambaModelConfig.verify_and_update_config``, no prefix caching): the attention block
    raised to ``block`` tokens so that an attention page (``block x attention_token_bytes``, one layer)
    holds one layer's recurrent state (``mamba_page``), which is then padded to exactly that page."""

    block: int  # attention tokens per page
    mamba_page: int  # one layer's conv + temporal bytes, one sequence
    page: int  # the padded page: what each stateful layer holds per sequence
    state_per_sequence: int  # page x stateful layers x pages per layer (1 + speculative blocks)

    @property
    def padding_pct(self) -> float:
        """What vLLM logs: 'Padding mamba page size by X%'."""
        return 100 * (self.page - self.mamba_page) / self.mamba_page if self.mamba_page else 0.0


def vllm_hybrid_block(
    state: StateBytes, *, attention_token_bytes: int, block_size: int, spec_blocks: int = 0
) -> HybridBlock:
    """The pages of a hybrid model in vLLM V1: ``block = 16 x ceil(mamba_page / (16 x attention
    token bytes))`` when the asked ``block_size`` is smaller, every stateful layer's state padded to one
    attention page. A model without attention layers keeps its states unpadded (MambaSpec alone).
    ``spec_blocks``: MambaSpec ``num_speculative_blocks`` (= num_speculative_tokens): a request holds
    ``1 + spec_blocks`` pages per stateful layer (vllm/v1/kv_cache_interface.py
    ``MambaSpec.max_memory_usage_bytes``, mamba_cache_mode "none"; "align", prefix caching's, holds
    ``2 + spec_blocks``: not modelled)."""
    require(block_size > 0, "block_size", block_size, "must be positive")
    require(spec_blocks >= 0, "num_speculative_tokens", spec_blocks, "must be >= 0")
    pages = 1 + spec_blocks
    mamba_page = state.largest_layer
    if not attention_token_bytes or not mamba_page:
        return HybridBlock(block=block_size, mamba_page=mamba_page, page=mamba_page,
                           state_per_sequence=state.total * pages)  # fmt: skip
    align = VLLM_HYBRID_BLOCK_ALIGNMENT
    needed = align * -(-mamba_page // (align * attention_token_bytes))
    block = max(block_size, needed)
    page = block * attention_token_bytes
    return HybridBlock(
        block=block, mamba_page=mamba_page, page=page, state_per_sequence=page * state.layers * pages
    )


def has_recurrent_state(spec: ModelSpec) -> bool:
    """Whether a layer of ``spec`` keeps a recurrent (SSM / delta-rule / linear-attention) state: vLLM's
    ``ModelConfig.is_hybrid`` / ``is_attention_free`` models (a Mamba-style mixer in some or all layers)."""
    infos = (g.layer.derived for g in spec.groups)
    return any(i is not None and (i.state_elements or i.state_fp32_elements) for i in infos)
