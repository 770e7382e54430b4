"""CUDA graph capture memory (formulas/serving/cuda_graphs.py): capture sizes per engine and release, the
term's bytes, where each release accounts for it, its band, the options' errors, CLI = API. Hand-derived
on tiny specs."""

from __future__ import annotations

from dataclasses import replace

import pytest

from _infer_specs import LLAMA_3_8B, build_spec, infer_cli_equals_api, tiny
from peakmem.breakdown import Category
from peakmem.errors import InputError
from peakmem.formulas.serving import estimate_inference
from peakmem.formulas.serving.cuda_graphs import (
    NCCL_ALLREDUCE_GRAPH_BYTES,
    OLD_DRIVER_RATIO,
    PER_GRAPH_BYTES,
    Accounting,
    allreduces_per_forward,
    custom_all_reduce_off,
    graph_band,
    graph_memory,
    graph_note,
    v0_capture_sizes,
    vllm_accounting,
    vllm_capture_sets,
    vllm_model_runner,
)
from peakmem.formulas.serving.sglang_graphs import sglang_capture_sizes
from peakmem.formulas.serving.vllm_profile import NON_TORCH_ONE_GPU
from peakmem.inference import CudagraphMode, Draft, Engine, InferenceSetup, ModelRunner
from peakmem.options import CUDAGRAPH_MODES, MODEL_RUNNERS
from peakmem.units import GiB, KiB, MiB

# tiny(): 2 layers, hidden 64, MLP 128, bf16. One layer's fused temporaries a token (forward.py): MLP act,
# up and product 3 x 128 x 2 B + vLLM's residual stream 2 x 64 x 2 B = 1,024 B (attention 640 B, norm 512 B).
TINY_PER_TOKEN = 3 * 128 * 2 + 2 * 64 * 2
TINY_PARAMS = 128 * 64 * 2 + 2 * (64 * 64 * 2 + 64 * 32 * 2 + 3 * 64 * 128 + 2 * 64) + 64
# vLLM 0.21+ at its defaults (max_num_seqs 256): PIECEWISE [1, 2, 4] + 8..248 step 8 (31) + 256..512 step 16
# (17) = 51 graphs, FULL [1, 2, 4] + 8..248 + 256 = 35 graphs; the shared working set is the largest
# capture's, 512 tokens: 512 x 1,024 = 524,288 B; 86 x 6 MiB = 541,065,216 B.
TINY_GRAPHS = 512 * TINY_PER_TOKEN + 86 * 6 * MiB
# the profiled chunk: vllm serve's 2048 tokens on a GPU under 70 GiB or none named (peakmem.vllm_defaults;
# min(256 x 100, 2048)), more than the sampler's 256 x 128 x (2 + 13.25) B
ACTIVATIONS = 2048 * TINY_PER_TOKEN


def _sizes(release: tuple[int, int], **kw: int) -> list[tuple[str, int, int]]:
    args = {"max_num_seqs": 256, "max_tokens": 8192, "spec_tokens": 0, **kw}
    sets = vllm_capture_sets(release, CudagraphMode.AUTO, **args)
    return [(s.mode, len(s.sizes), max(s.sizes)) for s in sets]


def test_vllm_capture_sizes_per_release() -> None:
    # vLLM's own log at the defaults: "PIECEWISE=51 (largest=512), FULL=35 (largest=256)"
    assert _sizes((0, 27)) == [("PIECEWISE", 51, 512), ("FULL", 35, 256)]
    # max_num_seqs 8: the largest capture min(2 x 8, 512) = 16 -> [1, 2, 4, 8, 16]; FULL up to 8
    sets = vllm_capture_sets((0, 27), CudagraphMode.AUTO, max_num_seqs=8, max_tokens=8192, spec_tokens=0)
    assert [s.sizes for s in sets] == [(1, 2, 4, 8, 16), (1, 2, 4, 8)]
    # 3 speculative tokens, max_num_seqs 40: min(40 x 4 x 2, 512) = 320 (vllm #32324 quotes 320)
    assert _sizes((0, 27), max_num_seqs=40, spec_tokens=3)[0][2] == 320
    # 0.11: FULL_AND_PIECEWISE on the step-8 sizes: 3 + 64 = 67 PIECEWISE, FULL up to 256: 3 + 32 = 35
    assert _sizes((0, 11)) == [("PIECEWISE", 67, 512), ("FULL", 35, 256)]
    assert _sizes((0, 10)) == [("PIECEWISE", 67, 512)]  # PIECEWISE only before 0.11
    assert _sizes((0, 10), max_tokens=256) == [("PIECEWISE", 35, 256)]  # capped at max_num_batched_tokens
    assert _sizes((0, 6)) == [("FULL", 35, 256)]  # V0: [1, 2, 4] + 8 x (1..32)
    assert v0_capture_sizes(20) == (1, 2, 4, 8, 16, 24)  # max_num_seqs padded to a multiple of 8
    assert v0_capture_sizes(1000)[-1] == 256
    explicit = vllm_capture_sets((0, 27), CudagraphMode.FULL_DECODE_ONLY, max_num_seqs=256, max_tokens=8192,
                                 spec_tokens=0)  # fmt: skip
    assert [(s.mode, len(s.sizes)) for s in explicit] == [("FULL", 35)]
    assert (
        vllm_capture_sets((0, 27), CudagraphMode.NONE, max_num_seqs=256, max_tokens=8192, spec_tokens=0) == ()
    )


