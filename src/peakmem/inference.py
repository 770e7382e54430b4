"""What an inference job is: weight format (:mod:`peakmem.weight_formats`), KV-cache dtype, batch, context,
engine, GPUs.

Names follow what people run: ``hf`` is transformers ``generate`` (a dynamic cache that grows
token by token), ``vllm`` preallocates a paged KV cache up to ``gpu_memory_utilization``,
``sglang`` does the same with one-token pages, ``llamacpp`` runs GGUF files with a fixed-size KV
cache of ``n_ctx`` tokens and offloads ``n_gpu_layers`` layers to the GPU.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from fractions import Fraction

from peakmem.choice import Choice
from peakmem.device import check_interconnect
from peakmem.errors import InputError, require
from peakmem.model import STATE_DTYPES, ModelSpec
from peakmem.releases import Release, parse_release
from peakmem.serving_layout import ServingLayout
from peakmem.sglang_defaults import SglangDefaults, sglang_defaults
from peakmem.validate import (
    MAX_DEVICE_BYTES,
    MAX_GPUS,
    MAX_TOKENS,
    check_bool,
    check_int,
    check_real,
    too_large,
)
from peakmem.vllm_defaults import VllmBatch, check_entrypoint, vllm_batch
from peakmem.weight_formats import (
    TORCHAO_SCHEMES,
    CheckpointWeights,
    Scheme,
    WeightFormat,
    parse_weight_format,
)


class Engine(Choice):
    HF = "hf"  # transformers generate()
    VLLM = "vllm"
    SGLANG = "sglang"
    LLAMACPP = "llamacpp"
    LITGPT = "litgpt"  # Lit-GPT generate/base.py (formulas/serving/litgpt.py)


class KvDtype(Choice):
    AUTO = "auto"  # the compute dtype (bf16 unless the weights are fp16/fp32)
    FP32 = "fp32"
    FP16 = "fp16"
    BF16 = "bf16"
    FP8 = "fp8"  # vLLM/SGLang kv_cache_dtype="fp8" (e4m3, per-layer scalar scales)
    INT8 = "int8"  # llama.cpp -ctk q8_0 / HQQ 8-bit: 8 bits + 16-bit scale per 32 elements
    INT4 = "int4"  # llama.cpp -ctk q4_0 / quanto 4-bit: 4 bits + 16 bits of scale per 32 elements


# Storage bits per cached element. int8/int4 carry one fp16 scale per block of 32 elements:
# ggml-common.h block_q8_0 = {ggml_half d; int8_t qs[32]} = 34 bytes / 32 and block_q4_0 =
# {ggml_half d; uint8_t qs[16]} = 18 bytes / 32. transformers' QuantizedCache (quanto, q_group_size=64,
# fp16 scale + zero point per group: 4 + 32/64 bits) stores the same 4.5 bits for int4.
KV_BITS: dict[KvDtype, Fraction] = {
    KvDtype.FP32: Fraction(32),
    KvDtype.FP16: Fraction(16),
    KvDtype.BF16: Fraction(16),
    KvDtype.FP8: Fraction(8),
    KvDtype.INT8: Fraction(34 * 8, 32),
    KvDtype.INT4: Fraction(18 * 8, 32),
}

MlaCache = str  # "auto" | "latent" | "expanded"
MLA_CACHE_CHOICES = ("auto", "latent", "expanded")
# The recurrent state's dtypes a user may ask (InferenceSetup ssm_cache_dtype / conv_cache_dtype): vLLM's
# MambaDType (vllm/config/cache.py: "auto", "float32", "float16", "bfloat16"; releases of 2025 took
# "auto" and "float32" only), SGLang's --mamba-ssm-dtype choices (server_args.py) and the
# SGLANG_MAMBA_CONV_DTYPE names (configs/mamba_utils.py dtype_map); "auto": the engine's default
STATE_CACHE_DTYPES = ("auto", *STATE_DTYPES)
STATE_DTYPE_ENGINES = ("vllm", "sglang")


# --- the setup -----------------------------------------------------------------------------------
DEFAULT_WEIGHTS = "bf16"  # when neither --weights nor the checkpoint's quantization_config names one
# vLLM EngineArgs defaults (vllm/engine/arg_utils.py): gpu_memory_utilization=0.9, block_size=16.
VLLM_GPU_MEMORY_UTILIZATION = 0.9
VLLM_BLOCK_SIZE = 16
# SGLang's defaults (mem_fraction_static, cuda_graph_max_bs, chunked_prefill_size) by GPU: sglang_defaults.py
# SGLang --attention-backend values whose CUDA-graph state peakmem models (formulas/serving/sglang_graphs.py)
SGLANG_ATTENTION_BACKENDS = ("fa3", "flashinfer", "triton")


# vLLM LoRAConfig (vllm/config/lora.py, vLLM 0.11): max_loras=1 and max_lora_rank=16 by default, the
# rank one of MaxLoRARanks = Literal[1, 8, 16, 32, 64, 128, 256, 320, 512] (formulas/serving/lora_slots.py).
VLLM_DEFAULT_MAX_LORAS = 1
VLLM_DEFAULT_MAX_LORA_RANK = 16
VLLM_MAX_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


# vLLM's speculative methods peakmem models (vllm/config/speculative.py ``SpeculativeMethod``):
# a separate draft model, an EAGLE / EAGLE-3 head, the target's own MTP layers, n-gram lookup.
DRAFT_METHODS = ("draft_model", "eagle", "eagle3", "mtp", "ngram")


@dataclass(frozen=True, kw_only=True)
class Draft:
    """A draft for speculative decoding (formulas/serving/speculative.py): its name as given, its
    spec (None for ``ngram``: no weights), the format its checkpoint's quantization_config names
    ("": the target's compute dtype, as vLLM loads a draft: vllm/config/speculative.py
    ``dtype=self.target_model_config.dtype``) and its vLLM ``method`` (:data:`DRAFT_METHODS`).
    For ``eagle3`` ``draft_vocab_size`` is the head's vocabulary (0: the target's).
    Its vocabulary and tokenizer are not checked against the target's."""

    name: str
    spec: ModelSpec | None
    weights: str = ""
    method: str = "draft_model"
    draft_vocab_size: int = 0

    def __post_init__(self) -> None:
        require(isinstance(self.name, str) and bool(self.name), "draft", self.name, "a model name")
        methods = ", ".join(DRAFT_METHODS)
        require(self.method in DRAFT_METHODS, "draft_method", self.method, f"one of {methods}")
        if self.method == "ngram":
            require(self.spec is None, "draft", self.name, "an n-gram draft has no model")
        elif not isinstance(self.spec, ModelSpec):
            raise InputError(f"draft={self.name!r}: its spec must be a ModelSpec")
        if self.weights:
            parse_weight_format(self.weights)
        check_int("draft_vocab_size", self.draft_vocab_size, minimum=0, maximum=MAX_TOKENS, what="tokens")

    @property
    def mtp(self) -> bool:
        """The target's own multi-token-prediction layers (--draft mtp)."""
        return self.method == "mtp"


