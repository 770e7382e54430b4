"""What SGLang's CUDA graph runners capture, and the static buffers they allocate, with and without
speculative decoding (``--speculative-algorithm EAGLE|EAGLE3|NEXTN|STANDALONE|NGRAM``).
formulas/serving/cuda_graphs.py turns it into graphs and bytes.

Read in the sglang 0.5.5 release (its wheel, ``python/sglang/srt``; a release of the 0.5 line peakmem takes
for SGLang) and checked against the 0.5.23 release (2026-10-30, the newest) and the code index's
``speculative/eagle_draft_cuda_graph_runner.py`` @ 00023be5e5f2:

* **Batch sizes.** ``server_args.py`` ``_generate_cuda_graph_batch_sizes`` (0.5.23:
  ``arg_groups/cuda_graph_hook.py`` ``generate_decode_cuda_graph_batch_sizes``, which appends
  cuda_graph_max_bs when missing): without speculation ``[1, 2, 4, 8, 12] + range(16, 257, 8) + range(272,
  512, 16)``; with any ``speculative_algorithm`` "less padding for smaller batch sizes": ``range(1, 9) +
  range(10, 33, 2) + range(40, 65, 4) + range(72, 257, 8) + range(272, max + 1, 16)``, each up to
  cuda_graph_max_bs. Then ``cuda_graph_runner.py`` ``get_batch_sizes_to_capture`` (0.5.23:
  ``runner/base_cuda_graph_runner.py``) keeps those ``<= req_to_token_pool.size`` and adds the pool's size
  when the list goes past it. The pool holds ``max_running_requests``, which ``_handle_speculative_decoding``
  (0.5.23: ``arg_groups/speculative_hook.py`` ``_handle_eagle_family`` / ``_handle_ngram``) sets to 48
  unless given (formulas/serving/sglang_spec.py :data:`SGLANG_SPEC_MAX_RUNNING_REQUESTS`): with speculation
  every runner captures at most 48 sizes' worth, ``[1..8, 10..32 by 2, 40, 44, 48]`` = 23 graphs.
* **The target's graphs verify.** ``CudaGraphRunner.__init__``: for EAGLE / EAGLE3 / STANDALONE / NGRAM
  (NEXTN is EAGLE) the target captures ``ForwardMode.TARGET_VERIFY`` with ``num_tokens_per_bs =
  speculative_num_draft_tokens``: each batch size's graph is a forward of ``bs x num_draft_tokens`` tokens
  (0.5.23: ``resolve_num_tokens_per_req(phase="target_verify")``).
* **The draft's decode runner** (``speculative/eagle_draft_cuda_graph_runner.py``
  ``EAGLEDraftCudaGraphRunner``; created by ``eagle_worker.py`` ``EAGLEWorker.init_cuda_graphs`` only when
  ``speculative_num_steps > 1``; 0.5.23: ``eagle_worker_v2.py`` ``_capture_cuda_graphs``, the same test):
  the same ``capture_bs`` (``get_batch_sizes_to_capture`` on the draft's runner, which shares the target's
  req_to_token_pool), ``num_tokens_per_bs = speculative_eagle_topk``; ONE graph per batch size holds
  ``draft_forward``, whose loop runs ``speculative_num_steps - 1`` draft-model forwards ("we get 1 token from
  draft prefill and (#spec steps - 1) tokens here").
* **The draft-extend runner** (``eagle_draft_extend_cuda_graph_runner.py``
  ``EAGLEDraftExtendCudaGraphRunner``, created when the draft has a draft-extend attention backend:
  ``draft_utils.py`` ``create_draft_extend_backend`` gives one for flashinfer, triton, fa3, trtllm and
  aiter, None for flashmla): the same ``capture_bs``, one draft forward of ``bs x (speculative_num_steps +
  1)`` tokens (0.5.23: ``speculative_num_draft_tokens``, the same at topk 1).
* **One pool.** Both draft runners capture with ``pool=get_global_graph_memory_pool()`` and then
  ``set_global_graph_memory_pool(graph.pool())``: the target's pool, which every graph reuses. The draft's
  own ModelRunner captures no decode graphs (``disable_cuda_graph`` is set while it is built).
* **Their static buffers** (allocated under ``torch.device("cuda")`` in each ``__init__``, outside the pool,
  at the largest batch size ``B`` = max(capture_bs); ``N = B x num_tokens_per_bs``; 0.5.5's layout):
  draft decode: ``input_ids`` [N] int64, ``req_pool_indices`` [B] int32, ``seq_lens`` [B] int32,
  ``extend_seq_lens`` [B] int32, ``out_cache_loc`` [N x speculative_num_steps] int64, ``positions`` [N]
  int64, ``mrope_positions`` [3, N] int64, ``topk_p`` [B, topk] fp32, ``topk_index`` [B, topk] int64,
  ``hidden_states`` [B, draft hidden] in the model dtype. Draft extend: ``input_ids``, ``out_cache_loc``,
  ``positions`` [N] int64, ``mrope_positions`` [3, N] int64, ``req_pool_indices``, ``seq_lens``,
  ``extend_seq_lens``, ``accept_length`` [B] int32, ``hidden_states`` [N, 3 x target_hidden_size] for
  EAGLE-3 (its fc reads three target layers) else [N, draft hidden], and ``next_token_logits_buffer`` [B,
  vocab] fp32 (``draft_vocab_size`` for an EAGLE-3 head, else the draft's vocabulary). 0.5.23 shares
  same-named, same-sized input buffers across runners (``input_buffers.py`` ``share_input_buffer``) and takes
  the draft-extend logits buffer from ``graph_shared_output.py`` ``GraphSharedOutput`` (one per vocabulary
  size, shared with the target's where the sizes match): up to the logits buffer less there.

* **The target runner's own static buffers** (``CudaGraphRunner.__init__``, under ``torch.device``, outside
  the pool, at ``B`` = max(capture_bs), ``N = B x num_tokens_per_bs``): ``input_ids``, ``out_cache_loc``,
  ``positions`` [N] int64, ``mrope_positions`` [3, N] int64, ``req_pool_indices``, ``seq_lens`` [B] int32,
  ``num_token_non_padded`` [1] int32, ``custom_mask`` bool of ``(seq_lens.sum() + N) x num_tokens_per_bs``
  (seq_lens filled with the backend's ``get_cuda_graph_seq_len_fill_value``, 1 for every backend read), and
  ``next_token_logits_buffer`` [N, vocab_size] fp32 (the full vocabulary: ``model_config.vocab_size``), by far
  the largest: 160 x 151,936 x 4 B = 92.7 MiB for Qwen3-8B. 0.5.23 (``decode_cuda_graph_runner.py``
  ``DecodeInputBuffers.create``) has the same rows and takes the logits buffer from ``GraphSharedOutput``.
* **The attention backend's CUDA-graph state**: ``CudaGraphRunner.__init__`` calls
  ``attn_backend.init_cuda_graph_state(B, N)`` before the capture, and ``model_runner.py``
  ``init_device_graphs`` takes ``before_mem`` before the runner is built, so the log's "Capture cuda graph end
  ... mem usage" holds it. SGLang's default backend (``server_args.py``
  ``_handle_attention_backend_compatibility``, ``_handle_model_specific_adjustments``): fa3 on Hopper for
  the architectures of ``utils/common.py`` ``is_fa3_default_architecture`` and for MLA models, flashinfer
  for the other MHA models, triton for MLA models off Hopper and Blackwell (:func:`sglang_attention_backend`);
  one-token pages (``page_size`` 1) for all three. Per backend instance (``layers/attention``, 0.5.5):

  - fa3 (``flashattention_backend.py`` ``FlashAttentionBackend.init_cuda_graph_state``): the decode metadata
    (``cache_seqlens`` [B], ``cu_seqlens_q`` / ``cu_seqlens_k`` [B + 1] int32, ``page_table`` [B, context]
    int32, ``strided_indices`` [context] int64); with speculation (``speculative_num_draft_tokens`` set, on
    the target's and the draft's backends alike) ``page_table_draft_decode`` [B, context] int32 and two
    more such sets (``target_verify_metadata``, ``draft_extend_metadata``); and, for every model,
    ``encoder_metadata``'s ``encoder_page_table`` [B, context] int32 (0.5.23 allocates it only for
    encoder-decoder models: 4 B a slot less).
  - flashinfer (``flashinfer_backend.py`` ``FlashInferAttnBackend.init_cuda_graph_state``):
    ``cuda_graph_kv_indices`` [N x context] int32 for each wrapper (2 with sliding-window layers) and, unless
    ``skip_prefill`` (the draft's decode backends), ``cuda_graph_custom_mask`` [N x context] uint8. Each
    captured batch size then builds its own wrappers (``init_forward_metadata_capture_cuda_graph``): a
    ``BatchDecodeWithPagedKVCacheWrapper`` per wrapper for decode, a ``BatchPrefillWithPagedKVCacheWrapper``
    (backend "auto") for target-verify and draft-extend; flashinfer 0.5.0 (the release sglang 0.5.5 pins)
    allocates in each an 8 MiB ``_int_workspace_buffer`` on the device (``decode.py`` / ``prefill.py``
    ``__init__``), and the prefill wrapper also a ``_vector_sparse_indices_buffer`` of 16 Mi int32, a
    ``_vector_sparse_indptr_buffer`` and a ``_kv_lens_buffer`` of 32,768 int32: they live as long as the
    graph. The multi-step draft backend (``FlashInferMultiStepDraftBackend``) holds one
    [speculative_num_steps, B x context] int32 index buffer for its ``speculative_num_steps - 1`` backends.
  - triton (``triton_backend.py`` ``TritonAttnBackend.init_cuda_graph_state``): ``cuda_graph_attn_logits``
    [N, heads, max_kv_splits, v_head_dim] and ``cuda_graph_attn_lse`` [N, heads, max_kv_splits] fp32
    (heads of the rank, tp // dp ways with DP attention; ``max_kv_splits``: ``triton_attention_num_kv_splits``
    8; v_head_dim the value buffer's width, ``kv_lora_rank`` for MLA), ``cuda_graph_num_kv_splits`` [N] int32,
    ``cuda_graph_kv_indices`` [N x context] int64, ``cuda_graph_custom_mask`` [N x context] uint8 unless
    ``skip_prefill``, and with a sliding window [N x window] int64 indices; the multi-step draft backend
    holds one [speculative_num_steps, N x context] int64 index buffer and one [N] int32 split count.

  With speculation each runner's backend has its own state: the target's at ``N = B x (K + 1)``, the draft
  decode runner's ``speculative_num_steps - 1`` backends (``*MultiStepDraftBackend.init_cuda_graph_state``),
  and the draft-extend backend at ``N = B x (K + 1)``: K + 1 instances for the chain peakmem models. The
  context they are sized by is the served one (``model_config.context_len``: --context-length, else the
  model's limit), the draft's overridden to the target's.

Not modelled: the DP-attention gathered-token counters ([dp] int32), two-batch overlap's and DP attention's
batch-size alignment (``mul_base``), topk > 1 trees (peakmem's chain has topk 1), pipeline parallelism's proxy
tensors, LoRA's graph batch info, Llama 4's local-attention metadata, flashinfer's per-wrapper indptr clones
(``cuda_graph_qk_indptr`` / ``qo_indptr``: max_running_requests + 1 int32 each), the state of the other
attention backends (flashinfer's MLA backend, SGLang's default for MLA models on Blackwell; trtllm_mha /
trtllm_mla, DeepSeek-V3's and gpt-oss's on Blackwell; flashmla, aiter: the note says so and the term holds
none), multi-layer EAGLE / frozen-KV MTP runners of 0.5.23, and SGLang's prefill (breakable / piecewise)
graphs.
"""

