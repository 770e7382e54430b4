"""Lit-GPT's generate (engine litgpt, formulas/serving/litgpt.py), derived by hand on a tiny spec: 2 layers,
hidden 64, 4 query heads x 16, 2 key/value heads, MLP 128, vocab 256, untied: the head (256 x 64 = 16,384
weights) is the largest Linear (the MLP's are 64 x 128 = 8,192). Context 100, prompt 60."""

from __future__ import annotations

from typing import Any

import pytest

from _infer_specs import infer_cli_equals_api, tiny
from peakmem.breakdown import Estimate, Phase
from peakmem.errors import InputError
from peakmem.formulas.serving import estimate_inference
from peakmem.formulas.weights import bnb_4bit_bytes
from peakmem.inference import InferenceSetup

HEAD = 256 * 64  # the head's weights: the largest Linear
CTX, PROMPT = 100, 60


def _est(
    weights: str = "nf4", *, batch: int = 1, version: str | None = "0.0", kv_heads: int = 2, spec: Any = None
) -> Estimate:
    setup = InferenceSetup(weights=weights, engine="litgpt", context=CTX, prompt=PROMPT, batch=batch,
                           engine_version=version)  # type: ignore[arg-type]  # fmt: skip
    return estimate_inference(spec or tiny(vocab=256, kv_heads=kv_heads), setup)


def _item(est: Estimate, phase: Phase, start: str) -> int:
    (found,) = [p for p in est.phases if p.phase is phase]
    return sum(i.bytes for i in found.items if i.path.startswith(start))


def test_cache_is_preallocated_and_expanded_before_0_5_5() -> None:
    # K and V x heads x 16 x 100 tokens x bf16 x 2 layers; Lit-GPT 2023 caches all 4 query heads,
    # litgpt 0.5.5+ the 2 groups; multi-query (1 group) caches 1 head in both
    assert _item(_est(), Phase.PREFILL, "kv cache") == 2 * 4 * 16 * CTX * 2 * 2
    assert _item(_est(version=None), Phase.DECODE, "kv cache") == 2 * 2 * 16 * CTX * 2 * 2
    assert _item(_est(kv_heads=1), Phase.PREFILL, "kv cache") == 2 * 1 * 16 * CTX * 2 * 2
    # mask_cache 100 x 100 bool + RoPE cos and sin 100 x 16 bf16
    assert _item(_est(), Phase.DECODE, "mask_cache") == CTX * CTX + 2 * CTX * 16 * 2


def test_4bit_head_is_quantized_and_dequantized_at_prefill() -> None:
    est = _est("nf4")
    # 16-bit: the embedding (256 x 64) and 5 norms of 64, not the head (Fabric quantizes it)
    assert {r.dtype: r.params for r in est.per_param}["bf16"] == HEAD + 5 * 64
    # the fp16 dequantized head and its bf16 copy; double quant adds the fp32 absmax (one per 64)
    assert _item(est, Phase.PREFILL, "quantized matmul") == HEAD * (2 + 2)
    assert _item(_est("nf4-dq"), Phase.PREFILL, "quantized matmul") == HEAD * 4 + HEAD // 64 * 4
    # decode: gemv_4bit at batch 1, the dequantized weight from 2 rows
    assert _item(est, Phase.DECODE, "quantized matmul") == 0
    assert _item(_est("nf4", batch=2), Phase.DECODE, "quantized matmul") == HEAD * 4
    # the load: the head's fp16 copy + its new packed weight and absmax, beside every quantized weight
    assert _item(est, Phase.LOAD, "checkpoint load") == HEAD * 2 + bnb_4bit_bytes(HEAD)
    assert est.peak_phase is Phase.PREFILL


def test_int8_load_and_fp16() -> None:
    est = _est("int8")
    # fp16 copy + CB + CBt (int8 each) + fp32 row (256) and column (64) scales
    assert _item(est, Phase.LOAD, "checkpoint load") == HEAD * 2 + 2 * HEAD + 4 * (256 + 64)
    # CxB beside CB, + the head's int8 input (60 x 64) and int32 output (60 x 256)
    assert _item(est, Phase.PREFILL, "quantized matmul") == HEAD + PROMPT * (64 + 4 * 256)
    # the load holds the weights and that transient only (no cache yet); here the 100-token cache outweighs it
    load = {p.phase: p.bytes for p in est.phases}[Phase.LOAD]
    assert load == _item(est, Phase.LOAD, "weights") + HEAD * 4 + 4 * (256 + 64)
    # Fabric's int8 runs in fp16: the embedding's 256 x 64 and the cache are 2 bytes an element
    assert _item(est, Phase.DECODE, "kv cache") == 2 * 4 * 16 * CTX * 2 * 2