# --- quantized kernels (formulas/quant_kernels.py) ------------------------------------------------
class GptqKernel(Choice):
    """The auto-gptq backend transformers' GPTQ integration runs (optimum ``GPTQQuantizer``; optimum's
    benchmark names them so): ``exllama`` (v1), ``exllamav2`` (``exllama_config={"version": 2}``) or
    ``cuda-old`` (``use_exllama=False`` without act-order). Each allocates its own workspace."""

    EXLLAMA = "exllama"
    EXLLAMAV2 = "exllamav2"
    CUDA_OLD = "cuda-old"


GPTQ_KERNEL_BITS = {GptqKernel.EXLLAMA: (4,), GptqKernel.EXLLAMAV2: (4,), GptqKernel.CUDA_OLD: (2, 3, 4, 8)}


# --- CUDA graphs (formulas/serving/cuda_graphs.py) -------------------------------------------------
class CacheImplementation(Choice):
    """transformers ``generate``'s ``cache_implementation`` (generation/configuration_utils.py; the cache
    classes in cache_utils.py): ``dynamic`` (DynamicCache, the default: grows by ``torch.cat`` every
    step) or ``static`` (StaticCache: every layer's K and V allocated at ``max_cache_len`` = prompt + new
    tokens on the first update, then written in place with ``index_copy_``; what ``torch.compile``'d
    decoding uses)."""

    DYNAMIC = "dynamic"
    STATIC = "static"


class CudagraphMode(Choice):
    """vLLM ``compilation_config.cudagraph_mode`` (vllm/config/compilation.py CUDAGraphMode); ``auto``:
    the version's default (PIECEWISE 0.8-0.10, FULL_AND_PIECEWISE from 0.11; V0 before 0.8 captures
    FULL decode graphs). SGLang captures FULL decode graphs (``none``: --disable-cuda-graph)."""

    AUTO = "auto"
    NONE = "none"
    PIECEWISE = "piecewise"
    FULL = "full"
    FULL_DECODE_ONLY = "full_decode_only"
    FULL_AND_PIECEWISE = "full_and_piecewise"


class ModelRunner(Choice):
    """vLLM's GPU model runner (``VLLM_USE_V2_MODEL_RUNNER``: ``v1`` = 0, ``v2`` = 1); ``auto``: the
    release's choice for the model (formulas/serving/cuda_graphs.py ``vllm_model_runner``)."""

    AUTO = "auto"
    V1 = "v1"
    V2 = "v2"


# The newest release of each engine whose CUDA-graph accounting was read (formulas/serving/cuda_graphs.py):
# vLLM 0.27 (gpustack/runner PR #251 runs 0.27.1; from 0.20 the V1 model runner's estimate comes out of the
# KV budget; the V2 runner, default for dense models from 0.25, reserves nothing before 0.29).
# hf: the transformers release; litgpt: tag v0.5.13 (formulas/serving/litgpt.py; "0.0": the 2023 lit-gpt)
CURRENT_ENGINE_VERSION = {"vllm": "0.27", "sglang": "0.5", "hf": "5.23", "litgpt": "0.5.13"}
# Lit-GPT's --quantize choices engine litgpt takes (generate/base.py ``quantize: Literal[...]``, bnb.* only)
LITGPT_FORMATS = ("nf4", "nf4-dq", "fp4", "fp4-dq", "int8")
LITGPT_KV_DTYPES = (KvDtype.AUTO, KvDtype.BF16, KvDtype.FP16, KvDtype.FP32)  # its KVCache: the precision's