def test_sglang_capture_sizes() -> None:
    # [1, 2, 4, 8, 12] + 16..160 step 8 (19) = 24; 512: + 168..256 (12) + 272..512 step 16 (16) = 52
    assert len(sglang_capture_sizes(160)) == 24 and sglang_capture_sizes(160)[-1] == 160
    assert len(sglang_capture_sizes(512)) == 52
    assert sglang_capture_sizes(10) == (1, 2, 4, 8, 10)  # the max appended (sglang PR #27537's log)


def test_the_term_by_hand_on_a_tiny_model() -> None:
    est = estimate_inference(tiny(), InferenceSetup(engine="vllm", context=100))  # type: ignore[arg-type]
    assert est.extra["cuda_graph_bytes"] == TINY_GRAPHS == 541_589_504
    # vLLM 0.27 runs a dense model on Model Runner V2, which reserves nothing for the graphs before 0.29
    assert est.extra["cuda_graphs"] == 86 and est.extra["cuda_graph_accounting"] == "on_top"
    assert est.extra["vllm_model_runner"] == "v2"
    assert est.by_category()[Category.CUDA_GRAPHS] == TINY_GRAPHS
    eager = estimate_inference(tiny(), InferenceSetup(engine="vllm", context=100, enforce_eager=True))  # type: ignore[arg-type]
    assert Category.CUDA_GRAPHS not in eager.by_category()
    assert est.peak_allocated_bytes - eager.peak_allocated_bytes == TINY_GRAPHS
    assert 6 * MiB == PER_GRAPH_BYTES


def test_which_model_runner_vllm_runs() -> None:
    from peakmem.resolve import resolve_model

    v = InferenceSetup(engine="vllm")  # type: ignore[arg-type]
    assert vllm_model_runner(tiny(), v) == "v2"  # dense, 0.27
    assert vllm_model_runner(tiny(), replace(v, engine_version="0.24")) == "v1"  # V2 the default from 0.25
    assert vllm_model_runner(tiny(), replace(v, engine_version="0.7")) == ""  # V0
    assert vllm_model_runner(tiny(), replace(v, model_runner="v1")) == "v1"  # type: ignore[arg-type]
    # a hybrid (Gated DeltaNet layers: vLLM's is_hybrid), a MoE not in DEFAULT_V2_MODEL_RUNNER_ARCHITECTURES
    assert vllm_model_runner(resolve_model("qwen3.5-27b"), v) == "v1"
    assert vllm_model_runner(resolve_model("qwen3-30b-a3b"), v) == "v1"
    assert vllm_model_runner(resolve_model("deepseek-v2-lite"), v) == "v2"  # a MoE on the list
    ngram = replace(v, draft=Draft(name="ngram", spec=None, method="ngram"), num_speculative_tokens=3)
    assert vllm_model_runner(tiny(), ngram) == "v1"  # V2 lacks ngram speculation
    on_top, budget = Accounting.ON_TOP, Accounting.KV_BUDGET
    assert (vllm_accounting((0, 27), "v2"), vllm_accounting((0, 29), "v2")) == (on_top, budget)
    assert (vllm_accounting((0, 27), "v1"), vllm_accounting((0, 19), "v1")) == (budget, on_top)


