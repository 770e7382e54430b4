"""Parallel serving (pipeline, data and expert parallelism, SGLang's DP attention): what one rank holds,
derived by hand on tiny specs (peakmem.serving_layout, formulas/serving/parallel.py)."""

from __future__ import annotations

from typing import Any

import pytest

from _infer_specs import build_spec, infer_cli_equals_api, tiny
from peakmem.errors import InputError
from peakmem.formulas.serving import estimate_inference, serving_fit
from peakmem.formulas.serving.parallel import pp_layer_counts, stage_spec
from peakmem.inference import InferenceSetup
from peakmem.units import GiB

# tiny(layers=4): hidden 64, 4 heads x 16, 2 KV heads x 16, gated MLP 128, vocab 128, untied, bf16.
# Per layer: q 64x64 + k 64x32 + v 64x32 + o 64x64 = 12,288 attention params, MLP 3 x 64 x 128 = 24,576,
# two norms of 64 (replicated under TP).
LAYER_SPLIT = (12_288 + 24_576) * 2  # bytes of a layer's linears (split tp ways)
LAYER_NORMS = 2 * 64 * 2
EMBED = HEAD = 128 * 64 * 2
FINAL_NORM = 64 * 2

# A tiny MoE: 2 layers, the same attention, a router 64 -> 8 and 8 experts of gate/up/down 64 <-> 32.
MOE = dict(
    name="tiny-moe", hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_experts=8,
    num_experts_per_tok=2, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
    vocab_size=128, max_position_embeddings=1024, tie_word_embeddings=False,
)  # fmt: skip
ATTENTION = 12_288 * 2
ROUTER = 64 * 8 * 2
EXPERTS = 8 * 3 * 64 * 32 * 2


def _est(spec: Any, **kw: Any) -> Any:
    return estimate_inference(spec, InferenceSetup(**kw))


def test_pipeline_split_follows_vllm_get_pp_indices() -> None:
    # layers // pp each; the remainder one more each on the stages before the last, from the second-last
    assert pp_layer_counts(10, 4) == (2, 3, 3, 2)
    assert pp_layer_counts(61, 8) == (7, 7, 8, 8, 8, 8, 8, 7)
    assert pp_layer_counts(5, 2) == (3, 2)
    assert pp_layer_counts(4, 1) == (4,)
    spec = tiny(layers=4)
    first, last = stage_spec(spec, 2, 0), stage_spec(spec, 2, 1)
    assert (first.num_layers, last.num_layers) == (2, 2)
    assert {t.component for t in first.outer} == {"embeddings"}
    assert {t.component for t in last.outer} == {"norms", "head"}


def test_pipeline_stage_weights_and_kv_by_hand() -> None:
    spec = tiny(layers=4)
    est = _est(spec, engine="vllm", tp=2, pp=2, batch=3, context=64)
    per_layer = LAYER_SPLIT // 2 + LAYER_NORMS
    assert est.extra["stage_weight_bytes"] == [
        EMBED // 2 + 2 * per_layer,
        2 * per_layer + FINAL_NORM + HEAD // 2,
    ]
    assert est.extra["pp_layer_counts"] == [2, 2] and est.extra["gpus"] == 4
    # KV on a stage: its 2 layers x (K, V) x 1 KV head per rank (2 over tp 2) x 16 x bf16, 64 tokens
    per_seq = 2 * 2 * 1 * 16 * 2 * 64
    assert est.extra["kv_bytes_per_sequence"] == per_seq
    assert est.extra["kv_needed_bytes"] == 3 * per_seq
    assert est.extra["most_loaded_stage"] == 1  # the last stage's head and norm outweigh the embedding


def test_pipeline_with_a_tied_head_keeps_a_copy_on_the_last_stage() -> None:
    spec = build_spec({**MOE, "name": "tied", "num_experts": 0, "tie_word_embeddings": True})
    last = stage_spec(spec, 2, 1)
    heads = [t for t in last.outer if t.component == "head"]
    assert len(heads) == 1 and heads[0].shape == (128, 64)


def test_vllm_data_parallel_experts_split_over_tp_times_dp() -> None:
    spec = build_spec(MOE)
    # vLLM: tp 2 x dp 2, --enable-expert-parallel: ep = 4; attention split tp = 2 ways in each DP rank
    per_layer = ATTENTION // 2 + ROUTER + EXPERTS // 4 + LAYER_NORMS
    expected = 2 * per_layer + EMBED // 2 + HEAD // 2 + FINAL_NORM
    est = _est(spec, engine="vllm", tp=2, dp=2, ep=4, batch=5, context=64)
    assert est.extra["stage_weight_bytes"] == [expected]
    # the same bytes without expert parallelism: FusedMoE slices each expert tp x dp ways instead
    assert _est(spec, engine="vllm", tp=2, dp=2, batch=5, context=64).extra["stage_weight_bytes"] == [
        expected
    ]
    # each DP rank holds ceil(5 / 2) = 3 sequences: 2 layers x (K, V) x 1 KV head x 16 x bf16 x 64 tokens
    assert est.extra["kv_needed_bytes"] == 3 * (2 * 2 * 1 * 16 * 2 * 64)


