"""The request and response bodies of the JSON API (``peakmem.web.app``): one pydantic model per endpoint,
each field the CLI option of the same name, bounded by the option table's limits (peakmem.options), so the
page and the CLI refuse the same values."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from peakmem.accelerate_versions import ACCELERATE_CURRENT
from peakmem.bnb_versions import BNB_CURRENT
from peakmem.inference import Engine, KvDtype
from peakmem.options import (
    MAX_BATCH,
    MAX_DEGREE,
    MAX_GLOBAL_BATCH,
    MAX_GRAD_ACCUM,
    MAX_IMAGES,
    MAX_LORA_RANK,
    MAX_LORA_SLOTS,
    MAX_PIXELS_BOUND,
    MAX_SEQ,
    MAX_SPECULATIVE_TOKENS,
    MAX_WORLD,
)
from peakmem.peft_versions import PEFT_CURRENT
from peakmem.post_training import DEFAULT_ROLLOUT_MEMORY, MAX_BETA, MAX_GENERATIONS
from peakmem.torchao_versions import TORCHAO_CURRENT
from peakmem.training import (
    AttentionKernel,
    Framework,
    LossImpl,
    Method,
    OptimizerName,
    Precision,
)  # fmt: skip
from peakmem.transformers_versions import TRANSFORMERS_CURRENT

MAX_PLAN_GPUS = MAX_WORLD  # plan searches 405B on 65,536 H100s in under a second
MAX_GPUS_PER_REQUEST = 16
MAX_NAME_LEN = 200


# --- request models --------------------------------------------------------------------------------
GpuArg = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[^,]+$",
                              description="a catalog GPU name or a size: 24GB")]  # fmt: skip


class ModelChoice(BaseModel):
    """Exactly one of ``model`` (a catalog name) or ``config`` (a pasted config.json object)."""

    model_config = ConfigDict(extra="forbid")

    model: str | None = Field(
        None, min_length=1, max_length=MAX_NAME_LEN, description="catalog name or alias", examples=["gpt2-xl"]
    )
    config: dict[str, Any] | None = Field(None, description="a Hugging Face config.json object")
    name: str | None = Field(None, max_length=MAX_NAME_LEN, description="a display name for a pasted config")
    gpus: list[GpuArg] = Field(
        default_factory=list, max_length=MAX_GPUS_PER_REQUEST, description="GPUs to check: names or sizes",
        examples=[["rtx-4090", "a100-40gb"]],
    )  # fmt: skip

    @model_validator(mode="after")
    def _one_model(self) -> ModelChoice:
        if (self.model is None) == (self.config is None):
            raise ValueError("give exactly one of model (a catalog name) or config (a config.json object)")
        return self


class TrainOptions(ModelChoice):
    """The training options ``peakmem train|fit|plan`` share (each the CLI option of the same name)."""

    method: Method = Method.FULL
    precision: Precision = Precision.MIXED_BF16
    optimizer: OptimizerName = OptimizerName.ADAMW
    optimizer_impl: Literal["auto", "foreach", "fused", "for-loop"] = Field(
        "auto", description="the optimizer step: auto (the framework's default, peakmem.defaults) or a kernel"
    )
    batch: int = Field(1, ge=1, le=MAX_BATCH, description="micro-batch size per GPU")
    seq: int | None = Field(None, ge=1, le=MAX_SEQ, description="sequence length; default min(context, 2048)")
    grad_accum: int = Field(1, ge=1, le=MAX_GRAD_ACCUM)
    grad_sync: Literal["auto", "each-micro-batch", "last-micro-batch"] = Field(
        "auto", description="FSDP with grad_accum: when the loop reduces gradients (auto: the framework's)"
    )
    padded_lengths: Literal["fixed", "varying"] = Field(
        "fixed", description="fixed (every batch seq tokens) or varying (each batch padded to its longest "
        "sample, up to seq: reserved grows as the caching allocator keeps each length's segments)",
    )  # fmt: skip
    checkpointing: str = Field(
        "none", pattern=r"^(none|selective|op|full|every-[0-9]{1,4})$",
        description="none, selective, op, full, or every-N (every N-th layer checkpointed)",
    )  # fmt: skip
    attention: AttentionKernel = AttentionKernel.SDPA
    framework: Framework = Framework.HF
    lora_rank: int | None = Field(None, ge=1, le=MAX_LORA_RANK, description="LoRA rank r (default 8)")
    lora_alpha: float | None = Field(None, gt=0, description="LoRA scaling alpha (default 8)")
    lora_targets: str | None = Field(None, max_length=MAX_NAME_LEN, description="all-linear or q_proj,v_proj")
    lora_target_parameters: str | None = Field(
        None, max_length=MAX_NAME_LEN,
        description="LoRA on bare parameters (peft target_parameters): 22.mlp.experts.gate_up_proj,... or "
        "experts",
    )  # fmt: skip
    quant: str | None = Field(None, max_length=10, description="qlora base: nf4 (default), fp4, int8")
    kbit_prep: str | None = Field(
        None, max_length=7,
        description="qlora: none (default, or what trl implies), peft (prepare_model_for_kbit_training: fp32 "
        "embeddings, norms, head), trl (TRL 0.7.5-0.25 SFTTrainer under bf16: norms fp32, embeddings and "
        "head bf16) or axolotl (its loader: norms, embeddings, head bf16; the rest's 16-bit weights fp32)",
    )  # fmt: skip
    trl: str | None = Field(
        None, max_length=30,
        description="lora/qlora: the TRL release whose trainer built the peft model, e.g. 0.13.0 or 0.26.0: "
        "its kbit_prep and adapter dtype unless given (0.26+: no preparation, bf16 adapters)",
    )  # fmt: skip
    bitsandbytes: str = Field(
        BNB_CURRENT, max_length=20,
        description="qlora: the bitsandbytes release, e.g. 0.41.1 (before 0.43.2 4-bit Linears keep inputs)",
    )  # fmt: skip
    torchao: str = Field(
        TORCHAO_CURRENT, max_length=30,
        description="qlora under torchtune: the torchao release, e.g. 0.1 (before 0.2.0: to_nf4 of whole "
        "weights)",
    )  # fmt: skip
    transformers: str = Field(
        TRANSFORMERS_CURRENT, max_length=30,
        description="the transformers release, e.g. 4.48.1 (before 5.0 MoE experts are Linears bitsandbytes "
        "quantizes; before 4.49 the loss copies the shifted logits)",
    )  # fmt: skip
    accelerate: str = Field(
        ACCELERATE_CURRENT, max_length=30,
        description="the accelerate release under the HF Trainer, e.g. 1.10.0 (before 1.11 its no_sync "
        "leaves FSDP2 reducing every micro-batch)",
    )  # fmt: skip
    peft: str = Field(
        PEFT_CURRENT, max_length=30,
        description="lora: the peft release, e.g. 0.17.0 (before 0.21 target_parameters form full-size "
        "deltas)",
    )  # fmt: skip
    loss: LossImpl = LossImpl.STANDARD
    optimizer_in_backward: bool = Field(False, description="step each parameter in backward (torchtune)")
    activation_offload: bool = Field(False, description="saved activations to CPU RAM (torchtune)")
    compile: bool = Field(False, description="torch.compile each layer (the CLI's --compile)")
    liger: bool = Field(False, description="Liger kernels: RMSNorm, SwiGLU, RoPE, fused CE")
    keep_grads: bool = Field(False, description="zero_grad(set_to_none=False): gradients kept between steps")


class ParallelOptions(BaseModel):
    """The multi-GPU layout ``peakmem train|fit`` take (per-rank answer)."""

    gpu_count: int = Field(1, ge=1, le=MAX_WORLD, description="world size (the CLI's --gpus)")
    zero: int = Field(0, ge=0, le=3, description="DeepSpeed ZeRO stage")
    fsdp: str = Field("none", max_length=20, description="none, full-shard, shard-grad-op, hybrid-shard")
    tp: int = Field(1, ge=1, le=MAX_DEGREE, description="tensor-parallel degree")
    pp: int = Field(1, ge=1, le=MAX_DEGREE, description="pipeline-parallel degree")
    offload: str = Field("none", max_length=10, description="optimizer states to none, cpu or nvme")
    offload_params: str = Field("none", max_length=10, description="parameters to none, cpu or nvme")
    float8_all_gather: bool = Field(
        False, description="FSDP2 float8 all-gather (torchao; float8-tensorwise with FSDP only)"
    )


class ImageOptions(BaseModel):
    """Images of a vision-language model's sequence (``peakmem train|fit --images``)."""

    images: int | None = Field(None, ge=1, le=MAX_IMAGES, description="images per sequence")
    image_size: str | None = Field(None, min_length=3, max_length=20, description="WIDTHxHEIGHT in pixels")
    min_pixels: int | None = Field(None, ge=1, le=MAX_PIXELS_BOUND, description="Qwen-VL min_pixels")
    max_pixels: int | None = Field(None, ge=1, le=MAX_PIXELS_BOUND, description="Qwen-VL max_pixels")


