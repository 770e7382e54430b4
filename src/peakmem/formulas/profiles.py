"""Framework profiles: the same architecture saves different tensors in different model code.

* ``Framework.HF`` - transformers 5.23 model code and ``ForCausalLMLoss``.
* ``Framework.TORCHTUNE`` - torchtune's own modules (torchtune/modules/rms_norm.py,
  torchtune/modules/attention.py, torchtune/modules/transformer.py):
  - ``RMSNorm.forward``: ``x_fp32 = x.float(); x_normed = x_fp32 * rsqrt(...); (x_normed *
    scale).type_as(x)`` - the product with the fp32 ``scale`` keeps ``x_normed`` in fp32
    (4 B instead of transformers' 16-bit y);
  - ``MultiHeadAttention``: for GQA, k and v are expanded to all heads
    (``k.unsqueeze(2).expand(...).flatten(1, 2)``) before SDPA, so SDPA saves full-head k, v (with one
    kv head the flatten is a view: nothing is copied);
  - ``TransformerDecoder``: ``output = self.output(h).float()`` and the recipe's
    ``CEWithChunkedOutputLoss``/``CrossEntropyLoss`` on fp32 logits; the recipe deletes the
    logits before ``loss.backward()``;
  - ``RotaryPositionalEmbeddings`` (and ``Llama3ScaledRoPE``) keep cos and sin for every position up
    to the builder's ``max_seq_len`` in an fp32 buffer (:func:`rope_cache_bytes`).
* ``Framework.UNSLOTH`` - transformers models patched by unsloth (unslothai/unsloth):
  - ``use_gradient_checkpointing="unsloth"`` (models/_utils.py ``Unsloth_Offloaded_Gradient_Checkpointer``:
    ``saved_hidden_states = hidden_states.to("cpu", non_blocking=True)`` in forward, moved back and the
    layer recomputed in backward): under full checkpointing the layer inputs live in CPU RAM, only the
    working layer's on the device - modelled as checkpointing + activation offloading;
  - kernels/cross_entropy_loss.py ``Fast_CrossEntropyLoss``: the Triton kernel reads the 16-bit logits,
    saves them with the fp32 logsumexp and writes dlogits in place (no fp32 copy, no log-softmax);
  - kernels/rms_layernorm.py ``Fast_RMS_Layernorm`` (saves X, W, r): as Liger's RMSNorm;
    kernels/fast_lora.py ``LoRA_MLP`` saves X, gate and up (e, g) and recomputes their SwiGLU product.
* ``Framework.LITGPT_2023`` - Lit-GPT's own model code, read at Lightning-AI/litgpt@8641822b3249 (2023-10-16,
  the release its resource tables were measured with) and run on CPU (its modules, tiny Llama-like configs
  h 256, 4 heads, 2 layers, seq 64, batch 1-2, MHA and 2 kv heads, LoRA r8 on query+value or q, k, v with
  dropout 0.05, bf16, AdamW; step 2 under peakmem's storage tracker: the estimate's forward and backward
  peaks within 1.1 %, where the HF profile was up to 9 % high):
  - lit_gpt/rmsnorm.py ``RMSNorm.forward`` (l. 17-21): ``norm_x = torch.mean(x * x, ...)``; ``x_normed = x *
    torch.rsqrt(norm_x + eps)``; ``self.weight * x_normed`` - all in the input dtype: it saves its 16-bit
    input and a 16-bit rstd, not transformers' fp32 ``x.float()``;
  - lit_gpt/model.py ``CausalSelfAttention.forward`` (l. 196-227): one ``attn`` Linear makes q, k, v; k and
    v are views of its output (``qkv.view(...).permute(...).split(...)``; with grouped queries ``k.expand
    (...)`` then ``reshape`` copies k, v to all heads, l. 208-215); ``apply_rope`` (l. 339-345) and
    ``torch.cat((q_roped, q[..., rope_n_elem:]))`` (l. 219-220) make fresh q and k; SDPA saves them and v,
    which keeps the whole qkv output alive where v is a view;
  - lit_gpt/lora.py ``LoRAQKVLinear.forward`` (l. 372-386): one dropout and one ``lora_A`` for all the
    enabled q/k/v parts (r x parts rows), ``conv1d`` with ``lora_B``, then ``zero_pad`` (l. 290-296) when
    not all of q, k, v are enabled: ``index_copy`` of the B output into a zeros qkv-shaped tensor, whose
    backward (derivatives.yaml ``index_copy``: ``grad.index_select(dim, index).expand_as(source)``) saves
    that B output (tokens x enabled widths) and the int64 index;
  - lit_gpt/lora.py ``GPT.forward`` (l. 500-502, ``lm_head_chunk_size=128`` from finetune/lora.py l. 216)
    and lit_gpt/utils.py ``chunked_cross_entropy`` (l. 256-262): the 16-bit logits in 128-token chunks,
    cross_entropy per chunk in their dtype; finetune/lora.py keeps the list (``logits``) through
    ``fabric.backward``, so every chunk's logits stay alive in backward;
  - finetune/lora.py's loop never deletes ``logits`` or ``loss``: the previous micro-batch's logits live
    until the next forward returns, and its graph's nodes (with bitsandbytes < 0.43.2, every 4-bit Linear's
    input in ``ctx.tensors``) until the next loss is bound, through the optimizer step between them
    (:mod:`peakmem.formulas.loop_held`). HF Trainer (``training_step`` returns ``loss.detach()``),
    torchtune (``del logits``) and unsloth (HF's Trainer) keep nothing into the next micro-batch.
* ``Framework.LITGPT`` - LitGPT as released from the package rename (2024-03) on, read at litgpt@5895df1
  (2024-03/04, the config-hub table's commit), f247be8 (2024-07) and 00af8b0 (2024-09), identical in what
  follows; the same as 2023 except:
  - litgpt/model.py ``RMSNorm.forward``: ``x = x.float()``; ``x * x``, ``x * torch.rsqrt(...)``;
    ``x_normed.to(dtype=dtype)`` times ``self.weight`` (Gemma: ``(1 + self.weight)``): it saves the fp32
    upcast (4 B) and an fp32 rstd, as transformers' LlamaRMSNorm does, where 2023's rmsnorm.py kept its
    16-bit input (on the CPU below: 3.6 % of a tiny LoRA step's forward peak); the weight side stays in
    the input dtype, Gemma's too (transformers' GemmaRMSNorm multiplies in fp32). At HEAD (2026) the
    weight multiplies in fp32 (``(x_normed * weight.float()).to(dtype)``): a trainable norm's weight side
    is fp32 there (full fine-tuning only; not modelled);
  - ``CausalSelfAttention.forward``: ``k.expand``/``v.expand`` whenever ``n_query_groups != n_head`` in
    training, MQA included (2023 skipped it for one kv head): with one kv head the reshape is a stride-0
    view, ``apply_rope`` broadcasts it into a fresh all-heads k, and v stays a view of the fused output;
  - ``GPT.max_seq_length``'s setter (called by finetune/*.py ``fit`` with the longest sample, at most
    ``train.max_seq_length``) rebuilds ``cos``/``sin`` as fp32 buffers ``[max_seq_length, rope_n_elem]``
    (``build_rope_cache``: ``torch.outer(seq_idx, theta).repeat(1, 2)``); the forward slices them
    (``self.cos[:T]``): no per-forward copy (2023 alike: its rebuild ran outside the bf16 init context);
  - finetune/full.py (both eras): ``logits = model(input_ids)`` is the base GPT's whole-sequence head (only
    the adapter scripts pass ``lm_head_chunk_size=128``) and ``chunked_cross_entropy(logits[..., :-1, :],
    ...)`` reshapes the shifted slice: a copy when the batch has more than one row, a view for one; the
    128-row chunks of the loss keep every chunk's 16-bit log-softmax output as the whole one does.
  Measured on CPU: litgpt@5895df1's model.py, lora.py and utils.py (chunked_cross_entropy) run as
  finetune/lora.py and full.py do (bf16 model, ``model.max_seq_length = T``, AdamW foreach, logits and loss
  never deleted, 2 steps of 2 micro-batches; step 2 under peakmem's storage tracker, ``kernels="cpu"``), six
  tiny configs (h 256, 4 heads, 2 layers, seq 64, vocab 512: LoRA q+v MHA batch 2; LoRA on everything and
  the head, 2 kv heads; the same on a Gemma-like MQA; full fine-tuning 2 kv heads batch 2, MHA batch 1,
  Gemma-like MQA batch 2): the forward, backward and optimizer peaks within -1.8 .. +0.1 % (the 2023
  profile: -5.5 .. -0.2 %); what is left is the block's Python locals (``x_normed``, ``attention_output``)
  alive through its MLP, which the in-model forward peak does not count (2023 alike).
* HF Trainer + peft (axolotl, LLaMA-Factory, TRL's SFTTrainer) run transformers' model code:
  ``Framework.HF``. Their Liger option (``use_liger_kernel`` / ``liger_kernel``) is
  ``TrainingSetup.liger``; ``torch_compile`` is ``TrainingSetup.compiled``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any

from peakmem import dtypes
from peakmem.adapters import QuantConfig, quant_of
from peakmem.model import ModelSpec, linear
from peakmem.training import (
    LITGPT_FRAMEWORKS,
    Checkpointing,
    Framework,
    Method,
    PaddedLengths,
    TrainingSetup,
)
from peakmem.transformers_versions import release_facts as transformers_release
from peakmem.transformers_versions import sdpa_repeats_kv


@dataclass(frozen=True, kw_only=True)
class Profile:
    name: str
    rmsnorm_normed_fp32: bool  # RMSNorm keeps the normalised x in fp32 (torchtune)
    sdpa_repeats_kv: bool  # GQA k/v expanded to all heads before SDPA
    source: str
    # Triton RMSNorm / SwiGLU kernels (unsloth; Liger with ``TrainingSetup.liger``): see
    # peakmem.formulas.activations.fused_rmsnorm_saved / fused_swiglu_item
    fused_kernels: bool = False
    fused_mlp_saves: int = 3  # T x I tensors a fused gated MLP keeps (unsloth's LoRA_MLP: gate, up)
    # full checkpointing keeps each layer's input in CPU RAM, not on the device (unsloth
    # ``use_gradient_checkpointing="unsloth"``)
    offloaded_checkpointing: bool = False
    # the loss saves the 16-bit logits + fp32 logsumexp and writes their gradient in place
    # (peakmem.formulas.loss.in_place_ce)
    in_place_ce: bool = False
    # RMSNorm computes in the input dtype: saves its 16-bit input and rstd, no fp32 upcast (Lit-GPT 2023)
    rmsnorm_in_input_dtype: bool = False
    # the framework's own RMSNorm multiplies its weight in the input dtype whatever the checkpoint's
    # transformers class does (Lit-GPT's Gemma: ``x_normed.to(dtype) * (1 + weight)``)
    rmsnorm_weight_in_input_dtype: bool = False
    # with one kv head, k is expanded to every head before RoPE, which makes a fresh all-heads k (LitGPT 2024)
    mqa_rope_expands_k: bool = False
    # the rotary embedding ends in a torch.cat that makes q contiguous per head ([B, H, T, D]); CUDA's flash
    # kernel then writes its output in that layout (flash_api.cpp mha_fwd: ``out = at::empty_like(q)`` of the
    # transposed q keeps its strides), so the output's transpose to [B, T, H * D] for the projection is a copy
    # (Lit-GPT model.py ``apply_rope`` + ``torch.cat``, ``y.reshape(B, T, ...)``; ModelSpec.rope_concat alike)
    rope_cat: bool = False
    # cos/sin are fp32 buffers [seq, rotary dim] rebuilt at the training length and sliced per forward
    # (Lit-GPT ``GPT.max_seq_length``); :func:`rope_cache_bytes`
    rope_cache_at_seq: bool = False
    # q, k, v come from one fused Linear whatever the checkpoint's layout (Lit-GPT ``attn``): with RoPE, SDPA
    # keeps the fused output alive through the v view next to the rotated q, k (activations/attention.py)
    fused_qkv: bool = False
    # LoRA on the fused q, k, v: one dropout and lora_A for the adapted parts; the zero pad that places
    # the B output in the qkv layout saves that output and its index when not all three are adapted
    # (peakmem.formulas.lora.deltas.fused_qkv_adapter)
    fused_qkv_lora: bool = False
    # the lm_head runs in chunks of this many positions per sequence and the loop keeps the list of 16-bit
    # logits chunks through backward (0: one logits tensor, dropped before backward); adapter methods only:
    # Lit-GPT's finetune/full.py runs the whole head (:func:`head_chunk`)
    lm_head_chunk: int = 0
    # RoPE keeps a [max positions, rotary dim / 2, (cos, sin)] fp32 cache buffer (torchtune)
    rope_cache: bool = False
    # the training loop keeps the micro-batch's logits and loss bound until the next micro-batch rebinds
    # them: they (and what the graph's nodes hold) live through the step and the next forward (Lit-GPT;
    # peakmem.formulas.loop_held)
    loop_keeps_output: bool = False
    # the loop runs the data's longest sample as its first micro-batch, then random samples each padded to its
    # own length (Lit-GPT@8641822b finetune/lora.py, full.py, adapter.py ``get_batch(fabric, train_data,
    # longest_seq_ix if iter_num == 0 else None)``: 'force the longest sample at the beginning so potential
    # OOMs happen right away'; litgpt 2024 draws its batches from a shuffled DataLoader): with
    # --padded-lengths varying nothing of an earlier micro-batch is alive at the longest one
    # (peakmem.formulas.padded_lengths ``first_is_longest``)
    longest_first: bool = False
    # QLoRA's bitsandbytes base as Lightning Fabric's BitsandbytesPrecision builds it: every torch.nn.Linear,
    # the lm_head included, quantized from fp16 (QuantConfig.quantize_head, state_dtype; formulas/qlora.py
    # SRC_FABRIC_BNB, formulas/quant_head.py)
    fabric_bnb: bool = False
    # the model itself returns fp32 logits (torchtune TransformerDecoder ``self.output(h).float()``, eager
    # outside the compiled layers): a compiled loss reads and keeps them in fp32 (lowbit_optim.compiled_ce)
    logits_fp32_in_model: bool = False
    # the step's batches carry padding, so transformers hands SDPA a mask (:func:`profile_of`): a boolean one
    # that SDPA makes additive at each call, or (``float_padding_mask``, before 4.53) one additive mask in the
    # model's dtype that every layer is handed
    padding_mask: bool = False
    float_padding_mask: bool = False
    # transformers' sdpa_attention_forward calls ``repeat_kv`` whatever the mask (before 4.54.0:
    # peakmem.transformers_versions.sdpa_repeats_kv); SDPA calls only, not flash-attn's
    sdpa_call_repeats_kv: bool = False
    # the framework's own attention module calls SDPA, not the checkpoint's transformers class: no mask in
    # training (``is_causal``) and its own k/v heads (activations/kernels.py sdpa_call_heads), whatever the
    # transformers class passes (``ModelSpec.sdpa_kv``, ``sdpa_mask``: Falcon's materialised mask and one
    # k/v head). Lit-GPT's ``CausalSelfAttention`` (litgpt/model.py@5895df1 l. 215-261, GPT.forward
    # ``mask = None`` without a KV cache)
    own_attention: bool = False


# finetune/lora.py@8641822b l. 216: ``model(input_ids, lm_head_chunk_size=128)``
LITGPT_LM_HEAD_CHUNK = 128

PROFILES: dict[Framework, Profile] = {
    Framework.HF: Profile(
        name="hf", rmsnorm_normed_fp32=False, sdpa_repeats_kv=False,
        source="transformers 5.23 modeling_*.py, integrations/sdpa_attention.py (enable_gqa)",
    ),
    Framework.TORCHTUNE: Profile(
        name="torchtune", rmsnorm_normed_fp32=True, sdpa_repeats_kv=True, rope_cache=True,
        logits_fp32_in_model=True,
        source="torchtune modules/rms_norm.py, modules/attention.py, modules/transformer.py",
    ),
    Framework.UNSLOTH: Profile(
        name="unsloth", rmsnorm_normed_fp32=False, sdpa_repeats_kv=False, fused_kernels=True,
        fused_mlp_saves=2, offloaded_checkpointing=True, in_place_ce=True,
        source=(
            "unsloth models/_utils.py Unsloth_Offloaded_Gradient_Checkpointer (layer inputs to CPU), kernels/"
            "cross_entropy_loss.py Fast_CrossEntropyLoss, kernels/rms_layernorm.py, kernels/fast_lora.py"
        ),
    ),
    Framework.LITGPT: Profile(
        name="litgpt", rmsnorm_normed_fp32=False, sdpa_repeats_kv=True, rmsnorm_weight_in_input_dtype=True,
        mqa_rope_expands_k=True, rope_cache_at_seq=True, fused_qkv=True, fused_qkv_lora=True,
        lm_head_chunk=LITGPT_LM_HEAD_CHUNK, loop_keeps_output=True, fabric_bnb=True, rope_cat=True,
        own_attention=True,
        source=(
            "litgpt@5895df1 (= f247be8, 00af8b0) litgpt/model.py (RMSNorm on x.float(), fused attn Linear, "
            "k/v expand, apply_rope + cat, fp32 cos/sin at max_seq_length), litgpt/lora.py (LoRAQKVLinear, "
            "zero_pad), litgpt/utils.py chunked_cross_entropy, finetune/lora.py and full.py loops"
        ),
    ),
}  # fmt: skip
# Lit-GPT@8641822b (2023) as the 2024 code but for its RMSNorm (16-bit input and rstd saved) and MQA's k
# (rotated before any expand): the resource tables' runs (benchmarks/published_scale.json litgpt-lora-*)
PROFILES[Framework.LITGPT_2023] = replace(
    PROFILES[Framework.LITGPT],
    name="litgpt-2023",
    rmsnorm_in_input_dtype=True,
    mqa_rope_expands_k=False,
    longest_first=True,
    source="Lit-GPT@8641822b lit_gpt/model.py (fused attn Linear, apply_rope + cat), lit_gpt/rmsnorm.py, "
    "lit_gpt/lora.py (LoRAQKVLinear, zero_pad), lit_gpt/utils.py chunked_cross_entropy, finetune/lora.py's "
    "loop (logits and loss kept into the next micro-batch; the longest sample first, get_batch)",
)


# The model types Liger patches: linkedin/Liger-Kernel src/liger_kernel/transformers/monkey_patch.py
# ``MODEL_TYPE_TO_APPLY_LIGER_FN`` (commit ead96b6, 2026-08-21). For any other type
# ``_apply_liger_kernel`` logs that it applies nothing (HF Trainer ``use_liger_kernel`` included).
LIGER_MODEL_TYPES = frozenset({
    "deepseek_v4", "gemma", "gemma2", "gemma3_text", "gemma3", "gemma4_text", "gemma4", "glm4", "glm4v",
    "glm4v_moe", "gpt_oss", "internvl", "llama", "llama4_text", "llama4", "llava", "granite", "mllama",
    "mllama_text_model", "ministral", "mistral", "mixtral", "nemotron", "olmo2", "pixtral", "olmo3", "qwen2",
    "qwen3", "qwen3_moe", "qwen2_vl", "qwen2_vl_text", "qwen2_5_vl", "qwen2_5_vl_text", "qwen3_next",
    "qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text", "qwen3_vl", "qwen3_vl_text", "qwen3_vl_moe",
    "qwen3_vl_moe_text", "smollm3", "phi3", "paligemma", "falcon_h1", "smolvlm", "hunyuan_v1_dense",
    "hunyuan_v1_moe", "exaone4",
})  # fmt: skip


def liger_applies(model_type: str) -> bool:
    """Whether Liger patches this model type (:data:`LIGER_MODEL_TYPES`)."""
    return model_type in LIGER_MODEL_TYPES


# cos and sin: torchtune modules/position_embeddings.py build_rope_cache ``torch.stack([cos, sin], dim=-1)``
ROPE_CACHE_TRIG = 2
SRC_ROPE_CACHE = (
    "torchtune modules/position_embeddings.py RotaryPositionalEmbeddings.build_rope_cache: cos, sin of "
    "max_seq_len x head_dim/2 angles, fp32, one module shared by every layer (bd2a0fc7c)"
)


def rope_cache_bytes(spec: ModelSpec, setup: TrainingSetup) -> int:
    """The RoPE cache torchtune's model keeps on the device (``rope_cache`` profiles; Lit-GPT's at the
    training length, ``rope_cache_at_seq``; 0 otherwise).

    torchtune (bd2a0fc7c ``modules/position_embeddings.py``; ``models/llama3_1/_position_embeddings.py``
    ``Llama3ScaledRoPE`` alike) builds ``idx_theta = einsum(positions, theta).float()`` for positions
    ``0 .. max_seq_len - 1`` and registers ``torch.stack([cos, sin], dim=-1)``, a
    ``[max_seq_len, head_dim // 2, 2]`` fp32 non-persistent buffer. Its builders set ``max_seq_len`` to
    the checkpoint's context (``llama2_7b`` 4096, ``llama3_1_8b`` 131072: the HF config's
    ``max_position_embeddings``) and pass ONE rope module to every layer (``models/llama2/
    _component_builders.py``: ``rope = RotaryPositionalEmbeddings(...)`` before ``for _ in
    range(num_layers)``): one cache. The llama2 builder before 23896c30d (2025-01-27) deep-copied one
    template layer into every layer (``modules/transformer.py`` ``_get_clones``; ff594c231, 2024-04-15):
    one cache per layer, not modelled (benchmarks/published_scale.json ``torchtune-tutorial-lora-*``).
    """
    prof = PROFILES[setup.framework]
    if not (prof.rope_cache or prof.rope_cache_at_seq) or spec.position != "rope":
        return 0
    att = spec.first_layer.attention
    rotary = att.qk_rope_head_dim or att.head_dim
    if prof.rope_cache_at_seq:
        # Lit-GPT model.py build_rope_cache: cos and sin, each [max_seq_length, rope_n_elem] fp32 (the
        # half-angles repeated twice), max_seq_length = the training length (finetune/*.py fit)
        return dtypes.FP32.nbytes(setup.seq_len * rotary * ROPE_CACHE_TRIG)
    return dtypes.FP32.nbytes(spec.max_position_embeddings * (rotary // 2) * ROPE_CACHE_TRIG)


# Lit-GPT's model code (litgpt@5895df1 and lit_gpt@8641822b model.py) has no dropout module (SDPA runs with
# dropout_p=0.0) and runs GELU as torch's fused ``F.gelu(x, approximate=config.gelu_approximate)``
# (GptNeoxMLP, GemmaMLP; config.py: phi-2, Gemma and others set gelu_approximate="tanh"), where
# transformers' "gelu_new" / "gelu_fast" are Python formulas (activations.py NewGELUActivation,
# FastGELUActivation) whose autograd saves every intermediate, and its configs' dropouts (phi-2's
# resid_pdrop 0.1) save masks. A derived model's blocks are measured on transformers' modules built
# from this config under --framework litgpt (measured: phi-2 LoRA at 4 x 512, bf16, 32 layers: 13.87 GB
# of activations on the Hub config, 9.51 GB on this one, both with the adapters fp32 as the fake step then
# left them; in the base dtype, simulate/fakeify.py adapters_to_base_dtype: 7.76 GB on this one). Checked on
# CPU against litgpt@5895df1's own model.py/lora.py/utils.py run as finetune/lora.py runs them (a phi-2-like
# config: h 320, 4 heads of 80, rotary 0.4, 2 layers, LoRA r8 on every Linear and the head, dropout 0.05,
# batch 2 x 64, bf16, AdamW, 2 micro-batches a step; step 2 under peakmem's storage tracker): the forward,
# backward and optimizer peaks +1.7, +1.0, +0.3 %. Not modelled: peft's three q/k/v LoRA dropouts (two more
# outputs and CUDA bool masks: 6 B a token and hidden unit) against Lit-GPT's one for its fused attn Linear,
# whose output the v view keeps beyond v (4 B): the derived block keeps 2 B a token and hidden unit a layer
# more than Lit-GPT's (0.31 GiB for phi-2 at 4 x 512).
LITGPT_CODE = "litgpt"
_TANH_GELUS = frozenset({"gelu_new", "gelu_fast", "gelu_pytorch_tanh"})
_ACTIVATION_KEYS = ("hidden_act", "hidden_activation", "activation_function")


def derived_code(setup: TrainingSetup) -> str:
    """The model code a derived spec's blocks are measured on (:func:`code_config`): "" for
    transformers' own."""
    return LITGPT_CODE if setup.framework in LITGPT_FRAMEWORKS else ""