from __future__ import annotations

from dataclasses import dataclass

from peakmem.device import is_rocm
from peakmem.formulas.serving.context import resolve_context
from peakmem.formulas.serving.eagle import EAGLE3, EAGLE3_AUX_HIDDEN_STATES
from peakmem.formulas.serving.sglang_spec import SGLANG_EAGLE_TOPK, SGLANG_SPEC_MAX_RUNNING_REQUESTS
from peakmem.inference import Engine, InferenceSetup
from peakmem.model import Attention, ModelSpec
from peakmem.units import MiB

# SGLang picks cuda_graph_max_bs by GPU memory and TP (0.5.5 server_args.py _handle_gpu_memory_settings;
# 0.5.23 arg_groups/memory_hook.py): peakmem.sglang_defaults.sglang_tier, from ``setup.gpu_bytes`` (the GPU
# the answer is for: formulas/serving/fit.py sets it per GPU, as SGLang sees its own), unless
# --cuda-graph-max-bs is given; 160, SGLang's own fallback when the GPU's memory is not known, without a GPU
# (an H100 at tp 1 captures 36 sizes up to 256, an RTX 4090 at tp 1 7 up to 24). With speculative decoding
# max_running_requests (48) caps the sizes first.

# The draft proposers that run SGLang's EAGLE worker (eagle_worker.py; STANDALONE is a subclass): they capture
# the draft decode and draft-extend runners. NGRAM runs no draft model: only the target's verify graphs.
SGLANG_DRAFT_GRAPH_METHODS = ("draft_model", "eagle", EAGLE3, "mtp")