def test_where_each_release_accounts_for_it() -> None:
    gpu = 4 * GiB
    budget = int(gpu * 0.9)
    # vLLM 0.20+: weights, the profiled chunk, the profile's non-torch increase and the graphs come out of
    # the budget (the CUDA context is the profile's baseline from 0.19: formulas/serving/vllm_profile.py)
    pool_without = budget - 2 * TINY_PARAMS - ACTIVATIONS - NON_TORCH_ONE_GPU.likely
    v1 = estimate_inference(tiny(), InferenceSetup(engine="vllm", context=100, gpu_bytes=gpu,  # type: ignore[arg-type]
                                                   model_runner="v1"))  # fmt: skip
    assert v1.extra["kv_pool_bytes"] == pool_without - TINY_GRAPHS
    # Model Runner V2 (the default for a dense model, 0.25-0.28): its estimate is 0, the pool keeps its
    # size and the graphs come on top (vllm #49224); from 0.29 it measures them (cudagraph_utils.py)
    now = estimate_inference(tiny(), InferenceSetup(engine="vllm", context=100, gpu_bytes=gpu))  # type: ignore[arg-type]
    assert now.extra["kv_pool_bytes"] == pool_without and now.extra["cuda_graph_accounting"] == "on_top"
    assert now.device_total_bytes - v1.device_total_bytes == 0  # the same bytes, counted elsewhere
    later = estimate_inference(tiny(), InferenceSetup(engine="vllm", context=100, gpu_bytes=gpu,  # type: ignore[arg-type]
                                                      engine_version="0.29"))  # fmt: skip
    assert later.extra["kv_pool_bytes"] == pool_without - TINY_GRAPHS
    assert later.extra["vllm_model_runner"] == "v2" and later.extra["cuda_graph_accounting"] == "kv_budget"
    # before 0.20 the graphs are captured after the pool: it keeps its size, the graphs come on top
    # (vllm/envs.py VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS: "0" in the 0.19.1 wheel, "1" from 0.20.0)
    old = estimate_inference(tiny(), InferenceSetup(engine="vllm", context=100, gpu_bytes=gpu,  # type: ignore[arg-type]
                                                    engine_version="0.19"))  # fmt: skip
    assert old.extra["kv_pool_bytes"] == pool_without and old.extra["cuda_graph_accounting"] == "on_top"
    first = estimate_inference(tiny(), InferenceSetup(engine="vllm", context=100, gpu_bytes=gpu,  # type: ignore[arg-type]
                                                      engine_version="0.20.0"))  # fmt: skip
    assert first.extra["kv_pool_bytes"] == pool_without - TINY_GRAPHS
    assert first.extra["cuda_graph_accounting"] == "kv_budget"
    eager = estimate_inference(tiny(), InferenceSetup(engine="vllm", context=100, gpu_bytes=gpu,  # type: ignore[arg-type]
                                                      enforce_eager=True))  # fmt: skip
    assert eager.extra["kv_pool_bytes"] == pool_without
    # SGLang: the graphs sit outside mem_fraction_static: the pool is the same with or without them
    # (--cuda-graph-max-bs 160, SGLang's size when the GPU is not known; on this 4 GiB GPU it picks 8)
    sg = [estimate_inference(tiny(), InferenceSetup(engine="sglang", context=100, gpu_bytes=gpu,  # type: ignore[arg-type]
                                                    cuda_graph_max_bs=160, enforce_eager=e))
          for e in (False, True)]  # fmt: skip
    assert sg[0].extra["kv_pool_bytes"] == sg[1].extra["kv_pool_bytes"]
    # max bs 160: 24 FULL graphs, working set 160 tokens; outside the pool
    # (formulas/serving/sglang_graphs.py, test_sglang_graphs.py) the runner's buffers, 160 x (6 x 8 B +
    # 128 x 4 B fp32 logits) + 160 x 2 x 4 + (160 + 160) B mask + 4, and flashinfer's state (tiny is no
    # fa3 architecture): kv indices 160 x 100 x 4 B, mask 160 x 100 B, one 8 MiB decode wrapper a graph
    outside = 160 * (6 * 8 + 128 * 4) + 160 * 8 + 320 + 4 + 160 * 100 * 5 + 24 * 8 * MiB
    assert sg[0].extra["cuda_graph_bytes"] == 160 * TINY_PER_TOKEN + 24 * 6 * MiB + outside


