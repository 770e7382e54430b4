"""FSDP1's root unit against the real ``FullyShardedDataParallel`` on torch's fake process group
(:mod:`peakmem.measure.parallel_fsdp1`): tiny Llama (hidden 128, 2 layers) with an untied head and a
vocabulary of 32,000 so that the root unit (embeddings, final norm, head) dominates, fp32, FULL_SHARD over
4 ranks, rank 0, 2 x 64 tokens; within 3 % (issue 27's tolerance) on every phase. Without the root's
held gradients and their ``cat`` (peakmem.formulas.fsdp1_root) backward read -9.5 %. (At vocabulary
8,000 forward reads +5.5 %: the layer units peakmem counts gathered in an FSDP1 forward, not the root.)
About 10 s, most of it the oracle's forkserver start."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("torch.testing._internal.distributed.fake_pg")

from peakmem.hf import spec_from_config  # noqa: E402
from peakmem.measure.parallel import TINY_LLAMA  # noqa: E402
from peakmem.measure.parallel_fsdp1 import measure_fsdp1_rank  # noqa: E402
from peakmem.parallel import FsdpMode, Parallelism  # noqa: E402
from peakmem.ranks import estimate_ranks  # noqa: E402
from peakmem.training import KernelPolicy, OptimizerImpl, Precision, TrainingSetup  # noqa: E402

pytestmark = pytest.mark.torch

TOLERANCE = 0.03


def test_fsdp1_root_unit_matches_the_oracle() -> None:
    config = {**TINY_LLAMA, "vocab_size": 32000, "tie_word_embeddings": False}
    setup = TrainingSetup(precision=Precision.FP32, micro_batch=2, seq_len=64, kernel_policy=KernelPolicy.CPU,
                          optimizer_impl=OptimizerImpl.FOREACH)  # fmt: skip
    par = Parallelism(gpus=4, fsdp=FsdpMode.FULL_SHARD, fsdp_version=1)
    oracle = measure_fsdp1_rank(config, setup, par)
    est = estimate_ranks(spec_from_config(config, name="llama"), setup, par).role("all ranks").estimate
    for p in est.phases:
        err = p.bytes / oracle[p.phase] - 1
        assert abs(err) <= TOLERANCE, (
            f"{p.phase.value}: estimate {p.bytes:,} oracle {oracle[p.phase]:,} ({err:+.1%})"
        )
