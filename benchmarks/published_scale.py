"""peakmem against published GPU memory at scale (issue 27 part 6): fitting set and held-out set.

    .venv/bin/python benchmarks/published_scale.py [--json OUT.json] [--points FILE.json]

The points are in ``benchmarks/published_scale.json`` (facts only; its ``schema`` documents every
field and the split rule, decided 2026-12-05 before any estimate of them was computed: within each
kind of job, alternate by the SHA-256 of the id). This script maps each point's facts to the options
of peakmem's Python API (``peakmem.train`` / ``peakmem.infer``), compares the SAME quantity the
source measured and prints, for each set: id, kind, quantity, measured, estimate, error, inside the
band?, flags; then median |error|, how many within 10 %, band coverage, and how misses split between
low (estimate below the measurement, the OOM side) and high. A KV pool (``vllm_available_kv_cache``) is
what is left, not what is used: its sides are read in memory-use terms, so an estimate above the logged
pool (peakmem's non-KV memory below vLLM's) is a miss low, and its error counts on the low side when
positive (``_scale_bands.USE_INVERTED``). Points peakmem cannot be asked are listed
with the reason (from the file, or the error peakmem raised). It sets no formula, constant or band
term: the lead reads the held-out table.

The quantities (``measured.quantity``):

* ``peak_reserved``: torchtitan logs ``torch.cuda.memory_stats()['reserved_bytes.all.peak']`` (GiB) as
  "memory" (torchtitan@9dec370 ``torchtitan/metrics.py`` ``DeviceMemoryMonitor``); compared with
  ``peak_reserved_bytes`` and the band's ``reserved`` row.
* ``peak_allocated``: ``torch.cuda.max_memory_allocated()``; ``peak_allocated_bytes``, band ``allocated``.
* ``allocated_plus_external``: optimum's GPTQ benchmark (optimum@87fcf9f
  ``tests/benchmark/benchmark_gptq.py`` ``benchmark_memory``) reports torch's peak allocated plus
  (peak nvidia-smi - torch's peak reserved), in MB (1e6 B): the estimate is ``peak_allocated_bytes +
  (device_total_bytes - peak_reserved_bytes)``; its band adds the ``device_total`` terms (CUDA context,
  NCCL) to the ``allocated`` band.
* ``nvidia_smi``: ``device_total_bytes``, band ``device_total``.
* ``nvml_v1_used``: NVML's v1 ``nvmlDeviceGetMemoryInfo(handle).used`` (py3nvml): ``device_total_bytes`` plus
  the memory the driver and firmware set aside on the point's GPU (``peakmem.formulas.overhead``
  ``nvml_v1_used_bytes``; the catalog's ``driver_reserved_bytes``), band ``device_total`` shifted by it.
* ``vllm_non_kv``: vLLM's "Total non KV cache memory" (vllm/v1/worker/gpu_worker.py
  ``determine_available_memory``: the weights, the profile run's torch peak increase and its non-torch
  increase), what the engine subtracts from ``gpu_memory_utilization`` x the GPU to size its KV pool: the
  estimate is the same difference in peakmem (the verdict's ``memory_budget_bytes - kv_pool_bytes``), its
  band the formula residual on it and the range of what lies outside torch (:func:`_non_kv_band`).
* ``vllm_available_kv_cache``: vLLM's "Available KV cache memory" (or V1's "the rest of the memory reserved
  for KV Cache"), the pool itself, where the log prints no non-KV total: ``gpu_memory_utilization`` x
  torch's total less the non-KV memory. The estimate is the verdict's ``kv_pool_bytes`` on the catalog GPU,
  its band the budget less the non-KV band (:func:`_pool_band`). Decided 2026-12-07 (session 22) before any
  point of this quantity was estimated.
* ``sglang_kv_pool``: SGLang's "KV Cache is allocated" K size + V size (GiB), its token pool:
  mem_fraction_static of what is free once the CUDA context is up, less the weights. The estimate is the
  verdict's ``kv_pool_bytes``, its band ``_scale_bands.sglang_pool_band``; read in memory-use terms as
  vLLM's pool. Decided 2026-12-07 (session 24) before any SGLang point was estimated; the twentieth
  search's post-training and SGLang jobs become options in ``_scale_options.py``.

How the facts become options (the choices a reader should check; none is tuned to a point):

* ``job.precision_id`` says how the framework mixes precisions: ``autocast-fp16`` (Lightning
  ``precision=16`` with DDP: fp32 weights, autocast) -> ``amp-fp16``; ``deepspeed-fp16`` (DeepSpeed fp16:
  16-bit weights and gradients, fp32 master in the ZeRO optimizer) -> ``mixed-fp16``, with ``zero`` the
  stage and ``offload`` / ``offload_params`` as run; a model the run built from a ``GPT2Config``
  (``model_config``) is passed as a ``config.json`` written to a temporary folder.
* torchtitan's FSDP2 keeps fp32 sharded parameters with ``MixedPrecisionPolicy(param_dtype=bf16,
  reduce_dtype=fp32)`` and no autocast anywhere (torchtitan@9dec370: ``parallelize_llama.py``
  ``apply_fsdp``; ``train.py`` has no ``torch.autocast``): ``precision='mixed-bf16'`` (16-bit weights
  in compute, fp32 master and Adam states: the same 16 B/param sharded, and no autocast weight cache,
  which ``amp-bf16`` would add: 13 GiB on the 8B); with float8 Linears ``precision='float8-tensorwise'``
  (torchao's tensorwise recipe, torchtitan's default then), which peakmem prices on mixed-bf16 states;
  ``job.float8_fsdp_all_gather`` true (torchtitan's ``[float8] enable_fsdp_float8_all_gather``) ->
  ``float8_all_gather=True`` (the layer units gathered in float8), null or false -> off. Its reduce
  dtype is fp32 (torchtitan@9dec370 ``config_manager.py`` ``--training.mixed_precision_reduce`` default
  ``"float32"``, read by ``parallelize_llama.py`` ``apply_fsdp``; 238fa995 ``config/job_config.py``
  ``mixed_precision_reduce: Literal["float32"] = "float32"``): ``fsdp2-mp-bf16`` -> also
  ``fsdp_reduce_dtype='fp32'``, not the HF default (accelerate's param dtype).
* A training point whose ``gpu`` names a catalog GPU (its text before any parenthesis) -> ``gpu=`` that
  GPU, as a user would name it (2026-12-07, session 17): its cuBLAS workspace, what a load may reserve
  (peakmem.step_load: transformers' warm-up block and the CUDA allocator freeing its cache near the
  device's size) and, on a GPU before Ampere, the band's attention-kernel term.
* ``job.deepspeed_zero`` (the ``zero_optimization`` section a framework builds: Lightning 1.7's
  ``DeepSpeedStrategy`` sets 2e8-element buckets and ``sub_group_size=1e12``) is written to a DeepSpeed
  JSON and passed as ``from_file``, as ``peakmem train --from ds.json`` reads it.
* ``job.zero_grad_set_to_none`` false (a 2022 loop: Lightning 1.x calls ``optimizer.zero_grad()``, whose
  ``set_to_none`` was False before torch 2.0) -> ``keep_grads=True``: the zeroed gradients stay allocated
  through the next forward.
* ``fsdp='full-shard'``, ``fsdp_version=2``, ``gpus`` the world size, ``tp``/``pp``/``cp`` as stated;
  with TP ``sp=True``: torchtitan's TP plan always puts ``SequenceParallel`` on the norms, so the
  activations between blocks (what full checkpointing keeps) are sharded by the sequence
  (torchtitan@9dec370 ``torchtitan/parallelisms/parallelize_llama.py`` ``apply_tp``);
  with PP, ``batch`` is the micro-batch (local batch / microbatches) and ``grad_accum`` the number of
  micro-batches (torchtitan@9dec370 ``pipeline_llama.py``: microbatches default to the pp degree),
  ``pp_schedule`` 1f1b or interleaved with ``virtual_stages`` (2 stages per rank for interleaved).
* ``seq`` is the full sequence (before CP splits it), ``checkpointing`` op / full as stated or inferred
  (``inferred`` in the file says where from), ``compile`` as stated, ``attention='sdpa'`` (``eager``
  where the point says the run's model used eager attention: transformers' 2022 GPT-2; ``flash`` where it
  ran a FlashAttention kernel: flash_attention_2/3, flash-attn).
* ``loss`` as the run's framework computed it: ``standard`` (torchtitan@9dec370 ``train.py``: full
  fp32 logits), ``half`` (ColossalAI's 2022 ``GPTLMLoss``: cross_entropy on the fp16 logits' shifted
  copy, no upcast), ``fused`` (torchtitan's ``ChunkedLossWrapper``, from 786e26f8e, 2026-04-27, the
  llama3 / qwen3 configs' loss: the model skips its lm_head and each of 8 chunks runs lm_head, the
  cross-entropy and their backward inside the loss call, so the full logits never exist and the head
  input's gradient is kept for the decoder's backward, as in peakmem's fused loss; not ``chunked``, which
  is torchtune's ``CEWithChunkedOutputLoss`` keeping every chunk's fp32 log-softmax output) or
  ``compiled``. torchtitan's plain cross-entropy is compiled exactly when compile is on
  and the release compiles it (``job.loss`` and its ``inferred`` line): from e10cb9494 (2024-10-22,
  ``train.py``) to e8977b007 (2024-12-18, "TODO: compiling loss function causes CUDA errors": 9dec370 runs
  it eagerly, ``standard``) and again from bbb1b616e (2025-04-02, ``components/loss.py``
  ``build_cross_entropy_loss``; e7c0cae: ``compiled``), with ``"loss"`` in ``compile.components`` (the
  default) from 08b8b244f (2025-08-20).
* Async TP has no option: such points are estimated as plain TP and flagged ``A`` (approximation).
* Generation: ``peakmem.infer(engine='hf', cache_implementation='dynamic', engine_version=the
  transformers release that ran (``job.transformers_version``), prompt=P, context=P + N,
  batch=B, weights=...)`` with fp16 -> ``fp16``, GPTQ -> ``gptq-4bit-g128`` with ``gptq_kernel`` the
  point's kernel (exllama, exllamav2, autogptq-cuda-old -> cuda-old: each backend's workspace and
  dequantization, formulas/quant_kernels.py), bitsandbytes 4-bit fp4 -> ``fp4``, 8-bit -> ``int8``; the
  prefill-only benchmark is ``generate`` with one new token (N = 1).

The second search (``split_rule_2``; each such point has ``split``: ``split_rule_2``) adds:

* ``job.precision_id`` ``pure-bf16`` (Lightning Fabric ``bf16-true``, torchtune ``dtype: bf16``: weights,
  adapters, gradients and optimizer states in bf16) -> ``precision='bf16'``; ``job.float8`` as torchao
  names the recipe: tensorwise / rowwise / rowwise_with_gw_hp -> ``float8-tensorwise`` / ``float8-rowwise``
  / ``float8-rowwise-gw-hp`` (mxfp8 recipes: not expressible);
* ``layout.fsdp_version`` (Lit-GPT's Lightning ``FSDPStrategy`` is FSDP1) instead of always 2;
* ``job.framework`` (``torchtune``; ``litgpt-2023`` for Lit-GPT@8641822b's resource tables, ``litgpt`` for
  the 2024 config hub: peakmem.formulas.profiles), ``lora_rank``, ``lora_alpha``,
  ``lora_dropout``, ``lora_targets`` (HF
  module names, joined by commas), ``adapter_dtype`` (``base``: adapters in the model's bf16), ``quant``
  and ``double_quant`` false -> ``no_double_quant=True``, ``bitsandbytes`` (the release a QLoRA job ran:
  Lit-GPT's 0.41.1, whose 4-bit Linears keep their inputs), ``torchao`` (the release a torchtune QLoRA job
  ran: torchtune@0914d5cfb pins 0.1, whose to_nf4 quantizes whole weights at load), passed as the options
  of the same names;
* ``job.expandable_segments`` true -> ``expandable_segments=True`` (peakmem's allocator model with
  ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``: one growing segment per stream, no fragmentation
  slack): recorded on the torchao table's points, whose launcher (torchtitan ``run_train.sh``, at
  0da8901b1, 2c8b59479 and 6fc499f6f alike) sets it; false on the MI300X rows, where torch 2.9's ROCm
  build ignores it (``CUDAAllocatorConfig::expandable_segments()`` is false without
  ``PYTORCH_C10_DRIVER_API_SUPPORTED``; ROCm support came with pytorch#173330 / #177974 in 2026-03). The
  first search's torchtitan points ran the same launcher (9dec370 ``run_llama_train.sh``, e7c0cae
  ``run_train.sh``) but do not record it: they stay on the default allocator, so that ``split_rule``'s
  fitting set (and formulas/band.py MEASURED_RESIDUALS) does not move here;
* ``job.alloc_roundup_divisions`` N -> ``alloc_roundup_divisions=N`` (``PYTORCH_CUDA_ALLOC_CONF``
  ``roundup_power2_divisions:N``): recorded on the axolotl points, whose CLI sets 16 with expandable
  segments (utils/__init__.py ``set_pytorch_cuda_alloc_conf``);
* generate: ``job.cache_implementation`` (``static`` for Lit-GPT's KV cache preallocated to prompt + new
  tokens) and bitsandbytes NF4 weights (``bnb-nf4``, ``bnb-nf4-dq``) -> ``nf4``; ``job.draft`` and
  ``job.num_assistant_tokens`` (transformers' assisted generation) -> ``draft``, ``num_speculative_tokens``;
* ``job.padded_lengths`` ``varying`` (the loop pads each batch to its longest sample: torchtune@ff594c231
  ``utils/collate.py`` ``padded_collate``, the collate_fn of ``recipes/lora_finetune_single_device.py``) ->
  ``padded_lengths='varying'`` (formulas/padded_lengths.py); absent: ``fixed``;
* ``job.grad_accum`` (the loop's accumulation: Lit-GPT ``128 // micro_batch_size``, torchtune's config) ->
  ``grad_accum``; ``job.fsdp_adapter_wrap`` ``in-layer`` (Lit-GPT's ``FSDPStrategy(auto_wrap_policy={Block})``
  keeps the LoRA adapters in the Block units: FSDP1 whole-unit gradients, unsharded under no_sync) ->
  ``fsdp_adapter_wrap``.

The third search (``split_rule_3``, brief h-published7; flag ``T``): every point is held out, gathered and
recorded before any estimate of it, as a blind test of the band set in session 9. It needs no new job field:
Lit-GPT's config-hub table (``config_hub/finetune/README.md``: LoRA / QLoRA / full on one A10G, full under
FSDP1 on two or four) maps through the fields above (``framework`` litgpt, ``grad_accum``, the LoRA fields,
``bitsandbytes``, ``model_config`` for the models outside the catalog).

Only ``split_rule``'s fitting set feeds ``--residuals`` (what formulas/band.py MEASURED_RESIDUALS was
measured on); the output ends with each later search's points alone, by set.

The fourth search (``split_rule_4``, brief h-published8; flag ``F``): every point is held out, recorded
before any estimate of it. It adds ``job.dora`` true -> ``dora=True`` (peft's DoRA, ``use_dora``) and
``job.precision_id`` ``bf16-weights-autocast-bf16`` (the HF Trainer's ``bf16=True`` autocast on a model loaded
with ``torch_dtype=bfloat16``: fms-acceleration's QLoRA rows) -> ``precision='bf16'`` with the point's
``adapter_dtype`` (peakmem has no plan for autocast on 16-bit weights: each such point lists it among its
approximations). Byte counts printed as bytes have ``measured.unit`` ``B``. ``job.kbit_prep`` (brief h-kbit:
``trl`` where TRL 0.13's SFTTrainer ran ``prepare_model_for_kbit_training`` on a one-GPU 4-bit model) ->
``kbit_prep``, and with it ``precision='amp-bf16'`` (the Trainer's autocast over the quantized base's 16-bit
and fp32 weights: peakmem.formulas.kbit_prep). ``job.trl`` (brief h-trl: the TRL release the framework text
names) -> ``trl``, whose SFTTrainer rule gives ``kbit_prep`` and the adapters' dtype (peakmem.trl_versions;
the point then states neither), and ``precision='amp-bf16'`` where that rule prepares the base.

The fifth search (``split_rule_5``, brief h-published9; flag ``V``): every point is held out, recorded
before any estimate of it (axolotl example READMEs, Lit-GPT's quantize tutorial). It adds
``job.activation_offload`` true (axolotl ``activation_offloading``) -> ``activation_offload=True``;
``job.precision_id`` ``accelerate-fsdp2-mp-bf16`` (accelerate's FSDP2 with ``mixed_precision`` bf16: the
bf16-loaded model upcast to fp32 shards, ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=bf16)``) ->
``precision='mixed-bf16'`` with the framework's reduce dtype (no ``fsdp_reduce_dtype``); and ``job.weights``
``bnb-fp4-dq`` -> ``fp4`` (double quantization flagged A, as nf4-dq). ``job.lora_target_parameters`` (peft
LoRA on 3D expert tensors) -> ``lora_target_parameters`` (joined by commas), with ``job.peft`` (the
release the framework text names) -> ``peft`` (peakmem.peft_versions: before 0.21 a full-size delta per
forward). Examined
after the miss (session h-gptoss): axolotl@ba3dba3e replaces accelerate's ``fsdp2_prepare_model`` by its own
(src/axolotl/monkeypatch/accelerate/fsdp2.py, applied by loaders/patch_manager.py when ``fsdp_version`` is
2), which has no fp32 upcast: ``job.precision_id`` ``axolotl-fsdp2-bf16`` -> ``precision='bf16'``; and
``job.accelerate`` (the accelerate release, peakmem ``--accelerate``: before 1.11 the HF Trainer's no_sync
leaves FSDP2 reducing every micro-batch).

The sixth search (``split_rule_6``, brief h-published10; flag ``S``: ``V`` is the fifth's): every point is
held out, recorded before any estimate of it (TRL's SFT QLoRA notebook runs). It adds ``job.liger`` true (the
HF Trainer's ``use_liger_kernel``) -> ``liger=True``.

The seventh search (``split_rule_7``, brief h-published11; flag ``G``): every point is held out, recorded
before any estimate of it (optimum-benchmark's running-llamas fp16 generate / forward runs, DeepSpeed-Chat's
step-1 OPT-1.3B ZeRO-2 log). Its ``job.dropout`` is recorded, not mapped.

The eighth search (``split_rule_8``, brief h-published12; flag ``H``): every point is held out, recorded
before any estimate of it (ms-swift's example scripts, whose first line states the memory the run took). It
adds ``job.precision_id`` ``deepspeed-bf16`` (DeepSpeed's bf16 mode under the HF Trainer) ->
``precision='mixed-bf16'``, and the kind ``train-lora-ddp`` (LoRA under plain DDP).

The ninth search (``split_rule_9``, brief h-published13; flag ``K``): unlike the third to eighth, its points
alternate held_out / fit by the SHA-256 of the id within each kind (as ``split_rule_2``), decided before any
estimate of them. It adds ``job.optimizer_in_backward`` true (torchtune ``optimizer_in_bwd``: one optimizer
per parameter, stepped in its gradient hook) -> ``optimizer_in_backward=True``.

The tenth search (``split_rule_10``, briefs h-published14a / h-published14b; flag ``X``): every point is held
out, the rule decided before any point was gathered and recorded before any estimate of it. The eleventh
(``split_rule_11``, briefs h-published15a / h-published15b; flag ``Y``): the same. The twelfth
(``split_rule_12``, briefs h-published16a / h-published16b; flag ``Z``) alternates held_out / fit by SHA-256
within each kind again, as the ninth, so that its fitting half measures the band terms of kinds that rested
on two or three points; the thirteenth (``split_rule_13``, briefs h-published17a / h-published17b; flag
``W``) the same, aimed at one-GPU fine-tunes and Hugging Face ``generate``; the fourteenth
(``split_rule_14``, briefs h-published18a / h-published18b; flag ``U``) the same, aimed at ``generate`` read
with nvidia-smi and at multi-GPU fine-tunes; the fifteenth (``split_rule_15``, briefs h-published19a /
h-published19b; flag ``Q``) alternates the other way round (the 1st, 3rd, ... of a kind fit), as the
one-GPU kinds' fitting sets held 2-8 points against 41-49 held out; the sixteenth (``split_rule_16``, briefs
h-published20a / h-published20b; flag ``R``) held_out first again, aimed at ``generate`` at batch and at
training runs from sources not yet read; the seventeenth (``split_rule_17``, briefs h-published21a /
h-published21b; flag ``P``) the same; the eighteenth (``split_rule_18``, brief h-published22; flag ``O``)
the same, aimed at vLLM startup logs off the H100 and before 0.19; the nineteenth (``split_rule_19``, brief
h-published23; flag ``M``) the same, aimed at vLLM startup logs of MoE and MLA models; the twentieth
(``split_rule_20``, briefs h-published24a / h-published24b; flag ``L``) the same, aimed at post-training
(preference and RL objectives), SGLang serving and speculative decoding; the twenty-first
(``split_rule_21``, brief h-published25; flag ``J``) the same, aimed at post-training again. The
twenty-second (``split_rule_22``, brief h-published26; flag ``D``) holds every point out again (a blind test,
as the third to eighth): torchao-quantized checkpoints and their bf16 baselines. The twenty-third
(``split_rule_23``, briefs h-published27a / -27b / -27c; flag ``B``) alternates again (held_out first),
aimed at fine-tuning runs whose framework states the memory the run took.

Flags: each later search's letter (``SEARCH_FLAGS``: ``N`` the second search, ``split_rule_2``, then ``T F V S
G H K X Y Z W U Q R P O M L J D B`` for the third to the twenty-third, in order), ``A`` an approximation
listed in the point, ``I`` a field inferred from framework defaults, ``E`` a held-out point read after peakmem
missed it (``examined_after_miss``): its mapping or a formula was then taken from the framework's source,
nothing fit to it, but it no longer counts as unseen; the held-out summary is also given without them.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from _scale_bands import ENGINE_FIGURES, miss_side, miss_text, use_error
from _scale_bands import band as _band
from _scale_options import NotExpressible, post_training_options, post_training_seq, sglang_options

if TYPE_CHECKING:
    from peakmem.device import Gpu

GiB = 2**30
WITHIN = 0.10  # the "within 10 %" count the done-when uses
POINTS_FILE = Path(__file__).resolve().with_suffix(".json")
SETS = ("fit", "held_out")

# job.precision_id -> peakmem precision (see the module docstring)
PRECISION = {
    "fsdp2-mp-bf16": "mixed-bf16",
    "autocast-fp16": "amp-fp16",
    "deepspeed-fp16": "mixed-fp16",
    "pure-bf16": "bf16",  # Lightning bf16-true, torchtune dtype bf16: weights, grads and states all bf16
    # HF Trainer bf16=True on a torch_dtype=bfloat16 model (QLoRA): 16-bit weights; no autocast plan (A)
    "bf16-weights-autocast-bf16": "bf16",
    # accelerate FSDP2, mixed_precision bf16: fp32 shards, bf16 compute and reduce (axolotl gpt-oss)
    "accelerate-fsdp2-mp-bf16": "mixed-bf16",
    # axolotl's FSDP2 (monkeypatch/accelerate/fsdp2.py fsdp2_prepare_model replaces accelerate's, without its
    # model.to(torch.float32) upcast): the bf16-loaded model stays bf16: bf16 shards, gradients, states
    "axolotl-fsdp2-bf16": "bf16",
    # DeepSpeed bf16 (ds_config bf16 enabled, the HF Trainer's bf16=True filling 'auto'): bf16 module, fp32
    # master weights and Adam states of the trainable parameters, partitioned by ZeRO (the eighth search)
    "deepspeed-bf16": "mixed-bf16",
    # float16 weights under the HF Trainer's fp16=True (unsloth's notebooks on a T4, the tenth search): 2-byte
    # weights and fp32 adapters, the bytes of the bf16 entry above; no GradScaler state counted (A)
    "fp16-weights-autocast-fp16": "bf16",
    # fp32 weights, gradients and states, no autocast (a plain loop over from_config(dtype=float32): the
    # thirteenth search)
    "fp32": "fp32",
}
# job.float8 (torchao's recipe names) -> peakmem precision; the MX recipes (mxfp8: torchtitan's default
# mxfp8_cublas) -> float8-mxfp8
FLOAT8 = {
    "tensorwise": "float8-tensorwise",
    "rowwise": "float8-rowwise",
    "rowwise_with_gw_hp": "float8-rowwise-gw-hp",
    "mxfp8": "float8-mxfp8",
    "mxfp8_cublas": "float8-mxfp8",
    "mxfp8_cublas_rceil": "float8-mxfp8",
}
WEIGHTS = {
    "fp16": "fp16",
    "bf16": "bf16",
    "gptq-4bit-g128": "gptq-4bit-g128",
    "gptq-8bit-g128": "gptq-8bit-g128",
    "awq-4bit": "awq-4bit",  # AutoAWQ GEMM, group 128, through transformers (unfused)
    # the sixteenth search wrote peakmem's own names (mapped before any estimate of its points)
    "awq-4bit-g128": "awq-4bit-g128",
    "gptq-2bit-g128": "gptq-2bit-g128",
    "fp8-channel": "fp8-channel",  # transformers' FbgemmFp8Config: fp8 weights, one fp32 scale per row
    "bnb-fp4": "fp4",
    "bnb-int8": "int8",
    # bitsandbytes 4-bit with double quantization (bnb_4bit_use_double_quant): peakmem's nf4-dq / fp4-dq
    # formats (inference.py: uint8 absmax and a second-level fp32 absmax per 256 blocks)
    "bnb-nf4": "nf4",
    "bnb-nf4-dq": "nf4-dq",
    "bnb-fp4-dq": "fp4-dq",
    # torchao (session 25: peakmem's torchao formats built from torchao / transformers sources)
    "torchao-int4wo-g128": "torchao-int4wo-g128",
    "torchao-fp8-rowwise": "torchao-float8dq-row",
    # the twenty-second search's torchao checkpoints (mapped at merge, before any estimate; see the points)
    "torchao-int4wo-g128-hqq": "torchao-int4wo-g128",
    "torchao-qat-int4wo": "torchao-int4wo-g128",
    "torchao-awq-int4": "torchao-int4wo-g128",
}
# vLLM --kv-cache-dtype -> peakmem's --kv-cache (vllm/config/cache.py CacheDType: fp8 is e4m3 on CUDA)
VLLM_KV_CACHE_DTYPES = {"auto": "auto", "fp8": "fp8", "fp8_e4m3": "fp8", "fp8_e5m2": "fp8"}
# job.optimizer spellings that differ from peakmem's --optimizer
OPTIMIZERS = {"paged-adamw-32bit": "paged-adamw"}  # bitsandbytes.optim.PagedAdamW
# the split rules of the file's schema, in order; a point's optional `split` names its rule
SPLIT_RULES = ("split_rule", *(f"split_rule_{n}" for n in range(2, 24)))  # split_rule_2 .. _23
# the flag of each later search's points, in the order of SPLIT_RULES[1:]
SEARCH_FLAGS = dict(zip(SPLIT_RULES[1:], "NTFVSGHKXYZWUQRPOMLJDB", strict=True))
# job.gptq_kernel (benchmark_gptq.py's names) -> peakmem's gptq_kernel (formulas/quant_kernels.py)
GPTQ_KERNELS = {
    "exllama": "exllama", "exllamav2": "exllamav2", "autogptq-cuda-old": "cuda-old",
    "cuda-old": "cuda-old",  # the sixteenth search wrote peakmem's name
}  # fmt: skip


def attention_of(job: dict[str, Any]) -> str:
    """peakmem's attention kernel for the point's ``job.attention``: eager where the run's model used eager
    attention, flash where it ran a FlashAttention kernel (flash_attention_2/3, flash-attn), else sdpa."""
    named = str(job.get("attention", ""))
    return "eager" if named.startswith("eager") else "flash" if named.startswith("flash") else "sdpa"


def train_options(p: dict[str, Any]) -> dict[str, Any]:
    """peakmem.train options for a training point (see the module docstring for each choice)."""
    lay, job = p["layout"], p["job"]
    seq = post_training_seq(job)  # a post-training job may give its prompt and completion lengths
    for field, value in (("micro_batch", job.get("micro_batch")), ("seq", seq),
                         ("checkpointing", job.get("checkpointing")), ("loss", job.get("loss"))):  # fmt: skip
        if value is None:
            raise NotExpressible(f"job.{field} is not known")
    if lay.get("dp_replicate", 1) != 1 or lay.get("ep", 1) != 1:
        raise NotExpressible("HSDP replicate / EP layouts are not mapped by this script yet")
    if job.get("modules_to_save"):  # peft's trainable copies of whole modules: peakmem has no option for them
        raise NotExpressible(f"job.modules_to_save {job['modules_to_save']}: no peakmem option")
    precision = PRECISION.get(job.get("precision_id") or "")
    if precision is None:
        raise NotExpressible(f"precision {job.get('precision_id')!r} is not mapped")
    float8 = job.get("float8")
    if float8 is not None and float8 not in FLOAT8:
        raise NotExpressible(f"float8 recipe {float8!r} is not mapped")
    opts: dict[str, Any] = {
        "method": job["method"],
        "precision": FLOAT8[float8] if float8 else precision,
        "optimizer": OPTIMIZERS.get(job["optimizer"], job["optimizer"]),
        "optimizer_impl": job["optimizer_impl"],
        "batch": job["micro_batch"],
        "seq": seq,
        "checkpointing": job["checkpointing"],
        "compile": bool(job["compile"]),
        "loss": job["loss"],
        "attention": attention_of(job),
        "gpus": lay["gpus"],
    }
    if lay["fsdp"] > 1 or lay["cp"] > 1:  # torchtitan shards over dp_shard x cp
        opts.update(fsdp="full-shard", fsdp_version=lay.get("fsdp_version") or 2)
    if job.get("framework"):  # torchtune, Lit-GPT: their model code and loss (peakmem.formulas.profiles)
        opts["framework"] = job["framework"]
    if job.get(
        "transformers"
    ):  # the release the point's framework text names (peakmem.transformers_versions)
        opts["transformers"] = job["transformers"]
    if job.get("accelerate"):  # the accelerate release under the HF Trainer (peakmem.accelerate_versions)
        opts["accelerate"] = job["accelerate"]
    adapter_fields = (
        "lora_rank",
        "lora_alpha",
        "lora_dropout",
        "adapter_dtype",
        "quant",
        "bitsandbytes",
        "torchao",
    )
    for name in adapter_fields:
        if job.get(name) is not None:
            opts[name] = job[name]
    if job.get("lora_targets"):
        opts["lora_targets"] = ",".join(job["lora_targets"])
    if job.get("lora_target_parameters"):  # peft target_parameters (ParamWrapper on 3-D expert tensors)
        opts["lora_target_parameters"] = ",".join(job["lora_target_parameters"])
    if job.get("peft"):  # the peft release the point's framework text names (peakmem.peft_versions)
        opts["peft"] = job["peft"]
    if job.get("dora"):  # peft use_dora (the fourth search's method_comparison DoRA run)
        opts["dora"] = True
    if job.get("kbit_prep"):  # who prepared the quantized model, where no TRL release decides it
        opts["kbit_prep"] = job["kbit_prep"]
    if job.get("trl"):  # the TRL release the point's framework text names (peakmem.trl_versions)
        opts["trl"] = job["trl"]
    if _prepared(job, lay) and job.get("precision_id") == "bf16-weights-autocast-bf16":
        opts["precision"] = "amp-bf16"  # the Trainer's autocast over the prepared base, now planned
    if job.get("double_quant") is False:
        opts["no_double_quant"] = True
    if job.get("precision_id") == "fsdp2-mp-bf16":  # torchtitan's MixedPrecisionPolicy(reduce_dtype=fp32)
        opts["fsdp_reduce_dtype"] = "fp32"
    if job.get("float8_fsdp_all_gather"):  # torchao enable_fsdp_float8_all_gather (null / false: off)
        opts["float8_all_gather"] = True
    if job.get("zero_grad_set_to_none") is False:  # the loop's zero_grad keeps the gradients (torch < 2.0)
        opts["keep_grads"] = True
    if job.get("expandable_segments"):  # the allocator as the platform ran it (module docstring)
        opts["expandable_segments"] = True
    if job.get("alloc_roundup_divisions"):  # PYTORCH_CUDA_ALLOC_CONF roundup_power2_divisions (docstring)
        opts["alloc_roundup_divisions"] = job["alloc_roundup_divisions"]
    if lay.get("zero_stage"):
        opts["zero"] = lay["zero_stage"]
    if job.get("zero_init") is False:  # the model built outside deepspeed.zero.Init (formulas/zero3.py)
        opts["no_zero_init"] = True
    if job.get("offload_optimizer"):
        opts["offload"] = job["offload_optimizer"]
    if job.get("offload_params"):
        opts["offload_params"] = job["offload_params"]
    for name in ("tp", "pp", "cp"):
        if lay[name] > 1:
            opts[name] = lay[name]
    if lay["tp"] > 1:  # torchtitan's TP plan shards the norms' sequence (SequenceParallel)
        opts["sp"] = True
    if job.get("grad_accum"):  # the loop's accumulation (Lit-GPT, torchtune): gradients kept between them
        opts["grad_accum"] = job["grad_accum"]
    if job.get("padded_lengths"):  # the loop pads each batch to its longest sample (torchtune padded_collate)
        opts["padded_lengths"] = job["padded_lengths"]
    if job.get("fsdp_adapter_wrap"):  # Lit-GPT: LoRA inside the Block units (FSDP1 whole-unit grads)
        opts["fsdp_adapter_wrap"] = job["fsdp_adapter_wrap"]
    if job.get("activation_offload"):  # axolotl activation_offloading: checkpointed inputs to CPU RAM
        opts["activation_offload"] = True
    if job.get("optimizer_in_backward"):  # torchtune optimizer_in_bwd: each parameter stepped in its hook
        opts["optimizer_in_backward"] = True
    if job.get("liger"):  # the HF Trainer's use_liger_kernel (TRL notebooks): Liger's kernels and fused CE
        opts["liger"] = True
    opts.update(post_training_options(job))  # objective, trainer, rollout, ... (_scale_options.py)
    gpu = catalog_gpu(p)
    if gpu is not None:  # the run's GPU: its cuBLAS workspace, and what a load may reserve (step_load.py)
        opts["gpu"] = gpu.name
    if lay["pp"] > 1:
        opts["grad_accum"] = lay["pp_microbatches"]
        opts["pp_schedule"] = lay["pp_schedule"]
        if (lay.get("virtual_stages") or 1) > 1:
            opts["virtual_stages"] = lay["virtual_stages"]
    return opts


def _prepared(job: dict[str, Any], lay: dict[str, Any]) -> bool:
    """Whether peft's prepare_model_for_kbit_training ran on the point's quantized base: its
    ``job.kbit_prep``, else what its ``job.trl`` release's SFTTrainer does (peakmem.trl_versions)."""
    from peakmem.trl_versions import peft_preparation

    if job.get("kbit_prep"):
        return job["kbit_prep"] != "none"
    if not job.get("trl") or job["method"] != "qlora":
        return False
    zero3 = lay.get("zero_stage") == 3
    sharded = zero3 or lay["fsdp"] > 1
    prep = peft_preparation(job["trl"], objective="sft", method="qlora", precision="amp-bf16",
                            quant=job.get("quant") or "nf4", sharded=sharded, zero3=zero3)  # fmt: skip
    return prep is not None and prep.kbit_prep not in (None, "none")