class LongContextOptions(BaseModel):
    """Long-context training (``peakmem train|fit --ulysses --tiled-mlp --max-tokens-per-gpu``:
    :mod:`peakmem.formulas.long_context`)."""

    ulysses: int = Field(1, ge=1, le=MAX_DEGREE, description="DeepSpeed-Ulysses sequence-parallel degree")
    tiled_mlp: bool = Field(False, description="ALST tiled MLP (recomputed in backward)")
    tiled_mlp_shards: int | None = Field(None, ge=1, le=MAX_SEQ, description="tiled MLP shards")
    max_tokens_per_gpu: int | None = Field(
        None, ge=1, le=MAX_SEQ, description="verl token-budget micro-batch"
    )


class PostTrainingOptions(BaseModel):
    """A preference or RL job (``peakmem train|fit --objective``: :mod:`peakmem.post_training`)."""

    objective: Literal["sft", "dpo", "orpo", "simpo", "grpo", "rloo", "kto", "ppo", "distill"] = "sft"
    reference: Literal["auto", "separate", "adapter", "none", "precomputed"] = "auto"
    rollout: Literal["hf", "vllm-colocate", "vllm-server"] = "hf"
    beta: float | None = Field(None, ge=0, le=MAX_BETA, description="KL / preference coefficient")
    num_generations: int | None = Field(None, ge=1, le=MAX_GENERATIONS, description="completions per prompt")
    completion: int | None = Field(None, ge=1, le=MAX_SEQ, description="completion tokens within seq")
    steps_per_generation: int | None = Field(None, ge=1, le=MAX_GRAD_ACCUM)
    rollout_memory: float = Field(DEFAULT_ROLLOUT_MEMORY, gt=0, lt=1, description="vLLM colocated: its share")
    rollout_sleep: bool = Field(False, description="vLLM colocated: sleep mode outside rollout")
    teacher: str | None = Field(None, min_length=1, max_length=200, description="distill: the teacher model")
    critic: str | None = Field(None, min_length=1, max_length=200, description="ppo: the critic's backbone")
    entropy: bool = Field(False, description="verl: the actor's update computes the entropy")
    trainer: Literal["trl", "verl"] = Field("trl", description="grpo/rloo: TRL's trainer or verl's loop")