def test_the_band_is_the_terms_spread() -> None:
    est = estimate_inference(tiny(), InferenceSetup(engine="vllm", context=100))  # type: ignore[arg-type]
    assert est.band is not None
    (term,) = [t for t in est.band.terms if t.name == "cuda_graphs"]
    # +-10 % of 541,589,504 B, and 20 MiB for each PIECEWISE graph above 272 tokens (288..512 step 16: 15)
    assert (term.low_bytes, term.high_bytes) == (-54_158_950, 54_158_950 + 15 * 20 * MiB)
    eager = estimate_inference(tiny(), InferenceSetup(engine="vllm", context=100, enforce_eager=True))  # type: ignore[arg-type]
    assert eager.band is not None and "cuda_graphs" not in {t.name for t in eager.band.terms}


def test_llama_8b_with_fewer_sequences() -> None:
    # max_num_seqs 64: the largest capture 128; PIECEWISE [1, 2, 4] + 8..128 step 8 = 19, FULL up to 64:
    # 3 + 8 = 11; 30 x 6 MiB + 128 x (3 x 14336 x 2 + 2 x 4096 x 2) = 188,743,680 + 13,107,200 B
    spec = build_spec(LLAMA_3_8B)
    est = estimate_inference(spec, InferenceSetup(engine="vllm", context=8192, max_num_seqs=64))  # type: ignore[arg-type]
    assert est.extra["cuda_graphs"] == 30
    assert est.extra["cuda_graph_bytes"] == 30 * 6 * MiB + 128 * (3 * 14336 * 2 + 2 * 4096 * 2) == 201_850_880


def test_tensor_parallel_allreduces_are_counted_not_priced() -> None:
    # tiny(): 2 layers. With TP each forward runs 2 all-reduces a layer (RowParallelLinear o_proj, down_proj)
    # + 1 (VocabParallelEmbedding) = 5; vLLM 0.21+ at its defaults captures 86 graphs: 430 all-reduces
    assert allreduces_per_forward(tiny(), tp=2) == 5
    assert allreduces_per_forward(tiny(), tp=1) == 0  # no tensor parallelism, no collective
    # pp 2: the first stage holds ceil(2 / 2) = 1 layer and the embedding (2 + 1); 3 layers: ceil(3 / 2) = 2
    assert allreduces_per_forward(tiny(), tp=2, pp=2) == 3
    assert allreduces_per_forward(tiny(layers=3), tp=2, pp=2) == 5
    g = graph_memory(tiny(), InferenceSetup(engine="vllm", context=100, tp=2), act_bytes=2, max_tokens=8192)  # type: ignore[arg-type]
    assert g is not None and g.graphs == 86 and g.captured_allreduces == 430
    # their NCCL memory is the CUDA driver's (vllm #5517), not in the term: 86 x 6 MiB over the working set
    assert g.bytes == g.shared_bytes + 86 * 6 * MiB
    assert "430 tensor-parallel all-reduces captured (5 a graph)" in graph_note(g)
    alone = graph_memory(tiny(), InferenceSetup(engine="vllm", context=100), act_bytes=2, max_tokens=8192)  # type: ignore[arg-type]
    assert alone is not None and alone.captured_allreduces == 0 and "all-reduce" not in graph_note(alone)


def _drafted(**kw: object) -> InferenceSetup:
    # tiny() at TP 2 with a 1-layer EAGLE drafter proposing K = 1: vLLM's decode batches are max_num_seqs 2 x
    # (1 + 1) = 4 tokens, so it captures up to min(2 x 4, 512) = 8 tokens: PIECEWISE [1, 2, 4, 8]
    draft = Draft(name="head", spec=tiny(layers=1), method="eagle")
    args = {"engine": "vllm", "context": 100, "tp": 2, "max_num_seqs": 2, "cudagraph_mode": "piecewise",
            "draft": draft, "num_speculative_tokens": 1, **kw}  # fmt: skip
    return InferenceSetup(**args)  # type: ignore[arg-type]