# Element sizes of the runners' buffers (torch.int64 / int32 / float32 / bool and uint8)
INT64_BYTES = 8
INT32_BYTES = 4
FP32_BYTES = 4
BOOL_BYTES = 1
MROPE_SECTIONS = 3  # mrope_positions: [3, N]
# seq_lens' fill value in the captured graphs: get_cuda_graph_seq_len_fill_value of fa3, flashinfer, triton,
# flashinfer_mla, flashmla and trtllm_mla all return 1 (0.5.5); the custom_mask holds (B x 1 + N) x tokens
SEQ_LEN_FILL_VALUE = 1

# SGLang's attention backends (server_args.py --attention-backend) and its default choice (0.5.5
# _handle_attention_backend_compatibility: "We will turn on FA3 on hopper unless user use spec decode with
# topk > 1 or page_size > 1"; MLA: FA3 on Hopper, flashinfer on Blackwell, else triton)
FA3, FLASHINFER, TRITON = "fa3", "flashinfer", "triton"
# the GPU architecture the default backend is taken for when the GPU is not known (no catalog GPU named):
# Hopper's
SGLANG_ASSUMED_ARCHITECTURE = "hopper"
# utils/common.py is_fa3_default_architecture (0.5.5): the MHA models that get fa3 on Hopper
FA3_DEFAULT_ARCHITECTURES = frozenset({
    "Qwen2ForCausalLM", "Llama4ForConditionalGeneration", "LlamaForCausalLM", "Olmo2ForCausalLM",
    "Gemma2ForCausalLM", "Gemma3ForConditionalGeneration", "Qwen3ForCausalLM", "Qwen3MoeForCausalLM",
    "Glm4MoeForCausalLM", "Glm4vMoeForConditionalGeneration", "Step3VLForConditionalGeneration",
})  # fmt: skip
# server_args.py _handle_model_specific_adjustments (0.5.5): DeepseekV3ForCausalLM gets trtllm_mla on sm100;
# GptOssForCausalLM trtllm_mha on sm100, fa3 on sm90, else triton
BLACKWELL_BACKENDS = {"DeepseekV3ForCausalLM": "trtllm_mla", "GptOssForCausalLM": "trtllm_mha"}
GPT_OSS = "GptOssForCausalLM"
# flashinfer 0.5.0 (pinned by sglang 0.5.5): what one wrapper built for a captured batch size allocates on the
# device. decode.py BatchDecodeWithPagedKVCacheWrapper.__init__ / prefill.py
# BatchPrefillWithPagedKVCacheWrapper.__init__: _int_workspace_buffer (8 * 1024 * 1024,) uint8; the
# prefill wrapper with backend "auto" (SGLang's target-verify and draft-extend wrappers) also
# _vector_sparse_indices_buffer (16 * 1024 * 1024,) int32 ("assume maximum accumulate kv length is 16M"),
# _vector_sparse_indptr_buffer and _kv_lens_buffer (32768,) int32 ("assume maximum batch size is 32768")
FLASHINFER_INT_WORKSPACE_BYTES = 8 * MiB
FLASHINFER_PREFILL_WRAPPER_BYTES = (
    FLASHINFER_INT_WORKSPACE_BYTES + 16 * MiB * INT32_BYTES + 2 * 32768 * INT32_BYTES
)
# server_args.py triton_attention_num_kv_splits default (16 on ROCm: _handle_amd_specifics)
TRITON_NUM_KV_SPLITS = 8