# optimum-benchmark commits whose inference benchmark runs its forward loop (``_ = backend.forward(...)``,
# each output held until the next call returns) before the generate calls, in one process on one model
# (benchmarks/inference/benchmark.py@014c97e and @f75d9f9 InferenceBenchmark.run): generate's replay
# starts from the pool that loop leaves (peakmem's forward_loop)
OPTBENCH_FORWARD_LOOP = ("optimum-benchmark@014c97e", "optimum-benchmark@f75d9f9")
# a point's job.framework naming Lit-GPT's 2023 repository (Lit-GPT@<commit>): engine litgpt, release "0.0"
LITGPT_FRAMEWORK = "Lit-GPT@"
LITGPT_2023 = "0.0"


def infer_options(p: dict[str, Any]) -> dict[str, Any]:
    """peakmem.infer options for a generate / prefill point."""
    job = p["job"]
    if job.get("prompt") is None:
        raise NotExpressible("the prompt length is not known")
    weights = WEIGHTS.get(job["weights"])
    if weights is None:
        raise NotExpressible(f"weights {job['weights']!r} have no peakmem format")
    kernel = job.get("gptq_kernel")
    if str(job.get("awq_version", "")).startswith("exllama"):
        # transformers' AwqConfig(version="exllama") defaults exllama_config to version 2 (4.47.1
        # utils/quantization_config.py): AutoAWQ's exllamav2 linears (formulas/quant_kernels.py)
        kernel = "exllamav2"
    if kernel is not None and kernel not in GPTQ_KERNELS:
        raise NotExpressible(f"GPTQ kernel {kernel!r} is not modelled")
    common = {"weights": weights, "batch": job["batch"], "prompt": job["prompt"],
              "context": job["prompt"] + job["new_tokens"]}  # fmt: skip
    if job.get("draft"):  # transformers' assisted generation (generate(assistant_model=...)): the 14th search
        common["draft"] = job["draft"]
        common["num_speculative_tokens"] = job.get("num_assistant_tokens")
    if str(p.get("framework", "")).startswith(LITGPT_FRAMEWORK):
        # Lit-GPT's own generate/base.py (formulas/serving/litgpt.py); the 2023 repository predates litgpt 0.1
        return {**common, "engine": "litgpt", "engine_version": LITGPT_2023}
    gpu = catalog_gpu(p)  # the run's GPU: generate's allocator replay reserves at most what it leaves
    return {
        **common,
        **({"gpu": gpu.name} if gpu is not None else {}),
        "gptq_kernel": GPTQ_KERNELS.get(kernel) if kernel else None,
        "engine": "hf",
        "cache_implementation": job.get("cache_implementation") or "dynamic",
        # the release decides the cache (peakmem.inference TRANSFORMERS_CACHE_CLASSES: before 4.36 a tuple
        # cache rebuilt every step); a point that does not say runs as today's transformers
        "engine_version": job.get("transformers_version"),
        **({"forward_loop": True} if job["mode"] == "generate"
           and str(p.get("framework", "")).startswith(OPTBENCH_FORWARD_LOOP) else {}),
    }  # fmt: skip