class TrainRequest(TrainOptions, ParallelOptions, ImageOptions, LongContextOptions, PostTrainingOptions):
    """``peakmem train``: the training options and the multi-GPU layout (per-rank answer)."""


class InferRequest(ModelChoice):
    """``peakmem infer``."""

    weights: str | None = Field(
        None,
        min_length=1,
        max_length=40,
        description=(
            "bf16, fp8, mxfp4, nf4, gptq-4bit-g128, ...; "
            "default: the checkpoint's quantization_config, else bf16"
        ),
    )
    kv_cache: KvDtype = KvDtype.AUTO
    batch: int = Field(1, ge=1, le=MAX_BATCH, description="concurrent sequences")
    context: int | None = Field(None, ge=1, le=MAX_SEQ, description="prompt + generated tokens per sequence")
    prompt: int | None = Field(None, ge=1, le=MAX_SEQ)
    engine: Engine = Engine.HF
    tp: int = Field(1, ge=1, le=MAX_DEGREE)
    pp: int = Field(1, ge=1, le=MAX_DEGREE, description="vLLM/SGLang pipeline stages")
    dp: int = Field(1, ge=1, le=MAX_DEGREE, description="vLLM/SGLang data-parallel ranks")
    ep: int = Field(
        1, ge=1, le=MAX_DEGREE, description="expert parallel: vLLM 1 or tp x dp, SGLang divides tp"
    )
    dp_attention: bool = Field(False, description="SGLang --enable-dp-attention")
    gpu_memory_utilization: float | None = Field(
        None, gt=0, le=1, description="vLLM gpu_memory_utilization / SGLang mem_fraction_static"
    )
    max_loras: int | None = Field(None, ge=0, le=MAX_LORA_SLOTS, description="vLLM multi-LoRA adapter slots")
    max_lora_rank: int | None = Field(None, ge=1, le=MAX_LORA_RANK, description="vLLM multi-LoRA slot rank")
    prefix_tokens: int = Field(0, ge=0, le=MAX_SEQ, description="a prompt prefix every request shares")
    draft: str | None = Field(
        None, min_length=1, max_length=MAX_NAME_LEN,
        description="speculative decoding: a draft model (a catalog name), mtp (the target's MTP layers) "
        "or ngram (n-gram lookup, no model)",
    )  # fmt: skip
    draft_method: Literal["draft_model", "eagle", "eagle3"] | None = Field(
        None, description="speculative decoding: what the draft is (vLLM method; EAGLE heads)"
    )
    num_speculative_tokens: int | None = Field(
        None,
        le=MAX_SPECULATIVE_TOKENS,
        description="speculative decoding: tokens the draft proposes per step",
    )
    # CUDA graphs (formulas/serving/cuda_graphs.py); the CLI's flags of the same names
    enforce_eager: bool = Field(False, description="vLLM --enforce-eager / SGLang --disable-cuda-graph")
    max_num_seqs: int | None = Field(None, ge=1, le=MAX_BATCH, description="vLLM --max-num-seqs")
    prefill_chunk: int | None = Field(
        None, ge=1, le=MAX_SEQ, description="vLLM --max-num-batched-tokens / SGLang --chunked-prefill-size"
    )
    vllm_entrypoint: Literal["serve", "llm"] = Field(
        "serve", description="vLLM's entry point: vllm serve, or the offline LLM class"
    )
    cudagraph_mode: str = Field(
        "auto", max_length=40, description="vLLM cudagraph_mode (auto: the release's)"
    )
    model_runner: Literal["auto", "v1", "v2"] = Field(
        "auto", description="vLLM VLLM_USE_V2_MODEL_RUNNER (auto: the release's for the model)"
    )
    cuda_graph_max_bs: int | None = Field(None, ge=1, le=MAX_BATCH, description="SGLang --cuda-graph-max-bs")
    disable_custom_all_reduce: bool = Field(False, description="vLLM / SGLang --disable-custom-all-reduce")
    attention_backend: Literal["fa3", "flashinfer", "triton"] | None = Field(
        None, description="SGLang --attention-backend (default: SGLang's for the model and the GPU)"
    )
    interconnect: Literal["", "nvlink", "xgmi", "pcie", "pcie-no-p2p"] | None = Field(
        None, description="how the tp GPUs are joined (peakmem.device.INTERCONNECTS; default: the GPU's)"
    )
    engine_version: str | None = Field(
        None, min_length=1, max_length=40, description="vLLM / SGLang / transformers / litgpt release"
    )
    # the recurrent state of SSM / linear-attention layers (formulas/recurrent_state.py)
    ssm_cache_dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="scan state dtype: vLLM --mamba-ssm-cache-dtype / SGLang --mamba-ssm-dtype"
    )
    conv_cache_dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="conv state dtype: vLLM --mamba-cache-dtype / SGLang SGLANG_MAMBA_CONV_DTYPE"
    )


