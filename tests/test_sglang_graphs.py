"""SGLang's CUDA graphs (formulas/serving/sglang_graphs.py, cuda_graphs.py): the batch sizes every runner
captures, the target's verify tokens, the draft decode and draft-extend runners' graphs in the shared pool,
the runners' static buffers, the attention backends' CUDA-graph state and all-reduces. Hand-derived on tiny
specs from sglang 0.5.5's source and flashinfer 0.5.0's (lines quoted); tiny(): vocab 128, hidden 64, 4 heads
of 16, architecture TestForCausalLM (not one of fa3's defaults)."""

from __future__ import annotations

from _infer_specs import tiny
from peakmem.catalog import get_model
from peakmem.errors import InputError
from peakmem.formulas.serving import estimate_inference
from peakmem.formulas.serving.cuda_graphs import NCCL_ALLREDUCE_GRAPH_BYTES, graph_memory, graph_note
from peakmem.formulas.serving.eagle import eagle_draft_spec
from peakmem.formulas.serving.sglang_graphs import (
    FLASHINFER_PREFILL_WRAPPER_BYTES,
    sglang_attention_backend,
    sglang_spec_capture_sizes,
    target_buffer_bytes,
)
from peakmem.formulas.serving.speculative import mtp_draft_spec
from peakmem.hf import spec_from_config
from peakmem.inference import Draft, InferenceSetup
from peakmem.units import MiB

K = 3  # --speculative-num-steps 3, --speculative-eagle-topk 1, --speculative-num-draft-tokens 4
DRAFT_VOCAB = 32
# tiny(): hidden 64, MLP 128, bf16: one layer's fused temporaries a token are 3 x 128 x 2 + 2 x 64 x 2 =
# 1,024 B (test_cuda_graphs.py TINY_PER_TOKEN); an EAGLE-3 head built on tiny(layers=1) has the same MLP
TINY_PER_TOKEN = 3 * 128 * 2 + 2 * 64 * 2
# fa3's CUDA-graph state of one backend instance at max_bs 8, context 100 (page_size 1), with speculation
# (flashattention_backend.py init_cuda_graph_state): each metadata set holds cache_seqlens [8] + cu_seqlens_q
# [9] + cu_seqlens_k [9] int32, page_table [8, 100] int32, strided_indices arange(0, 100, 1) int64 =
# 26 x 4 + 3,200 + 800 = 4,104 B; decode + page_table_draft_decode [8, 100] int32 + target_verify_metadata +
# draft_extend_metadata; encoder_metadata: encoder_page_table [8, 100] int32, encoder_lens_int32 [8],
# encoder_cu_seqlens_k [9] int32
FA3_SET = 26 * 4 + 8 * 100 * 4 + 100 * 8
FA3_SPEC_STATE = 3 * FA3_SET + 8 * 100 * 4 + 8 * 100 * 4 + 17 * 4
# the target's runner with 4 verify tokens at max_bs 8 (cuda_graph_runner.py __init__, N = 32): input_ids,
# out_cache_loc, positions [32] int64, mrope_positions [3, 32] int64, next_token_logits_buffer [32, 128] fp32;
# req_pool_indices, seq_lens [8] int32; custom_mask ones((seq_lens.sum() + 32) x 4) bool with seq_lens
# filled with 1; num_token_non_padded [1] int32
TARGET_VERIFY_STATIC = 32 * (6 * 8 + 128 * 4) + 8 * 2 * 4 + (8 + 32) * 4 + 4


def _eagle3(inter: int = 128) -> Draft:
    head = eagle_draft_spec(tiny(layers=1, inter=inter), "eagle3", target_hidden=64, draft_vocab=DRAFT_VOCAB)
    return Draft(name="e3", spec=head, method="eagle3", draft_vocab_size=DRAFT_VOCAB)


def _sglang(**kw: object) -> InferenceSetup:
    args = {"engine": "sglang", "context": 100, "draft": _eagle3(), "num_speculative_tokens": K,
            "cuda_graph_max_bs": 8, "attention_backend": "fa3", **kw}  # fmt: skip
    return InferenceSetup(**args)  # type: ignore[arg-type]