def code_config(config: Mapping[str, Any], code: str) -> dict[str, Any]:
    """``config`` as ``code``'s model runs it: for Lit-GPT every dropout probability 0 and a tanh-GELU
    as torch's fused one ("gelu_pytorch_tanh"); ``config`` itself for transformers' code ("")."""
    if code != LITGPT_CODE:
        return dict(config)
    out = {k: 0.0 if _is_dropout(k, v) else v for k, v in config.items()}
    for key in _ACTIVATION_KEYS:
        if out.get(key) in _TANH_GELUS:
            out[key] = "gelu_pytorch_tanh"
    return out


# Lit-GPT's ``GPT`` builds its own head, ``self.lm_head = nn.Linear(config.n_embd, config.padded_vocab_size,
# ...)`` (litgpt/model.py@5895df1 l. 25, f247be8 and 00af8b0 alike, HEAD l. 28), and nothing in model.py ties
# it to ``transformer.wte``; scripts/convert_hf_checkpoint.py copies the embedding into ``lm_head.weight``
# when the Hub checkpoint has none (``state_dict["lm_head.weight"] = state_dict["transformer.wte.weight"]``,
# 5895df1 l. 176-177, f247be8 l. 206-207, 00af8b0 l. 281-282), and ``load_state_dict`` copies it into the
# model's own parameter. Only pretrain.py ties them (``if train.tie_embeddings``); finetune/lora.py's
# validate_args refuses tie_embeddings. (The 2023 lit_gpt@8641822b listed no tied model.)
SRC_LITGPT_UNTIED = (
    "Lit-GPT runs a tied model untied: its GPT builds its own lm_head and convert_hf_checkpoint.py copies "
    "the embedding into it (litgpt/model.py@5895df1 l. 25; scripts/convert_hf_checkpoint.py l. 176-177): a "
    "second vocab x hidden weight"
)


