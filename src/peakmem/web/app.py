"""The JSON API behind ``peakmem serve``, and the static page it serves.

Endpoints (schema at ``/openapi.json``, read offline at ``/docs``):

Every answer is :func:`peakmem.question.answer`'s, the function behind the CLI's ``--json`` and the
Python API, so the three say the same for the same question.

- ``POST /api/train``: the CLI's ``peakmem train --json`` object, plus ``headline`` (the one-line
  answer) and ``chart`` (the stacked bars of :func:`peakmem.plot.chart_json`);
- ``POST /api/infer``: the CLI's ``peakmem infer --json`` object, plus ``headline`` and ``chart``;
- ``POST /api/fit``: the CLI's ``peakmem fit --json`` object (the planner's verdicts, ranked changes
  and limits per GPU), plus ``headline`` and ``estimate`` (the ``/api/train`` answer, for the page);
- ``POST /api/fit_infer``: ``peakmem fit --infer --json`` (per GPU: longest context, most sequences,
  ranked changes), plus ``headline`` and ``estimate`` (the ``/api/infer`` answer);
- ``POST /api/plan``: ``peakmem plan --json`` (the fastest layouts that fit, per-rank memory);
- ``GET /api/models``, ``GET /api/gpus``: the catalogs, as ``peakmem models|gpus --json``.

A model is a catalog name (``model``) or a pasted ``config.json`` object (``config``); the server
never reads paths or fetches from the network. Bad input is answered 422 (an unknown model or
GPU 404, with suggestions) with ``{"error": one line, "field": the field, "detail": [...]}``;
a body over :data:`MAX_BODY_BYTES` is answered 413 before it is parsed.
"""

from __future__ import annotations

import re
import threading
import webbrowser
from collections.abc import Awaitable, Callable, Mapping, MutableMapping, Sequence
from enum import Enum
from functools import cache
from pathlib import Path
from typing import Annotated, Any, Literal

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel, ConfigDict, Field, model_validator

from peakmem import __version__
from peakmem.errors import PeakmemError, UnknownNameError
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
from peakmem.post_training import DEFAULT_ROLLOUT_MEMORY, MAX_BETA, MAX_GENERATIONS
from peakmem.question import Answer, Question
from peakmem.training import (
    AttentionKernel,
    Framework,
    LossImpl,
    Method,
    OptimizerName,
    Precision,
)  # fmt: skip
from peakmem.units import MiB, fmt_count
from peakmem.web.hosts import HostCheck, allowed_hosts, host_name, send_error

STATIC_DIR = Path(__file__).with_name("static")

# --- limits: what the API accepts (each far beyond any real job, small enough to answer fast) ------
MAX_BODY_BYTES = 1 * MiB  # a config.json is a few KiB; the largest in the catalog is under 10 KiB
MAX_DRAIN_BYTES = 64 * MiB  # an oversized body is read (and dropped) up to this, so the client sees 413
# the option limits are the one table's (peakmem.options), so the page and the CLI refuse the same values
MAX_PLAN_GPUS = MAX_WORLD  # plan searches 405B on 65,536 H100s in under a second
MAX_GPUS_PER_REQUEST = 16
MAX_NAME_LEN = 200
# A pasted config: no integer above MAX_CONFIG_INT (hidden sizes are < 2**15, vocabularies < 2**19,
# contexts < 2**24), at most MAX_CONFIG_LAYERS layers (the deepest catalog model has 126), and at
# most MAX_PARAMS parameters in all (the largest published models have about 2 T).
MAX_CONFIG_INT = 2**24
MAX_CONFIG_LAYERS = 1024
MAX_PARAMS = 10**13
LAYER_KEYS = frozenset({
    "num_hidden_layers", "n_layer", "n_layers", "num_layers", "num_decoder_layers", "num_encoder_layers",
})  # fmt: skip
# Integers that are not sizes (token ids, seeds, RoPE bases): never bounded.
UNBOUNDED_KEY_PARTS = ("token_id", "theta", "seed", "base")