def litgpt_release(setup: InferenceSetup) -> Release:
    """The litgpt release asked (``engine_version``; "0.0": the 2023 lit-gpt repository, before litgpt 0.1),
    else the newest read (``CURRENT_ENGINE_VERSION``)."""
    default = CURRENT_ENGINE_VERSION["litgpt"]
    return parse_release(setup.engine_version or default, field="engine_version", examples="0.5.13 or 0.0")


# transformers v4.36.0 (Dec 2023) brought the Cache classes (cache_utils.py DynamicCache, updated in place);
# before it a decoder's past_key_values was a tuple of per-layer (K, V) tuples rebuilt every step
TRANSFORMERS_CACHE_CLASSES = (4, 36)
TRANSFORMERS_STATIC_CACHE = (4, 38)  # v4.38.0: StaticCache and generate(cache_implementation="static")
# transformers PR #31292 (merged 2024-07; in 4.45.0.dev0 per linkedin/Liger-Kernel issue #118, and in
# 4.45's modeling code as optimum-habana PR #1359's upgrade diff shows): generate passes
# num_logits_to_keep=1, so the prefill forward makes the last position's logits only. Before it
# LlamaForCausalLM.forward (v4.35 modeling_llama.py) ran lm_head over every prompt position and then
# ``logits = logits.float()``.
TRANSFORMERS_LOGITS_TO_KEEP = (4, 45)


def parse_engine_version(text: object) -> tuple[int, int]:
    """``0.21``, ``v0.10.1.1``, ``0.8.5.post1`` -> (major, minor) (peakmem.releases)."""
    major, minor, _ = parse_release(text, field="engine_version", examples="0.21 or 0.10.1")
    return major, minor


# Engines that run a draft model next to the target (vLLM speculative_config; transformers
# assisted generation, assistant_model=...).
DRAFT_ENGINES = ("vllm", "sglang", "hf")

# llama.cpp common defaults (common/common.h): n_batch 2048, n_ubatch 512.
LLAMACPP_N_UBATCH = 512