def test_speculative_batch_sizes() -> None:
    # server_args.py _generate_cuda_graph_batch_sizes, "Spec decoding case": list(range(1, 9, 1)) +
    # list(range(10, 33, 2)) + list(range(40, 65, 4)) + list(range(72, 257, 8)) + ...; then
    # get_batch_sizes_to_capture keeps bs <= req_to_token_pool.size = max_running_requests, 48 for speculative
    # decoding ("Max running requests is reset to 48"): 8 + 12 + 3 (40, 44, 48) = 23
    assert sglang_spec_capture_sizes(160) == (*range(1, 9), *range(10, 33, 2), 40, 44, 48)
    assert len(sglang_spec_capture_sizes(512)) == 23
    assert sglang_spec_capture_sizes(8) == tuple(range(1, 9))
    # cuda_graph_max_bs 50: 50 appended, past the pool: "capture_bs += [req_to_token_pool.size]", then <= 48
    assert sglang_spec_capture_sizes(50) == sglang_spec_capture_sizes(160)
    # --max-running-requests 35: the list up to 32, and the pool's size added: 8 + 12 + 1
    capped = sglang_spec_capture_sizes(160, pool=35)
    assert capped[-2:] == (32, 35) and len(capped) == 21


def test_eagle3_three_steps_by_hand() -> None:
    g = graph_memory(tiny(), _sglang(), act_bytes=2, max_tokens=8192)
    assert g is not None
    # capture_bs [1..8] for each runner: the target's TARGET_VERIFY graphs (num_tokens_per_bs =
    # speculative_num_draft_tokens = 4), EAGLEDraftCudaGraphRunner (speculative_num_steps > 1; draft_forward
    # runs K - 1 = 2 forwards of bs x topk tokens), EAGLEDraftExtendCudaGraphRunner (bs x (K + 1) tokens)
    assert [(s.mode, len(s.sizes), s.tokens_per_size, s.draft_forwards) for s in g.sets] == [
        ("FULL", 8, 4, 0), ("DRAFT", 8, 1, 2), ("DRAFT_EXTEND", 8, 4, 1),
    ]  # fmt: skip
    assert g.graphs == 24 and g.largest == 8 * 4
    # static buffers at max_bs B = 8. Draft decode (N = B x topk = 8): input_ids [N] int64, out_cache_loc
    # [N x K] int64, positions [N] int64, mrope_positions [3, N] int64 = 8 x (1 + 3 + 1 + 3) x 8 B;
    # req_pool_indices, seq_lens, extend_seq_lens [B] int32, topk_p [B, 1] fp32, topk_index [B, 1] int64,
    # hidden_states [B, 64] bf16 = 8 x (3 x 4 + 4 + 8 + 64 x 2)
    decode = 8 * (1 + K + 1 + 3) * 8 + 8 * (3 * 4 + 4 + 8 + 64 * 2)
    # draft extend (N = B x (K + 1) = 32): input_ids, out_cache_loc, positions [N] int64, mrope_positions
    # [3, N] int64, hidden_states [N, target_hidden_size x 3] bf16 ("if is_eagle3(): ... * 3");
    # req_pool_indices, seq_lens, extend_seq_lens, accept_length [B] int32, next_token_logits_buffer
    # [B, draft_vocab_size] fp32
    extend = 32 * (6 * 8 + 3 * 64 * 2) + 8 * (4 * 4 + DRAFT_VOCAB * 4)
    assert decode + extend == 1_728 + 14_976
    # + the target runner's buffers, and K + 1 = 4 fa3 backend instances (the target's, the draft decode
    # runner's speculative_num_steps - 1 = 2, the draft-extend backend), each with the speculative state
    assert TARGET_VERIFY_STATIC == 18_148 and FA3_SPEC_STATE == 18_780
    assert g.static_bytes == 16_704 + TARGET_VERIFY_STATIC + 4 * FA3_SPEC_STATE == 109_972
    # one pool (get_global_graph_memory_pool): the largest working set, the target's 32-token verify and the
    # head's 32-token extend tie at 32 x 1,024 B; 6 MiB a graph
    assert g.shared_bytes == 32 * TINY_PER_TOKEN
    assert g.bytes == 32 * TINY_PER_TOKEN + 24 * 6 * MiB + 109_972
    note = graph_note(g)
    assert "FULL=8 (largest=8 x 4 tokens) + DRAFT=8 (largest=8, 2 draft forwards each)" in note
    assert "the target runner's static buffers 18148 B" in note and "the draft runners' 16704 B" in note
    assert "fa3 attention backend's graph state 75120 B (context 100)" in note