class ApiError(Exception):
    """An error answered as JSON: status, the field it concerns, one line."""

    def __init__(self, status: int, field: str, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.status = status
        self.field = field
        self.message = message
        self.extra = extra


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
    checkpointing: str = Field(
        "none", pattern=r"^(none|selective|op|full|every-[0-9]{1,4})$",
        description="none, selective, op, full, or every-N (every N-th layer checkpointed)",
    )  # fmt: skip
    attention: AttentionKernel = AttentionKernel.SDPA
    framework: Framework = Framework.HF
    lora_rank: int | None = Field(None, ge=1, le=MAX_LORA_RANK, description="LoRA rank r (default 8)")
    lora_alpha: float | None = Field(None, gt=0, description="LoRA scaling alpha (default 8)")
    lora_targets: str | None = Field(None, max_length=MAX_NAME_LEN, description="all-linear or q_proj,v_proj")
    quant: str | None = Field(None, max_length=10, description="qlora base: nf4 (default), fp4, int8")
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
    cudagraph_mode: str = Field(
        "auto", max_length=40, description="vLLM cudagraph_mode (auto: the release's)"
    )
    cuda_graph_max_bs: int | None = Field(None, ge=1, le=MAX_BATCH, description="SGLang --cuda-graph-max-bs")
    disable_custom_all_reduce: bool = Field(False, description="vLLM / SGLang --disable-custom-all-reduce")
    attention_backend: Literal["fa3", "flashinfer", "triton"] | None = Field(
        None, description="SGLang --attention-backend (default: SGLang's for the model and the GPU)"
    )
    interconnect: Literal["", "nvlink", "xgmi", "pcie", "pcie-no-p2p"] | None = Field(
        None, description="how the tp GPUs are joined (peakmem.device.INTERCONNECTS; default: the GPU's)"
    )
    engine_version: str | None = Field(None, min_length=1, max_length=40, description="vLLM / SGLang release")
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


# --- building blocks -------------------------------------------------------------------------------
_FIELD = re.compile(r"^(?:config\.json: )?(?:missing key '([^']+)'|-*([A-Za-z_][\w.\-]*)=)")


def field_of(error: Exception, default: str, prefix: str = "") -> str:
    """The field an error message names (``batch=0: ...`` -> ``batch``), else ``default``."""
    match = _FIELD.match(str(error))
    if not match:
        return default
    return prefix + (match.group(1) or match.group(2)).replace("-", "_")


def check_config_sizes(config: Mapping[str, Any], path: str = "config", depth: int = 0) -> None:
    """Reject absurd sizes in a pasted config before building anything from it."""
    for key, value in config.items():
        where = f"{path}.{key}"
        if isinstance(value, dict) and depth < 3:
            check_config_sizes(value, where, depth + 1)
        if not isinstance(value, int) or isinstance(value, bool):
            continue
        if any(part in key for part in UNBOUNDED_KEY_PARTS):
            continue
        limit = MAX_CONFIG_LAYERS if key in LAYER_KEYS else MAX_CONFIG_INT
        if value > limit:
            raise ApiError(422, where, f"{where}={value}: too large; at most {limit:,} is accepted")


def _spec(req: ModelChoice) -> Any:
    from peakmem.catalog import find_model, unknown_model
    from peakmem.resolve import resolve_model

    if req.model is not None:
        if find_model(req.model) is None:  # the server reads no paths and fetches nothing
            raise unknown_model(req.model)
        try:
            return resolve_model(req.model)
        except UnknownNameError:
            raise
        except PeakmemError as error:
            raise ApiError(422, "model", str(error)) from error
    from peakmem.hf import spec_from_config

    assert req.config is not None
    check_config_sizes(req.config)
    raw_name = req.config.get("_name_or_path")
    name = req.name or (raw_name if isinstance(raw_name, str) and raw_name else "pasted config.json")
    try:
        spec = spec_from_config(req.config, name=name)
    except PeakmemError as error:
        raise ApiError(422, field_of(error, "config", "config."), str(error)) from error
    if spec.params > MAX_PARAMS:
        raise ApiError(
            422,
            "config",
            f"config: {fmt_count(spec.params)} parameters; at most {fmt_count(MAX_PARAMS)} accepted",
        )
    return spec


def _config(req: ModelChoice) -> Mapping[str, Any]:
    """The config.json behind the request's model (a catalog entry's, or the pasted one)."""
    if req.config is not None:
        return req.config
    from peakmem.resolve import resolve_config

    assert req.model is not None
    return resolve_config(req.model)[1]


def _gpus(names: list[str]) -> list[Any]:
    from peakmem.resolve import resolve_gpu

    out = []
    for i, name in enumerate(names):
        try:
            out.append(resolve_gpu(name))
        except UnknownNameError:
            raise
        except PeakmemError as error:
            raise ApiError(422, f"gpus.{i}", str(error)) from error
    return out


# A request field is the CLI option of the same name (its argparse dest), but for these.
_CLI_DEST = {"gpu_count": "gpus"}
_API_FIELD = {dest: name for name, dest in _CLI_DEST.items()}
_NOT_CLI = frozenset({"model", "config", "name", "gpus"})  # the model and the GPUs are passed apart


def question_of(command: str, req: ModelChoice) -> Question:
    """The question ``peakmem COMMAND ... --json`` asks for the same request: the request's fields are
    the options of the same names (:mod:`peakmem.options`), what it leaves out their defaults."""
    from peakmem import options
    from peakmem.question import ask

    takes = {o.name for o in options.of(command)}
    given: dict[str, Any] = {}
    for name in type(req).model_fields:
        if name in _NOT_CLI:
            continue
        dest = _CLI_DEST.get(name, name)
        if dest not in takes:  # a field that the command does not take: a bug here
            raise AssertionError(f"peakmem {command} has no option for the request field {name}")
        value = getattr(req, name)
        given[dest] = value.value if isinstance(value, Enum) else value
    given["gpu"] = ",".join(req.gpus) or None
    draft = given.get("draft")
    if isinstance(draft, str) and draft not in ("mtp", "ngram"):
        from peakmem.catalog import find_model, unknown_model

        if find_model(draft) is None:  # a draft is a catalog name too: the server reads no paths
            raise unknown_model(draft)
    if command == "fit":
        given["infer"] = isinstance(req, InferRequest)
    from peakmem.simulate import measuring_lookup

    spec = _spec(req)
    return ask(command, given, spec=spec, costs=measuring_lookup(), config=_config(req))


def cli_answer(command: str, req: ModelChoice) -> Answer:
    """``peakmem COMMAND --json`` for the request: :func:`peakmem.question.answer`, the one function
    the CLI and the Python API answer with (a pasted config is passed as the model it builds)."""
    from peakmem.question import answer

    _gpus(req.gpus)  # each unknown or bad GPU named by its place in the list
    try:
        return answer(question_of(command, req))
    except UnknownNameError:
        raise
    except PeakmemError as error:  # named by the request's field (gpu_count, not the CLI's --gpus)
        field = field_of(error, "body")
        api_field = _API_FIELD.get(field, field)
        raise ApiError(
            422, api_field if api_field in type(req).model_fields else field, str(error)
        ) from error


def train_answer(req: TrainOptions) -> dict[str, Any]:
    """``peakmem train --json`` for the request, plus ``headline`` (the CLI's first line) and ``chart``
    (the bars of :func:`peakmem.plot.chart_json`)."""
    from peakmem.answers import train_headline
    from peakmem.plot import chart_json

    got = cli_answer("train", req)
    q, est = got.question, got.estimate
    assert est is not None and q.training is not None
    out = got.json
    out["headline"] = train_headline(q.spec.name, q.training, est, par=q.parallel)
    out["chart"] = chart_json(est, got.ways.pairs() if got.ways is not None else [])
    return out


def infer_answer(req: InferRequest) -> dict[str, Any]:
    """``peakmem infer --json`` for the request, plus ``headline`` and ``chart``."""
    from peakmem.plot import chart_json

    got = cli_answer("infer", req)
    out = got.json
    out["headline"] = got.served.headline
    out["chart"] = chart_json(got.served.estimate)
    return out


def fit_answer(req: FitRequest) -> dict[str, Any]:
    """``peakmem fit --json`` for the request, plus ``headline`` and ``estimate`` (the ``/api/train``
    answer to the same question, for the page's chart and tables)."""
    out = cli_answer("fit", req).json
    estimate = train_answer(req)
    out["headline"] = estimate["headline"]
    out["estimate"] = estimate
    return out


def fit_infer_answer(req: FitInferRequest) -> dict[str, Any]:
    """``peakmem fit --infer --json`` for the request, plus ``headline`` and ``estimate`` (the
    ``/api/infer`` answer to the same question)."""
    out = cli_answer("fit", req).json
    estimate = infer_answer(req)
    out["headline"] = estimate["headline"]
    out["estimate"] = estimate
    return out


def plan_answer(req: PlanRequest) -> dict[str, Any]:
    """``peakmem plan --json`` for the request."""
    return cli_answer("plan", req).json


@cache
def model_entries() -> list[dict[str, Any]]:
    from peakmem.catalog import MODELS
    from peakmem.hf import spec_from_config

    out = []
    for m in MODELS:
        try:
            params: int | None = spec_from_config(m.config, name=m.name).params
        except PeakmemError:
            params = None
        out.append({"name": m.name, "family": m.family, "hub_id": m.hub_id, "aliases": list(m.aliases),
                    "source": m.source, "params": params})  # fmt: skip
    return out


def gpu_entries() -> list[dict[str, Any]]:
    from peakmem.catalog import GPUS

    return [
        {"name": g.name, "display_name": g.display_name, "vendor": g.vendor, "memory_bytes": g.memory_bytes,
         "usable_bytes": g.usable_bytes, "aliases": list(g.aliases), "bf16_tflops": g.bf16_tflops,
         "bandwidth_gbps": g.bandwidth_gbps, "source": g.memory_source}
        for g in GPUS
    ]  # fmt: skip


# --- errors ----------------------------------------------------------------------------------------
def _error_response(status: int, field: str, message: str, **extra: Any) -> JSONResponse:
    detail = [{"loc": ["body", *field.split(".")], "msg": message, "type": "value_error"}]
    return JSONResponse(
        status_code=status, content={"error": message, "field": field, "detail": detail, **extra}
    )


def _validation_response(error: RequestValidationError) -> JSONResponse:
    detail = []
    for e in error.errors():
        loc = [str(part) for part in e.get("loc", ())]
        detail.append({"loc": loc, "msg": str(e.get("msg", "")), "type": str(e.get("type", ""))})
    first = detail[0] if detail else {"loc": ["body"], "msg": "invalid request"}
    field = ".".join(part for part in first["loc"] if part != "body") or "body"
    message = f"{field}: {first['msg']}"
    return JSONResponse(status_code=422, content={"error": message, "field": field, "detail": detail})


def _peakmem_response(error: PeakmemError, field: str) -> JSONResponse:
    if isinstance(error, UnknownNameError):
        kind_field = "gpus" if error.kind == "gpu" else "model"
        return _error_response(404, kind_field, str(error), suggestions=error.suggestions)
    return _error_response(422, field_of(error, field), str(error))


# --- the body limit --------------------------------------------------------------------------------
Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


class BodyLimit:
    """ASGI middleware: the body is read first, up to ``limit`` bytes; a longer one (by its
    Content-Length or as it streams in) is answered 413 and never reaches the application. The
    excess is read and dropped (up to MAX_DRAIN_BYTES) so that the client gets the answer."""

    def __init__(self, app: Callable[[Scope, Receive, Send], Awaitable[None]], limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope.get("headers") or ()).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.limit:
            await self._drain(receive, 0)
            await self._reject(send)
            return
        chunks: list[bytes] = []
        size = 0
        more = True
        while more:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            more = bool(message.get("more_body", False))
            if size > self.limit:
                if more:
                    await self._drain(receive, size)
                await self._reject(send)
                return
            chunks.append(chunk)
        body = b"".join(chunks)
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _drain(self, receive: Receive, seen: int) -> None:
        more = True
        while more and seen <= MAX_DRAIN_BYTES:
            message = await receive()
            if message["type"] != "http.request":
                return
            seen += len(message.get("body", b""))
            more = bool(message.get("more_body", False))

    async def _reject(self, send: Send) -> None:
        message = f"request body over {self.limit:,} bytes; a config.json is a few KiB"
        await send_error(send, 413, ["body"], message, "too_large")


# --- the application -------------------------------------------------------------------------------
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
)


