"""transformers' caching-allocator warm-up at from_pretrained(device_map=...) (formulas/serving/hf_load.py),
by hand on a tiny Llama; benchmarks/hf_load_warmup.py holds the same blocks against transformers 4.53.3,
4.57.1 and 5.23.0's own caching_allocator_warmup (all 42 rows equal, 2026-12-07)."""

from __future__ import annotations

from typing import Any

import pytest

from peakmem.breakdown import Phase
from peakmem.catalog import get_model
from peakmem.formulas.serving import estimate_inference
from peakmem.formulas.serving.context import CUDA_CONTEXT_BYTES
from peakmem.formulas.serving.hf_load import warmup_block_bytes
from peakmem.hf import spec_from_config
from peakmem.inference import InferenceSetup
from peakmem.model import ModelSpec

TINY = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "torch_dtype": "bfloat16",
        "rms_norm_eps": 1e-5, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1000,
        "max_position_embeddings": 256}  # fmt: skip
# by hand: per layer q 64x64, k and v 64x32, o 64x64, gate / up / down 64x128, two norms of 64
LAYER = 4096 + 2048 + 2048 + 4096 + 3 * 8192 + 2 * 64
EMBED = 1000 * 64
TIED_PARAMS = EMBED + 2 * LAYER + 64  # 138,048: the head shares the embedding


def _spec(tied: bool) -> ModelSpec:
    return spec_from_config({**TINY, "tie_word_embeddings": tied}, name="tiny-llama")


def _setup(release: str, weights: str = "bf16", **kw: Any) -> InferenceSetup:
    return InferenceSetup(
        engine="hf", engine_version=release, weights=weights, batch=1, context=32, prompt=16, **kw
    )


def test_parameter_count_by_hand() -> None:
    assert _spec(True).params == TIED_PARAMS
    assert _spec(False).params == TIED_PARAMS + EMBED


@pytest.mark.parametrize(
    ("release", "tied", "weights", "block"),
    [
        ("4.49", True, "bf16", 0),  # no warm-up before 4.50
        ("4.50", True, "bf16", (TIED_PARAMS + EMBED) * 2),  # the tied head's key counted again
        ("4.53", True, "bf16", (TIED_PARAMS + EMBED) * 2),
        ("4.53", False, "bf16", (TIED_PARAMS + EMBED) * 2),  # untied: the weights exactly
        ("4.54", True, "bf16", TIED_PARAMS * 2),  # the tied key skipped
        ("4.57", False, "bf16", TIED_PARAMS * 2),  # the class's lm_head key skipped though untied
        ("4.50", True, "nf4", 0),  # 4.50 warms no quantized load
        ("4.51", True, "nf4", (TIED_PARAMS + EMBED) * 2 // 4 * 2),  # 16-bit meta bytes, factor 4
        ("4.53", False, "int8", (TIED_PARAMS + EMBED) * 2 // 4 * 2),
        ("4.57", False, "nf4", TIED_PARAMS * 2 // 4 * 2),
        ("4.53", True, "gptq-4bit-g128", 0),  # other quantizers: not modelled
        ("5.0", True, "bf16", 0),  # 5.x: the block is the weights' own size
        ("5.0", True, "nf4", 0),
    ],
)
def test_block_by_release(release: str, tied: bool, weights: str, block: int) -> None:
    assert warmup_block_bytes(_spec(tied), _setup(release, weights)) == block


def test_free_memory_caps_the_bytes_before_the_factor() -> None:
    """``min(byte_count, int(device_memory - 1.2 * 1024**3))`` from 4.52, ``int(0.95 * device_memory)``
    before, device_memory the free bytes (here the GPU less peakmem's CUDA context)."""
    spec, free = _spec(True), int(1.2 * 2**30) + 100_000
    gpu = free + CUDA_CONTEXT_BYTES
    # the margin in float arithmetic: int(100,000 - 0.8) = 99,999 bytes, then fp16 elements of it
    assert warmup_block_bytes(spec, _setup("4.53", gpu_bytes=gpu)) == 99_999 // 2 * 2
    assert warmup_block_bytes(spec, _setup("4.53", "nf4", gpu_bytes=gpu)) == 99_999 // 4 * 2
    assert warmup_block_bytes(spec, _setup("4.51", gpu_bytes=300_000 + CUDA_CONTEXT_BYTES)) == 285_000
    big = 80 * 2**30  # room: no cap
    assert warmup_block_bytes(spec, _setup("4.53", gpu_bytes=big)) == (TIED_PARAMS + EMBED) * 2


def test_tensor_parallel_not_modelled() -> None:
    assert warmup_block_bytes(_spec(True), _setup("4.53", tp=2)) == 0


def test_block_beyond_the_weights_is_the_load_phase_and_stays_reserved() -> None:
    spec = _spec(True)
    old, new = estimate_inference(spec, _setup("4.53")), estimate_inference(spec, _setup("4.54"))
    block = (TIED_PARAMS + EMBED) * 2
    assert Phase.LOAD not in {p.phase for p in new.phases}
    load = next(p for p in old.phases if p.phase is Phase.LOAD)
    assert load.bytes == block  # the one torch.empty, before any weight
    assert old.peak_phase is Phase.LOAD and old.peak_allocated_bytes == block  # the tiny job's steps: less
    assert old.peak_reserved_bytes >= max(block, new.peak_reserved_bytes)
    assert any("warms the caching allocator" in a for a in old.assumptions)
    # the steps themselves are the same job
    assert [p.bytes for p in old.phases if p.phase is not Phase.LOAD] == [p.bytes for p in new.phases]


def test_no_load_phase_where_the_weights_fill_the_block() -> None:
    est = estimate_inference(_spec(False), _setup("4.53", "int8"))
    assert Phase.LOAD not in {p.phase for p in est.phases}
    assert not any("warms the caching allocator" in a for a in est.assumptions)


def test_llama_3_2_1b_generate_reserves_the_tied_head_again() -> None:
    """meta-llama/Llama-3.2-1B (tied, vocab 128256 x hidden 2048): 4.53 reserves one more embedding's bytes
    from load on than 4.54 does for the same short bf16 generate."""
    spec = spec_from_config(dict(get_model("llama-3.2-1b").config))
    embed = 128256 * 2048
    block = (spec.params + embed) * 2
    old, new = estimate_inference(spec, _setup("4.53")), estimate_inference(spec, _setup("4.54"))
    assert warmup_block_bytes(spec, _setup("4.53")) == block == 2_996_965_376
    assert old.peak_reserved_bytes == -(-block // 2**21) * 2**21  # the block rounded to kRoundLarge
    assert new.peak_reserved_bytes < spec.params * 2 + embed  # the weights and the short job's steps