def code_spec(spec: ModelSpec, setup: TrainingSetup) -> ModelSpec:
    """``spec`` as ``setup``'s framework's model code holds it: Lit-GPT unties a tied head
    (:func:`litgpt_spec`); ``spec`` itself otherwise."""
    return litgpt_spec(spec) if setup.framework in LITGPT_FRAMEWORKS else spec


def litgpt_spec(spec: ModelSpec) -> ModelSpec:
    """``spec`` as Lit-GPT's GPT holds it (its finetune and generate scripts): a tied head untied, a second
    vocab x hidden weight (:data:`SRC_LITGPT_UNTIED`)."""
    if not spec.tie_word_embeddings:
        return spec
    head = linear("lm_head", spec.hidden_size, spec.vocab_size, False, "head")
    return replace(spec, outer=(*spec.outer, *head), tie_word_embeddings=False,
                   notes=(*spec.notes, SRC_LITGPT_UNTIED))  # fmt: skip


def _is_dropout(key: str, value: Any) -> bool:
    return ("dropout" in key or "pdrop" in key) and isinstance(value, float) and value > 0


def head_chunk(setup: TrainingSetup) -> int:
    """Positions per sequence of one lm_head chunk in this setup's loop (0: the whole head at once): the
    profile's :attr:`Profile.lm_head_chunk` for adapter methods; Lit-GPT's finetune/full.py calls
    ``model(input_ids)`` without ``lm_head_chunk_size`` (8641822b and litgpt@5895df1 alike)."""
    if setup.method is Method.FULL:
        return 0
    return PROFILES[setup.framework].lm_head_chunk