def test_the_shared_working_set_is_the_largest_of_target_and_draft() -> None:
    # a head with a 512-wide MLP: its 32-token extend holds 32 x (3 x 512 x 2 + 2 x 64 x 2) = 106,496 B, more
    # than the target's verify (32,768 B): the pool keeps the draft's
    g = graph_memory(tiny(), _sglang(draft=_eagle3(inter=512)), act_bytes=2, max_tokens=8192)
    assert g is not None and g.shared_bytes == 32 * (3 * 512 * 2 + 2 * 64 * 2) == 106_496


def test_one_step_captures_no_draft_decode_graphs() -> None:
    # K = 1: "if self.speculative_num_steps > 1" builds the draft decode runner; the extend runner remains,
    # at 2 tokens a sequence, with hidden 3 x 64 and the head's vocabulary
    g = graph_memory(tiny(), _sglang(num_speculative_tokens=1), act_bytes=2, max_tokens=8192)
    assert g is not None
    assert [(s.mode, s.tokens_per_size) for s in g.sets] == [("FULL", 2), ("DRAFT_EXTEND", 2)]
    extend = 16 * (6 * 8 + 3 * 64 * 2) + 8 * (4 * 4 + DRAFT_VOCAB * 4)
    # the target's runner at N = 16 (2 verify tokens), and 2 fa3 instances (target, draft extend)
    target = 16 * (6 * 8 + 128 * 4) + 8 * 2 * 4 + (8 + 16) * 2 + 4
    assert g.static_bytes == extend + target + 2 * FA3_SPEC_STATE


def test_mtp_and_ngram() -> None:
    # NEXTN (an MTP layer of tiny()): extend hidden_states [N, hidden] (not x 3) and the full vocabulary (128)
    mtp = Draft(name="mtp", spec=mtp_draft_spec(tiny(), 1), method="mtp")
    g = graph_memory(tiny(), _sglang(draft=mtp), act_bytes=2, max_tokens=8192)
    assert g is not None and g.graphs == 24
    decode = 8 * (1 + K + 1 + 3) * 8 + 8 * (3 * 4 + 4 + 8 + 64 * 2)
    drafts = decode + 32 * (6 * 8 + 64 * 2) + 8 * (4 * 4 + 128 * 4)
    assert g.static_bytes == drafts + TARGET_VERIFY_STATIC + 4 * FA3_SPEC_STATE
    # NGRAM: no draft model, no draft runners; the target still verifies K + 1 tokens a sequence, <= 48 sizes
    ngram = Draft(name="ngram", spec=None, method="ngram")
    n = graph_memory(tiny(), _sglang(draft=ngram, cuda_graph_max_bs=None), act_bytes=2, max_tokens=8192)
    assert n is not None and [(s.mode, len(s.sizes), s.tokens_per_size) for s in n.sets] == [("FULL", 23, 4)]
    # no draft runners; the target's buffers at N = 48 x 4 = 192 and one fa3 instance (speculative metadata:
    # speculative_num_draft_tokens is set) at max_bs 48: sets of 146 x 4 + 4,800 x 4 + 800 B
    target = 192 * (6 * 8 + 128 * 4) + 48 * 2 * 4 + (48 + 192) * 4 + 4
    fa3 = 3 * (146 * 4 + 48 * 100 * 4 + 800) + 48 * 100 * 4 + 48 * 100 * 4 + 97 * 4
    assert n.static_bytes == target + fa3
    assert n.bytes == 48 * 4 * TINY_PER_TOKEN + 23 * 6 * MiB + target + fa3