def test_drafter_captures_and_nccl_allreduces_with_custom_all_reduce_off() -> None:
    # 4 PIECEWISE sizes; each captures the target's forward (2 x 2 layers + 1 = 5 all-reduces) and one
    # drafter forward (llm_base_proposer.py dummy_run: 2 x 1 + 1 = 3): 4 x 5 + 4 x 3 = 32 captured
    off = graph_memory(tiny(), _drafted(disable_custom_all_reduce=True), act_bytes=2, max_tokens=8192,
                       spec_tokens=1)  # fmt: skip
    assert off is not None and (off.graphs, off.draft_captures, off.draft_allreduces_per_graph) == (4, 4, 3)
    assert off.captured_allreduces == 32
    # --disable-custom-all-reduce: NCCL keeps 135 KiB a captured all-reduce, in the term
    assert 135 * KiB == NCCL_ALLREDUCE_GRAPH_BYTES
    assert off.nccl_bytes == 32 * 135 * KiB == 4_423_680
    assert off.bytes == off.shared_bytes + 4 * 6 * MiB + 4_423_680
    # the band: +-10 % of the term; the high end adds the CUDA 12.2 drivers' excess (vllm #5517: 3.8086 /
    # 1.1367 GiB): 4,423,680 x 38,086 // 11,367 = 14,821,877 B in all, 10,398,197 B over the term's
    assert OLD_DRIVER_RATIO == (38086, 11367)
    spread = int(off.bytes * 0.10)
    assert graph_band(off) == (-spread, spread + 14_821_877 - 4_423_680)
    assert "32 tensor-parallel all-reduces captured (5 a graph + 3 in each of the drafter's 4 captures)" in (
        graph_note(off)
    )
    # without the flag and no catalog GPU it is not known whether the engine runs custom all-reduce: none in
    # the term, all in the band
    on = graph_memory(tiny(), _drafted(), act_bytes=2, max_tokens=8192, spec_tokens=1)
    assert on is not None and on.captured_allreduces == 32 and on.nccl_bytes == 0
    assert on.bytes == off.bytes - 4_423_680
    assert graph_band(on)[1] == int(on.bytes * 0.10) + 14_821_877
    # FULL_AND_PIECEWISE: the drafter is captured with the PIECEWISE sizes only (use_cudagraphs is False for
    # FULL): [1, 2, 4, 8] PIECEWISE + [1, 2, 4] FULL = 7 graphs, 4 drafter captures, 7 x 5 + 4 x 3 = 47
    both = graph_memory(tiny(), _drafted(cudagraph_mode="auto"), act_bytes=2, max_tokens=8192, spec_tokens=1)
    assert both is not None and (both.graphs, both.draft_captures, both.captured_allreduces) == (7, 4, 47)
    # no tensor parallelism: no collective, nothing for NCCL even with the flag
    alone = graph_memory(tiny(), _drafted(tp=1, disable_custom_all_reduce=True), act_bytes=2, max_tokens=8192,
                         spec_tokens=1)  # fmt: skip
    assert alone is not None and alone.captured_allreduces == 0 and alone.nccl_bytes == 0
    assert graph_band(alone)[1] == int(alone.bytes * 0.10)


@pytest.mark.parametrize(
    ("link", "tp", "off"),
    [
        ("nvlink", 8, False), ("xgmi", 8, False), ("nvlink", 3, True),  # 3 is not a custom all-reduce size
        ("pcie", 2, False), ("pcie", 4, True),  # "not supported on more than two PCIe-only GPUs"
        ("pcie-no-p2p", 2, True), ("", 4, None), ("", 1, False),  # "lacks GPU P2P capability"; not known
    ],
)  # fmt: skip
def test_custom_all_reduce_follows_vllm_on_the_gpus_links(link: str, tp: int, off: bool | None) -> None:
    setup = InferenceSetup(engine="vllm", tp=tp, context=4096, interconnect=link)  # type: ignore[arg-type]
    assert custom_all_reduce_off(setup) is off
    assert custom_all_reduce_off(replace(setup, disable_custom_all_reduce=True)) is (tp > 1)