# Lightning fabric/plugins/precision/bitsandbytes.py _Linear4bit.quantize: ``weight.to(dtype=torch.half)``
FABRIC_QUANT_STATE_DTYPE = "fp16"


def fabric_quant(quant: QuantConfig) -> QuantConfig:
    """``quant`` as Lightning Fabric's BitsandbytesPrecision applies it (:attr:`Profile.fabric_bnb`): the
    head quantized too, 4-bit weights quantized from fp16 (formulas/qlora.py SRC_FABRIC_BNB)."""
    if quant.quantize_head and quant.state_dtype is not None:
        return quant
    return replace(quant, quantize_head=True, state_dtype=FABRIC_QUANT_STATE_DTYPE if quant.is_4bit else None)


# the (release, padded) profiles kept: bounded, since the release is the user's text (the web face)
HF_PROFILES_KEPT = 64


def profile_of(setup: TrainingSetup) -> Profile:
    """``setup``'s framework profile as its release and batches run it. transformers (``Framework.HF``):
    SDPA copies GQA k/v to every head before 4.54.0 whatever the mask
    (:func:`peakmem.transformers_versions.sdpa_repeats_kv`), and a batch with padding
    (``--padded-lengths varying`` at micro-batch > 1: some row shorter than the longest) hands SDPA a mask,
    which from 4.54.0 on makes it repeat too (formulas/activations/kernels.py ``sdpa_call_heads``); fixed
    lengths (packed or full rows) leave the mask None (masking_utils ``_ignore_causal_mask_sdpa``). The other
    frameworks keep their own flags (torchtune and Lit-GPT pass no padding mask)."""
    padded = setup.padded_lengths is PaddedLengths.VARYING and setup.micro_batch > 1
    return (
        _hf_profile(setup.transformers, padded)
        if setup.framework is Framework.HF
        else PROFILES[setup.framework]
    )