def sglang_capture_sizes(max_bs: int) -> tuple[int, ...]:
    """SGLang's decode batch sizes without speculation up to ``max_bs`` (appended when not in the list)."""
    base = (1, 2, 4, 8, 12, *range(16, 257, 8), *range(272, 513, 16))
    sizes = [n for n in base if n <= max_bs]
    if max_bs not in sizes:
        sizes.append(max_bs)
    return tuple(sizes)


def sglang_spec_capture_sizes(max_bs: int, pool: int = SGLANG_SPEC_MAX_RUNNING_REQUESTS) -> tuple[int, ...]:
    """SGLang's batch sizes with speculative decoding: the speculative list up to ``max_bs`` (appended when
    not in it), then ``get_batch_sizes_to_capture``: the req_to_token pool's size ``pool`` added when the list
    goes past it, and the sizes above it dropped."""
    base = (*range(1, 9), *range(10, 33, 2), *range(40, 65, 4), *range(72, 257, 8),
            *range(272, max_bs + 1, 16))  # fmt: skip
    sizes = [n for n in base if n <= max_bs]
    if max_bs not in sizes:
        sizes.append(max_bs)
    if max(sizes) > pool:
        sizes.append(pool)
    return tuple(sorted({n for n in sizes if n <= pool}))


@dataclass(frozen=True, kw_only=True)
class SglangCapture:
    """The runners SGLang builds on one rank: the batch sizes every runner captures, the tokens each batch
    entry of the target's graphs holds (1 without speculation, else speculative_num_draft_tokens), the draft
    forwards in each draft-decode graph (0: no such runner), the tokens per entry of the draft-extend graphs
    (0: no such runner); what they allocate outside the graph pool: the draft runners' static buffers
    (``static_bytes``), the target runner's (``target_static_bytes``), and the attention backend's
    (``backend``, "" when not modelled) CUDA-graph state (``backend_bytes``: init_cuda_graph_state of every
    backend instance and the per-batch-size wrappers' workspaces)."""

    capture_bs: tuple[int, ...]
    verify_tokens: int = 1
    draft_forwards: int = 0
    draft_tokens: int = SGLANG_EAGLE_TOPK
    extend_tokens: int = 0
    static_bytes: int = 0
    target_static_bytes: int = 0
    backend: str = ""
    backend_bytes: int = 0
    context: int = 0

    def __post_init__(self) -> None:
        if not self.capture_bs or min(self.capture_bs) < 1:
            raise ValueError(f"SglangCapture.capture_bs={self.capture_bs!r}: batch sizes >= 1")
        for name in ("verify_tokens", "draft_forwards", "draft_tokens", "extend_tokens", "static_bytes",
                     "target_static_bytes", "backend_bytes", "context"):  # fmt: skip
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"SglangCapture.{name}={value!r}: a count or size >= 0")

    @property
    def outside_pool_bytes(self) -> int:
        """Everything the runners and backends allocate outside the graph pool (in the log's mem usage)."""
        return self.static_bytes + self.target_static_bytes + self.backend_bytes

    def describe(self) -> str:
        """The note's words for the bytes outside the pool."""
        if self.backend:
            state = f"{self.backend} attention backend's graph state {self.backend_bytes} B"
            state += f" (context {self.context})"
        else:
            state = "the attention backend's graph state not modelled (not fa3, flashinfer or triton)"
        drafts = f", the draft runners' {self.static_bytes} B" if self.static_bytes else ""
        return (
            f"outside the pool: the target runner's static buffers {self.target_static_bytes} B (input ids, "
            f"positions, cache locations, fp32 logits){drafts}; the {state} (sglang_graphs.py)"
        )