def test_the_gpu_named_decides_where_nccl_goes(capsys: pytest.CaptureFixture[str]) -> None:
    """4 x RTX 4090 (PCIe, no P2P): vLLM captures NCCL all-reduces, in the term; 8 x H100 SXM (NVLink): custom
    all-reduce runs them, nothing for NCCL, not even in the band; a plain size: not known, in the band.
    max_num_seqs 256 on all three (vLLM would pick 1024 on the H100 and the 80 GB size: vllm_defaults)."""
    kw = dict(engine="vllm", tp=4, context=4096, max_num_seqs=256)

    def graphs(gpu: str) -> tuple[int, int, int]:
        out = infer_cli_equals_api(capsys, "llama-3.1-8b", **kw, gpu=gpu)
        band = next(t for t in out["band"]["terms"] if t["name"] == "cuda_graphs")
        return out.get("cuda_graph_nccl_bytes", 0), out["cuda_graph_bytes"], band["high_bytes"]

    geforce, nvlink, plain = graphs("rtx-4090"), graphs("h100-sxm"), graphs("80GB")
    allreduces = (2 * 32 + 1) * 86  # FULL_AND_PIECEWISE, 51 + 35 sizes at max_num_seqs 256
    assert geforce[0] == allreduces * 135 * KiB and geforce[1] == nvlink[1] + geforce[0]
    assert nvlink[0] == plain[0] == 0 and nvlink[1] == plain[1]
    # the band's high end: 10 % of the term, 20 MiB for each PIECEWISE size above 272 tokens (288 .. 512 by
    # 16: 15), and where NCCL is or may be captured the CUDA 12.2 drivers' cost less what the term holds
    old_driver, large = allreduces * 135 * KiB * 38086 // 11367, 15 * 20 * MiB
    assert nvlink[2] == int(nvlink[1] * 0.10) + large and plain[2] == nvlink[2] + old_driver
    assert geforce[2] == int(geforce[1] * 0.10) + large + old_driver - geforce[0]


def test_yi_34b_on_four_gpus_captures_4235_allreduces() -> None:
    # vllm #7553 (benchmarks/cuda_graph_logs.json H3): vLLM 0.5, Yi-1.5-34B (60 layers), TP 4, max_num_seqs
    # 256: 35 FULL decode graphs of 2 x 60 + 1 = 121 all-reduces each, 4,235 NCCL kernels on 4 x RTX 4090
    # (custom all-reduce off on more than two PCIe-only GPUs)
    yi = dict(name="yi-1.5-34b", hidden_size=7168, intermediate_size=20480, num_hidden_layers=60,
              num_attention_heads=56, num_key_value_heads=8, vocab_size=64000, max_position_embeddings=4096,
              tie_word_embeddings=False)  # fmt: skip
    setup = InferenceSetup(engine="vllm", engine_version="0.5", tp=4, context=4096)  # type: ignore[arg-type]
    g = graph_memory(build_spec(yi), setup, act_bytes=2, max_tokens=8192)
    assert g is not None and (g.graphs, g.allreduces_per_graph, g.captured_allreduces) == (35, 121, 4235)


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"engine": "hf", "enforce_eager": True}, r"^enforce_eager=True: CUDA graphs are captured by vllm"),
        ({"engine": "sglang", "max_num_seqs": 8}, r"^max_num_seqs=8: an option of engine=vllm, not sglang$"),
        ({"engine": "vllm", "cuda_graph_max_bs": 8}, r"^cuda_graph_max_bs=8: an option of engine=sglang"),
        ({"engine": "vllm", "max_num_seqs": 0}, r"^max_num_seqs=0: must be positive"),
        ({"engine": "vllm", "engine_version": "latest"}, r"^engine_version='latest': a release number"),
        ({"engine": "llamacpp", "weights": "q4_k_m", "engine_version": "0.2"},
         r"^engine_version='0.2': versions are modelled for vllm, sglang, hf and litgpt, not llamacpp$"),
        ({"engine": "vllm", "engine_version": "0.6", "cudagraph_mode": "full"}, r"^cudagraph_mode='full'"),
        ({"engine": "vllm", "cudagraph_mode": "always"}, r"^cudagraph_mode='always': unknown; choose one of"),
        ({"engine": "sglang", "cudagraph_mode": "full"}, r"^cudagraph_mode='full': an option of engine=vllm"),
        ({"engine": "vllm", "enforce_eager": "yes"}, r"^enforce_eager='yes': must be True or False"),
        ({"engine": "hf", "disable_custom_all_reduce": True},
         r"^disable_custom_all_reduce=True: CUDA graphs are captured by vllm and sglang, not hf$"),
        ({"engine": "vllm", "cudagraph_mode": 5}, r"^cudagraph_mode=5: must be text$"),
        ({"engine": "vllm", "engine_version": 21}, r"^engine_version=21: a release number"),
        ({"engine": "vllm", "model_runner": "v3"}, r"^model_runner='v3': unknown; choose one of auto, v1"),
        ({"engine": "sglang", "model_runner": "v1"}, r"^model_runner='v1': an option of engine=vllm, not"),
        ({"engine": "vllm", "engine_version": "0.7", "model_runner": "v2"}, r"^model_runner='v2': vLLM 0.7"),
    ],
)  # fmt: skip
def test_bad_values_are_one_line_errors(kw: dict[str, object], match: str) -> None:
    with pytest.raises(InputError, match=match) as info:
        InferenceSetup(**kw)  # type: ignore[arg-type]
    assert "\n" not in str(info.value)