@lru_cache(maxsize=HF_PROFILES_KEPT)
def _hf_profile(version: str, padded: bool) -> Profile:
    repeats = sdpa_repeats_kv(version, masked=False)
    if not (repeats or padded):
        return PROFILES[Framework.HF]
    float_mask = padded and not transformers_release(version).bool_padding_mask
    return replace(
        PROFILES[Framework.HF],
        sdpa_call_repeats_kv=repeats,
        padding_mask=padded,
        float_padding_mask=float_mask,
    )


def profile_setup(setup: TrainingSetup) -> TrainingSetup:
    """The setup as the framework runs it: unsloth's offloaded gradient checkpointing is full
    checkpointing with the layer inputs in CPU RAM (``activation_offload``); Lit-GPT's QLoRA base as
    Lightning Fabric quantizes it (:func:`fabric_quant`); ``setup`` itself otherwise (no copy: the planner
    calls this for every candidate)."""
    prof = PROFILES[setup.framework]
    if (
        setup.checkpointing is Checkpointing.FULL
        and not setup.activation_offload
        and prof.offloaded_checkpointing
    ):
        setup = replace(setup, activation_offload=True)
    quant = quant_of(setup)
    if prof.fabric_bnb and quant is not None and fabric_quant(quant) != quant:
        setup = replace(setup, quant=fabric_quant(quant))
    lora = setup.lora
    if prof.fused_qkv_lora and lora is not None and not lora.qkv_slices:
        setup = replace(setup, lora=replace(lora, qkv_slices=True))
    return setup