def target_buffer_bytes(*, max_bs: int, tokens_per_bs: int, vocab: int) -> int:
    """``CudaGraphRunner.__init__``'s buffers at ``max_bs`` (0.5.5): N = max_bs x ``tokens_per_bs``."""
    n = max_bs * tokens_per_bs
    # input_ids, out_cache_loc, positions, mrope_positions [3, N]; next_token_logits_buffer [N, vocab] fp32
    per_token = INT64_BYTES * (3 + MROPE_SECTIONS) + vocab * FP32_BYTES
    per_seq = 2 * INT32_BYTES  # req_pool_indices, seq_lens
    custom_mask = (max_bs * SEQ_LEN_FILL_VALUE + n) * tokens_per_bs * BOOL_BYTES
    return n * per_token + max_bs * per_seq + custom_mask + INT32_BYTES  # + num_token_non_padded [1]


def draft_decode_buffer_bytes(*, max_bs: int, steps: int, hidden: int, act_bytes: int,
                              topk: int = SGLANG_EAGLE_TOPK) -> int:  # fmt: skip
    """``EAGLEDraftCudaGraphRunner.__init__``'s buffers at ``max_bs`` (0.5.5): N = max_bs x topk tokens."""
    n = max_bs * topk
    per_token = INT64_BYTES * (1 + steps + 1 + MROPE_SECTIONS)  # input_ids, out_cache_loc, positions, mrope
    per_seq = 3 * INT32_BYTES + topk * (FP32_BYTES + INT64_BYTES) + hidden * act_bytes
    return n * per_token + max_bs * per_seq


