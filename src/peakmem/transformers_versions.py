"""What a transformers release does that changes the bytes of a training step, one row per change.

peakmem's formulas read transformers 5.23 (:data:`TRANSFORMERS_CURRENT`, the installed wheel);
``--transformers VERSION`` names the release a job ran, and :func:`release_facts` gives the row in force
for it. Read in the released wheels (``pip download transformers==V --no-deps``: 4.30.0, 4.31.0, 4.36.0,
4.45.0, 4.46.0, 4.48.1, 4.49.0, 4.50.0, 4.52.1, 4.53.0, 4.54.0, 4.57.1, 5.0.0):

* The causal-LM loss. 5.23 and 4.49.0 on (loss/loss_utils.py ``ForCausalLMLoss``, 4.49.0 l. 36-40):
  ``logits = logits.float()``, then the *labels* are shifted (``nn.functional.pad(labels, (0, 1))``): the
  fp32 logits go to ``cross_entropy`` as a view. 4.46.0-4.48.x (4.48.1 l. 36-39): ``logits.float()`` and
  ``shift_logits = logits[..., :-1, :].contiguous()``: a second fp32 copy of B x (S-1) x V, alive with the
  model's 16-bit logits (the model's forward still holds them: modeling_mistral.py 4.48.1 l. 848-852) and
  the fp32 upcast while ``log_softmax`` writes its output. 4.31.0-4.45.x: the model's forward itself does
  ``logits = logits.float()`` (llama 4.31.0 l. 825, 4.36.0 l. 1193; 4.45.0 l. 1219 under ``labels``), which
  rebinds the name, so the 16-bit logits are freed, then the same shifted ``.contiguous()`` copy and
  ``CrossEntropyLoss``. 4.30.0 (llama l. 701-706): no upcast: the shifted copy and the cross-entropy in the
  logits' dtype. In backward the shifted copy adds nothing beyond the cross-entropy's two gradients (its
  ``SliceBackward`` zero-fills a B x S x V fp32 gradient after ``log_softmax``'s saved output is freed).
  With B = 1 the slice is contiguous and ``.contiguous()`` copies nothing (formulas/loss.py
  ``transformers_head``; measured with 4.46.3 on the CPU, benchmarks/msswift_cpu_run.py).
* MoE experts. Before 5.0.0 the MoE blocks of :data:`EXPERT_LINEAR_MODEL_TYPES` hold one module per expert
  with ``nn.Linear`` projections (4.48.1 models/mixtral/modeling_mixtral.py l. 67-75
  ``MixtralBlockSparseTop2MLP``: ``w1``, ``w2``, ``w3``; l. 107 ``MixtralSparseMoeBlock.experts =
  nn.ModuleList``; the same at 4.57.1), which bitsandbytes replaces by ``Linear4bit`` / ``Linear8bitLt``
  like any other Linear; 5.0.0 fused them into 3-D parameters (``MixtralExperts.gate_up_proj =
  nn.Parameter(...)``, modeling_mixtral.py l. 63-71) that bitsandbytes leaves 16-bit. Architectures
  whose 4.x experts were already 3-D parameters (gpt_oss, llama4, dbrx, granitemoe, jetmoe,
  qwen3_vl_moe) are not in the set.
* The MXFP4 checkpoint's dequantization at load (gpt-oss, :mod:`peakmem.formulas.mxfp4_load`; wheels 4.55.0,
  4.56.0, 4.57.1, 5.0.0, 5.1.0, 5.2.0, 5.3.0, 5.6.0, 5.8.0, 5.10.0): ``integrations/mxfp4.py``
  ``convert_moe_packed_tensors`` makes the nibble indices int64 and both before gathering through 5.0.x
  (5.0.0 l. 261-262), int32 and one at a time, each deleted after its gather, from 5.1.0 (l. 253-258).
* gpt-oss's experts in training (:mod:`peakmem.formulas.moe_loop`; wheels 4.55.0, 4.56.0, 4.57.1, 5.0.0):
  before 5.0.0 ``GptOssExperts.forward`` loops over the hit experts and indexes the 3-D weights per expert,
  with a 1-element index tensor in 4.55.x (4.55.0 l. 101-105: copies) and with ``expert_idx[0]`` from 4.56.0
  (4.56.0 l. 108: a view); 5.0.0 runs ``grouped_mm`` by default (``get_correct_experts_implementation``).
* Gradient checkpointing. ``gradient_checkpointing_enable()`` without kwargs checkpoints each layer with
  reentrant ``torch.utils.checkpoint`` before 5.0.0 (4.48.1 / 4.57.1 modeling_utils.py
  ``gradient_checkpointing_kwargs = {"use_reentrant": True}``; 4.36.0 passes ``{}``, 4.30.0 calls
  ``torch.utils.checkpoint.checkpoint`` directly: torch's reentrant default) and non-reentrant from 5.0.0 on
  (5.0.0 l. 3099 ``{"use_reentrant": False}``; 5.23 the same). Under FSDP1 with frozen layer units this keeps
  every layer's input to the end of backward (:mod:`peakmem.formulas.fsdp1_frozen_inputs`).
* The HF Trainer's default optimizer. ``TrainingArguments.optim`` is ``adamw_torch_fused`` from 4.54.0
  where torch >= 2.8 (4.54.0 training_args.py l. 1286-1291); before it ``adamw_torch`` (4.48.1 l. 1273,
  4.50.0 l. 1301, 4.52.1 l. 1273, 4.53.0 l. 1281), which ``Trainer.get_optimizer_cls_and_kwargs`` builds as
  ``torch.optim.AdamW`` with ``fused=True`` only for ``adamw_torch_fused`` (4.48.1 trainer.py l. 1316-1322):
  neither foreach nor fused given, torch runs foreach on CUDA (:mod:`peakmem.defaults`).
* OPT's eager attention clamps the masked scores: 4.30.0 to 4.48.1 ``OPTAttention.forward`` (4.30.0
  modeling_opt.py l. 224-227, 4.48.1 l. 200-203) does ``attn_weights = attn_weights.view(...) +
  attention_mask`` then ``torch.max(attn_weights, torch.tensor(finfo.min))``, and ``maximum`` keeps both
  inputs for its backward: one B x heads x S x S tensor in the compute dtype per layer, beside the softmax's
  (measured: a saved-tensors hook on the two ops, torch 2.13 CPU); 4.49.0 (and 4.50.0) has no ``torch.max``
  in modeling_opt.py. XGLM keeps the same clamp in 4.49.0 (not modelled: not in the catalog).
* GQA k/v in the SDPA path (:func:`sdpa_repeats_kv`). Before 4.54.0 it copies k and v to every query head:
  4.48.1-4.53.0 ``integrations/sdpa_attention.py`` ``sdpa_attention_forward`` (4.53.0 l. 40-42) calls
  ``repeat_kv`` whenever the module has ``num_key_value_groups``, and before 4.48 each model's
  ``*SdpaAttention`` did the same (4.36.0 and 4.46.3 modeling_llama.py ``LlamaSdpaAttention.forward``,
  4.46.3 l. 584-585; 4.46.3 modeling_qwen2.py ``Qwen2SdpaAttention``); SDPA saves the expanded copies for
  backward. 4.54.0 (l. 27-33, 52-57)
  calls it only where ``use_gqa_in_sdpa`` fails, i.e. where the call passes a mask (torch >= 2.5; 4.57.1
  l. 30-45 alike on CUDA and CPU; 5.23 also needs equal k/v head sizes <= 256), else ``enable_gqa=True``.
  The mask is None for causal rows without padding (4.54.0 / 4.57.1 / 5.23 masking_utils.py
  ``_ignore_causal_mask_sdpa``: ``padding_mask is None or padding_mask.all()``), present for a batch with
  padding: 4.53.0 on a boolean B x 1 x S x S mask (``create_causal_mask``), which SDPA makes additive in the
  inputs' dtype at each call; before 4.53 ``_update_causal_mask`` (4.52.1 modeling_llama.py l. 483-) builds
  one additive mask in the model's dtype that every layer is handed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from peakmem.releases import Release, ReleaseTable

# The release peakmem's formulas read (the installed wheel).
TRANSFORMERS_CURRENT = "5.23.0"
Version = Release
# where the fp32 upcast of the logits happens: in the loss function (the model's 16-bit logits stay
# alive next to it), in the model's forward (``logits = logits.float()`` frees the 16-bit ones), or none
Upcast = Literal["loss", "model", "none"]

# transformers 4.57.1 models/<type>/modeling_<type>.py: ``self.experts = nn.ModuleList(...)`` of per-expert
# MLPs with nn.Linear projections (grep of the wheel); the causal LMs among them that peakmem reads
EXPERT_LINEAR_MODEL_TYPES = frozenset({
    "deepseek_v2", "deepseek_v3", "dots1", "ernie4_5_moe", "flex_olmo", "glm4_moe", "hunyuan_v1_moe",
    "jamba", "longcat_flash", "minimax", "mixtral", "olmoe", "phimoe", "qwen2_moe", "qwen3_moe",
    "qwen3_next",
})  # fmt: skip


# Of those, the ones whose 4.x training forward loops over the experts with ``torch.where`` on a one-hot mask
# and ``index_add_``s each expert's weighted rows (transformers 4.57.1 modeling_<type>.py, read 2026-12-06;
# 4.48.1 modeling_mixtral.py l. 112-150 alike; peakmem.formulas.activations.expert_loop). DeepSeek-V2 sorts
# the routed rows instead (``DeepseekV2Moe.moe``: argsort, per-expert slices, ``torch.cat``): not this loop.
INDEX_ADD_LOOP_MODEL_TYPES = EXPERT_LINEAR_MODEL_TYPES - {"deepseek_v2"}
# Of those, the loops that weight and accumulate in the router's fp32 (4.57.1 ``DeepseekV3MoE.moe``:
# ``final_hidden_states = torch.zeros_like(hidden_states, dtype=topk_weights.dtype)``, the topk weights from a
# float32 sigmoid router; dots1, glm4_moe and longcat_flash alike); the others cast the routing weights to the
# hidden states' dtype first (``routing_weights.to(hidden_states.dtype)``; PhiMoE's sparsemixer weights are
# the logits' dtype) and index_add_ ``current_hidden_states.to(hidden_states.dtype)``.
FP32_ROUTED_LOOP_MODEL_TYPES = frozenset({"deepseek_v3", "dots1", "glm4_moe", "longcat_flash"})


# transformers 4.30.0-4.48.1 models/opt/modeling_opt.py OPTAttention: torch.max(scores + mask, finfo.min)
SCORES_CLAMP_MODEL_TYPES = frozenset({"opt"})


@dataclass(frozen=True, kw_only=True)
class TransformersRelease:
    """What the releases from ``since`` on (until the previous row's) do, as far as a step's bytes go."""

    since: Version
    moe_expert_linears: bool  # MoE experts are per-expert nn.Linear modules (EXPERT_LINEAR_MODEL_TYPES)
    shifted_logits_copy: bool  # the loss makes a contiguous copy of logits[..., :-1, :]
    upcast: Upcast
    mxfp4_index_bytes: int  # bytes of one nibble index in the MXFP4 dequantization at load (int64 / int32)
    mxfp4_indices_together: bool  # idx_lo and idx_hi alive together (else one at a time)
    reentrant_checkpointing: bool  # gradient_checkpointing_enable() uses reentrant torch.utils.checkpoint
    clamps_scores: bool  # eager attention of SCORES_CLAMP_MODEL_TYPES: torch.max(scores + mask, finfo.min)
    # TrainingArguments' default optim is adamw_torch_fused (on torch >= 2.8), else adamw_torch (foreach)
    trainer_fused_adamw: bool
    # SDPA runs GQA k/v with ``enable_gqa`` where the call has no mask (``use_gqa_in_sdpa``), else repeat_kv
    sdpa_gqa_without_mask: bool
    # a padded batch's mask is masking_utils' boolean one (else an additive one in the model's dtype)
    bool_padding_mask: bool
    source: str


# Newest first: the first row whose ``since`` is at most the version asked is the one in force.
TRANSFORMERS_RELEASES: tuple[TransformersRelease, ...] = (
    TransformersRelease(
        since=(5, 1, 0), moe_expert_linears=False, shifted_logits_copy=False, upcast="loss",
        mxfp4_index_bytes=4, mxfp4_indices_together=False, reentrant_checkpointing=False,
        clamps_scores=False, trainer_fused_adamw=True, sdpa_gqa_without_mask=True,
        bool_padding_mask=True,
        source="transformers 5.1.0 integrations/mxfp4.py _convert_moe_packed_tensors l. 253-258: int32 "
        "nibble indices, each deleted after its gather",
    ),
    TransformersRelease(
        since=(5, 0, 0), moe_expert_linears=False, shifted_logits_copy=False, upcast="loss",
        mxfp4_index_bytes=8, mxfp4_indices_together=True, reentrant_checkpointing=False,
        clamps_scores=False, trainer_fused_adamw=True, sdpa_gqa_without_mask=True,
        bool_padding_mask=True,
        source="transformers 5.0.0 modeling_mixtral.py MixtralExperts (fused 3-D gate_up_proj / down_proj); "
        "loss_utils.py ForCausalLMLoss: logits.float(), labels padded; modeling_utils.py "
        "gradient_checkpointing_enable: use_reentrant False; integrations/mxfp4.py l. 261-262: int64 nibble "
        "indices, both made before the gathers",
    ),
    TransformersRelease(
        since=(4, 54, 0), moe_expert_linears=True, shifted_logits_copy=False, upcast="loss",
        mxfp4_index_bytes=8, mxfp4_indices_together=True, reentrant_checkpointing=True,
        clamps_scores=False, trainer_fused_adamw=True, sdpa_gqa_without_mask=True,
        bool_padding_mask=True,
        source="transformers 4.54.0 training_args.py l. 1286-1291: default_optim = 'adamw_torch_fused' where "
        "is_torch_greater_or_equal_than_2_8 (4.53.0 l. 1281: 'adamw_torch'); integrations/sdpa_attention.py "
        "l. 27-33, 52-57: repeat_kv only where use_gqa_in_sdpa fails (a mask), else enable_gqa; the rest as "
        "4.53.0",
    ),
    TransformersRelease(
        since=(4, 53, 0), moe_expert_linears=True, shifted_logits_copy=False, upcast="loss",
        mxfp4_index_bytes=8, mxfp4_indices_together=True, reentrant_checkpointing=True,
        clamps_scores=False, trainer_fused_adamw=False, sdpa_gqa_without_mask=False,
        bool_padding_mask=True,
        source="transformers 4.53.0 models/llama/modeling_llama.py l. 30, 419: masking_utils "
        "create_causal_mask (a boolean mask where the batch is padded; 4.52.1 _update_causal_mask: "
        "additive in the model's dtype); integrations/sdpa_attention.py l. 40-42: repeat_kv always; the rest "
        "as 4.49.0",
    ),
    TransformersRelease(
        since=(4, 49, 0), moe_expert_linears=True, shifted_logits_copy=False, upcast="loss",
        mxfp4_index_bytes=8, mxfp4_indices_together=True, reentrant_checkpointing=True,
        clamps_scores=False, trainer_fused_adamw=False, sdpa_gqa_without_mask=False,
        bool_padding_mask=False,
        source="transformers 4.49.0 loss_utils.py ForCausalLMLoss l. 36-40: logits.float(), "
        "nn.functional.pad(labels, (0, 1)); MoE experts nn.ModuleList of nn.Linear MLPs; "
        "gradient_checkpointing_enable: use_reentrant True (4.57.1 modeling_utils.py)",
    ),
    TransformersRelease(
        since=(4, 46, 0), moe_expert_linears=True, shifted_logits_copy=True, upcast="loss",
        mxfp4_index_bytes=8, mxfp4_indices_together=True, reentrant_checkpointing=True,
        clamps_scores=True, trainer_fused_adamw=False, sdpa_gqa_without_mask=False,
        bool_padding_mask=False,
        source="transformers 4.46.0-4.48.1 loss_utils.py ForCausalLMLoss l. 36-39: logits.float(); "
        "shift_logits = logits[..., :-1, :].contiguous() (an fp32 copy); 4.48.1 modeling_utils.py l. 2539 "
        "gradient_checkpointing_kwargs = {'use_reentrant': True}",
    ),
    TransformersRelease(
        since=(4, 31, 0), moe_expert_linears=True, shifted_logits_copy=True, upcast="model",
        mxfp4_index_bytes=8, mxfp4_indices_together=True, reentrant_checkpointing=True,
        clamps_scores=True, trainer_fused_adamw=False, sdpa_gqa_without_mask=False,
        bool_padding_mask=False,
        source="transformers 4.31.0-4.45 modeling_llama.py LlamaForCausalLM.forward: logits = logits.float() "
        "(the 16-bit logits freed), shift_logits = logits[..., :-1, :].contiguous(), CrossEntropyLoss",
    ),
    TransformersRelease(
        since=(0, 0, 0), moe_expert_linears=True, shifted_logits_copy=True, upcast="none",
        mxfp4_index_bytes=8, mxfp4_indices_together=True, reentrant_checkpointing=True,
        clamps_scores=True, trainer_fused_adamw=False, sdpa_gqa_without_mask=False,
        bool_padding_mask=False,
        source="transformers 4.30.0 modeling_llama.py l. 701-706: no upcast; shift_logits = "
        "logits[..., :-1, :].contiguous() and CrossEntropyLoss in the logits' dtype",
    ),
)  # fmt: skip


# ``transformers=`` as users type it (peakmem.releases: a leading v, dev / post / rc and +local tags) and the
# row in force for it
TABLE = ReleaseTable(
    field="transformers", example="4.48.1", current=TRANSFORMERS_CURRENT, rows=TRANSFORMERS_RELEASES
)
parse_transformers_version = TABLE.parse
release_facts = TABLE.facts


def experts_are_linears(version: str, model_type: str) -> bool:
    """Whether ``model_type``'s MoE experts are per-expert ``nn.Linear`` modules at ``version``."""
    return release_facts(version).moe_expert_linears and model_type in EXPERT_LINEAR_MODEL_TYPES


def experts_loop(version: str, model_type: str) -> bool:
    """Whether ``model_type``'s MoE block at ``version`` runs the 4.x ``index_add_`` loop over ``nn.Linear``
    experts (:data:`INDEX_ADD_LOOP_MODEL_TYPES`)."""
    return experts_are_linears(version, model_type) and model_type in INDEX_ADD_LOOP_MODEL_TYPES


def keeps_clamped_scores(version: str, model_type: str) -> bool:
    """Whether ``model_type``'s eager attention at ``version`` keeps the masked scores for ``torch.max``."""
    return release_facts(version).clamps_scores and model_type in SCORES_CLAMP_MODEL_TYPES


def sdpa_repeats_kv(version: str, masked: bool) -> bool:
    """Whether transformers' SDPA path at ``version`` copies GQA k/v to every query head (``repeat_kv``)
    for a call that passes a mask (``masked``) or not (module docstring): always before 4.54.0, only with a
    mask from 4.54.0 on. The k/v head-size condition of 5.x is :func:`peakmem.formulas.activations.kernels.
    sdpa_call_heads`'s."""
    return masked or not release_facts(version).sdpa_gqa_without_mask


# gpt-oss's training loop over its experts (module docstring): how 4.x indexes each expert's weights
ExpertLoop = Literal["index", "select"]
GPT_OSS_SELECT_SINCE = (4, 56, 0)  # 4.56.0 modeling_gpt_oss.py l. 108: ``expert_idx = expert_idx[0]``
GPT_OSS_GROUPED_MM_SINCE = (5, 0, 0)  # 5.0.0 modeling_utils.py: grouped_mm experts by default


def gpt_oss_expert_loop(version: str) -> ExpertLoop | None:
    """How gpt-oss's experts take their weights in training at ``version``: ``"index"`` (4.55.x: copies),
    ``"select"`` (4.56.0-4.57.x: views), None from 5.0.0 (``grouped_mm``, what peakmem measures)."""
    release = parse_transformers_version(version)
    if release >= GPT_OSS_GROUPED_MM_SINCE:
        return None
    return "select" if release >= GPT_OSS_SELECT_SINCE else "index"


__all__ = [
    "EXPERT_LINEAR_MODEL_TYPES",
    "FP32_ROUTED_LOOP_MODEL_TYPES",
    "INDEX_ADD_LOOP_MODEL_TYPES",
    "SCORES_CLAMP_MODEL_TYPES",
    "TRANSFORMERS_CURRENT",
    "TRANSFORMERS_RELEASES",
    "ExpertLoop",
    "TransformersRelease",
    "experts_are_linears",
    "experts_loop",
    "gpt_oss_expert_loop",
    "keeps_clamped_scores",
    "parse_transformers_version",
    "release_facts",
    "sdpa_repeats_kv",
]