def serve_options(p: dict[str, Any]) -> dict[str, Any]:
    """peakmem.infer options for a vLLM serving point (the engine's own defaults where the job names them)."""
    job = p["job"]
    if job.get("engine") not in ("vllm", "sglang"):
        raise NotExpressible(f"serving engine {job.get('engine')!r} is not mapped")
    weights = WEIGHTS.get(job["weights"], job["weights"])  # else peakmem's own name (it says if not)
    # automatic prefix caching changes no startup figure (the profile run and the pool it sizes): a
    # vLLM point is compared on those only (decided 2026-12-07, session 22, before the eighteenth search's
    # points were estimated)
    kv = VLLM_KV_CACHE_DTYPES.get(job.get("kv_cache_dtype") or "auto")
    if kv is None:
        raise NotExpressible(f"kv_cache_dtype {job['kv_cache_dtype']!r} is not mapped")
    gpu = catalog_gpu(p)
    if gpu is None:
        raise NotExpressible(f"GPU {p.get('gpu')!r} is not in the catalog")
    if job["engine"] == "sglang":
        return sglang_options(job, gpu=gpu.name, weights=weights, kv=kv)
    mode = job.get("cudagraph_mode")
    return {
        "engine": "vllm", "engine_version": job["engine_version"], "weights": weights, "gpu": gpu.name,
        "gpu_memory_utilization": job["gpu_memory_utilization"], "context": job["max_model_len"],
        "tp": job.get("tp") or 1, "pp": job.get("pp") or 1, "max_num_seqs": job.get("max_num_seqs"),
        "prefill_chunk": job.get("max_num_batched_tokens"),
        **({"ep": p["layout"]["ep"]} if (p["layout"].get("ep") or 1) > 1 else {}),
        **({"kv_cache": kv} if kv != "auto" else {}),
        "enforce_eager": bool(job.get("enforce_eager")),
        **({"vllm_entrypoint": job["vllm_entrypoint"]} if job.get("vllm_entrypoint") else {}),
        **({"cudagraph_mode": mode.lower()} if mode else {}),
    }  # fmt: skip