def draft_extend_buffer_bytes(*, max_bs: int, tokens: int, hidden_in: int, vocab: int, act_bytes: int) -> int:
    """``EAGLEDraftExtendCudaGraphRunner.__init__``'s buffers at ``max_bs`` (0.5.5): N = max_bs x ``tokens``;
    ``hidden_in`` is the width of its hidden_states (3 x target hidden for EAGLE-3), ``vocab`` its logits'."""
    n = max_bs * tokens
    # input_ids, out_cache_loc, positions, mrope_positions; hidden_states
    per_token = INT64_BYTES * (3 + MROPE_SECTIONS) + hidden_in * act_bytes
    # req_pool_indices, seq_lens, extend_seq_lens, accept_length; next_token_logits_buffer
    per_seq = 4 * INT32_BYTES + vocab * FP32_BYTES
    return n * per_token + max_bs * per_seq


def _attention(spec: ModelSpec) -> Attention:
    """The first attention of the language model (SGLang sizes its backend by layer 0's)."""
    return spec.language_groups[0].layer.attention


def _sliding_window(spec: ModelSpec) -> int:
    """The sliding window of the model's windowed layers (0: none)."""
    windows = [g.layer.attention.sliding_window or 0 for g in spec.language_groups]
    return max(windows)


def sglang_attention_backend(spec: ModelSpec, setup: InferenceSetup) -> str:
    """The backend SGLang runs ``spec`` with: --attention-backend, else its default for the GPU's architecture
    (:data:`SGLANG_ASSUMED_ARCHITECTURE` when not known) as 0.5.5's server_args.py picks it."""
    if setup.attention_backend:
        return setup.attention_backend
    arch = setup.gpu_architecture or SGLANG_ASSUMED_ARCHITECTURE
    if arch == "blackwell" and spec.architecture in BLACKWELL_BACKENDS:
        return BLACKWELL_BACKENDS[spec.architecture]
    if spec.architecture == GPT_OSS:
        return FA3 if arch == "hopper" else TRITON
    if is_rocm(arch):
        return "aiter"
    if _attention(spec).is_mla:
        return {"hopper": FA3, "blackwell": FLASHINFER}.get(arch, TRITON)
    return FA3 if arch == "hopper" and spec.architecture in FA3_DEFAULT_ARCHITECTURES else FLASHINFER