class FitRequest(TrainOptions, ParallelOptions, ImageOptions, LongContextOptions, PostTrainingOptions):
    """``peakmem fit``: a training job (on one GPU, or its most loaded rank) checked on each GPU."""

    gpus: list[GpuArg] = Field(..., min_length=1, max_length=MAX_GPUS_PER_REQUEST)


class FitInferRequest(InferRequest):
    """``peakmem fit --infer``: a serving job checked on each GPU."""

    gpus: list[GpuArg] = Field(..., min_length=1, max_length=MAX_GPUS_PER_REQUEST)


class PlanRequest(TrainOptions):
    """``peakmem plan``: the fastest parallel layout on up to ``max_gpus`` of one GPU type."""

    gpus: list[GpuArg] = Field(
        ...,
        min_length=1,
        max_length=1,
        description="the one GPU type (the CLI's --gpu)",
        examples=[["h100-sxm"]],
    )
    max_gpus: int = Field(..., ge=1, le=MAX_PLAN_GPUS, description="the most GPUs to use")
    global_batch: int | None = Field(None, ge=1, le=MAX_GLOBAL_BATCH, description="sequences per step")


# --- response models -------------------------------------------------------------------------------
class EstimateResponse(BaseModel):
    """``peakmem train|infer --json`` (every key of it, ``verdicts`` and ``ways_down`` included when
    present), plus ``headline`` and ``chart``."""

    model_config = ConfigDict(extra="allow")

    method: str
    job: str
    model: dict[str, Any]
    setup: dict[str, Any]
    bytes_per_param: list[dict[str, Any]]
    model_state_bytes: int
    breakdown: dict[str, int]
    phases: dict[str, int]
    peak_phase: str
    peak_allocated_bytes: int
    peak_reserved_bytes: int
    device_total_bytes: int
    needed_bytes: int  # the device total less the cache the allocator frees before an OOM
    assumptions: list[str]
    headline: str
    chart: list[dict[str, Any]]