SRC_COMPILE_NOTE = (
    "torch.compile: each layer's saved tensors as Inductor's partitioner leaves them (measured on Llama "
    "layers, bf16/fp32/CPU amp-bf16: norms keep their rstd, the layer input stays, SwiGLU recomputes act; "
    "benchmarks/compile_activations.py)"
)


def profile_assumptions(setup: TrainingSetup) -> tuple[str, ...]:
    """What the framework options change, echoed in ``Estimate.assumptions``."""
    out = []
    prof = PROFILES[setup.framework]
    if setup.compiled:
        out.append(SRC_COMPILE_NOTE + "; LayerNorm/GELU models are estimated as eager")
    if setup.liger:
        out.append(
            "Liger kernels: RMSNorm saves its input + fp32 rstd, SwiGLU recomputes silu, RoPE in place; "
            "fused linear cross-entropy: no full logits, grads of the head computed in forward"
        )
    if prof.fused_kernels and not setup.liger:
        out.append("unsloth kernels: RMSNorm saves its input + fp32 rstd; the MLP saves gate and up only")
    if prof.offloaded_checkpointing and setup.checkpointing is Checkpointing.FULL:
        out.append("unsloth offloaded gradient checkpointing: layer inputs in CPU RAM, one on the device")
    if prof.in_place_ce and not setup.liger:
        out.append("unsloth cross-entropy: 16-bit logits + fp32 logsumexp kept, gradient written in place")
    if prof.rope_cache:
        out.append("buffers include the RoPE cache: " + SRC_ROPE_CACHE)
    return tuple(out)
