"""Parity: the analytic estimate (KernelPolicy.CPU) against real CPU execution (issue 3, item 7).

A deterministic quarter of the grid in ``peakmem.measure.parity`` (every family x every
precision, rotating attention x checkpointing x shape so each value appears); the full grid is
``benchmarks/parity.py``. Tolerances: peak within 5%, each category within 10% at the measured
peak's phase (categories under 1% of the peak: within 1% of the peak, absolutely).

The peak tolerance is enforced on every case. Cases in :data:`CATEGORY_GAPS` are those whose
*category split* at the backward peak still misses (the analytic timeline picks a slightly
different instant of the backward pass than the one measured); they are marked xfail, not
skipped, and only for the category check: remove an entry once the benchmark shows it passing.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from peakmem.measure.parity import analytic_available, run_case, sampled_grid

pytestmark = [pytest.mark.torch, pytest.mark.slow]

_WHY = analytic_available()
CASES = sampled_grid()

# From `benchmarks/parity.py` at 19:31 UTC: 96/96 cases within every tolerance (worst peak 2.3%, worst
# category 5.9%), so no case is expected to miss; add "case name": "why" here only for a known gap.
CATEGORY_GAPS: dict[str, str] = {}


@pytest.mark.skipif(_WHY is not None, reason=_WHY or "")
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_analytic_matches_measured(case):
    result = run_case(case)
    assert result.peak_ok, f"{case.name}: " + "; ".join(result.failures())
    if not result.ok and case.name in CATEGORY_GAPS:
        pytest.xfail(f"{CATEGORY_GAPS[case.name]}: " + "; ".join(result.failures()))
    assert result.ok, f"{case.name}: " + "; ".join(result.failures())


# A sliding-window model past its window (masking_utils hands SDPA a bool mask; SDPA keeps it additive at
# every layer): before the formulas counted that mask, tiny Gemma 3 below was 10.4 % (fp32) and 7.3 % (bf16)
# under the measured peak; with it, 0.25 % and 0.19 %.
GEMMA3_SLIDING = {
    "model_type": "gemma3_text", "vocab_size": 128, "hidden_size": 64, "num_hidden_layers": 4,
    "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 16, "intermediate_size": 96,
    "max_position_embeddings": 1024, "sliding_window": 32, "bos_token_id": 0, "eos_token_id": 0,
    "pad_token_id": 0, "layer_types": ["sliding_attention"] * 3 + ["full_attention"],
}  # fmt: skip


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_sliding_window_mask_matches_measured(precision):
    from peakmem.estimate import estimate_training
    from peakmem.hf import spec_from_config
    from peakmem.measure import measure_training
    from peakmem.training import KernelPolicy, Precision, TrainingSetup

    cpu = KernelPolicy.CPU
    setup = TrainingSetup(seq_len=256, micro_batch=2, kernel_policy=cpu, precision=Precision(precision))
    real = measure_training(dict(GEMMA3_SLIDING), setup).peak_allocated_bytes
    analytic = estimate_training(spec_from_config(dict(GEMMA3_SLIDING)), setup).peak_allocated_bytes
    assert abs(analytic / real - 1) <= 0.01, (analytic, real)
