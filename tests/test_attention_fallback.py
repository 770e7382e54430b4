"""Architectures without an SDPA kernel in transformers run eager attention, and so does the estimate."""

from dataclasses import replace

from peakmem.catalog import get_model
from peakmem.estimate import estimate_training
from peakmem.hf import spec_from_config
from peakmem.training import AttentionKernel, TrainingSetup


def test_bloom_sdpa_request_is_estimated_as_eager_and_said() -> None:
    spec = spec_from_config(dict(get_model("bloom-560m").config))
    assert spec.attention_kernels == ("eager",)
    sdpa = TrainingSetup(seq_len=512, attention=AttentionKernel.SDPA)
    asked = estimate_training(spec, sdpa)
    eager = estimate_training(spec, replace(sdpa, attention=AttentionKernel.EAGER))
    assert asked.peak_allocated_bytes == eager.peak_allocated_bytes
    assert any("not implemented by transformers for bloom" in a for a in asked.assumptions)


def test_models_with_sdpa_keep_it() -> None:
    spec = spec_from_config(dict(get_model("gpt2").config))
    # batch 8 x 1024: activations, not the optimizer step, make the peak
    setup = TrainingSetup(micro_batch=8, seq_len=1024, attention=AttentionKernel.SDPA)
    eager = estimate_training(spec, replace(setup, attention=AttentionKernel.EAGER))
    assert estimate_training(spec, setup).peak_allocated_bytes < eager.peak_allocated_bytes
