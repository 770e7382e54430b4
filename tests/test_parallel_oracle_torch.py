"""peakmem's per-rank training estimate against the parallel execution oracle
(:mod:`peakmem.measure.parallel`): the real FSDP2 / DTensor TP / torch.distributed.pipelining code run
one rank at a time over torch's fake process group on CPU, every storage tracked.

Tolerance: :data:`TOLERANCE` (3%, issue 27's done-when) on the peak of every phase of every rank type,
with ``KernelPolicy.CPU`` on the estimate side (the CPU's kernels decide the bytes being measured).
A layout whose formula is still wrong is ``xfail(strict=True)`` with the measured error in the reason.
"""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("torch.testing._internal.distributed.fake_pg")

from peakmem.breakdown import Phase  # noqa: E402
from peakmem.hf import spec_from_config  # noqa: E402
from peakmem.measure.parallel import RankMeasurement, measure_rank  # noqa: E402
from peakmem.parallel import FsdpMode, Parallelism  # noqa: E402
from peakmem.ranks import estimate_ranks  # noqa: E402
from peakmem.training import KernelPolicy, OptimizerImpl, Precision, TrainingSetup  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.slow]

TOLERANCE = 0.03
# Tiny Llama (RoPE, RMSNorm, SwiGLU, GQA, untied head): hidden 128, vocab 512, 2 layers, so that
# activations, FSDP units and the vocab-sized logits all matter; one rank runs in well under a second.
LLAMA: dict[str, Any] = {
    "model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 512, "hidden_size": 128,
    "intermediate_size": 344, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "max_position_embeddings": 256, "bos_token_id": 0, "eos_token_id": 0,
}  # fmt: skip


def _setup(**over: Any) -> TrainingSetup:
    kw: dict[str, Any] = dict(
        precision=Precision.FP32, micro_batch=2, seq_len=64, kernel_policy=KernelPolicy.CPU,
        optimizer_impl=OptimizerImpl.FOREACH,
    )  # fmt: skip
    kw.update(over)
    return TrainingSetup(**kw)


def _errors(m: RankMeasurement, setup: TrainingSetup, par: Parallelism) -> dict[Phase, float]:
    est = estimate_ranks(spec_from_config(LLAMA, name="tiny-llama"), setup, par).role(m.role).estimate
    ana = {p.phase: p.bytes for p in est.phases}
    return {ph: (ana[ph] - b) / b for ph, b in m.phases.items()}


def _check(par: Parallelism, ranks: tuple[int, ...], setup: TrainingSetup | None = None) -> None:
    setup = setup or _setup()
    misses = []
    for rank in ranks:
        m = measure_rank(LLAMA, setup, par, rank)
        for ph, err in _errors(m, setup, par).items():
            if abs(err) > TOLERANCE:
                misses.append(f"rank {rank} ({m.role}) {ph.value}: {err:+.1%}")
    assert not misses, "; ".join(misses)


def test_fsdp2_optimizer_phase_matches() -> None:
    """FSDP2 over 4 ranks: at the optimizer step every rank holds its padded shards of parameters,
    gradients, AdamW's two states and foreach's sqrt temporary, exactly as estimated."""
    par = Parallelism(gpus=4, fsdp=FsdpMode.FULL_SHARD)
    setup = _setup()
    for rank in (0, 3):
        m = measure_rank(LLAMA, setup, par, rank)
        assert abs(_errors(m, setup, par)[Phase.OPTIMIZER]) <= TOLERANCE


@pytest.mark.xfail(
    strict=True, reason="FSDP2 forward +9.5%, backward +12.3%: all-gathered units summed over the loss"
)
def test_fsdp2_every_phase() -> None:
    _check(Parallelism(gpus=4, fsdp=FsdpMode.FULL_SHARD), (0, 3))
