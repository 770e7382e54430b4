"""The options of a question, in one table, and the one conversion of their values.

Every face asks with the same option names (the CLI's flags without dashes, with underscores:
``lora_rank``, ``gpu``, ``zero``): the CLI builds its argparse flags from :data:`OPTIONS`, the Python
API passes keyword arguments, the web its request body, ``--from`` the fields it read from a
framework's file and the Trainer callback the TrainingArguments it read. :func:`convert` checks and
converts each value the same way for all of them (an error names the field and the value), and
:func:`peakmem.question.ask` builds the typed question from the result.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

from peakmem.accelerate_versions import ACCELERATE_CURRENT
from peakmem.bnb_versions import BNB_CURRENT
from peakmem.errors import InputError
from peakmem.inference import SGLANG_ATTENTION_BACKENDS, STATE_CACHE_DTYPES
from peakmem.peft_versions import PEFT_CURRENT
from peakmem.post_training import DEFAULT_ROLLOUT_MEMORY, MAX_GENERATIONS
from peakmem.torchao_versions import TORCHAO_CURRENT
from peakmem.transformers_versions import TRANSFORMERS_CURRENT
from peakmem.validate import MAX_SHOWN_VALUE, MAX_TOKENS
from peakmem.vllm_defaults import LARGE_TIER, SMALL_TIER, V0_MAX_NUM_SEQS, VLLM_ENTRYPOINTS

JOB_COMMANDS = ("train", "infer", "fit", "plan")
MAX_NUMBER = MAX_TOKENS  # 2^40 ~ 1.1e12: no count or size a question holds is larger
MAX_TEXT_CHARS = 10_000  # a name, a list of GPUs or LoRA targets: real ones are well under 1,000 chars
AUTO = "auto"  # a default the framework that the setup implies decides (peakmem.defaults)

_ORACLES = frozenset({"measure", "simulate"})  # run the real model on a training setup (torch)
# --- limits: each far beyond any real job, small enough to answer fast; the web's request models take the
# same (peakmem.web.app). A value above one is refused naming the option and the reason.
MAX_BATCH = 2**16  # sequences in a micro-batch (or served at once); real recipes stay under 1,024
MAX_SEQ = 2**24  # tokens in a sequence: 16 M; the longest catalog context is 10 M (Llama 4 Scout)
MAX_GRAD_ACCUM = 2**16  # accumulation steps; recipes use at most a few hundred
MAX_DEGREE = 1024  # a tp/pp/cp/ep degree, virtual stages or GPUs per node; published runs use <= 128
MAX_WORLD = 65536  # GPUs in one job (the largest published runs use ~16k-100k)
# Sequences per optimizer step: the largest published runs take ~4k (16 M tokens of 4k); at most 2**20
# keeps plan's gradient accumulation within the core's limit of 1,048,576 steps on any layout.
MAX_GLOBAL_BATCH = 2**20
MAX_LORA_RANK = 4096  # published adapters use r <= 1,024; a rank is also at most the hidden size (question)
MAX_LORA_SLOTS = 4096  # vLLM --max-loras: GPU adapter slots; published multi-LoRA serving uses <= 128
MAX_LAYERS_ON_GPU = 10_000  # llama.cpp -ngl: the deepest catalog model has 126 layers
MAX_SPECULATIVE_TOKENS = 1024  # vLLM --speculative-config num_speculative_tokens: published runs use <= 16
MAX_CONTEXT_MIB = 2**20  # a CUDA context of 1 TiB: measured ones are 0.3-1.4 GiB
MAX_IMAGES = 4096  # images per sequence: multi-image VL recipes use <= ~100
MAX_PIXELS_BOUND = 2**32  # a Qwen processor's min/max pixels: 4.3 G (the defaults are <= 16.8 M)

_TRAINING = frozenset({"train", "fit", "plan", "plot", "explain"}) | _ORACLES  # take a training setup
_SHARDED = frozenset({"train", "fit", "explain"})  # ... and its parallel layout (plan searches it)
_SERVING = frozenset({"infer", "fit"})  # fit --infer sizes a serving job
_JOBS = frozenset(JOB_COMMANDS)
_GPU = _JOBS | _TRAINING  # a GPU to judge the answer on
_DEVICE_OVERHEADS = _JOBS | {"explain"}


@dataclass(frozen=True, kw_only=True)
class Option:
    """One option: its name (the argparse dest), the type of its value, its default, the commands that
    take it and its help. ``kind`` is int, float, bool or str; a None default means "not given"."""

    name: str
    kind: type
    default: Any
    commands: frozenset[str]
    help: str
    group: str = ""
    choices: tuple[str, ...] = ()
    maximum: int | None = None  # the largest value taken (:data:`MAX_BATCH`, ...)

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


def _o(name: str, kind: type, default: Any, commands: frozenset[str], help: str, **kw: Any) -> Option:
    return Option(name=name, kind=kind, default=default, commands=commands, help=help, **kw)


_LORA = "LoRA / QLoRA (with --method lora|qlora)"
_SAVING = "memory-saving options"
_MULTI = "multi-GPU (per-rank memory)"
_DEVICE = "device overheads"
_GRAPHS = "CUDA graphs (vllm / sglang: formulas/serving/cuda_graphs.py)"
# vLLM CUDAGraphMode spellings (peakmem.inference.CudagraphMode)
CACHE_IMPLEMENTATIONS = ("dynamic", "static")
GPTQ_KERNELS = ("exllama", "exllamav2", "cuda-old")  # peakmem.inference.GptqKernel
CUDAGRAPH_MODES = ("auto", "none", "piecewise", "full", "full_decode_only", "full_and_piecewise")
MODEL_RUNNERS = ("auto", "v1", "v2")  # inference.ModelRunner
T, S, SV, J = _TRAINING, _SHARDED, _SERVING, _JOBS
_KERNELS = _TRAINING - {"measure"}  # measure runs the device's own kernels
_IMAGES = "images (vision-language models)"
_IMG = frozenset({"train", "fit"})
_POST = "post-training (preference and RL objectives: peakmem.post_training)"
_PT = frozenset({"train", "fit", "measure"})  # the training sequence of a VL model (peakmem.formulas.images)

OPTIONS: tuple[Option, ...] = (
    # the training setup (peakmem.training.TrainingSetup)
    _o("method", str, "full", T, "full|lora|qlora"),
    _o("precision", str, "mixed-bf16", T,
       "fp32|amp-bf16|amp-fp16|mixed-bf16|mixed-fp16|bf16|float8-tensorwise|float8-rowwise|"
       "float8-rowwise-gw-hp|float8-mxfp8 (float8-*: torchao float8 / MXFP8 training on mixed-bf16 states)"),
    _o("optimizer", str, "adamw", T, "adamw|adam|sgd|sgd-momentum|adafactor|lion|adamw-8bit|..."),
    _o("optimizer_impl", str, AUTO, T,
       "auto (what the framework the setup implies runs: peakmem.defaults)|foreach|fused|for-loop"),
    _o("batch", int, 1, T | SV, "micro-batch size per GPU (infer: concurrent sequences)", maximum=MAX_BATCH),
    _o("seq", int, None, T, "sequence length (default: min(context, 2048))", maximum=MAX_SEQ),
    _o("grad_accum", int, 1, T, "gradient accumulation steps", maximum=MAX_GRAD_ACCUM),
    _o("grad_sync", str, AUTO, T, "with --grad-accum and FSDP, when gradients are reduced: auto (the "
       "framework's: hf = HF Trainer / accelerate no_sync, last; torchtune each)|each-micro-batch|"
       "last-micro-batch (no_sync: the unsharded gradients kept between micro-batches)",
       choices=("auto", "each-micro-batch", "last-micro-batch")),
    _o("fsdp_reduce_dtype", str, AUTO, T, "FSDP's reduce dtype (reduce-scatter; FSDP2's unsharded "
       "gradients under no_sync / PP): auto (the framework's: hf = accelerate, the param dtype)|param|"
       "fp32 (torchtitan)|bf16|fp16",
       choices=("auto", "param", "fp32", "bf16", "fp16")),
    _o("padded_lengths", str, "fixed", T, "fixed (every batch --seq tokens)|varying (each batch padded to "
       "its longest sample, up to --seq: HF DataCollatorWithPadding, torchtune, TRL without packing; the "
       "caching allocator keeps the segments each length cuts, so reserved grows)",
       choices=("fixed", "varying")),
    _o("checkpointing", str, "none", T,
       "none|selective|op|full|every-N (op: torchtitan's op-level SAC; every-N: full checkpointing of "
       "every N-th layer, e.g. every-2)"),
    _o("attention", str, "sdpa", T, "eager|sdpa|flash"),
    _o("framework", str, "hf", T, "hf|torchtune|unsloth|litgpt|litgpt-2023"),
    _o("kernels", str, "cuda", _KERNELS, "whose kernels decide the bytes: cuda|cpu (to hold against "
       "`peakmem measure --device cpu`)", choices=("cuda", "cpu")),
    _o("lora_rank", int, None, T, "adapter rank r (default 8, as peft)", group=_LORA, maximum=MAX_LORA_RANK),
    _o("lora_alpha", float, None, T, "scaling alpha (default 8)", group=_LORA),
    _o("lora_targets", str, None, T, "all-linear (default) or module names: q_proj,v_proj", group=_LORA),
    _o("lora_target_parameters", str, None, T, "LoRA on bare parameters (peft target_parameters): names "
       "such as 22.mlp.experts.gate_up_proj,22.mlp.experts.down_proj (N. names layer N only) or experts "
       "(every layer's fused expert parameters)", group=_LORA),
    _o("lora_dropout", float, None, T, "dropout on the adapter input", group=_LORA),
    _o("dora", bool, False, T, "DoRA: weight-decomposed LoRA", group=_LORA),
    _o("adapter_dtype", str, None, T, "fp32 (peft's default)|bf16|fp16|base", group=_LORA),
    _o("quant", str, None, T, "qlora base: nf4 (default)|fp4|int8", group=_LORA),
    _o("no_double_quant", bool, False, T, "qlora: plain fp32 absmax per block", group=_LORA),
    _o("kbit_prep", str, None, T, "qlora: who prepared the quantized model: none (default, or what --trl "
       "implies)|peft (prepare_model_for_kbit_training: embeddings, norms, head fp32)|trl (TRL 0.7.5-0.25 "
       "SFTTrainer under bf16: that, then embeddings and head back to bf16)|axolotl (its QLoRA loader: the "
       "upcast, then norms, embeddings and head back: fp32 stays on the rest, e.g. biases, convs); fp32 "
       "norms make the residual stream fp32 (peakmem.formulas.kbit_prep)", group=_LORA,
       choices=("none", "peft", "trl", "axolotl")),
    _o("trl", str, None, T, "lora/qlora: the TRL release whose trainer (--objective sft|dpo|grpo|rloo) built "
       "the peft model, e.g. 0.13.0 or 0.26.0: its --kbit-prep and --adapter-dtype unless given (0.26+: no "
       "preparation, bf16 adapters; peakmem.trl_versions); default: none (the options as given)",
       group=_LORA),
    _o("bitsandbytes", str, BNB_CURRENT, T, "qlora: the bitsandbytes release the base runs, e.g. 0.41.1 "
       f"(default {BNB_CURRENT}); before 0.43.2 each 4-bit Linear keeps its input for backward "
       "(peakmem.bnb_versions)", group=_LORA),
    _o("torchao", str, TORCHAO_CURRENT, T, "qlora --framework torchtune: the torchao release of its NF4 "
       f"base, e.g. 0.1 (default {TORCHAO_CURRENT}); before 0.2.0 to_nf4 quantizes whole weights at load "
       "(peakmem.torchao_versions)", group=_LORA),
    _o("transformers", str, TRANSFORMERS_CURRENT, T - _ORACLES, "the transformers release the job ran, e.g. "
       f"4.48.1 (default {TRANSFORMERS_CURRENT}): before 5.0 MoE experts are per-expert Linears that "
       "bitsandbytes quantizes under qlora; before 4.49 the loss copies the shifted logits "
       "(peakmem.transformers_versions)"),
    _o("accelerate", str, ACCELERATE_CURRENT, T - _ORACLES, "the accelerate release under the HF Trainer, "
       f"e.g. 1.10.0 (default {ACCELERATE_CURRENT}): before 1.11 its no_sync leaves FSDP2 reducing every "
       "micro-batch (grad-sync auto: each-micro-batch; peakmem.accelerate_versions)"),
    _o("peft", str, PEFT_CURRENT, T - _ORACLES, "lora: the peft release, e.g. 0.17.0 (default "
       f"{PEFT_CURRENT}): before 0.21 each --lora-target-parameters forms a full-size delta weight per "
       "forward (peakmem.peft_versions)", group=_LORA),
    _o("loss", str, "standard", T, "standard|chunked|chunked-compiled|fused|half (CE on 16-bit logits, no "
       "fp32 upcast: 2022 GPT-2 heads, custom loops on a .half() model)|compiled (the standard CE under "
       "torch.compile: torchtitan with compile on)", group=_SAVING),
    _o("optimizer_in_backward", bool, False, T, "step each parameter in backward", group=_SAVING),
    _o("activation_offload", bool, False, T, "saved activations to CPU RAM", group=_SAVING),
    _o("compile", bool, False, T, "torch.compile each layer", group=_SAVING),
    _o("liger", bool, False, T, "Liger kernels (RMSNorm, SwiGLU, RoPE, fused CE)", group=_SAVING),
    _o("float8_all_gather", bool, False, S | {"plan"},
       "FSDP2 all-gathers the float8 Linears' weights in float8 (torchao enable_fsdp_float8_all_gather; "
       "with --precision float8-tensorwise and --fsdp, fsdp version 2)", group=_MULTI),
    _o("keep_grads", bool, False, T,
       "optimizer.zero_grad(set_to_none=False): the gradients stay allocated between steps (torch < 2.0's "
       "default, e.g. Lightning 1.x and 2022 HF Trainer loops)"),
    _o("images", int, None, _IMG, "images per sequence: their tokens join --seq (a VL model)", group=_IMAGES,
       maximum=MAX_IMAGES),
    _o("image_size", str, None, _IMG, "WIDTHxHEIGHT of each image in pixels (with --images)", group=_IMAGES),
    _o("min_pixels", int, None, _IMG, "Qwen-VL processors: min_pixels (default: the checkpoint's "
       "preprocessor_config)", group=_IMAGES, maximum=MAX_PIXELS_BOUND),
    _o("max_pixels", int, None, _IMG, "Qwen-VL processors: max_pixels (default: the checkpoint's "
       "preprocessor_config)", group=_IMAGES, maximum=MAX_PIXELS_BOUND),
    _o("objective", str, "sft", _PT, "sft|dpo|orpo|simpo|kto|grpo|rloo|distill (TRL 1.16's trainers)|ppo "
       "(verl's, with a critic)",
       group=_POST),
    _o("trainer", str, "trl", _PT, "grpo/rloo: trl (TRL's trainer, its fused log-prob head)|verl (verl's "
       "loop: the actor's full logits, then the log-probs; what a verl config runs)", group=_POST),
    _o("teacher", str, None, _PT, "distill: the frozen teacher (a catalog name, Hub id or config path; the "
       "student's vocabulary)", group=_POST),
    _o("critic", str, None, _PT, "ppo: the critic's backbone (a catalog name, Hub id or config path; "
       "default the policy's, as verl's critic.model.path)", group=_POST),
    _o("reference", str, "auto", _PT, "auto (what TRL builds)|separate|adapter|none|precomputed",
       group=_POST),
    _o("rollout", str, "hf", _PT, "grpo/rloo/ppo generation: hf (generate on the policy)|"
       "vllm-colocate|vllm-server",
       group=_POST),
    _o("beta", float, None, _PT, "KL / preference coefficient (default TRL's: grpo 0.0, rloo 0.05, dpo 0.1; "
       "verl's ppo 0.0); grpo/rloo/ppo load a reference only when beta > 0; distill: the divergence (0 "
       "forward KL .. 1 reverse KL, the default)", group=_POST),
    _o("num_generations", int, None, _PT, "completions per prompt (default TRL's: grpo 8, rloo 2)",
       group=_POST, maximum=MAX_GENERATIONS),
    _o("completion", int, None, _PT, "completion tokens within --seq (default min(512, seq/2): TRL's "
       "max_completion_length 512)", group=_POST, maximum=MAX_SEQ),
    _o("steps_per_generation", int, None, _PT, "micro-batches per generation batch (default: "
       "--grad-accum, as TRL)",
       group=_POST, maximum=MAX_GRAD_ACCUM),
    _o("rollout_memory", float, DEFAULT_ROLLOUT_MEMORY, _PT, "vllm-colocate: vllm_gpu_memory_utilization "
       "(TRL's default 0.3)", group=_POST),
    _o("rollout_sleep", bool, False, _PT, "vllm-colocate: vllm_enable_sleep_mode (the engine's memory freed "
       "outside rollout)", group=_POST),
    _o("entropy", bool, False, _PT, "verl: the actor's update computes the entropy from the logits (verl's "
       "actor.entropy_coeff != 0 or calculate_entropy; off by default)", group=_POST),
    # the parallel layout (peakmem.parallel.Parallelism)
    _o("gpus", int, 1, S, "world size", group=_MULTI, maximum=MAX_WORLD),
    _o("gpus_per_node", int, 8, S, "GPUs per node", group=_MULTI, maximum=MAX_DEGREE),
    _o("zero", int, 0, S, "DeepSpeed ZeRO stage 0|1|2|3", group=_MULTI),
    _o("fsdp", str, "none", S, "none|full-shard|shard-grad-op|hybrid-shard", group=_MULTI),
    _o("fsdp_version", int, 2, S, "1 (flat params) or 2 (fully_shard)", group=_MULTI),
    _o("fsdp_adapter_wrap", str, "separate", S, "LoRA under FSDP1: adapters in units of their own (separate: "
       "peft, torchtune) or inside the layer units (in-layer: Lit-GPT; whole-unit gradients)", group=_MULTI),
    _o("tp", int, 1, S | SV, "tensor-parallel degree (infer: tensor-parallel GPUs)", group=_MULTI,
       maximum=MAX_DEGREE),
    _o("pp", int, 1, S | SV, "pipeline-parallel degree (infer: vLLM/SGLang pipeline stages)", group=_MULTI,
       maximum=MAX_DEGREE),
    _o("cp", int, 1, S, "context-parallel degree", group=_MULTI, maximum=MAX_DEGREE),
    _o("cp_rotate", str, "auto", S, "CP K/V exchange auto|p2p|allgather|alltoall (auto: torch's allgather "
       "under FSDP2, Megatron's p2p otherwise)", group=_MULTI),
    _o("ep", int, 1, S | SV, "expert-parallel degree (infer: vLLM 1 or tp x dp, SGLang a divisor of tp)",
       group=_MULTI, maximum=MAX_DEGREE),
    _o("dp", int, 1, SV, "infer: vLLM/SGLang data-parallel ranks (each its own KV pool and requests)",
       group=_MULTI, maximum=MAX_DEGREE),
    _o("dp_attention", bool, False, SV, "infer: SGLang --enable-dp-attention (the dp ranks inside the tp "
       "GPUs)", group=_MULTI),
    _o("sp", bool, False, S, "Megatron sequence parallelism (with --tp)", group=_MULTI),
    _o("pp_schedule", str, "1f1b", S, "1f1b|interleaved", group=_MULTI),
    _o("virtual_stages", int, 1, S, "interleaved schedule: chunks per rank", group=_MULTI,
       maximum=MAX_DEGREE),
    _o("offload", str, "none", S, "optimizer states to none|cpu|nvme", group=_MULTI),
    _o("offload_params", str, "none", S, "parameters to none|cpu|nvme (ZeRO-3/FSDP)", group=_MULTI),
    _o("no_zero_init", bool, False, S, "ZeRO-3: the model was built outside deepspeed.zero.Init "
       "(from_pretrained before TrainingArguments(deepspeed=...), accelerate zero3_init_flag false): "
       "the whole 16-bit model goes to each GPU at deepspeed.initialize, and torch's F.linear keeps "
       "each gathered weight until its backward", group=_MULTI),
    # long-context training (peakmem.formulas.long_context)
    _o("ulysses", int, 1, S, "DeepSpeed-Ulysses / ALST sequence-parallel degree (heads split, all-to-all)",
       group=_MULTI, maximum=MAX_DEGREE),
    _o("tiled_mlp", bool, False, S, "ALST tiled MLP: the MLP in sequence shards, recomputed in backward",
       group=_SAVING),
    _o("tiled_mlp_shards", int, None, S, "tiled MLP shards (default: DeepSpeed's ceil(seq / hidden))",
       group=_SAVING, maximum=MAX_SEQ),
    _o("max_tokens_per_gpu", int, None, S, "verl use_dynamic_bsz ppo_max_token_len_per_gpu: the micro-batch "
       "is one packed row of this many tokens per GPU (--seq: the longest sample)", maximum=MAX_SEQ),
    # the serving setup (peakmem.inference.InferenceSetup)
    _o("weights", str, None, SV, "bf16|fp16|fp32|fp8|fp8-block|mxfp4|nvfp4|int8|nf4|fp4|gptq-4bit-g128|"
       "awq-4bit|torchao-int4wo|torchao-float8dq|q4_k_m|... (default: the format the model's config.json "
       "quantization_config names, else bf16)"),
    _o("kv_cache", str, "auto", SV, "auto|bf16|fp16|fp8|int8|int4"),
    _o("context", int, None, SV, "tokens per sequence (default: model limit)", maximum=MAX_SEQ),
    _o("prompt", int, None, SV, "prefill tokens (default: the whole context)", maximum=MAX_SEQ),
    _o("engine", str, "hf", SV, "hf|vllm|sglang|llamacpp|litgpt (Lit-GPT generate/base.py)"),
    _o("gpu_memory_utilization", float, None, SV,
       "vLLM gpu_memory_utilization / SGLang mem_fraction_static (default: vLLM 0.9; SGLang 0.5's "
       "(GPU - reserve) / GPU, the reserve 0.5 GiB + 1.5 MiB x chunked prefill + 2 MiB x cuda-graph-max-bs "
       "+ tp x pp / 8 GiB, at least 10 GiB above 60 GiB, + 2 GiB EAGLE / 6 GiB draft model)"),
    _o("n_gpu_layers", int, None, SV, "llama.cpp -ngl", maximum=MAX_LAYERS_ON_GPU),
    _o("max_loras", int, None, SV, "vLLM multi-LoRA: adapter slots on the GPU (default 1 with "
       "--max-lora-rank; 0: LoRA off)", maximum=MAX_LORA_SLOTS),
    _o("max_lora_rank", int, None, SV, "vLLM multi-LoRA: slot rank, one of 1|8|16|32|64|128|256|320|512 "
       "(default 16 with --max-loras)"),
    _o("prefix_tokens", int, 0, SV, "vLLM/SGLang: a prompt prefix every request shares (prefix caching; "
       "part of --context)", maximum=MAX_SEQ),
    _o("draft", str, None, SV, "speculative decoding: the draft model (a catalog name or config.json path, "
       "as MODEL; an EAGLE head's config.json; mtp: the target's MTP layers; ngram: n-gram lookup, no "
       "model); engines vllm, sglang and hf (assisted generation)"),
    _o("draft_method", str, None, SV, "speculative decoding: what --draft is (vLLM method; default: an "
       "EAGLE-3 config's architectures, else draft_model)", choices=("draft_model", "eagle", "eagle3")),
    _o("num_speculative_tokens", int, None, SV, "speculative decoding: tokens the draft proposes per step "
       "(vLLM and SGLang need it with --draft; SGLang: a chain of K steps)", maximum=MAX_SPECULATIVE_TOKENS),
    _o("enforce_eager", bool, False, SV, "vLLM --enforce-eager / SGLang --disable-cuda-graph: no CUDA graphs",
       group=_GRAPHS),
    _o("max_num_seqs", int, None, SV, f"vLLM --max-num-seqs (default: vLLM's for the GPU: "
       f"{LARGE_TIER.max_num_seqs} on {LARGE_TIER.where}, else {SMALL_TIER.max_num_seqs}; V0 "
       f"{V0_MAX_NUM_SEQS}): sequences per step; sets the CUDA graph capture sizes", group=_GRAPHS,
       maximum=MAX_BATCH),
    _o("prefill_chunk", int, None, SV, "tokens per prefill forward: vLLM --max-num-batched-tokens, SGLang "
       "--chunked-prefill-size, transformers generate's prefill_chunk_size (default: the engine's; vLLM "
       f"serve {LARGE_TIER.serve_tokens} on {LARGE_TIER.where}, else {SMALL_TIER.serve_tokens}, the LLM "
       f"class {LARGE_TIER.llm_tokens} / {SMALL_TIER.llm_tokens}; transformers the whole prompt)",
       group=_GRAPHS, maximum=MAX_SEQ),
    _o("vllm_entrypoint", str, "serve", SV, "vLLM's entry point, whose batch defaults differ: serve (vllm "
       "serve, the OpenAI server) or llm (the offline LLM class)", group=_GRAPHS, choices=VLLM_ENTRYPOINTS),
    _o("cudagraph_mode", str, "auto", SV, "vLLM compilation_config cudagraph_mode (auto: the release's "
       "default)", group=_GRAPHS, choices=CUDAGRAPH_MODES),
    _o("model_runner", str, "auto", SV, "vLLM's model runner, VLLM_USE_V2_MODEL_RUNNER (auto: V2 for dense "
       "models from 0.25, which reserves nothing for CUDA graphs before 0.29)", group=_GRAPHS,
       choices=MODEL_RUNNERS),
    _o("cuda_graph_max_bs", int, None, SV, "SGLang --cuda-graph-max-bs (default: SGLang 0.5's for the GPU "
       "and --tp: 8 below 20 GiB, 24 / 80 below 35, 32 / 160 below 60, 256 / 512 below 160 at tp < 4 / "
       ">= 4, 512 above; 160 with no GPU)", group=_GRAPHS, maximum=MAX_BATCH),
    _o("disable_custom_all_reduce", bool, False, SV, "vLLM / SGLang --disable-custom-all-reduce: with --tp "
       "the CUDA graphs capture NCCL all-reduces", group=_GRAPHS),
    _o("attention_backend", str, None, SV, "SGLang --attention-backend, whose CUDA-graph state is in the "
       "graph term (default: SGLang's for the model and the --gpu's architecture: fa3 on Hopper, else "
       "flashinfer, triton for MLA models)", group=_GRAPHS, choices=SGLANG_ATTENTION_BACKENDS),
    _o("interconnect", str, None, SV, "how the --tp GPUs are joined, which decides whether vLLM / SGLang "
       "custom all-reduce runs or the CUDA graphs capture NCCL: nvlink (all to all; or an NVLink-bridged "
       "pair)|xgmi|pcie (with peer-to-peer access)|pcie-no-p2p (default: the catalog GPU's; "
       "peakmem.device.INTERCONNECTS)", group=_GRAPHS),
    _o("engine_version", str, None, SV, "vLLM / SGLang / transformers (hf) release, e.g. 0.10 (default: the "
       "newest read, vLLM 0.27, transformers 5.23): vLLM counts CUDA graphs inside gpu_memory_utilization "
       "from 0.20, on top before; transformers before 4.36 rebuilds a tuple cache every step, before 4.45 "
       "makes every prompt position's logits; litgpt (default 0.5.13; 0.0: the 2023 lit-gpt) before 0.5.5 "
       "caches grouped-query K/V expanded to every head",
       group=_GRAPHS),
    _o("ssm_cache_dtype", str, "auto", SV, "the SSM / linear-attention scan state's dtype: vLLM "
       "--mamba-ssm-cache-dtype, SGLang --mamba-ssm-dtype (auto: the engine's default for the model)",
       choices=STATE_CACHE_DTYPES),
    _o("conv_cache_dtype", str, "auto", SV, "the SSM conv state's dtype: vLLM --mamba-cache-dtype (also the "
       "scan state's where that is auto), SGLang SGLANG_MAMBA_CONV_DTYPE (auto: model dtype / bf16)",
       choices=STATE_CACHE_DTYPES),
    _o("keep_all_logits", bool, False, SV, "logits for every prompt position"),
    _o("cache_implementation", str, "dynamic", SV, "transformers generate's cache (engine hf): dynamic "
       "(grows by torch.cat) or static (allocated at prompt + new tokens, written in place)",
       choices=CACHE_IMPLEMENTATIONS),
    _o("forward_loop", bool, False, SV, "transformers generate (engine hf) after a loop of plain forwards "
       "over the same batch and prompt, each output held until the next returns (optimum-benchmark's "
       "inference benchmark): the caching allocator's segments they leave change what generate's growing "
       "cache strands"),
    _o("gptq_kernel", str, None, SV, "transformers' GPTQ backend (auto-gptq; engine hf): exllama, exllamav2 "
       "(its scratch for 2048 x 8 tokens) or cuda-old; each allocates its own workspace (default: not "
       "named, one layer dequantized in prefill); with AWQ weights exllamav2 is AwqConfig(version="
       "'exllama'), AutoAWQ's exllama v2 linears", choices=GPTQ_KERNELS),
    _o("strict", bool, False, SV, "context beyond the model's limit is an error"),
    # the GPUs, the device overheads and the search
    _o("gpu", str, None, _GPU, "GPU name(s) or size(s), comma-separated: rtx-4090,40GB"),
    _o("cuda_context_mib", float, None, _DEVICE_OVERHEADS,
       "CUDA context as nvidia-smi shows it after torch.ones(1, device='cuda')", group=_DEVICE,
       maximum=MAX_CONTEXT_MIB),
    _o("fragmentation", float, None, _DEVICE_OVERHEADS,
       "allocator fragmentation, a fraction of the per-step churn (default: one-GPU full fine-tuning "
       "replays the step through the caching-allocator model, at least 0.10; elsewhere 0.10)", group=_DEVICE),
    _o("profile", str, None, _DEVICE_OVERHEADS, "a calibrated profile (peakmem calibrate)", group=_DEVICE),
    _o("expandable_segments", bool, False, _DEVICE_OVERHEADS,
       "model PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (reserved grows by pages; little "
       "fragmentation)", group=_DEVICE),
    _o("alloc_roundup_divisions", int, 0, _DEVICE_OVERHEADS,
       "model PYTORCH_CUDA_ALLOC_CONF=roundup_power2_divisions:N (0: not set; 1 or a power of two): every "
       "block above 512 B x N rounded up to the next 1/N of its power of two (axolotl sets 16); the "
       "per-interval list form is not modelled", group=_DEVICE),
    _o("infer", bool, False, frozenset({"fit"}), "fit a serving job instead of training"),
    _o("margin", bool, False, frozenset({"fit"}),
       "rank changes that make it fit with margin: the band's high end fits ('fits', not 'tight')"),
    _o("max_gpus", int, None, frozenset({"plan"}), "the most GPUs to use", maximum=MAX_WORLD),
    _o("global_batch", int, None, frozenset({"plan"}), "sequences per optimizer step",
       maximum=MAX_GLOBAL_BATCH),
)  # fmt: skip
BY_NAME: dict[str, Option] = {o.name: o for o in OPTIONS}


def of(command: str) -> tuple[Option, ...]:
    """The options ``command`` takes, in the table's order."""
    return tuple(o for o in OPTIONS if command in o.commands)


