"""SGLang's CUDA graphs with speculative decoding (formulas/serving/sglang_graphs.py, cuda_graphs.py): the
batch sizes every runner captures, the target's verify tokens, the draft decode and draft-extend runners'
graphs in the shared pool, their static buffers and all-reduces. Hand-derived on tiny specs from sglang
0.5.5's source (lines quoted); SGLang without a draft is test_cuda_graphs.py's, unchanged."""

from __future__ import annotations

from _infer_specs import tiny
from peakmem.formulas.serving import estimate_inference
from peakmem.formulas.serving.cuda_graphs import NCCL_ALLREDUCE_GRAPH_BYTES, graph_memory, graph_note
from peakmem.formulas.serving.eagle import eagle_draft_spec
from peakmem.formulas.serving.sglang_graphs import sglang_spec_capture_sizes
from peakmem.formulas.serving.speculative import mtp_draft_spec
from peakmem.inference import Draft, InferenceSetup
from peakmem.units import MiB

K = 3  # --speculative-num-steps 3, --speculative-eagle-topk 1, --speculative-num-draft-tokens 4
DRAFT_VOCAB = 32
# tiny(): hidden 64, MLP 128, bf16: one layer's fused temporaries a token are 3 x 128 x 2 + 2 x 64 x 2 =
# 1,024 B (test_cuda_graphs.py TINY_PER_TOKEN); an EAGLE-3 head built on tiny(layers=1) has the same MLP
TINY_PER_TOKEN = 3 * 128 * 2 + 2 * 64 * 2


def _eagle3(inter: int = 128) -> Draft:
    head = eagle_draft_spec(tiny(layers=1, inter=inter), "eagle3", target_hidden=64, draft_vocab=DRAFT_VOCAB)
    return Draft(name="e3", spec=head, method="eagle3", draft_vocab_size=DRAFT_VOCAB)


def _sglang(**kw: object) -> InferenceSetup:
    args = {"engine": "sglang", "context": 100, "draft": _eagle3(), "num_speculative_tokens": K,
            "cuda_graph_max_bs": 8, **kw}  # fmt: skip
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
    assert g.static_bytes == decode + extend == 1_728 + 14_976
    # one pool (get_global_graph_memory_pool): the largest working set, the target's 32-token verify and the
    # head's 32-token extend tie at 32 x 1,024 B; 6 MiB a graph
    assert g.shared_bytes == 32 * TINY_PER_TOKEN
    assert g.bytes == 32 * TINY_PER_TOKEN + 24 * 6 * MiB + 16_704
    note = graph_note(g)
    assert "FULL=8 (largest=8 x 4 tokens) + DRAFT=8 (largest=8, 2 draft forwards each)" in note
    assert "static buffers 16704 B" in note


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
    assert g.static_bytes == 16 * (6 * 8 + 3 * 64 * 2) + 8 * (4 * 4 + DRAFT_VOCAB * 4)


def test_mtp_and_ngram() -> None:
    # NEXTN (an MTP layer of tiny()): extend hidden_states [N, hidden] (not x 3) and the full vocabulary (128)
    mtp = Draft(name="mtp", spec=mtp_draft_spec(tiny(), 1), method="mtp")
    g = graph_memory(tiny(), _sglang(draft=mtp), act_bytes=2, max_tokens=8192)
    assert g is not None and g.graphs == 24
    decode = 8 * (1 + K + 1 + 3) * 8 + 8 * (3 * 4 + 4 + 8 + 64 * 2)
    assert g.static_bytes == decode + 32 * (6 * 8 + 64 * 2) + 8 * (4 * 4 + 128 * 4)
    # NGRAM: no draft model, no draft runners; the target still verifies K + 1 tokens a sequence, <= 48 sizes
    ngram = Draft(name="ngram", spec=None, method="ngram")
    n = graph_memory(tiny(), _sglang(draft=ngram, cuda_graph_max_bs=None), act_bytes=2, max_tokens=8192)
    assert n is not None and [(s.mode, len(s.sizes), s.tokens_per_size) for s in n.sets] == [("FULL", 23, 4)]
    assert n.static_bytes == 0 and n.bytes == 48 * 4 * TINY_PER_TOKEN + 23 * 6 * MiB


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
    assert est.extra["cuda_graph_bytes"] == 32 * TINY_PER_TOKEN + 24 * 6 * MiB + 16_704
    eager = estimate_inference(tiny(), _sglang(enforce_eager=True))
    assert "cuda_graph_bytes" not in eager.extra