def test_the_drafts_allreduces_are_captured_in_its_graphs() -> None:
    # TP 2, --disable-custom-all-reduce: the target's 2 x 2 layers + 1 = 5 in each of its 8 graphs; the head's
    # 2 x 1 + 1 = 3 in each draft forward: 8 x 2 (DRAFT) + 8 x 1 (DRAFT_EXTEND) = 24 forwards
    g = graph_memory(tiny(), _sglang(tp=2, disable_custom_all_reduce=True), act_bytes=2, max_tokens=8192)
    assert g is not None and (g.target_graphs, g.draft_forwards, g.draft_allreduces_per_graph) == (8, 24, 3)
    assert g.captured_allreduces == 8 * 5 + 24 * 3 == 112
    assert g.nccl_bytes == 112 * NCCL_ALLREDUCE_GRAPH_BYTES
    counted = "112 tensor-parallel all-reduces captured (5 a graph + 3 in each of the drafter's 24 captures)"
    assert counted in graph_note(g)


def test_the_estimate_carries_the_draft_graphs() -> None:
    est = estimate_inference(tiny(), _sglang())
    assert est.extra["cuda_graphs"] == 24
    assert est.extra["cuda_graph_bytes"] == 32 * TINY_PER_TOKEN + 24 * 6 * MiB + 109_972
    eager = estimate_inference(tiny(), _sglang(enforce_eager=True))
    assert "cuda_graph_bytes" not in eager.extra


def test_the_target_runners_buffers_by_hand() -> None:
    # cuda_graph_runner.py CudaGraphRunner.__init__ (0.5.5), "with torch.device(self.device)": input_ids
    # zeros((max_num_token,), int64), req_pool_indices zeros((max_bs,), int32), seq_lens full((max_bs,),
    # seq_len_fill_value, int32), out_cache_loc zeros((max_num_token,), int64), positions int64,
    # mrope_positions zeros((3, max_num_token), int64), num_token_non_padded zeros((1,), int32), custom_mask
    # ones(((seq_lens.sum() + max_num_token) * num_tokens_per_bs), bool), next_token_logits_buffer
    # zeros((max_num_token, vocab_size), float). max_bs 8, one token: 8 x (48 + 128 x 4) + 8 x 8 + (8 + 8) + 4
    assert target_buffer_bytes(max_bs=8, tokens_per_bs=1, vocab=128) == 8 * 560 + 64 + 16 + 4 == 4_564
    # Qwen3-8B at the default max bs 160: the logits buffer alone is 160 x 151,936 x 4 B = 92.7 MiB
    qwen = target_buffer_bytes(max_bs=160, tokens_per_bs=1, vocab=151_936)
    assert qwen - 160 * 151_936 * 4 == 160 * 48 + 160 * 8 + 320 + 4


def _plain(backend: str, **kw: object) -> InferenceSetup:
    args = {"engine": "sglang", "context": 100, "cuda_graph_max_bs": 8, "attention_backend": backend, **kw}
    return InferenceSetup(**args)  # type: ignore[arg-type]


def test_each_backends_graph_state_by_hand() -> None:
    target = target_buffer_bytes(max_bs=8, tokens_per_bs=1, vocab=128)
    outside = {}
    for backend in ("fa3", "flashinfer", "triton"):
        g = graph_memory(tiny(), _plain(backend), act_bytes=2, max_tokens=8192)
        assert g is not None and g.graphs == 4  # [1, 2, 4, 8]
        outside[backend] = g.static_bytes - target
    # fa3 without speculation: the decode set and encoder_metadata (allocated for every model in 0.5.5)
    assert outside["fa3"] == FA3_SET + 8 * 100 * 4 + 17 * 4 == 7_372
    # flashinfer_backend.py: cuda_graph_kv_indices zeros((max_num_tokens * max_context_len,), int32),
    # cuda_graph_custom_mask zeros((max_num_tokens * max_context_len), uint8); then each captured bs builds a
    # BatchDecodeWithPagedKVCacheWrapper, whose __init__ (flashinfer 0.5.0 decode.py) allocates
    # _int_workspace_buffer empty((8 * 1024 * 1024,), uint8) on the device: 4 graphs
    assert outside["flashinfer"] == 8 * 100 * (4 + 1) + 4 * 8 * MiB
    # triton_backend.py: cuda_graph_attn_logits zeros((N, num_head, max_kv_splits, v_head_dim), float32),
    # cuda_graph_attn_lse zeros((N, num_head, max_kv_splits), float32), num_kv_splits full((N,), int32),
    # kv_indices zeros((N * max_context_len), int64), custom_mask zeros((N * max_context_len), uint8): N 8,
    # 4 heads, 8 splits, v_head_dim 16
    assert outside["triton"] == 8 * 4 * 8 * (16 + 1) * 4 + 8 * 4 + 8 * 100 * 8 + 8 * 100 == 24_640