def defaults(command: str) -> dict[str, Any]:
    return {o.name: o.default for o in of(command)}


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= MAX_SHOWN_VALUE else f"{text[:MAX_SHOWN_VALUE]}..."


def convert_value(opt: Option, value: Any) -> Any:
    """``value`` as ``opt`` holds it, or an InputError naming the field: no bool where a number
    belongs, finite numbers no larger than :data:`MAX_NUMBER`, lists of names joined with commas, an
    enum member as its spelling, text of at most :data:`MAX_TEXT_CHARS`."""
    name = opt.name
    if value is None:
        if opt.default is None:
            return None
        raise InputError(f"{name}=None: give a value (default {opt.default!r})")
    if opt.kind is bool:
        if not isinstance(value, bool):
            raise InputError(f"{name}={_shown(value)}: must be True or False")
        return value
    if opt.kind in (int, float):
        integral = isinstance(value, int) and not isinstance(value, bool)
        if opt.kind is int and not integral:
            raise InputError(f"{name}={_shown(value)}: must be an integer")
        if opt.kind is float and not (integral or isinstance(value, float)):
            raise InputError(f"{name}={_shown(value)}: must be a number")
        if isinstance(value, float) and not math.isfinite(value):
            raise InputError(f"{name}={value!r}: must be a finite number")
        if abs(value) > MAX_NUMBER:
            raise InputError(f"{name}={_shown(value)}: too large (more than {MAX_NUMBER:,})")
        if opt.maximum is not None and value > opt.maximum:
            raise InputError(
                f"{name}={_shown(value)}: too large (at most {opt.maximum:,}; no real job has more)"
            )
        return float(value) if opt.kind is float else value
    if isinstance(value, (list, tuple)):
        value = ",".join(_text(opt, v) for v in value)
    text = _text(opt, value)
    if opt.choices and text not in opt.choices:
        raise InputError(f"{name}={text!r}: unknown; choose one of {', '.join(opt.choices)}")
    return text


def _text(opt: Option, value: Any) -> str:
    if isinstance(value, Enum):
        value = value.value
    if not isinstance(value, str):
        raise InputError(f"{opt.name}={_shown(value)}: must be a string")
    if len(value) > MAX_TEXT_CHARS:
        raise InputError(f"{opt.name}={_shown(value)}: too long (more than {MAX_TEXT_CHARS:,} characters)")
    return value


def convert(command: str, given: Mapping[str, Any]) -> dict[str, Any]:
    """Every option of ``command``: the given ones converted (:func:`convert_value`), the rest at
    their defaults. A name ``command`` does not take is an InputError listing the ones it does."""
    out = defaults(command)
    if not out:
        raise InputError(f"command={command!r}: one of {', '.join(JOB_COMMANDS)}")
    for name, value in given.items():
        if name not in out:
            raise InputError(
                f"{name}={_shown(value)}: not an option of peakmem {command} "
                f"(options: {', '.join(sorted(out))})"
            )
        out[name] = convert_value(BY_NAME[name], value)
    return out