@dataclass(frozen=True, kw_only=True)
class InferenceSetup:
    """One inference job. ``context`` counts prompt plus generated tokens per sequence."""

    weights: str = DEFAULT_WEIGHTS
    kv_cache: KvDtype = KvDtype.AUTO
    batch: int = 1  # concurrent sequences
    context: int | None = None  # None: the model's limit (max_position_embeddings)
    prompt: int | None = None  # prefill length; None: the whole context is prompt
    engine: Engine = Engine.HF
    tp: int = 1  # tensor-parallel GPUs
    # pipeline / data / expert parallelism and SGLang's DP attention (peakmem.serving_layout)
    pp: int = 1
    dp: int = 1
    ep: int = 1
    dp_attention: bool = False
    gpu_bytes: int | None = None  # one GPU's memory (vLLM sizes its KV pool from it; fit limits)
    gpu_name: str = ""  # that GPU's name as torch reports it (vLLM's batch defaults read it; "": not known)
    # that GPU's nvidia-smi total (torch's plus the driver's reserve), which SGLang's default fraction and
    # tiers read (server_args.py get_device_memory_capacity); None: gpu_bytes
    gpu_smi_bytes: int | None = None
    vllm_entrypoint: str = "serve"  # vllm serve or the offline LLM class (peakmem.vllm_defaults)
    interconnect: str = ""  # how the node's GPUs are joined (peakmem.device.INTERCONNECTS; "": not known)
    # vLLM gpu_memory_utilization / SGLang mem_fraction_static; None: the engine's default
    gpu_memory_utilization: float | None = None
    block_size: int | None = None  # paged-cache tokens per block; None: the engine's default
    prefill_chunk: int | None = None  # chunked prefill: tokens per forward; None: engine default
    keep_all_logits: bool = False  # logits for every prompt position (generate keeps only the last)
    cache_implementation: CacheImplementation = CacheImplementation.DYNAMIC  # transformers generate's cache
    # generate after a loop of plain forwards over the same batch and prompt in the same process, each
    # output (cache and logits) held until the next call returns (optimum-benchmark's inference
    # benchmark: ``_ = backend.forward(...)``); the caching allocator keeps their segments for generate
    forward_loop: bool = False
    n_gpu_layers: int | None = None  # llama.cpp -ngl; None: all layers on the GPU
    n_ubatch: int = LLAMACPP_N_UBATCH
    mla_cache: MlaCache = "auto"  # MLA: cache the latent or the expanded keys/values
    strict: bool = False  # context beyond the model's limit is an error, not a warning
    # vLLM multi-LoRA (--enable-lora): adapter slots on the GPU (0: LoRA off) of max_lora_rank (None: 16)
    max_loras: int | None = None  # None: 1 (vLLM's default) when max_lora_rank is given, else off
    max_lora_rank: int | None = None
    prefix_tokens: int = 0  # a prompt prefix every request shares (automatic prefix caching)
    # speculative decoding: a draft model and the tokens it proposes per step (vLLM speculative_config)
    draft: Draft | None = None
    num_speculative_tokens: int | None = None
    # the checkpoint's own quantization_config (None: not read, or the config has none)
    checkpoint: CheckpointWeights | None = None
    # CUDA graphs (formulas/serving/cuda_graphs.py): vLLM --enforce-eager / SGLang --disable-cuda-graph,
    # vLLM --max-num-seqs (None: 256) and cudagraph_mode, SGLang --cuda-graph-max-bs (None: by gpu_bytes),
    # and the engine's release (None: CURRENT_ENGINE_VERSION): where the capture memory is accounted
    enforce_eager: bool = False
    max_num_seqs: int | None = None
    cudagraph_mode: CudagraphMode = CudagraphMode.AUTO
    model_runner: ModelRunner = ModelRunner.AUTO  # vLLM VLLM_USE_V2_MODEL_RUNNER
    cuda_graph_max_bs: int | None = None
    # vLLM / SGLang --disable-custom-all-reduce: at TP > 1 the graphs capture NCCL all-reduces
    disable_custom_all_reduce: bool = False
    # SGLang --attention-backend ("": SGLang's default for the model on ``gpu_architecture``, the catalog
    # GPU's architecture; "" there: Hopper's): its CUDA-graph state (formulas/serving/sglang_graphs.py)
    attention_backend: str = ""
    gpu_architecture: str = ""
    engine_version: str | None = None
    gptq_kernel: GptqKernel | None = None  # transformers' GPTQ backend (None: not named)
    # the recurrent state of SSM / linear-attention layers (formulas/recurrent_state.py): the scan state's
    # dtype (vLLM --mamba-ssm-cache-dtype, SGLang --mamba-ssm-dtype) and the conv state's (vLLM
    # --mamba-cache-dtype, SGLang SGLANG_MAMBA_CONV_DTYPE); "auto": the engine's default for the model
    ssm_cache_dtype: str = "auto"
    conv_cache_dtype: str = "auto"

    def __post_init__(self) -> None:
        if self.checkpoint is not None and not isinstance(self.checkpoint, CheckpointWeights):
            raise InputError(f"checkpoint={self.checkpoint!r}: a CheckpointWeights or None")
        if not isinstance(self.engine, Engine):  # a CLI spelling: "vllm"
            object.__setattr__(self, "engine", Engine.parse(self.engine, "engine"))
        if not isinstance(self.kv_cache, KvDtype):
            object.__setattr__(self, "kv_cache", KvDtype.parse(self.kv_cache, "kv_cache"))
        fmt = parse_weight_format(self.weights)
        check_int("batch", self.batch, maximum=MAX_TOKENS, what="sequences")
        for name in ("context", "prompt", "block_size", "prefill_chunk"):
            if getattr(self, name) is not None:
                check_int(name, getattr(self, name), maximum=MAX_TOKENS, what="tokens")
        check_int("tp", self.tp, maximum=MAX_GPUS, what="GPUs; no cluster has more")
        for name in ("gpu_bytes", "gpu_smi_bytes"):
            if getattr(self, name) is not None:
                check_int(name, getattr(self, name), maximum=MAX_DEVICE_BYTES, what="bytes")
        check_interconnect(self.interconnect)
        if self.gpu_memory_utilization is not None:
            check_real("gpu_memory_utilization", self.gpu_memory_utilization, minimum=0.0, maximum=1.0)
        for name in ("keep_all_logits", "strict", "forward_loop"):
            check_bool(name, getattr(self, name))
        if self.context is not None and self.batch * self.context > MAX_TOKENS:
            raise too_large("batch x context", self.batch * self.context, MAX_TOKENS, "tokens")
        require(self.batch >= 1, "batch", self.batch, "must be at least 1")
        if self.context is not None:
            require(self.context >= 1, "context", self.context, "must be at least 1")
        if self.prompt is not None:
            require(self.prompt >= 1, "prompt", self.prompt, "must be at least 1")
            require(
                self.context is None or self.prompt <= self.context, "prompt", self.prompt,
                f"must not exceed context={self.context}",
            )  # fmt: skip
        require(self.tp >= 1, "tp", self.tp, "must be at least 1")
        if self.gpu_bytes is not None:
            require(self.gpu_bytes > 0, "gpu_bytes", self.gpu_bytes, "must be positive")
        if self.gpu_memory_utilization is not None:
            require(
                0.0 < self.gpu_memory_utilization <= 1.0, "gpu_memory_utilization",
                self.gpu_memory_utilization, "must be in (0, 1]",
            )  # fmt: skip
        if self.block_size is not None:
            require(self.block_size >= 1, "block_size", self.block_size, "must be at least 1")
        if self.prefill_chunk is not None:
            require(self.prefill_chunk >= 1, "prefill_chunk", self.prefill_chunk, "must be at least 1")
        if self.n_gpu_layers is not None:
            require(self.n_gpu_layers >= 0, "n_gpu_layers", self.n_gpu_layers, "must be 0 or more")
        require(self.n_ubatch >= 1, "n_ubatch", self.n_ubatch, "must be at least 1")
        if not isinstance(self.cache_implementation, CacheImplementation):
            require(isinstance(self.cache_implementation, str), "cache_implementation",
                    self.cache_implementation, "must be text")  # fmt: skip
            impl = CacheImplementation.parse(self.cache_implementation, "cache_implementation")
            object.__setattr__(self, "cache_implementation", impl)
        if self.cache_implementation is not CacheImplementation.DYNAMIC:
            require(
                self.engine is Engine.HF, "cache_implementation", self.cache_implementation.value,
                f"transformers generate's cache (engine hf), not engine={self.engine.value}",
            )  # fmt: skip
        if self.forward_loop:
            require(self.engine is Engine.HF, "forward_loop", True,
                    f"forwards before hf generate (engine hf), not {self.engine.value}")  # fmt: skip
            # replayed where generate's prefill is that plain forward (formulas/serving/cache_growth.py)
            require(self.version < TRANSFORMERS_CACHE_CLASSES, "forward_loop", True,
                    "replayed for transformers before 4.36 (engine_version), whose generate prefill is the "
                    "model's plain forward")  # fmt: skip
        self._check_lora_and_prefix()
        self._check_draft()
        self._check_graphs()
        self._check_gptq_kernel(fmt)
        self._check_state_dtypes()
        if self.engine is Engine.LITGPT:
            self._check_litgpt()
        _ = self.layout  # builds and checks the parallel layout (peakmem.serving_layout)
        require(
            self.mla_cache in MLA_CACHE_CHOICES, "mla_cache", self.mla_cache, f"choose {MLA_CACHE_CHOICES}"
        )
        # Which engines load which formats.
        if fmt.scheme is Scheme.GGUF:
            require(
                self.engine is Engine.LLAMACPP, "weights", self.weights,
                f"GGUF files run in llama.cpp (--engine llamacpp), not engine={self.engine.value}",
            )  # fmt: skip
        if self.engine is Engine.LLAMACPP:
            require(
                fmt.scheme in (Scheme.GGUF, Scheme.FLOAT), "weights", self.weights,
                "llama.cpp runs GGUF types (q4_k_m, q8_0, f16, ...)",
            )  # fmt: skip
        if fmt.scheme in (Scheme.BNB_INT8, Scheme.BNB_4BIT):
            require(
                self.engine in (Engine.HF, Engine.VLLM, Engine.LITGPT), "weights", self.weights,
                f"bitsandbytes formats run in transformers, vLLM or Lit-GPT, not engine={self.engine.value}",
            )  # fmt: skip
        if fmt.scheme in TORCHAO_SCHEMES:
            require(
                self.engine in (Engine.HF, Engine.VLLM, Engine.SGLANG), "weights", self.weights,
                f"torchao formats run in transformers, vLLM or SGLang, not engine={self.engine.value}",
            )  # fmt: skip
        if self.engine in (Engine.VLLM, Engine.SGLANG):
            require(
                self.kv_cache not in (KvDtype.INT8, KvDtype.INT4), "kv_cache", self.kv_cache.value,
                f"{self.engine.value} caches KV in 16-bit or fp8 only",
            )  # fmt: skip
        if self.engine is Engine.LLAMACPP:
            require(self.tp == 1, "tp", self.tp, "llama.cpp splits layers, not tensors; use tp=1")
        if self.n_gpu_layers is not None:
            require(
                self.engine is Engine.LLAMACPP, "n_gpu_layers", self.n_gpu_layers,
                "only llama.cpp offloads layers to the CPU",
            )  # fmt: skip

    def _check_lora_and_prefix(self) -> None:
        """vLLM's LoRA slots (vllm/config/lora.py LoRAConfig) and a shared prefix (pooled engines)."""
        if self.max_loras is not None:
            check_int("max_loras", self.max_loras, minimum=0, maximum=MAX_TOKENS, what="adapters")
        if self.max_lora_rank is not None:
            check_int("max_lora_rank", self.max_lora_rank, minimum=0, maximum=MAX_TOKENS, what="(the rank)")
            require(self.max_lora_rank in VLLM_MAX_LORA_RANKS, "max_lora_rank", self.max_lora_rank,
                    f"vLLM takes one of {', '.join(map(str, VLLM_MAX_LORA_RANKS))}")  # fmt: skip
        if self.lora_slots:
            require(self.engine is Engine.VLLM, "max_loras", self.lora_slots,
                    f"LoRA slots are modelled for engine=vllm, not {self.engine.value}")  # fmt: skip
        check_int("prefix_tokens", self.prefix_tokens, minimum=0, maximum=MAX_TOKENS, what="tokens")
        if self.prefix_tokens:
            require(self.engine in (Engine.VLLM, Engine.SGLANG), "prefix_tokens", self.prefix_tokens,
                    f"prefix caching is modelled for vllm and sglang, not {self.engine.value}")  # fmt: skip
            require(self.context is None or self.prefix_tokens < self.context, "prefix_tokens",
                    self.prefix_tokens, f"must be below context={self.context} (each request has "
                    "tokens of its own)")  # fmt: skip

    def _check_draft(self) -> None:
        """Speculative decoding: vLLM's speculative_config (vllm/config/speculative.py) or transformers'
        assisted generation (generation/utils.py: assisted generation takes batch size 1)."""
        k = self.num_speculative_tokens
        if k is not None:
            check_int("num_speculative_tokens", k, maximum=MAX_TOKENS, what="tokens")
            require(k >= 1, "num_speculative_tokens", k, "must be at least 1")
            require(self.draft is not None, "num_speculative_tokens", k, "needs a draft model (--draft)")
        if self.draft is None:
            return
        if not isinstance(self.draft, Draft):
            raise InputError(f"draft={self.draft!r}: a Draft or None")
        name = self.draft.name
        engines = ", ".join(DRAFT_ENGINES)
        require(self.engine.value in DRAFT_ENGINES, "draft", name,
                f"speculative decoding is modelled for {engines}, not {self.engine.value}")  # fmt: skip
        if self.engine is Engine.VLLM:
            # SpeculativeConfig: a draft model needs num_speculative_tokens (unless its config has n_predict)
            require(k is not None, "num_speculative_tokens", k, "vLLM needs it with a draft model")
        elif self.engine is Engine.SGLANG:
            # peakmem maps K to --speculative-num-steps K, --speculative-eagle-topk 1,
            # --speculative-num-draft-tokens K + 1 (formulas/serving/speculative.py)
            require(k is not None, "num_speculative_tokens", k, "SGLang's speculative_num_steps: give it")
        else:
            method = self.draft.method
            require(method == "draft_model", "draft", name,
                    f"transformers' assisted generation takes a draft model, not {method}")  # fmt: skip
            require(self.batch == 1, "batch", self.batch, "transformers' assisted generation takes batch 1")

    def _check_graphs(self) -> None:
        """CUDA-graph options (formulas/serving/cuda_graphs.py): each belongs to the engine that has it."""
        if not isinstance(self.cudagraph_mode, CudagraphMode):
            require(
                isinstance(self.cudagraph_mode, str), "cudagraph_mode", self.cudagraph_mode, "must be text"
            )
            mode = CudagraphMode.parse(self.cudagraph_mode, "cudagraph_mode")
            object.__setattr__(self, "cudagraph_mode", mode)
        if not isinstance(self.model_runner, ModelRunner):
            require(isinstance(self.model_runner, str), "model_runner", self.model_runner, "must be text")
            object.__setattr__(self, "model_runner", ModelRunner.parse(self.model_runner, "model_runner"))
        engine = self.engine.value
        pooled = self.engine in (Engine.VLLM, Engine.SGLANG)
        for flag in ("enforce_eager", "disable_custom_all_reduce"):
            check_bool(flag, getattr(self, flag))
            if getattr(self, flag):
                require(pooled, flag, True, f"CUDA graphs are captured by vllm and sglang, not {engine}")
        for name, owner in (("max_num_seqs", "vllm"), ("cuda_graph_max_bs", "sglang")):
            value = getattr(self, name)
            if value is not None:
                check_int(name, value, maximum=MAX_TOKENS, what="sequences")
                require(engine == owner, name, value, f"an option of engine={owner}, not {engine}")
        if self.attention_backend:
            require(engine == "sglang", "attention_backend", self.attention_backend,
                    f"an option of engine=sglang, not {engine}")  # fmt: skip
            require(self.attention_backend in SGLANG_ATTENTION_BACKENDS, "attention_backend",
                    self.attention_backend, f"one of {', '.join(SGLANG_ATTENTION_BACKENDS)}")  # fmt: skip
        for name in ("gpu_architecture", "gpu_name"):
            require(isinstance(getattr(self, name), str), name, getattr(self, name), "must be text")
        check_entrypoint(self.vllm_entrypoint)
        if self.vllm_entrypoint != "serve":
            require(engine == "vllm", "vllm_entrypoint", self.vllm_entrypoint,
                    f"an option of engine=vllm, not {engine}")  # fmt: skip
        if self.engine_version is not None:
            versioned = pooled or self.engine in (Engine.HF, Engine.LITGPT)
            require(versioned, "engine_version", self.engine_version,
                    f"versions are modelled for vllm, sglang, hf and litgpt, not {engine}")  # fmt: skip
            parse_engine_version(self.engine_version)
        if self.cache_implementation is CacheImplementation.STATIC:
            require(self.version >= TRANSFORMERS_STATIC_CACHE, "cache_implementation", "static",
                    f"transformers {self.engine_version} has no StaticCache (from 4.38)")  # fmt: skip
        if self.cudagraph_mode is not CudagraphMode.AUTO:
            mode_name = self.cudagraph_mode.value
            require(engine == "vllm", "cudagraph_mode", mode_name, f"an option of engine=vllm, not {engine}")
            require(self.version >= (0, 8), "cudagraph_mode", mode_name,
                    f"vLLM {self.engine_version} (V0) captures FULL decode graphs only")  # fmt: skip
        if self.model_runner is not ModelRunner.AUTO:
            runner = self.model_runner.value
            require(engine == "vllm", "model_runner", runner, f"an option of engine=vllm, not {engine}")
            require(self.version >= (0, 8), "model_runner", runner,
                    f"vLLM {self.engine_version} is V0: no V1 / V2 model runner")  # fmt: skip

    def _check_litgpt(self) -> None:
        """The options Lit-GPT's generate has no counterpart for (formulas/serving/litgpt.py): one line
        naming the field."""
        fmt = self.weight_format
        require(fmt.scheme is Scheme.FLOAT or fmt.name in LITGPT_FORMATS, "weights", self.weights,
                "Lit-GPT's --quantize takes bnb.nf4, bnb.nf4-dq, bnb.fp4, bnb.fp4-dq or bnb.int8 "
                "(engine litgpt), or a float format")  # fmt: skip
        require(self.kv_cache in LITGPT_KV_DTYPES, "kv_cache", self.kv_cache.value,
                "Lit-GPT's KVCache holds the precision's dtype (engine litgpt)")  # fmt: skip
        require(self.tp == 1, "tp", self.tp, "Lit-GPT's generate/base.py quantizes on one device only; its "
                "multi-GPU generate is not modelled (engine litgpt)")  # fmt: skip
        for name in ("prefill_chunk", "gpu_memory_utilization", "block_size"):
            require(getattr(self, name) is None, name, getattr(self, name),
                    "Lit-GPT's generate runs the whole prompt in one forward into its own cache "
                    "(engine litgpt)")  # fmt: skip
        require(not self.keep_all_logits, "keep_all_logits", True,
                "Lit-GPT's GPT.forward makes every prompt position's logits (engine litgpt)")  # fmt: skip
        litgpt_release(self)

    def _check_state_dtypes(self) -> None:
        """``ssm_cache_dtype`` / ``conv_cache_dtype``: a name of :data:`STATE_CACHE_DTYPES`; other than
        "auto", a flag of vllm and sglang (transformers and llama.cpp have none: fp32 scan state)."""
        for name in ("ssm_cache_dtype", "conv_cache_dtype"):
            value = getattr(self, name)
            require(isinstance(value, str) and value in STATE_CACHE_DTYPES, name, value,
                    f"choose one of {', '.join(STATE_CACHE_DTYPES)}")  # fmt: skip
            if value != "auto":
                require(self.engine.value in STATE_DTYPE_ENGINES, name, value,
                        f"a flag of vllm and sglang, not engine={self.engine.value}")  # fmt: skip

    def _check_gptq_kernel(self, fmt: WeightFormat) -> None:
        """``gptq_kernel`` names a backend of transformers' GPTQ integration (engine hf, GPTQ weights)."""
        if self.gptq_kernel is None:
            return
        kernel = self.gptq_kernel
        if not isinstance(kernel, GptqKernel):  # a CLI spelling: "exllamav2"
            require(isinstance(kernel, str), "gptq_kernel", kernel, "must be text")
            kernel = GptqKernel.parse(kernel, "gptq_kernel")
            object.__setattr__(self, "gptq_kernel", kernel)
        # transformers' AwqConfig(version="exllama") runs AutoAWQ's exllama v2 linears by default
        awq = fmt.scheme is Scheme.AWQ and kernel is GptqKernel.EXLLAMAV2
        require(fmt.scheme is Scheme.GPTQ or awq, "gptq_kernel", kernel.value,
                f"a GPTQ backend (exllamav2 also for AWQ); weights={fmt.name} are neither")  # fmt: skip
        require(self.engine is Engine.HF, "gptq_kernel", kernel.value,
                f"a backend of transformers' GPTQ integration (engine hf), not "
                f"engine={self.engine.value}")  # fmt: skip
        bits = GPTQ_KERNEL_BITS[kernel]
        require(fmt.bits in bits, "gptq_kernel", kernel.value,
                f"runs {'/'.join(map(str, bits))}-bit weights, not {fmt.bits}-bit")  # fmt: skip

    @property
    def version(self) -> tuple[int, int]:
        """The engine release asked about (``engine_version``), else the newest one read."""
        default = CURRENT_ENGINE_VERSION.get(self.engine.value, "0.0")
        return parse_engine_version(self.engine_version or default)

    @property
    def layout(self) -> ServingLayout:
        """The deployment's parallel layout (what one rank holds follows from it)."""
        return ServingLayout(engine=self.engine.value, tp=self.tp, pp=self.pp, dp=self.dp, ep=self.ep,
                             dp_attention=self.dp_attention)  # fmt: skip

    @property
    def weight_format(self) -> WeightFormat:
        return parse_weight_format(self.weights)

    def weights_assumption(self) -> str | None:
        """How the weight format relates to the checkpoint's quantization_config, for the answer's
        assumptions; None when no quantization_config was read."""
        ck, name = self.checkpoint, self.weight_format.name
        if ck is None:
            return None
        if not ck.weights:
            return (
                f"the checkpoint's config.json quantization_config ({ck.read}) is not modelled: weights "
                f"priced as {name}; give --weights to price the stored format"
            )
        if parse_weight_format(ck.weights).name == name:
            return (
                f"weights priced from the checkpoint's config.json quantization_config ({ck.read}) as {name}"
            )
        return f"--weights {name} overrides the checkpoint's quantization_config ({ck.read}: {ck.weights})"

    def memory_fraction(self, gpu_bytes: int) -> float:
        """The share of a GPU a pooled engine takes: the one given, else vLLM's 0.9 or SGLang's default."""
        if self.gpu_memory_utilization is not None:
            return self.gpu_memory_utilization
        if self.engine is Engine.SGLANG:
            return self.sglang_defaults(gpu_bytes).mem_fraction_static
        return VLLM_GPU_MEMORY_UTILIZATION

    def sglang_defaults(self, gpu_bytes: int | None) -> SglangDefaults:
        """SGLang's chunked_prefill_size, cuda_graph_max_bs and mem_fraction_static on a GPU of ``gpu_bytes``
        (None: not known) for this layout and draft; the values given (--prefill-chunk, --cuda-graph-max-bs,
        --gpu-memory-utilization) are kept (sglang_defaults.py)."""
        own = self.gpu_smi_bytes is not None and gpu_bytes == self.gpu_bytes  # nvidia-smi's total of this GPU
        return sglang_defaults(
            self.gpu_smi_bytes if own else gpu_bytes, tp=self.tp, pp=self.pp, dp=self.dp,
            dp_attention=self.dp_attention,
            draft_method=self.draft.method if self.draft is not None else None,
            chunked_prefill_size=self.prefill_chunk, cuda_graph_max_bs=self.cuda_graph_max_bs,
            mem_fraction_static=self.gpu_memory_utilization,
        )  # fmt: skip

    def vllm_batch(self, max_model_len: int | None = None) -> VllmBatch:
        """vLLM's max_num_seqs and max_num_batched_tokens for this job with sequences of ``max_model_len``
        tokens (None: ``context``) (--max-num-seqs and --prefill-chunk kept, else the release's defaults
        for the GPU and the entry point: peakmem.vllm_defaults)."""
        return vllm_batch(
            self.version, gpu_bytes=self.gpu_bytes, gpu_name=self.gpu_name, entrypoint=self.vllm_entrypoint,
            max_model_len=max_model_len or self.context, max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=self.prefill_chunk,
        )  # fmt: skip

    def on_gpu(self, gpu_bytes: int, gpu_name: str = "", smi_bytes: int | None = None) -> InferenceSetup:
        """This job on one GPU of ``gpu_bytes`` (torch's total) named ``gpu_name``, nvidia-smi's total
        ``smi_bytes`` (None: the same): what a per-GPU verdict estimates."""
        return replace(self, gpu_bytes=gpu_bytes, gpu_name=gpu_name, gpu_smi_bytes=smi_bytes)

    @property
    def effective_block_size(self) -> int:
        """Tokens per KV page: vLLM 16 (EngineArgs.block_size), SGLang 1 (page_size), others 1."""
        if self.block_size is not None:
            return self.block_size
        return VLLM_BLOCK_SIZE if self.engine is Engine.VLLM else 1

    @property
    def lora_slots(self) -> int:
        """vLLM's max_loras: the one given, else its default 1 when a rank is given, else 0 (LoRA off)."""
        if self.max_loras is not None:
            return self.max_loras
        return VLLM_DEFAULT_MAX_LORAS if self.max_lora_rank is not None else 0

    @property
    def lora_rank(self) -> int:
        """vLLM's max_lora_rank: the one given, else LoRAConfig's default 16."""
        return self.max_lora_rank if self.max_lora_rank is not None else VLLM_DEFAULT_MAX_LORA_RANK

    def echo(self) -> dict[str, object]:
        """The inputs, JSON-ready, for ``Estimate.setup``."""
        return {
            "weights": self.weight_format.name, "kv_cache": self.kv_cache.value, "batch": self.batch,
            "context": self.context, "prompt": self.prompt, "engine": self.engine.value, "tp": self.tp,
            "gpu_bytes": self.gpu_bytes, "gpu_memory_utilization": self.gpu_memory_utilization,
            "block_size": self.effective_block_size, "prefill_chunk": self.prefill_chunk,
            "keep_all_logits": self.keep_all_logits, "n_gpu_layers": self.n_gpu_layers,
            "cache_implementation": self.cache_implementation.value,
            "mla_cache": self.mla_cache, "strict": self.strict,
            # shown only when asked: the echo of every other job stays as it was
            **({"max_loras": self.lora_slots, "max_lora_rank": self.lora_rank} if self.lora_slots else {}),
            **({"prefix_tokens": self.prefix_tokens} if self.prefix_tokens else {}),
            **({"pp": self.pp, "dp": self.dp, "ep": self.ep, "dp_attention": self.dp_attention,
                "gpus": self.layout.gpus} if self.layout.parallel else {}),
            **({"draft": self.draft.name, "num_speculative_tokens": self.num_speculative_tokens}
               if self.draft is not None else {}),
            **{flag: True for flag in ("enforce_eager", "disable_custom_all_reduce") if getattr(self, flag)},
            # what decides the tensor-parallel all-reduces (the catalog GPU's or --interconnect)
            **({"interconnect": self.interconnect} if self.interconnect and self.tp > 1 else {}),
            **({"vllm_entrypoint": self.vllm_entrypoint} if self.vllm_entrypoint != "serve" else {}),
            **({"attention_backend": self.attention_backend} if self.attention_backend else {}),
            **{name: getattr(self, name) for name in ("max_num_seqs", "cuda_graph_max_bs", "engine_version")
               if getattr(self, name) is not None},
            **({"cudagraph_mode": self.cudagraph_mode.value}
               if self.cudagraph_mode is not CudagraphMode.AUTO else {}),
            **({"model_runner": self.model_runner.value}
               if self.model_runner is not ModelRunner.AUTO else {}),
            **({"gptq_kernel": self.gptq_kernel.value} if self.gptq_kernel is not None else {}),
            **({"forward_loop": True} if self.forward_loop else {}),
            **{name: getattr(self, name) for name in ("ssm_cache_dtype", "conv_cache_dtype")
               if getattr(self, name) != "auto"},
        }  # fmt: skip
