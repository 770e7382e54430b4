"""The accelerate release under the HF Trainer (peakmem.accelerate_versions): before 1.11 (accelerate
ec92b1af) ``Accelerator.no_sync`` is ``getattr(model, "no_sync", nullcontext)``, a no-op on an FSDP2
model, so ``grad_sync`` auto is each-micro-batch there; FSDP1 and DDP have ``no_sync`` in every release.

Hand-derived on test_parallel's tiny spec (tests/test_fsdp_no_sync.py): 276,032 parameters, every FSDP
shard over 2 ranks half; reduce dtype fp32 (torchtitan's), so the unsharded and the sharded fp32
gradients differ (4 x 276,032 against 4 x 138,016).
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from peakmem.accelerate_versions import ACCELERATE_CURRENT, parse_accelerate_version, release_facts
from peakmem.defaults import grad_sync, skips_grad_sync
from peakmem.errors import InputError
from peakmem.formulas import model_parallel as mp
from peakmem.formulas import sharding
from peakmem.formulas.technique import technique
from peakmem.parallel import FsdpMode, Parallelism
from peakmem.training import Framework, GradSync, Precision, ReduceDtype, TrainingSetup
from test_parallel import tiny

PARAMS = 276_032
FP32, BF16 = 4, 2
OLD = "1.10.0.dev0"  # accelerate@9359a019's __version__ (axolotl's gpt-oss examples pin it)
SETUP = TrainingSetup(
    seq_len=64, precision=Precision.MIXED_BF16, grad_accum=4, fsdp_reduce_dtype=ReduceDtype.FP32
)
FSDP2 = Parallelism(gpus=2, fsdp=FsdpMode.FULL_SHARD)


def _accumulated(setup: TrainingSetup, par: Parallelism = FSDP2) -> tuple[int, tuple[str, ...]]:
    spec = tiny()
    states = sharding.rank_states(technique(spec, setup), setup, par, mp.stage_params(spec, par, 0))
    return sum(i.bytes for i in states.accumulated), tuple(i.key for i in states.accumulated)


def test_releases() -> None:
    """The fix is in v1.11.0 (first tag holding ec92b1af), not in v1.10.0 or v1.10.1."""
    assert parse_accelerate_version(OLD) == (1, 10, 0)
    assert not release_facts("1.10.1").fsdp2_no_sync and not release_facts(OLD).fsdp2_no_sync
    assert release_facts("1.11.0").fsdp2_no_sync and release_facts(ACCELERATE_CURRENT).fsdp2_no_sync


def test_a_malformed_release_names_the_field() -> None:
    with pytest.raises(InputError, match="accelerate='one'"):
        TrainingSetup(accelerate="one")


def test_the_hf_trainer_default_under_fsdp2_follows_the_release() -> None:
    """HF (and unsloth, on the HF Trainer) before 1.11 under FSDP2: each micro-batch; FSDP1 / DDP, a newer
    release, or another framework's loop: as before; a grad_sync asked is kept."""
    old = replace(SETUP, accelerate=OLD)
    assert (
        grad_sync(old, fsdp2=True).value == "each-micro-batch"
        and "9359a019" in grad_sync(old, fsdp2=True).source
    )
    assert grad_sync(replace(old, framework=Framework.UNSLOTH), fsdp2=True).value == "each-micro-batch"
    assert grad_sync(old).value == "last-micro-batch"  # FSDP1 no_sync exists in every release
    assert grad_sync(SETUP, fsdp2=True).value == "last-micro-batch"
    assert grad_sync(replace(old, framework=Framework.LITGPT), fsdp2=True).value == "last-micro-batch"
    assert not skips_grad_sync(old, fsdp2=True)
    assert skips_grad_sync(replace(old, grad_sync=GradSync.LAST), fsdp2=True)


def test_fsdp2_keeps_shards_before_1_11() -> None:
    """FSDP2, fp32 reduce: 1.16 keeps every unsharded fp32 gradient (4 x 276,032), 1.10 the fp32 shards
    (4 x 138,016); FSDP1 keeps its unsharded bf16 .grad (2 x 276,032) with either release."""
    assert _accumulated(SETUP)[0] == FP32 * PARAMS == 1_104_128
    assert _accumulated(replace(SETUP, accelerate=OLD))[0] == FP32 * PARAMS // 2 == 552_064
    fsdp1 = replace(FSDP2, fsdp_version=1)
    old1 = _accumulated(replace(SETUP, accelerate=OLD), fsdp1)
    assert old1 == _accumulated(SETUP, fsdp1) and old1 == (BF16 * PARAMS, ("fsdp1.no_sync_grads",))
