"""The seed (shared/seeds/gpu-memory-to-train-an-llm.txt): GPT-2 XL, mixed-precision Adam, one GPU."""

from __future__ import annotations

from peakmem.estimate import estimate_training
from peakmem.hf import spec_from_config
from peakmem.training import AttentionKernel, Precision, TrainingSetup
from peakmem.units import GB, GiB

GPT2_XL = {
    "model_type": "gpt2", "n_layer": 48, "n_embd": 1600, "n_head": 25, "vocab_size": 50257,
    "n_positions": 1024, "tie_word_embeddings": True,
}  # fmt: skip
PARAMS = 1_557_611_200


def _estimate(attention: AttentionKernel):
    spec = spec_from_config(GPT2_XL)
    setup = TrainingSetup(precision=Precision.MIXED_FP16, micro_batch=1, seq_len=1024, attention=attention)
    return estimate_training(spec, setup)


def test_params_and_rows_assemble_16_bytes() -> None:
    est = _estimate(AttentionKernel.EAGER)
    assert est.params == PARAMS
    table = [(r.tensor, r.dtype, r.bytes_per_param) for r in est.per_param]
    assert table == [
        ("weights", "fp16", 2.0),
        ("gradients", "fp16", 2.0),
        ("master weights", "fp32", 4.0),
        ("AdamW m (exp_avg)", "fp32", 4.0),
        ("AdamW v (exp_avg_sq)", "fp32", 4.0),
    ]
    assert sum(r.bytes_per_param for r in est.per_param) == 16.0  # 2 + 2 + 4 + 4 + 4
    # 1,557,611,200 x 16 = 24,921,779,200 B = 24.92 GB = 23.21 GiB, 8x the fp16 weights
    assert est.model_state_bytes == 24_921_779_200
    assert round(est.model_state_bytes / GB, 2) == 24.92
    assert round(est.model_state_bytes / GiB, 2) == 23.21
    assert est.model_state_bytes == 8 * est.per_param[0].bytes


def test_eager_device_total_in_30_to_40_gb() -> None:
    est = _estimate(AttentionKernel.EAGER)
    # the seed's "~30-40 GB"; simulate's allocator replay of this setup (eager, mixed-fp16) shows
    # 41.74 GB reserved, 42.29 GB on the device: the replayed reserved (formulas/step_sequence.py) follows it
    assert 30 * GB <= est.device_total_bytes <= 43 * GB
    assert est.peak_allocated_bytes <= est.peak_reserved_bytes <= est.device_total_bytes
    # activations (eager keeps 25 heads x 1024^2 scores per layer) add several GB over the states
    fwd = next(p for p in est.phases if p.phase.value == "forward")
    assert fwd.bytes - est.model_state_bytes + est.per_param[1].bytes > 5 * GB


def test_sdpa_default_figure() -> None:
    """SDPA keeps no scores: activations shrink, the optimizer step (22 B/param) is the peak."""
    eager, sdpa = _estimate(AttentionKernel.EAGER), _estimate(AttentionKernel.SDPA)
    fwd_eager, fwd_sdpa = (
        next(p.bytes for p in e.phases if p.phase.value == "forward") for e in (eager, sdpa)
    )
    assert fwd_sdpa < fwd_eager
    assert sdpa.peak_phase.value == "optimizer"
    # optimizer step: fp16 w 2 + master 4 + fp32 grads 4 + m 4 + v 4 + foreach sqrt 4 = 22 B/param
    assert sdpa.peak_allocated_bytes == 22 * PARAMS  # GPT-2 registers no buffers in transformers 5
    # simulate's replay of the mixed-bf16 twin: 36.68 GiB reserved, 39.93 GB with the context
    assert 30 * GB <= sdpa.device_total_bytes <= 41 * GB