class _FitAnswer(BaseModel):
    """What ``peakmem fit --json`` and ``fit --infer --json`` share, plus ``headline`` and ``estimate``
    (the training or serving answer, as ``/api/train`` / ``/api/infer``, for the page's chart)."""

    model_config = ConfigDict(extra="allow")

    model: dict[str, Any]
    setup: dict[str, Any]
    fits_any: bool
    smallest_sufficient: str | None
    gpus: list[dict[str, Any]]
    search_space: list[dict[str, Any]]
    assumptions: list[str]
    headline: str
    estimate: EstimateResponse


class FitResponse(_FitAnswer):
    """``peakmem fit --json`` (every key of it), plus ``headline`` and ``estimate``."""

    device_total_bytes: int


class FitInferResponse(_FitAnswer):
    """``peakmem fit --infer --json`` (every key of it), plus ``headline`` and ``estimate``."""


class PlanResponse(BaseModel):
    """``peakmem plan --json`` (every key of it)."""

    model_config = ConfigDict(extra="allow")

    model: dict[str, Any]
    gpu: str
    capacity_bytes: int
    max_gpus: int
    global_batch: int
    seq_len: int
    layouts: list[dict[str, Any]]
    fewest_gpus: dict[str, Any] | None
    search_space: list[dict[str, Any]]
    assumptions: list[str]


class ModelEntry(BaseModel):
    name: str
    family: str
    hub_id: str
    aliases: list[str]
    source: str
    params: int | None


class GpuEntry(BaseModel):
    name: str
    display_name: str
    vendor: str
    memory_bytes: int
    usable_bytes: int
    aliases: list[str]
    bf16_tflops: float | None
    bandwidth_gbps: float | None
    source: str