def test_sglang_dp_attention_replicates_attention_and_keeps_kv_per_dp_rank() -> None:
    spec = build_spec(MOE)
    # SGLang --tp 4 --dp 4 --enable-dp-attention --ep 4: attention tp = 4 // 4 = 1 (replicated), the
    # embedding replicated, the LM head vocab-parallel over 4, experts 1/4 each
    per_layer = ATTENTION + ROUTER + EXPERTS // 4 + LAYER_NORMS
    expected = 2 * per_layer + EMBED + HEAD // 4 + FINAL_NORM
    est = _est(spec, engine="sglang", tp=4, dp=4, ep=4, dp_attention=True, batch=8, context=64)
    assert est.extra["stage_weight_bytes"] == [expected]
    assert est.extra["gpus"] == 4
    # KV: both KV heads on every rank (attention tp 1), 8 / 4 = 2 sequences per DP rank
    assert est.extra["kv_bytes_per_token"] == 2 * 2 * 2 * 16 * 2
    assert est.extra["kv_needed_bytes"] == 2 * 64 * (2 * 2 * 2 * 16 * 2)
    # the gathered buffers: (dp + 1) x the prefill chunk x hidden 64 x bf16 on top; SGLang's
    # chunked_prefill_size without a GPU is its fallback, 4096 (0.5.5 server_args.py; peakmem.sglang_defaults)
    plain = _est(spec, engine="sglang", tp=4, ep=4, batch=8, context=64)
    acts = {e: next(i.bytes for i in x.items if i.category.value == "activations") for e, x in
            (("dpa", est), ("plain", plain))}  # fmt: skip
    assert acts["dpa"] - acts["plain"] == 5 * 4096 * 64 * 2


def test_the_deployment_serves_dp_times_a_rank_pool() -> None:
    spec = tiny(layers=4)
    # eager: the CUDA graphs (86 x 6 MiB at vLLM's defaults) would take the 1 GiB GPU's whole pool
    eager = {"enforce_eager": True}
    one = serving_fit(spec, InferenceSetup(engine="vllm", context=64, gpu_bytes=GiB, **eager), GiB)
    four = serving_fit(spec, InferenceSetup(engine="vllm", dp=4, context=64, gpu_bytes=GiB, **eager), GiB)
    assert one.max_concurrent is not None and one.max_concurrent > 0
    assert four.max_concurrent == 4 * one.max_concurrent
    assert four.estimate.extra["rank_max_concurrent_sequences"] == one.max_concurrent
    # pipeline stages: the stage whose pool holds the fewest sequences decides (vLLM min_num_blocks)
    two = serving_fit(spec, InferenceSetup(engine="vllm", pp=2, context=64, gpu_bytes=GiB, **eager), GiB)
    assert two.max_concurrent is not None and two.max_concurrent > one.max_concurrent


@pytest.mark.parametrize(
    ("spec", "kw", "match"),
    [
        (tiny(layers=2), {"engine": "vllm", "pp": 3}, r"^pp=3: must not exceed num_hidden_layers=2$"),
        (build_spec(MOE), {"engine": "vllm", "dp": 3, "ep": 3}, r"^ep=3: must divide the 8 experts$"),
        (tiny(), {"engine": "sglang", "tp": 2, "ep": 2}, r"^ep=2: expert parallelism needs a MoE model"),
        (tiny(), {"engine": "vllm", "tp": 2, "ep": 2, "dp": 2}, r"^ep=2: vLLM's expert-parallel"),
        (tiny(), {"engine": "sglang", "tp": 4, "ep": 3}, r"^ep=3: SGLang needs ep to divide tp=4"),
        (tiny(), {"engine": "hf", "dp": 2}, r"^dp=2: engine=hf has no dp of its own; use vllm or sglang$"),
        (tiny(), {"engine": "llamacpp", "pp": 2, "weights": "q4_k_m"}, r"^pp=2: engine=llamacpp has no pp"),
        (tiny(), {"engine": "vllm", "dp_attention": True}, r"^dp_attention=True: DP attention is SGLang's"),
        (tiny(), {"engine": "sglang", "tp": 4, "dp": 3, "dp_attention": True}, r"^dp=3: DP attention splits"),
    ],
)  # fmt: skip
def test_bad_layouts_name_the_field(spec: Any, kw: dict[str, Any], match: str) -> None:
    with pytest.raises(InputError, match=match):
        _est(spec, context=64, **kw)


def test_jobs_without_the_new_flags_are_unchanged() -> None:
    spec = build_spec(MOE)
    plain = _est(spec, engine="vllm", tp=2, batch=3, context=64)
    assert "gpus" not in plain.extra and "pp" not in plain.setup
    per_layer = ATTENTION // 2 + ROUTER + EXPERTS // 2 + LAYER_NORMS
    weights = next(i.bytes for i in plain.items if i.path.startswith("weights ("))
    assert weights == 2 * per_layer + EMBED // 2 + HEAD // 2 + FINAL_NORM


def test_cli_equals_api_for_a_parallel_job(capsys: Any) -> None:
    cli = infer_cli_equals_api(capsys, "qwen3-30b-a3b", engine="vllm", tp=2, pp=2, dp=2, ep=4, context=4096,
                               gpu="h100-80gb")  # fmt: skip
    assert cli["setup"]["gpus"] == 8 and cli["pp_layer_counts"] == [24, 24]
    verdict = cli["verdicts"][0]
    assert verdict["max_concurrent"] > 0 and verdict["max_concurrent"] % 2 == 0  # 2 DP ranks' pools


def test_fit_infer_keeps_the_layout_and_counts_its_gpus() -> None:
    import peakmem

    got = peakmem.fit("llama-3.2-1b", infer=True, engine="vllm", tp=2, dp=2, gpu="8GB", context=131072,
                      batch=64).to_dict()  # fmt: skip
    row = got["gpus"][0]
    assert row["candidates"] and all(c["gpus"] == 4 for c in row["candidates"])  # tp 2 x dp 2
    tp_family = next(f for f in got["search_space"] if f["name"] == "tensor parallel over N GPUs")
    assert tp_family["status"] == "not applicable"
