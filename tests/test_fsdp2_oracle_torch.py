"""A no-grad forward (a post-training job's reference pass) under ``fully_shard`` in the fake process
group against :class:`peakmem.step_fsdp.NoGradForward` (FSDP2's terms under PP and with a large root
unit: tests/test_parallel_oracle_torch.py). About 8 s.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("torch.testing._internal.distributed.fake_pg")

from peakmem.hf import spec_from_config  # noqa: E402
from peakmem.measure.parallel import TINY_LLAMA  # noqa: E402
from peakmem.parallel import FsdpMode, Parallelism  # noqa: E402
from peakmem.ranks import estimate_ranks  # noqa: E402
from peakmem.training import (  # noqa: E402
    GradSync,
    KernelPolicy,
    OptimizerImpl,
    Precision,
    ReduceDtype,
    TrainingSetup,
)

pytestmark = [pytest.mark.torch, pytest.mark.slow]

SETUP = TrainingSetup(
    precision=Precision.FP32, micro_batch=2, seq_len=64, grad_accum=2, kernel_policy=KernelPolicy.CPU,
    optimizer_impl=OptimizerImpl.FOREACH, grad_sync=GradSync.EACH,  # torchtitan's loop: no no_sync
    fsdp_reduce_dtype=ReduceDtype.FP32,  # torchtitan's MixedPrecisionPolicy(reduce_dtype=float32)
)  # fmt: skip


# A no-grad forward of TINY_LLAMA under fully_shard (every decoder layer, then the root), rank 0 of 4 on
# the fake process group, twice: the largest sum of FSDP2's unsharded storages (parameters grown by
# resize_ and the all-gather buffers) at any instant. Run in a child process: one fake world per process.
NO_GRAD_RUN = """
import gc, sys, torch
from peakmem.breakdown import Phase
from peakmem.measure.parallel import TINY_LLAMA, ParallelTracker, _apply_fsdp, fake_world
from peakmem.measure.runner import build_model
from peakmem.parallel import FsdpMode, Parallelism
from peakmem.training import Precision, TrainingSetup
setup = TrainingSetup(precision=Precision(sys.argv[1]), micro_batch=2, seq_len=64)
gc.disable()
with fake_world(Parallelism(gpus=4, fsdp=FsdpMode.FULL_SHARD), 0) as mesh:
    model = build_model(TINY_LLAMA, setup, seed=0).eval()
    _apply_fsdp(model, model, mesh["dp"], setup, reshard_after_forward=True)
    tracker = ParallelTracker(device_type="cpu")
    tracker.register_module(model)
    ids = torch.randint(0, 512, (2, 64))
    with tracker, torch.no_grad():
        tracker.set_phase(Phase.FORWARD, 1)
        for _ in range(2):
            model(input_ids=ids)
        tracker.set_phase(Phase.LOAD, 2)
live, best = {}, 0
for sid, delta in tracker.ledger._events:
    if tracker.ledger.records[sid].op in ("resize_", "empty"):
        live[sid] = live.get(sid, 0) + delta
        best = max(best, sum(live.values()))
print(best)
"""


def test_no_grad_forward_unshards_as_measured() -> None:
    """The unsharded working set of a no-grad forward (peakmem.jobs' reference and teacher passes):
    the root (embedding, final norm, head: 131,200 elements) and a layer unit's output kept between
    units, and at the next unit's unshard its all-gather output and parameters: root + 3 units
    (181,504 elements each), above the first unit's unshard next to the root's output (2 roots +
    2 units), 4 bytes each in fp32 (mixed-bf16 measures half: bf16 all-gathers). Before the FSDP2 terms
    the reference pass counted root + 1 unit, 2 units low."""
    precision = Precision.FP32
    out = subprocess.run(
        [sys.executable, "-c", NO_GRAD_RUN, precision.value], capture_output=True, text=True, check=True,
        timeout=300,
    )  # fmt: skip
    measured = int(out.stdout.split()[-1])
    assert measured == 4 * (131_200 + 3 * 181_504) == 2_702_848
    setup = replace(SETUP, precision=precision)
    spec = spec_from_config(TINY_LLAMA, name="llama")
    forward = estimate_ranks(
        spec, setup, Parallelism(gpus=4, fsdp=FsdpMode.FULL_SHARD)
    ).most_loaded.no_grad_forward
    assert sum(i.bytes for i in forward.gathered) + forward.extra(0, 0, 0) == measured