def create_app(*, allowed_hosts: frozenset[str] | None = None, port: int = 0) -> FastAPI:
    """The application; with ``allowed_hosts``, a request whose Host header is not one of them (bare or
    with ``port``) is answered 400 (:mod:`peakmem.web.hosts`; ``serve`` always passes them)."""
    app = FastAPI(
        title="peakmem",
        version=__version__,
        description="How much GPU memory an LLM job takes, where every byte goes, and what makes it fit.",
        docs_url=None,  # FastAPI's docs pages load their scripts from a CDN; /docs is served locally
        redoc_url=None,
    )

    @app.exception_handler(RequestValidationError)
    async def _on_validation(_request: Request, error: RequestValidationError) -> JSONResponse:
        return _validation_response(error)

    @app.exception_handler(ApiError)
    async def _on_api_error(_request: Request, error: ApiError) -> JSONResponse:
        return _error_response(error.status, error.field, error.message, **error.extra)

    @app.exception_handler(PeakmemError)
    async def _on_peakmem_error(_request: Request, error: PeakmemError) -> JSONResponse:
        return _peakmem_response(error, "body")

    @app.post("/api/train", response_model=EstimateResponse, tags=["estimate"])
    def api_train(req: TrainRequest) -> dict[str, Any]:
        """GPU memory to train a model: the CLI's `peakmem train --json`, plus headline and chart."""
        return train_answer(req)

    @app.post("/api/infer", response_model=EstimateResponse, tags=["estimate"])
    def api_infer(req: InferRequest) -> dict[str, Any]:
        """GPU memory to serve a model: the CLI's `peakmem infer --json`, plus headline and chart."""
        return infer_answer(req)

    @app.post("/api/fit", response_model=FitResponse, tags=["estimate"])
    def api_fit(req: FitRequest) -> dict[str, Any]:
        """Per GPU: does it fit, the largest batch and seq that fit, and the changes that make it fit."""
        return fit_answer(req)

    @app.post("/api/fit_infer", response_model=FitInferResponse, tags=["estimate"])
    def api_fit_infer(req: FitInferRequest) -> dict[str, Any]:
        """Serving, per GPU: does it fit, the longest context and most sequences that fit, and the
        changes that make it fit: the CLI's `peakmem fit --infer --json`, plus headline and estimate."""
        return fit_infer_answer(req)

    @app.post("/api/plan", response_model=PlanResponse, tags=["estimate"])
    def api_plan(req: PlanRequest) -> dict[str, Any]:
        """The fastest parallel layouts that fit on up to max_gpus of one GPU: `peakmem plan --json`."""
        return plan_answer(req)

    @app.get("/api/models", response_model=list[ModelEntry], tags=["catalog"])
    def api_models() -> list[dict[str, Any]]:
        """The model catalog (as `peakmem models --json`, with parameter counts)."""
        return model_entries()

    @app.get("/api/gpus", response_model=list[GpuEntry], tags=["catalog"])
    def api_gpus() -> list[dict[str, Any]]:
        """The GPU catalog (as `peakmem gpus --json`)."""
        return gpu_entries()

    @app.get("/", include_in_schema=False)
    def index() -> FileResponse:
        return FileResponse(STATIC_DIR / "index.html", headers={"Content-Security-Policy": CSP})

    @app.get("/docs", include_in_schema=False)
    def docs() -> FileResponse:
        return FileResponse(STATIC_DIR / "docs.html", headers={"Content-Security-Policy": CSP})

    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")
    app.add_middleware(BodyLimit, limit=MAX_BODY_BYTES)
    if allowed_hosts is not None:
        app.add_middleware(HostCheck, allowed=allowed_hosts, port=port)  # outermost: checked first
    return app


def serve(
    host: str = "127.0.0.1", port: int = 8765, *, open_browser: bool = False, allow_hosts: Sequence[str] = ()
) -> None:
    """Run the API and the page until interrupted; it answers only requests whose Host header names it
    (``allow_hosts``: more names). uvicorn 0.54 has no header-read timeout (its ``timeout_keep_alive``
    starts only after a response); h11 caps a request's headers at 16 KiB."""
    import uvicorn

    url = f"http://{host_name(host)}:{port}/"
    print(f"peakmem {__version__}: serving {url} (API docs: {url}docs); Ctrl-C stops", flush=True)
    if open_browser:
        threading.Timer(1.0, webbrowser.open, args=(url,)).start()
    app = create_app(allowed_hosts=allowed_hosts(host, allow_hosts), port=port)
    uvicorn.run(app, host=host, port=port, log_level="warning")
