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

Not modelled: the DP-attention gathered-token counters ([dp] int32), two-batch overlap's and DP attention's
batch-size alignment (``mul_base``), topk > 1 trees (peakmem's chain has topk 1), the attention backends'
own graph state (``init_cuda_graph_state``: e.g. fa3's ``page_table`` of ``B x context`` int32 per backend
instance), the target runner's static buffers (with or without speculation), multi-layer EAGLE / frozen-KV
MTP runners of 0.5.23, and SGLang's prefill (breakable / piecewise) graphs.
"""

from __future__ import annotations

from dataclasses import dataclass

from peakmem.formulas.serving.eagle import EAGLE3, EAGLE3_AUX_HIDDEN_STATES
from peakmem.formulas.serving.sglang_spec import SGLANG_EAGLE_TOPK, SGLANG_SPEC_MAX_RUNNING_REQUESTS
from peakmem.inference import Engine, InferenceSetup
from peakmem.model import ModelSpec

# SGLang picks cuda_graph_max_bs by GPU memory (server_args.py, the tiers of inference.SGLANG_RESERVED_GIB:
# 8 below 35 GiB, 160 below 90, 256 below 160, else 512). What a request needs must not depend on the GPU
# asked about (formulas/serving/fit.py), so the term takes the A100 / H100 tier unless --cuda-graph-max-bs
# is given: 24 graphs, where a 24 GB card captures 4 (0.12 GiB less) and an H200 36 (0.07 GiB more). With
# speculative decoding max_running_requests (48) caps the sizes first.
SGLANG_DEFAULT_MAX_BS = 160

# The draft proposers that run SGLang's EAGLE worker (eagle_worker.py; STANDALONE is a subclass): they capture
# the draft decode and draft-extend runners. NGRAM runs no draft model: only the target's verify graphs.
SGLANG_DRAFT_GRAPH_METHODS = ("draft_model", "eagle", EAGLE3, "mtp")

# Element sizes of the runners' buffers (torch.int64 / int32 / float32)
INT64_BYTES = 8
INT32_BYTES = 4
FP32_BYTES = 4
MROPE_SECTIONS = 3  # mrope_positions: [3, N]


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
    (0: no such runner) and the draft runners' static buffers."""

    capture_bs: tuple[int, ...]
    verify_tokens: int = 1
    draft_forwards: int = 0
    draft_tokens: int = SGLANG_EAGLE_TOPK
    extend_tokens: int = 0
    static_bytes: int = 0

    def __post_init__(self) -> None:
        if not self.capture_bs or min(self.capture_bs) < 1:
            raise ValueError(f"SglangCapture.capture_bs={self.capture_bs!r}: batch sizes >= 1")
        for name in ("verify_tokens", "draft_forwards", "draft_tokens", "extend_tokens", "static_bytes"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"SglangCapture.{name}={value!r}: a count or size >= 0")


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


def sglang_capture(target: ModelSpec, setup: InferenceSetup, *, act_bytes: int) -> SglangCapture:
    """The runners SGLang builds for ``setup`` (engine sglang, graphs on): the target's alone without a draft;
    with one, peakmem's chain ``speculative_num_steps K``, topk 1, ``speculative_num_draft_tokens K + 1``."""
    if setup.engine is not Engine.SGLANG:
        raise ValueError(f"engine={setup.engine.value}: SGLang's runners only")
    max_bs = setup.cuda_graph_max_bs or SGLANG_DEFAULT_MAX_BS
    draft = setup.draft
    if draft is None:
        return SglangCapture(capture_bs=sglang_capture_sizes(max_bs))
    k = setup.num_speculative_tokens or 0
    capture_bs = sglang_spec_capture_sizes(max_bs)
    if draft.spec is None or draft.method not in SGLANG_DRAFT_GRAPH_METHODS:  # NGRAM: the target verifies
        return SglangCapture(capture_bs=capture_bs, verify_tokens=k + 1)
    b, d = max(capture_bs), draft.spec
    forwards = k - 1  # draft_forward: no forward after the last step; no runner at all for one step
    decode = (draft_decode_buffer_bytes(max_bs=b, steps=k, hidden=d.hidden_size, act_bytes=act_bytes)
              if forwards else 0)  # fmt: skip
    eagle3 = draft.method == EAGLE3
    hidden_in = EAGLE3_AUX_HIDDEN_STATES * target.hidden_size if eagle3 else d.hidden_size
    vocab = (draft.draft_vocab_size or d.vocab_size) if eagle3 else d.vocab_size
    extend = draft_extend_buffer_bytes(max_bs=b, tokens=k + 1, hidden_in=hidden_in, vocab=vocab,
                                       act_bytes=act_bytes)  # fmt: skip
    return SglangCapture(capture_bs=capture_bs, verify_tokens=k + 1, draft_forwards=forwards,
                         extend_tokens=k + 1, static_bytes=decode + extend)  # fmt: skip