def fa3_state_bytes(*, max_bs: int, context: int, speculative: bool) -> int:
    """``FlashAttentionBackend.init_cuda_graph_state`` (0.5.5, page_size 1, topk 1, no local attention)."""
    pages = context

    def metadata() -> int:  # cache_seqlens [B], cu_seqlens_q / _k [B + 1] int32; page_table; strided_indices
        return (3 * max_bs + 2) * INT32_BYTES + max_bs * pages * INT32_BYTES + pages * INT64_BYTES

    total = metadata()  # decode_cuda_graph_metadata
    if speculative:  # page_table_draft_decode; target_verify_metadata, draft_extend_metadata
        total += max_bs * pages * INT32_BYTES + 2 * metadata()
    # encoder_metadata: encoder_page_table [B, context], encoder_lens_int32 [B], encoder_cu_seqlens_k [B + 1]
    return total + max_bs * context * INT32_BYTES + (2 * max_bs + 1) * INT32_BYTES


def flashinfer_state_bytes(*, max_num_tokens: int, context: int, wrappers: int, skip_prefill: bool) -> int:
    """``FlashInferAttnBackend.init_cuda_graph_state`` (0.5.5): kv indices per wrapper, the custom mask."""
    slots = max_num_tokens * context
    return slots * INT32_BYTES * wrappers + (0 if skip_prefill else slots * BOOL_BYTES)


def triton_state_bytes(*, max_bs: int, max_num_tokens: int, context: int, heads: int, v_head_dim: int,
                       skip_prefill: bool, window: int = 0, kv_indices: bool = True) -> int:  # fmt: skip
    """``TritonAttnBackend.init_cuda_graph_state`` (0.5.5); ``kv_indices`` False: the multi-step backend's
    buffers are passed in (``kv_indices_buf``, ``cuda_graph_num_kv_splits_buf``)."""
    n = max_num_tokens
    logits = n * heads * TRITON_NUM_KV_SPLITS * (v_head_dim + 1) * FP32_BYTES  # attn_logits, attn_lse
    own = (n * INT32_BYTES + n * context * INT64_BYTES) if kv_indices else 0  # num_kv_splits, kv_indices
    mask = 0 if skip_prefill else n * context * BOOL_BYTES
    # sliding window: window kv indices [N x window] int64, window num_kv_splits [N], kv_offsets [B] int32
    swa = n * window * INT64_BYTES + n * INT32_BYTES + max_bs * INT32_BYTES if window else 0
    return logits + own + mask + swa


@dataclass(frozen=True, kw_only=True)
class _Runner:
    """One runner's backend: its batch size, tokens per entry, the model it attends for, and its role."""

    tokens: int  # tokens per batch entry (N = max_bs x tokens)
    spec: ModelSpec
    role: str  # "target", "draft_decode", "draft_extend"


