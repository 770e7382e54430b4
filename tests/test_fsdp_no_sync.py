"""Gradient accumulation under FSDP as the loop syncs it (``grad_sync``; peakmem.defaults GRAD_SYNC,
formulas/fsdp2.py ``accumulated``, formulas/fsdp_no_sync.py): the HF Trainer's accelerate ``no_sync``
keeps the unsharded gradients between micro-batches, torchtune and torchtitan keep gradient shards.

Hand-derived on test_parallel's tiny spec: 276,032 parameters (embedding and untied head 64,000 each,
final norm 64, 4 layer units of 36,992), every dim 0 even, so over 2 ranks every FSDP shard is half.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

import peakmem
from peakmem.breakdown import Phase
from peakmem.defaults import grad_sync, skips_grad_sync
from peakmem.errors import InputError
from peakmem.formulas import model_parallel as mp
from peakmem.formulas import sharding
from peakmem.formulas.technique import technique
from peakmem.parallel import FsdpMode, Offload, Parallelism
from peakmem.ranks import estimate_ranks
from peakmem.training import Framework, GradSync, Method, Precision, ReduceDtype, TrainingSetup
from test_parallel import tiny

PARAMS = 276_032
UNIT = 36_992
FP32, BF16 = 4, 2
SETUP = TrainingSetup(seq_len=64, precision=Precision.MIXED_BF16, grad_accum=4)
# torchtitan's reduce dtype (fp32), which the no_sync cases below were derived and measured under; the HF
# default (accelerate: the param dtype) is tests/test_fsdp_reduce_dtype.py's
TITAN = replace(SETUP, fsdp_reduce_dtype=ReduceDtype.FP32)
FSDP2 = Parallelism(gpus=2, fsdp=FsdpMode.FULL_SHARD)


def _states(setup: TrainingSetup, par: Parallelism = FSDP2) -> sharding.RankStates:
    spec = tiny()
    return sharding.rank_states(technique(spec, setup), setup, par, mp.stage_params(spec, par, 0))


def _accumulated(setup: TrainingSetup, par: Parallelism = FSDP2) -> int:
    return sum(i.bytes for i in _states(setup, par).accumulated)


def test_framework_defaults() -> None:
    """auto: the HF Trainer (and unsloth, which runs it) skips the sync, torchtune does not; one
    micro-batch never skips anything."""
    assert grad_sync(SETUP).value == "last-micro-batch"
    assert grad_sync(replace(SETUP, framework=Framework.UNSLOTH)).value == "last-micro-batch"
    assert grad_sync(replace(SETUP, framework=Framework.TORCHTUNE)).value == "each-micro-batch"
    assert skips_grad_sync(SETUP) and not skips_grad_sync(replace(SETUP, grad_accum=1))
    assert not skips_grad_sync(replace(SETUP, grad_sync=GradSync.EACH))
    assert skips_grad_sync(replace(SETUP, framework=Framework.TORCHTUNE, grad_sync=GradSync.LAST))


def test_fsdp2_keeps_the_unsharded_gradients_in_the_reduce_dtype() -> None:
    """FSDP2 mixed-bf16 (fp32 shards, reduce dtype fp32): no_sync keeps every parameter's fp32
    gradient whole, 4 x 276,032; synced each micro-batch, the fp32 shards, 4 x 138,016."""
    (acc,) = _states(TITAN).accumulated
    assert acc.bytes == FP32 * PARAMS == 1_104_128 and "set_requires_gradient_sync" in acc.path
    assert _accumulated(replace(TITAN, grad_sync=GradSync.EACH)) == FP32 * PARAMS // 2 == 552_064


def test_fsdp2_no_sync_keeps_no_reduce_scatter_input() -> None:
    """Synced each micro-batch, a layer unit's backward holds its bf16 parameters, the next unit's
    prefetched output and the previous unit's kept fp32 reduce-scatter input (2 x 2 x 36,992 +
    4 x 36,992); under no_sync the micro-batches but the last reduce nothing and the last one's input
    replaces the gradient it copies (fsdp2.reduce_adds): the two units only, the last layer one."""
    each, last = _states(replace(TITAN, grad_sync=GradSync.EACH)), _states(TITAN)
    assert each.layer_backward_extra == 2 * BF16 * UNIT + FP32 * UNIT == 295_936
    assert last.layer_backward_extra == 2 * BF16 * UNIT == 147_968
    assert (each.layer_backward_last_extra, last.layer_backward_last_extra) == (221_952, 73_984)
    assert last.root_backward_extra == 0 < each.root_backward_extra


def test_fsdp2_root_gradients_added_in_place_when_dtypes_match() -> None:
    """fp32 under no_sync: AccumulateGrad adds the head's new gradient into the accumulated fp32 one (no
    whole root gradient held through backward); mixed-bf16 writes new bf16 ones, held until the root's
    post-backward, as when synced every micro-batch."""
    fp32 = replace(TITAN, precision=Precision.FP32)
    assert not _states(fp32).root_grads_deferred
    assert _states(TITAN).root_grads_deferred
    assert _states(replace(fp32, grad_sync=GradSync.EACH)).root_grads_deferred


def test_fsdp1_keeps_every_unit_gradient_in_the_param_dtype() -> None:
    """FSDP1 no_sync: each FlatParameter's .grad stays unsharded in the dtype the unit ran in (bf16),
    2 x 276,032, and stays on the GPU under CPU offload, where synced gradients go to the CPU."""
    fsdp1 = replace(FSDP2, fsdp_version=1)
    (acc,) = _states(SETUP, fsdp1).accumulated
    assert acc.key == "fsdp1.no_sync_grads" and acc.bytes == BF16 * PARAMS == 552_064
    offload = replace(fsdp1, offload_optimizer=Offload.CPU, offload_params=Offload.CPU)
    assert _accumulated(SETUP, offload) == 552_064
    assert _states(replace(SETUP, grad_sync=GradSync.EACH), offload).accumulated == ()


def test_adapters_under_fsdp2_keep_their_unsharded_gradients() -> None:
    """LoRA r 8 on q_proj and v_proj in the base dtype: 4 x (1024 + 768) adapter elements, bf16."""
    lora = peakmem.adapters.LoraConfig(rank=8, targets=("q_proj", "v_proj"), adapter_dtype="base")
    setup = replace(SETUP, method=Method.LORA, precision=Precision.BF16, lora=lora)
    (acc,) = _states(setup).accumulated
    assert acc.key == "fsdp2.no_sync_grads" and acc.bytes == BF16 * 4 * (1024 + 768) == 14_336
    assert _accumulated(replace(setup, grad_sync=GradSync.EACH)) == 7_168


@pytest.mark.parametrize(
    "par",
    [
        Parallelism(gpus=4, pp=2, fsdp=FsdpMode.FULL_SHARD),
        Parallelism(gpus=2),
        Parallelism(gpus=2, zero_stage=2),
    ],
    ids=["pp2-fsdp2", "ddp", "zero2"],
)
def test_loops_whose_bytes_do_not_depend_on_it(par: Parallelism) -> None:
    """torch.distributed.pipelining runs every backward without sync whatever the loop; DDP keeps whole
    gradients either way; DeepSpeed accumulates itself (the HF Trainer skips no_sync for it)."""
    each = _states(replace(SETUP, grad_sync=GradSync.EACH), par)
    assert _states(SETUP, par).accumulated == each.accumulated


def test_the_forward_of_a_later_micro_batch_holds_the_difference() -> None:
    """The estimate's forward (a micro-batch after the first, every accumulated gradient resident) grows
    by the unsharded minus the sharded gradients, 1,104,128 - 552,064; the optimizer step reads the
    shards either way."""
    spec = tiny()

    def phases(sync: GradSync) -> dict[Phase, int]:
        est = estimate_ranks(spec, replace(TITAN, grad_sync=sync), FSDP2).ranks[0].estimate
        return {p.phase: p.bytes for p in est.phases}

    last, each = phases(GradSync.LAST), phases(GradSync.EACH)
    assert last[Phase.FORWARD] - each[Phase.FORWARD] == 552_064
    assert last[Phase.OPTIMIZER] == each[Phase.OPTIMIZER]


def test_api_echoes_the_default_and_refuses_a_bad_value() -> None:
    opts = {"seq": 1024, "gpus": 8, "fsdp": "full-shard", "grad_accum": 4, "fsdp_reduce_dtype": "fp32"}
    auto = peakmem.train("llama-3.1-8b", **opts).data
    each = peakmem.train("llama-3.1-8b", grad_sync="each-micro-batch", **opts).data
    assert auto["setup"]["grad_sync"] == "auto"
    assert any(
        a.startswith("grad-sync last-micro-batch (default: the HF Trainer") for a in auto["assumptions"]
    )
    # 8,030,261,248 parameters: fp32 whole instead of an eighth (the forward of a later micro-batch)
    grown = auto["peak_allocated_bytes"] - each["peak_allocated_bytes"]
    assert grown > 0.95 * 7 * 8_030_261_248 * FP32 / 8
    with pytest.raises(InputError, match="grad_sync='sometimes'"):
        peakmem.train("llama-3.1-8b", grad_sync="sometimes", **opts)


def test_hf_trainer_file_with_sync_each_batch(tmp_path: object) -> None:
    """``--from`` a TrainingArguments file: accelerator_config's ``sync_each_batch`` true is
    each-micro-batch; false (accelerate's default) leaves auto, the HF Trainer's no_sync."""
    import json
    from pathlib import Path

    path = Path(str(tmp_path)) / "args.json"
    for flag, expected in ((True, "each-micro-batch"), (False, "auto")):
        kwargs = {"gradient_accumulation_kwargs": {"sync_each_batch": flag}}
        path.write_text(json.dumps({"gradient_accumulation_steps": 4, "accelerator_config": kwargs}))
        data = peakmem.train("llama-3.1-8b", from_file=str(path), seq=1024, gpus=8, fsdp="full-shard").data
        assert data["setup"]["grad_sync"] == expected


def test_verl_actor_syncs_every_micro_batch() -> None:
    """verl's dp_actor runs ``loss.backward()`` per micro-batch without no_sync: auto is each."""
    from peakmem.post_training import post_training
    from peakmem.ppo import actor_setup

    post = post_training("grpo", trainer="verl", seq=SETUP.seq_len, batch=8, gpus=2)
    assert actor_setup(SETUP, post).grad_sync is GradSync.EACH
    assert actor_setup(replace(SETUP, grad_sync=GradSync.LAST), post).grad_sync is GradSync.LAST
