"""FSDP1 with the LoRA adapters inside the layer units (``fsdp_adapter_wrap='in-layer'``, Lit-GPT's
``FSDPStrategy(auto_wrap_policy={Block})``): use_orig_params makes each unit's FlatParameter require grad,
so its gradient covers the whole unit; under no_sync (gradient accumulation) it stays unsharded.

Hand-derived on test_parallel's tiny spec (hidden 64, 4 layers of 36,992 elements, vocabulary 1000),
LoRA r 8 on q_proj and v_proj in the base dtype (FSDP1 flattens one dtype a unit): q 8 x 64 + 64 x 8
= 1024, v 8 x 64 + 32 x 8 = 768 per layer, 7,168 in all.
"""

from __future__ import annotations

import pytest

import peakmem
from peakmem.adapters import LoraConfig
from peakmem.errors import InputError
from peakmem.formulas import model_parallel as mp
from peakmem.formulas import sharding
from peakmem.formulas.technique import technique
from peakmem.parallel import AdapterWrap, FsdpMode, Parallelism
from peakmem.training import GradSync, Method, Precision, TrainingSetup
from test_parallel import tiny

ADAPTERS = 4 * (1024 + 768)  # 7,168
LAYERS = 4 * 36_992  # the layer units' frozen elements
BF16 = 2


def _states(
    wrap: AdapterWrap, version: int = 1, grad_accum: int = 1, sync: GradSync = GradSync.AUTO
) -> sharding.RankStates:
    setup = TrainingSetup(seq_len=64, method=Method.LORA, precision=Precision.BF16,
                          lora=LoraConfig(rank=8, targets=("q_proj", "v_proj"), adapter_dtype="base"),
                          grad_accum=grad_accum, grad_sync=sync)  # fmt: skip
    par = Parallelism(gpus=2, fsdp=FsdpMode.FULL_SHARD, fsdp_version=version, fsdp_adapter_wrap=wrap)
    tech = technique(tiny(), setup)
    assert tech.trainable == ADAPTERS
    return sharding.rank_states(tech, setup, par, mp.stage_params(tiny(), par, 0))


def _grads(st: sharding.RankStates) -> int:
    return sum(i.bytes for i in st.step_grads)


def test_separate_units_shard_the_adapters_gradients_only() -> None:
    """Reduce-scattered every micro-batch, the adapters' shards accumulate; under the HF Trainer's
    no_sync (grad_sync auto for framework hf) their unsharded gradients stay (formulas/fsdp_no_sync.py)."""
    st = _states(AdapterWrap.SEPARATE, grad_accum=4, sync=GradSync.EACH)
    assert _grads(st) == BF16 * ADAPTERS // 2 == 7_168
    assert sum(i.bytes for i in st.accumulated) == 7_168
    (acc,) = _states(AdapterWrap.SEPARATE, grad_accum=4).accumulated
    assert acc.key == "fsdp1.no_sync_grads" and acc.bytes == BF16 * ADAPTERS == 14_336


def test_in_layer_fsdp1_shards_the_whole_units_gradients() -> None:
    st = _states(AdapterWrap.IN_LAYER)
    # every layer unit whole (base + adapters), halved over 2 ranks, bf16; the root holds no adapter
    assert _grads(st) == BF16 * (LAYERS + ADAPTERS) // 2 == 155_136
    assert st.accumulated == st.step_grads  # no accumulation: the shards only
    # each layer's backward keeps its unit's shard: kept / written = whole unit / 2 over the adapters
    assert st.grads_kept * ADAPTERS * BF16 == (LAYERS + ADAPTERS) * BF16 // 2


def test_in_layer_fsdp1_no_sync_keeps_them_unsharded() -> None:
    st = _states(AdapterWrap.IN_LAYER, grad_accum=4)
    (acc,) = st.accumulated
    assert acc.key == "fsdp1.no_sync_grads" and acc.bytes == BF16 * (LAYERS + ADAPTERS) == 310_272
    assert _grads(st) == 155_136  # the step reads the shards (reduce-scattered in the last micro-batch)
    # synced every micro-batch (torchtune's loop): the whole units' shards only
    assert _states(AdapterWrap.IN_LAYER, grad_accum=4, sync=GradSync.EACH).accumulated == st.step_grads


def test_fsdp2_grads_per_parameter_whatever_the_wrap() -> None:
    in_layer, separate = _states(AdapterWrap.IN_LAYER, version=2), _states(AdapterWrap.SEPARATE, version=2)
    assert _grads(in_layer) == _grads(separate)


def test_api_and_bad_value() -> None:
    opts = dict(method="lora", precision="bf16", seq=64, gpus=2, fsdp="full-shard", fsdp_version=1,
                lora_targets="q_proj,v_proj", adapter_dtype="base", grad_accum=4)  # fmt: skip
    sep = peakmem.train("llama-2-7b", **opts).data
    mixed = peakmem.train("llama-2-7b", fsdp_adapter_wrap="in-layer", **opts).data
    # llama-2-7b's 32 layers of 202,383,360 frozen elements, unsharded bf16 gradients: at least that more
    assert mixed["peak_allocated_bytes"] - sep["peak_allocated_bytes"] >= BF16 * 32 * 202_383_360
    with pytest.raises(InputError, match="fsdp_adapter_wrap='inside': unknown"):
        peakmem.train("llama-2-7b", fsdp_adapter_wrap="inside", **opts)
