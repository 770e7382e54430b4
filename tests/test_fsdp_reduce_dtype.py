"""FSDP's reduce dtype as the framework sets it (``fsdp_reduce_dtype``; peakmem.defaults REDUCE_DTYPE,
formulas/fsdp2.py ``reduce_dt``): accelerate (HF Trainer) reduces, and under no_sync keeps the unsharded
gradients, in the 16-bit param dtype; torchtitan in fp32 (asked explicitly).

Hand-derived on test_parallel's tiny spec (as tests/test_fsdp_no_sync.py): 276,032 parameters (embedding
and untied head 64,000 each, final norm 64, 4 layer units of 36,992), FSDP2 over 2 ranks, mixed-bf16.
About 2 s (two llama-3.1-8b answers).
"""

from __future__ import annotations

from dataclasses import replace

import pytest

import peakmem
from peakmem.defaults import fsdp_reduce, reduce_dtype
from peakmem.dtypes import BF16, FP32
from peakmem.errors import InputError
from peakmem.formulas import fsdp2, sharding
from peakmem.formulas import model_parallel as mp
from peakmem.formulas.technique import technique
from peakmem.parallel import FsdpMode, Parallelism
from peakmem.ranks import estimate_ranks
from peakmem.training import Framework, GradSync, Method, Precision, ReduceDtype, TrainingSetup
from test_parallel import tiny

PARAMS = 276_032
UNIT = 36_992
ROOT = 128_064
HF = TrainingSetup(seq_len=64, precision=Precision.MIXED_BF16, grad_accum=4)  # grad_sync auto: last
TITAN = replace(HF, fsdp_reduce_dtype=ReduceDtype.FP32)
FSDP2 = Parallelism(gpus=2, fsdp=FsdpMode.FULL_SHARD)
LLAMA_8B = 8_030_261_248  # llama-3.1-8b's parameters


def _states(setup: TrainingSetup) -> sharding.RankStates:
    spec = tiny()
    return sharding.rank_states(technique(spec, setup), setup, FSDP2, mp.stage_params(spec, FSDP2, 0))


def _phases(setup: TrainingSetup) -> dict[str, int]:
    est = estimate_ranks(tiny(), setup, FSDP2).ranks[0].estimate
    return {p.phase.value: p.bytes for p in est.phases}


def test_framework_policy_and_what_is_asked() -> None:
    """hf and unsloth run accelerate's policy, torchtune FSDP2 without one: the param dtype; asked wins."""
    for fw in Framework:
        assert reduce_dtype(replace(HF, framework=fw)) is ReduceDtype.PARAM
    assert fsdp_reduce(HF).assumption.startswith("fsdp-reduce-dtype param (default: accelerate")
    assert reduce_dtype(TITAN) is ReduceDtype.FP32
    assert fsdp2.reduce_dt(technique(tiny(), HF), HF) is BF16
    assert fsdp2.reduce_dt(technique(tiny(), TITAN), TITAN) is FP32
    fp32 = replace(HF, precision=Precision.FP32)
    assert fsdp2.reduce_dt(technique(tiny(), fp32), fp32) is FP32  # the param dtype is fp32 there


def test_kept_gradients_in_the_param_dtype() -> None:
    """no_sync keeps every unsharded gradient in bf16 (2 x 276,032) where fp32 is 4 x 276,032, and the
    bf16 gradients are the accumulator (added in place: the root's are not held apart until the end)."""
    (hf,) = _states(HF).accumulated
    (titan,) = _states(TITAN).accumulated
    assert hf.bytes == 2 * PARAMS == 552_064 and titan.bytes == 4 * PARAMS == 1_104_128
    assert not _states(HF).root_grads_deferred and _states(TITAN).root_grads_deferred


def test_reduce_scatter_buffers_in_the_reduce_dtype() -> None:
    """Synced each micro-batch: a layer unit's backward holds its bf16 parameters, the prefetched output
    and the previous unit's kept reduce-scatter input, in bf16 (2 x 36,992) instead of fp32 (4 x 36,992);
    the root's at the end: max(kept input, its input less its bf16 parameters) = max(2 x 36,992,
    2 x 128,064 - 2 x 128,064) for bf16, max(4 x 36,992, 4 x 128,064 - 2 x 128,064) for fp32."""
    hf = _states(replace(HF, grad_sync=GradSync.EACH))
    titan = _states(replace(TITAN, grad_sync=GradSync.EACH))
    assert hf.layer_backward_extra == 2 * 2 * UNIT + 2 * UNIT == 221_952
    assert titan.layer_backward_extra == 2 * 2 * UNIT + 4 * UNIT == 295_936
    assert hf.root_backward_extra == 2 * UNIT == 73_984
    assert titan.root_backward_extra == 4 * ROOT - 2 * ROOT == 256_128


def test_estimate_differs_by_the_kept_gradients() -> None:
    """A later micro-batch's forward and the backward hold every accumulated gradient: fp32 minus bf16,
    2 B x 276,032 = 552,064; the step reads fp32 shards either way. Over 2 ranks the whole bf16 gradients
    are the fp32 shards' bytes, so the HF forward is the each-micro-batch one."""
    hf, titan = _phases(HF), _phases(TITAN)
    assert titan["forward"] - hf["forward"] == titan["backward"] - hf["backward"] == 2 * PARAMS == 552_064
    assert titan["optimizer"] == hf["optimizer"]
    assert hf["forward"] == _phases(replace(HF, grad_sync=GradSync.EACH))["forward"]


def test_llama_8b_on_8_gpus_by_the_kept_gradients() -> None:
    """The brief's job: llama-3.1-8b, FSDP2 over 8 GPUs, mixed-bf16, seq 4096, 4 micro-batches, full
    checkpointing: the peak (backward, at the loss, before any reduce-scatter) is fp32 minus bf16 kept
    gradients apart, 2 B x 8,030,261,248, and each answer names its reduce dtype."""
    opts = {"seq": 4096, "gpus": 8, "fsdp": "full-shard", "fsdp_version": 2, "grad_accum": 4,
            "checkpointing": "full"}  # fmt: skip
    hf = peakmem.train("llama-3.1-8b", **opts).data
    titan = peakmem.train("llama-3.1-8b", fsdp_reduce_dtype="fp32", **opts).data
    assert titan["peak_allocated_bytes"] - hf["peak_allocated_bytes"] == 2 * LLAMA_8B
    assert any(
        a.startswith("FSDP reduces gradients in bf16: fsdp-reduce-dtype param") for a in hf["assumptions"]
    )
    assert "FSDP reduces gradients in fp32 (fsdp-reduce-dtype fp32, asked)" in titan["assumptions"]
    with pytest.raises(InputError, match="fsdp_reduce_dtype='int8'"):
        peakmem.train("llama-3.1-8b", fsdp_reduce_dtype="int8", **opts)


def test_adapters_keep_their_gradient_dtype() -> None:
    """LoRA: the adapters are reduced in their own gradients' dtype, whatever is asked."""
    lora = peakmem.adapters.LoraConfig(rank=8, targets=("q_proj", "v_proj"), adapter_dtype="base")
    setup = replace(TITAN, method=Method.LORA, precision=Precision.BF16, lora=lora)
    assert fsdp2.reduce_dt(technique(tiny(), setup), setup) is BF16