def catalog_gpu(p: dict[str, Any]) -> Gpu | None:
    """:func:`point_gpu`, or None where the point names no GPU or one the catalog does not hold."""
    from peakmem.errors import UnknownNameError

    try:
        return point_gpu(p) if p.get("gpu") else None
    except UnknownNameError:
        return None


def point_gpu(p: dict[str, Any]) -> Gpu:
    """The catalog GPU of the point's ``gpu`` text (its name before any parenthesised note)."""
    from peakmem.catalog import get_gpu

    return get_gpu(p["gpu"].split(" (")[0])


def model_arg(p: dict[str, Any], folder: Path) -> str:
    """The catalog name, or a config.json written under ``folder`` for a model the run built itself."""
    if "model_config" not in p:
        return str(p["model"])
    path = folder / p["id"] / "config.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(p["model_config"]))
    return str(path)


def estimate(p: dict[str, Any], folder: Path) -> dict[str, Any]:
    """One row: the estimate of the point's measured quantity, or why there is none."""
    import peakmem
    from peakmem.errors import PeakmemError

    row: dict[str, Any] = {
        "id": p["id"], "kind": p["kind"], "set": p["set"], "quantity": p["measured"]["quantity"],
        "measured_gib": p["measured"]["value_bytes"] / GiB,
        "rule": p.get("split", SPLIT_RULES[0]),
        "flags": ("A" if p.get("approximations") else "") + ("I" if p.get("inferred") else "")
        + ("E" if p.get("examined_after_miss") else "") + SEARCH_FLAGS.get(p.get("split", ""), ""),
    }  # fmt: skip
    if p.get("not_expressible"):
        return {**row, "reason": p["not_expressible"]}
    try:
        if p["job"]["mode"] == "train":
            opts = train_options(p)
            if p["job"].get("deepspeed_zero"):  # the framework's DeepSpeed config, read as --from reads one
                path = folder / p["id"] / "deepspeed.json"
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(json.dumps({"zero_optimization": p["job"]["deepspeed_zero"]}))
                opts["from_file"] = str(path)
            result = peakmem.train(model_arg(p, folder), **opts)
        else:
            opts = serve_options(p) if p["job"]["mode"] == "serve" else infer_options(p)
            result = peakmem.infer(model_arg(p, folder), **opts)
    except NotExpressible as exc:
        return {**row, "reason": str(exc)}
    except (PeakmemError, ValueError) as exc:
        return {**row, "reason": f"peakmem: {exc}".splitlines()[0]}
    try:
        gpu = point_gpu(p) if row["quantity"] == "nvml_v1_used" else None
        low, likely, high = _band(result.data, row["quantity"], gpu)
    except PeakmemError as exc:
        return {**row, "reason": f"peakmem: {exc}".splitlines()[0]}
    measured = p["measured"]["value_bytes"]
    # the published-residual term (formulas/band.py MEASURED_RESIDUALS, set from the fitting set): the
    # excess beyond the band without it is what --residuals measures
    own = [t for t in result.data["band"]["terms"] if t["name"] == "published_residual"]
    engine_figure = row["quantity"] in ENGINE_FIGURES
    allocated = likely if engine_figure else result.data["peak_allocated_bytes"]
    bare_low = low - sum(t["low_bytes"] for t in own)
    bare_high = high - sum(t["high_bytes"] for t in own)
    return {
        **row, "options": opts, "estimate_gib": likely / GiB, "low_gib": low / GiB, "high_gib": high / GiB,
        "band_kind": band_kind(p),
        "excess": (min(0, measured - bare_low) / allocated, max(0, measured - bare_high) / allocated),
        "error": likely / measured - 1, "in_band": low <= measured <= high,
        "band_miss": miss_side(row["quantity"], low, high, measured),
        "peak_phase": result.data.get("peak_phase"),
    }  # fmt: skip