def test_float_weights_have_no_load_phase_and_every_logit() -> None:
    est = _est("bf16")
    assert [p.phase for p in est.phases] == [Phase.PREFILL, Phase.DECODE]
    # every prompt position's logits + logits[0, -1] / T, the top-k mask and the softmax (bf16)
    assert _item(est, Phase.PREFILL, "prefill temporaries") >= PROMPT * 256 * 2 + 3 * 256 * 2


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"weights": "gptq-4bit"}, r"^weights='gptq-4bit': Lit-GPT's --quantize"),
        ({"kv_cache": "fp8"}, r"^kv_cache='fp8': Lit-GPT's KVCache"),
        ({"tp": 2}, r"^tp=2: "),
        ({"keep_all_logits": True}, r"^keep_all_logits=True: "),
        ({"prefill_chunk": 16}, r"^prefill_chunk=16: "),
        ({"engine_version": "new"}, r"^engine_version='new': a release number"),
        ({"cache_implementation": "static"}, r"^cache_implementation='static': transformers"),
    ],
)
def test_options_without_a_litgpt_counterpart_error(kw: dict[str, Any], match: str) -> None:
    with pytest.raises(InputError, match=match):
        InferenceSetup(engine="litgpt", **kw)  # type: ignore[arg-type]


def test_cli_llama_2_7b_nf4(capsys: Any) -> None:
    """Llama-2-7B nf4 (Lit-GPT 2023): the head, 32000 x 4096, dequantized to fp16 + bf16 at prefill:
    131,072,000 x 4 B; the cache 32 layers x K, V x 32 heads x 128 x 56 tokens x 2 B."""
    out = infer_cli_equals_api(capsys, "llama-2-7b", engine="litgpt", weights="nf4", prompt=6, context=56,
                               engine_version="0.0")  # fmt: skip
    items = {i["path"]: i["bytes"] for i in out["items"]}
    head = "quantized matmul (dequantized fp16 weight + its copy, largest Linear: the head)"
    assert items[head] == 524_288_000
    assert items["kv cache (56 tokens x 1, preallocated)"] == 32 * 2 * 32 * 128 * 56 * 2
    assert out["peak_phase"] == "prefill"
    assert any("BitsandbytesPrecision" in a for a in out["assumptions"])
    # int8: the load's transient (the head's fp16 copy, CB and CBt: 4 B a weight) is the peak
    out = infer_cli_equals_api(capsys, "llama-2-7b", engine="litgpt", weights="int8", prompt=6, context=56)
    assert out["peak_phase"] == "load"


def test_fit_searches_only_what_litgpt_takes() -> None:
    """``fit --infer``: Lit-GPT's --quantize formats (int8, nf4), no KV dtype, no tensor parallelism."""
    from peakmem.catalog import get_gpu
    from peakmem.planner.serving import fit_inference

    setup = InferenceSetup(weights="bf16", engine="litgpt", context=4096, prompt=4000)  # type: ignore[arg-type]
    report = fit_inference(tiny(vocab=256), setup, [get_gpu("rtx-4090")])
    status = {f.name: (f.status, f.options) for f in report.search_space}
    assert status["weight format"] == ("searched", ("int8", "nf4"))
    assert status["KV-cache dtype"][0] == status["tensor parallel over N GPUs"][0] == "not applicable"


def test_a_tied_model_runs_untied() -> None:
    """Lit-GPT's GPT builds its own lm_head (profiles.SRC_LITGPT_UNTIED): a tied config gets the head back,
    as a quantized Linear under nf4 and as a second bf16 weight unquantized: the same rows as the untied
    spec, and a note saying so."""
    from dataclasses import replace

    spec = tiny(vocab=256)
    outer = tuple(t for t in spec.outer if t.component != "head")
    tied = replace(spec, tie_word_embeddings=True, outer=outer)
    for weights in ("bf16", "nf4"):
        untied_est, tied_est = _est(weights, spec=spec), _est(weights, spec=tied)
        assert tied_est.per_param == untied_est.per_param
        assert any("untied" in n for n in tied_est.assumptions)
        assert not any("untied" in n for n in untied_est.assumptions)