def test_options_name_every_mode() -> None:
    assert tuple(m.value for m in CudagraphMode) == CUDAGRAPH_MODES
    assert tuple(m.value for m in ModelRunner) == MODEL_RUNNERS


def test_cli_equals_api(capsys: pytest.CaptureFixture[str]) -> None:
    out = infer_cli_equals_api(capsys, "llama-3.1-8b", engine="vllm", context=8192, gpu="a100-80gb",
                               max_num_seqs=64, engine_version="0.20")  # fmt: skip
    assert out["breakdown"]["cuda_graphs"] == 201_850_880  # as test_llama_8b_with_fewer_sequences
    assert out["setup"]["engine_version"] == "0.20" and out["setup"]["max_num_seqs"] == 64


def test_the_headline_says_graphs_on_top_before_0_20(capsys: pytest.CaptureFixture[str]) -> None:
    from peakmem.cli import main

    args = ["infer", "llama-3.1-8b", "--engine", "vllm", "--context", "8192", "--gpu", "a100-80gb"]
    heads = []
    for extra in (["--engine-version", "0.19"], ["--model-runner", "v1"], []):
        assert main([*args, *extra]) == 0
        out = " ".join(capsys.readouterr().out.split())  # rich wraps the headline
        heads.append(out[: out.index(": fits.")])
    assert "+ CUDA graphs 0.59 GB (0.55 GiB) on top" in heads[0]  # 593,494,016 B (test_serving_verdict.py)
    assert "on top" not in heads[1]  # the V1 runner takes them out of the KV budget
    assert "+ CUDA graphs 0.59 GB (0.55 GiB) on top" in heads[2]  # Model Runner V2, vLLM 0.27's default


def test_web_api_takes_the_options() -> None:
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from peakmem.web.app import create_app

    client = TestClient(create_app())
    body = {
        "model": "llama-3.1-8b",
        "engine": "vllm",
        "context": 8192,
        "max_num_seqs": 64,
        "engine_version": "0.20",
    }
    assert client.post("/api/infer", json=body).json()["breakdown"]["cuda_graphs"] == 201_850_880
    runner = client.post("/api/infer", json={**body, "engine_version": "0.27", "model_runner": "v1"}).json()
    assert runner["vllm_model_runner"] == "v1" and runner["setup"]["model_runner"] == "v1"
    bad = client.post("/api/infer", json={"model": "llama-3.1-8b", "engine": "hf", "enforce_eager": True})
    assert bad.status_code == 422 and bad.json()["field"] == "enforce_eager"


def test_fit_infer_offers_turning_the_graphs_off() -> None:
    # Llama-3.1-8B on a 4090 (vLLM, 7 x 6144 tokens): the graphs' memory leaves a pool of 6 sequences;
    # enforce_eager gives it back to the pool, and fit names that change on its own
    from peakmem.catalog import get_gpu
    from peakmem.planner.serving import fit_inference
    from peakmem.resolve import resolve_model

    # the V1 runner (VLLM_USE_V2_MODEL_RUNNER=0), which takes the graphs out of the KV budget;
    # --max-num-batched-tokens 8192 (vllm serve's default on this GPU is 2048: peakmem.vllm_defaults)
    setup = InferenceSetup(weights="bf16", batch=7, context=6144, engine=Engine.VLLM,  # type: ignore[arg-type]
                           model_runner="v1", prefill_chunk=8192)  # fmt: skip
    report = fit_inference(resolve_model("llama-3.1-8b"), setup, [get_gpu("rtx-4090")])
    (g,) = report.gpus
    assert not g.fits
    eager = [c for c in g.candidates if c.steps == ("enforce-eager",)]
    assert eager and eager[0].fits and eager[0].setup.enforce_eager
    family = next(f for f in report.search_space if f.name == "CUDA graphs off")
    assert family.status == "searched"
    already = fit_inference(
        resolve_model("llama-3.1-8b"), replace(setup, enforce_eager=True), [get_gpu("rtx-4090")]
    )
    assert next(f for f in already.search_space if f.name == "CUDA graphs off").status == "not applicable"