def test_flashinfer_with_a_draft_builds_prefill_wrappers_per_size() -> None:
    # target verify at N = 32: kv indices and mask [32 x 100]; each of the 8 sizes builds a
    # BatchPrefillWithPagedKVCacheWrapper (backend "auto": 8 MiB int workspace, 16 Mi int32 sparse indices,
    # 2 x 32,768 int32); the draft decode runner: one [K, 8 x 100] int32 buffer for its K - 1 = 2 skip_prefill
    # backends, whose decode wrappers take 8 MiB a size each; the draft-extend backend as the target's
    assert 8 * MiB + 64 * MiB + 256 * 1024 == FLASHINFER_PREFILL_WRAPPER_BYTES
    g = graph_memory(tiny(), _sglang(attention_backend="flashinfer"), act_bytes=2, max_tokens=8192)
    assert g is not None
    target = 32 * 100 * 5 + 8 * FLASHINFER_PREFILL_WRAPPER_BYTES
    draft_decode = K * 8 * 100 * 4 + 8 * 2 * 8 * MiB
    assert g.static_bytes == 16_704 + TARGET_VERIFY_STATIC + 2 * target + draft_decode


def test_the_served_context_sizes_the_state() -> None:
    # no --context: SGLang's context_len is the model's limit (tiny: 1,024), the page tables grow with it
    g = graph_memory(tiny(), _plain("fa3", context=None), act_bytes=2, max_tokens=8192)
    assert g is not None
    pages = 1024
    fa3 = 26 * 4 + 8 * pages * 4 + pages * 8 + 8 * pages * 4 + 17 * 4
    assert g.static_bytes == target_buffer_bytes(max_bs=8, tokens_per_bs=1, vocab=128) + fa3


def test_the_default_backend() -> None:
    # server_args.py _handle_attention_backend_compatibility: fa3 on Hopper for is_fa3_default_architecture's
    # list, else flashinfer; MLA: fa3 on Hopper, flashinfer on Blackwell, else triton; DeepseekV3 on sm100:
    # trtllm_mla (_handle_model_specific_adjustments), not modelled
    plain = InferenceSetup(engine="sglang")  # type: ignore[arg-type]
    llama = spec_from_config(get_model("llama-3.1-8b").config, name="llama-3.1-8b")
    dsv3 = spec_from_config(get_model("deepseek-v3").config, name="deepseek-v3")
    on = {arch: InferenceSetup(engine="sglang", gpu_architecture=arch)  # type: ignore[arg-type]
          for arch in ("hopper", "ampere", "blackwell")}  # fmt: skip
    assert sglang_attention_backend(llama, plain) == "fa3"  # the GPU not known: Hopper's
    assert sglang_attention_backend(tiny(), plain) == "flashinfer"
    assert [sglang_attention_backend(llama, on[a]) for a in on] == ["fa3", "flashinfer", "flashinfer"]
    assert [sglang_attention_backend(dsv3, on[a]) for a in on] == ["fa3", "triton", "trtllm_mla"]
    given = InferenceSetup(engine="sglang", attention_backend="triton", gpu_architecture="hopper")  # type: ignore[arg-type]
    assert sglang_attention_backend(llama, given) == "triton"
    # a backend not modelled: no state in the term, and the note says so
    g = graph_memory(dsv3, InferenceSetup(engine="sglang", gpu_architecture="blackwell", context=100),  # type: ignore[arg-type]
                     act_bytes=2, max_tokens=8192)  # fmt: skip
    assert g is not None and "graph state not modelled" in graph_note(g)


def test_bad_attention_backend() -> None:
    import pytest

    with pytest.raises(InputError, match=r"^attention_backend='flashmla': one of fa3, flashinfer, triton$"):
        InferenceSetup(engine="sglang", attention_backend="flashmla")  # type: ignore[arg-type]
    with pytest.raises(InputError, match=r"^attention_backend='fa3': an option of engine=sglang, not vllm$"):
        InferenceSetup(engine="vllm", attention_backend="fa3")  # type: ignore[arg-type]