def backend_bytes(backend: str, *, runners: tuple[_Runner, ...], max_bs: int, graphs: int, context: int,
                  tp: int, steps: int, speculative: bool) -> int:  # fmt: skip
    """The CUDA-graph state of ``backend`` for every runner's backend instance, and the wrappers flashinfer
    builds for each of the ``graphs`` batch sizes a runner captures (0 for a backend not modelled)."""
    total = 0
    for r in runners:
        n = max_bs * r.tokens
        att = _attention(r.spec)
        window = _sliding_window(r.spec)
        multi = r.role == "draft_decode"  # speculative_num_steps - 1 backends of one multi-step backend
        copies = steps - 1 if multi else 1
        if backend == FA3:
            total += copies * fa3_state_bytes(max_bs=max_bs, context=context, speculative=speculative)
        elif backend == FLASHINFER:
            wrappers = 2 if window else 1
            if multi:  # FlashInferMultiStepDraftBackend: [steps, B x context] int32, skip_prefill backends
                total += steps * max_bs * context * INT32_BYTES
            else:
                total += flashinfer_state_bytes(max_num_tokens=n, context=context, wrappers=wrappers,
                                                skip_prefill=False)  # fmt: skip
            # one wrapper set per captured batch size: decode wrappers (8 MiB each); target-verify and
            # draft-extend prefill wrappers (backend "auto")
            decode = r.role == "draft_decode" or (r.role == "target" and not speculative)
            per_wrapper = FLASHINFER_INT_WORKSPACE_BYTES if decode else FLASHINFER_PREFILL_WRAPPER_BYTES
            total += graphs * copies * wrappers * per_wrapper
        elif backend == TRITON:
            heads = -(-att.num_heads // tp)
            v_dim = att.kv_lora_rank if att.is_mla else att.v_head_dim
            if multi:  # TritonMultiStepDraftBackend: [steps, N x context] int64 + [N] int32, shared
                total += steps * n * context * INT64_BYTES + n * INT32_BYTES
            one = triton_state_bytes(
                max_bs=max_bs,
                max_num_tokens=n,
                context=context,
                heads=heads,
                v_head_dim=v_dim,
                skip_prefill=multi,
                window=window,
                kv_indices=not multi,
            )
            total += copies * one
    return total


def sglang_capture(target: ModelSpec, setup: InferenceSetup, *, act_bytes: int) -> SglangCapture:
    """The runners SGLang builds for ``setup`` (engine sglang, graphs on): the target's alone without a draft;
    with one, peakmem's chain ``speculative_num_steps K``, topk 1, ``speculative_num_draft_tokens K + 1``;
    their static buffers and the attention backend's graph state, sized by the served context."""
    if setup.engine is not Engine.SGLANG:
        raise ValueError(f"engine={setup.engine.value}: SGLang's runners only")
    max_bs = setup.sglang_defaults(setup.gpu_bytes).cuda_graph_max_bs  # given, else SGLang's for the GPU
    context = resolve_context(target, setup).context  # model_config.context_len: the served context
    backend = sglang_attention_backend(target, setup)
    modelled = backend if backend in (FA3, FLASHINFER, TRITON) else ""
    draft = setup.draft
    k = setup.num_speculative_tokens or 0
    speculative = draft is not None
    capture_bs = sglang_spec_capture_sizes(max_bs) if speculative else sglang_capture_sizes(max_bs)
    b = max(capture_bs)
    verify = k + 1 if speculative else 1
    target_static = target_buffer_bytes(max_bs=b, tokens_per_bs=verify, vocab=target.vocab_size)
    runners: list[_Runner] = [_Runner(tokens=verify, spec=target, role="target")]

    forwards = decode = extend = 0
    if draft is not None and draft.spec is not None and draft.method in SGLANG_DRAFT_GRAPH_METHODS:
        d = draft.spec
        forwards = k - 1  # draft_forward: no forward after the last step; no runner at all for one step
        if forwards:
            decode = draft_decode_buffer_bytes(max_bs=b, steps=k, hidden=d.hidden_size, act_bytes=act_bytes)
            runners.append(_Runner(tokens=SGLANG_EAGLE_TOPK, spec=d, role="draft_decode"))
        eagle3 = draft.method == EAGLE3
        hidden_in = EAGLE3_AUX_HIDDEN_STATES * target.hidden_size if eagle3 else d.hidden_size
        vocab = (draft.draft_vocab_size or d.vocab_size) if eagle3 else d.vocab_size
        extend = draft_extend_buffer_bytes(max_bs=b, tokens=k + 1, hidden_in=hidden_in, vocab=vocab,
                                           act_bytes=act_bytes)  # fmt: skip
        runners.append(_Runner(tokens=k + 1, spec=d, role="draft_extend"))
    state = backend_bytes(modelled, runners=tuple(runners), max_bs=b, graphs=len(capture_bs), context=context,
                          tp=setup.layout.attention_tp, steps=k, speculative=speculative)  # fmt: skip
    return SglangCapture(capture_bs=capture_bs, verify_tokens=verify, draft_forwards=forwards,
                         extend_tokens=k + 1 if extend else 0, static_bytes=decode + extend,
                         target_static_bytes=target_static, backend=modelled, backend_bytes=state,
                         context=context)  # fmt: skip