def band_kind(p: dict[str, Any]) -> str | None:
    """The kind of job whose published residual term (peakmem.formulas.band) applies to the point."""
    from peakmem.formulas import band
    from peakmem.formulas.lowbit_optim import GALORE_ADAMW

    if p["job"]["mode"] == "train":
        job = p["job"]
        return band.training_kind(
            gpus=p["layout"]["gpus"],
            adapters=job["method"] != "full",
            quantized=job.get("quant") is not None,
            galore=job.get("optimizer") == GALORE_ADAMW,
        )
    if p["job"]["mode"] == "serve":
        return None  # no published-residual term for serving engines
    return band.GENERATE if p["job"]["weights"] in ("fp16", "bf16") else band.GENERATE_QUANTIZED


def _fitting_by_kind(rows: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    by_kind: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        if r["set"] == "fit" and "error" in r and r["band_kind"]:
            by_kind[r["band_kind"]].append(r)
    return by_kind


def residuals_by_kind(points: Path = POINTS_FILE) -> dict[str, tuple[int, float, float]]:
    """Per band kind: (fitting points, the widest excess below the band, the widest above), as fractions
    of the likely allocated bytes, over the fitting sets of both split rules (what formulas/band.py
    MEASURED_RESIDUALS holds)."""
    doc = json.loads(points.read_text())
    with tempfile.TemporaryDirectory() as tmp:
        rows = [estimate(p, Path(tmp)) for p in doc["points"] if p["set"] == "fit"]
    return {
        kind: (len(rs), min(r["excess"][0] for r in rs), max(r["excess"][1] for r in rs))
        for kind, rs in _fitting_by_kind(rows).items()
    }


def residuals(rows: list[dict[str, Any]]) -> str:
    """Per band kind, the widening of the band (fractions of the likely allocated bytes) that holds every
    FITTING point: what formulas/band.py MEASURED_RESIDUALS should hold."""
    out = ["| band kind | fitting points | low | set by | high | set by |", "|---|---:|---:|---|---:|---|"]
    for kind, rs in sorted(_fitting_by_kind(rows).items()):
        lo = min(rs, key=lambda r: r["excess"][0])
        hi = max(rs, key=lambda r: r["excess"][1])
        low, high = lo["excess"][0], hi["excess"][1]
        out.append(f"| {kind} | {len(rs)} | {low:.4f} | {lo['id']} | {high:.4f} | {hi['id']} |")
    return "\n".join(out)


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Median |error|, within 10 %, band coverage and the sides of the misses of estimated rows."""
    est = [r for r in rows if "error" in r]
    if not est:
        return {"estimated": 0}
    errs = [r["error"] for r in est]
    return {
        "estimated": len(est),
        "not_expressible": len(rows) - len(est),
        "median_abs_error": statistics.median(abs(e) for e in errs),
        "within_10pct": sum(abs(e) <= WITHIN for e in errs),
        "in_band": sum(r["in_band"] for r in est),
        "band_miss_low": sum(r["band_miss"] == "low" for r in est),
        "band_miss_high": sum(r["band_miss"] == "high" for r in est),
        "beyond_10pct_low": sum(use_error(r) < -WITHIN for r in est),
        "beyond_10pct_high": sum(use_error(r) > WITHIN for r in est),
        # the band's width as a share of its likely value (issue 27: a median of at most 25 %)
        "median_band_width": statistics.median(
            (r["high_gib"] - r["low_gib"]) / r["estimate_gib"] for r in est
        ),
    }


def _summary_line(s: dict[str, Any]) -> str:
    if not s["estimated"]:
        return "no point estimated"
    n = s["estimated"]
    return (
        f"{n} estimated ({s['not_expressible']} not expressible): median |error| "
        f"{100 * s['median_abs_error']:.1f} %, within 10 %: {s['within_10pct']}/{n}, band holds "
        f"{s['in_band']}/{n} (median width {100 * s['median_band_width']:.1f} %); "
        f"band misses low {s['band_miss_low']} / high {s['band_miss_high']}; "
        f"beyond 10 % low {s['beyond_10pct_low']} / high {s['beyond_10pct_high']}"
    )


def render(rows: list[dict[str, Any]]) -> str:
    out = []
    for name in SETS:
        rs = [r for r in rows if r["set"] == name]
        out.append(f"\n## {name} ({len(rs)} points)\n")
        out.append(
            "| id | kind | quantity | measured GiB | estimate GiB | error | band GiB | in band | flags |"
        )
        out.append("|---|---|---|---:|---:|---:|---|---|---|")
        for r in rs:
            if "error" not in r:
                continue
            out.append(
                f"| {r['id']} | {r['kind']} | {r['quantity']} | {r['measured_gib']:.2f} | "
                f"{r['estimate_gib']:.2f} | {100 * r['error']:+.1f} % | "
                f"{r['low_gib']:.1f}-{r['high_gib']:.1f} | "
                f"{'yes' if r['in_band'] else 'no (' + miss_text(r) + ')'} | {r['flags']} |"
            )
        out.append(f"\n{name}: {_summary_line(summary(rs))}\n")
        examined = [r["id"] for r in rs if "E" in r["flags"]]
        if examined:
            unseen = [r for r in rs if "E" not in r["flags"]]
            out.append(
                f"examined after a miss (flag E, the file's `examined_after_miss`): {', '.join(examined)}; "
                f"the points never read after an estimate: {_summary_line(summary(unseen))}\n"
            )
        by_kind: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for r in rs:
            by_kind[r["kind"]].append(r)
        out.append("| kind | points | estimated | median error | min..max error | in band |")
        out.append("|---|---:|---:|---:|---|---:|")
        for kind, ks in sorted(by_kind.items()):
            errs = [r["error"] for r in ks if "error" in r]
            if errs:
                out.append(
                    f"| {kind} | {len(ks)} | {len(errs)} | {100 * statistics.median(errs):+.1f} % | "
                    f"{100 * min(errs):+.1f} .. {100 * max(errs):+.1f} % | "
                    f"{sum(r['in_band'] for r in ks if 'error' in r)}/{len(errs)} |"
                )
            else:
                out.append(f"| {kind} | {len(ks)} | 0 | - | - | - |")
        missing = [r for r in rs if "error" not in r]
        if missing:
            out.append(f"\nnot expressible ({name}):")
            out.extend(f"- {r['id']}: {r['reason']}" for r in missing)
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--points", type=Path, default=POINTS_FILE)
    ap.add_argument("--json", type=Path, help="also write the rows and summaries as JSON")
    ap.add_argument("--residuals", action="store_true",
                    help="only print the fitting set's residuals beyond the band, per band kind")  # fmt: skip
    args = ap.parse_args(argv)
    doc = json.loads(args.points.read_text())
    with tempfile.TemporaryDirectory() as tmp:
        rows = [estimate(p, Path(tmp)) for p in doc["points"]]
    if args.residuals:
        print(residuals(rows))
        return 0
    print(f"# peakmem vs published GPU memory ({args.points.name}, {len(rows)} points)")
    print(f"split rule: {doc['schema']['split_rule']}")
    print(render(rows))
    by_rule = {rule: [r for r in rows if r["rule"] == rule] for rule in SPLIT_RULES[1:]}
    for rule, later in by_rule.items():
        if not later:
            continue
        print(f"\n## the points of {rule} alone ({len(later)} points)\n")
        print(f"{rule}: {doc['schema'][rule]}\n")
        for name in SETS:
            print(f"- {name}: {_summary_line(summary([r for r in later if r['set'] == name]))}")
        print(f"- both: {_summary_line(summary(later))}")
        first_held = [r for r in rows if r["rule"] == SPLIT_RULES[0] and r["set"] == "held_out"]
        print(f"- the points of {SPLIT_RULES[0]}, held out: {_summary_line(summary(first_held))}")
    if args.json:
        out = {"rows": rows, "summary": {s: summary([r for r in rows if r["set"] == s]) for s in SETS}}
        for rule, later in by_rule.items():
            out["summary_" + rule] = {s: summary([r for r in later if r["set"] == s]) for s in SETS}
        args.json.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
