"""Method x optimizer x sharding on one model: what each rank holds next to one GPU.

Prints, per (method, optimizer, layout), the most loaded rank's trainable parameters, optimizer states,
gradients held at the step (ZeRO's fixed-size ipg bucket apart), forward activations and device total,
and whether the invariants of the one-engine issue hold (trainable and activations equal to one GPU's
under DDP/ZeRO/FSDP, states no larger). ``python benchmarks/engine_matrix.py [MODEL] [--seq N]``.
"""

from __future__ import annotations

import argparse
import time

from peakmem.breakdown import Category, Estimate, Phase
from peakmem.estimate import TrainingEstimator
from peakmem.parallel import FsdpMode, Parallelism
from peakmem.ranks import estimate_ranks
from peakmem.resolve import resolve_model
from peakmem.training import Method, OptimizerName, TrainingSetup

LAYOUTS = {
    "1 GPU": None,
    "DDP x2": Parallelism(gpus=2),
    "ZeRO-1 x8": Parallelism(gpus=8, zero_stage=1),
    "ZeRO-2 x8": Parallelism(gpus=8, zero_stage=2),
    "ZeRO-3 x8": Parallelism(gpus=8, zero_stage=3),
    "FSDP x8": Parallelism(gpus=8, fsdp=FsdpMode.FULL_SHARD),
    "TP x2": Parallelism(gpus=2, tp=2),
}
OPTIMIZERS = (OptimizerName.ADAMW, OptimizerName.LION, OptimizerName.ADAFACTOR, OptimizerName.ADAMW_8BIT)


def _phase_sum(est: Estimate, phase: Phase, category: Category, skip: str | None = None) -> int:
    items = next(p for p in est.phases if p.phase is phase).items
    return sum(i.bytes for i in items if i.category is category and i.key != skip)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model", nargs="?", default="llama-3.2-1b")
    ap.add_argument("--seq", type=int, default=512)
    args = ap.parse_args()
    spec = resolve_model(args.model)
    print(f"{args.model}, micro-batch 1 x seq {args.seq}, mixed-bf16; MiB; ok = invariants hold")
    print(f"{'method':6} {'optimizer':10} {'layout':10} {'trainable':>13} {'states':>8} {'grads':>8} "
          f"{'acts':>8} {'total':>8}  ok")  # fmt: skip
    start, n, bad = time.perf_counter(), 0, 0
    for method in (Method.FULL, Method.LORA, Method.QLORA):
        for opt in OPTIMIZERS:
            setup = TrainingSetup(method=method, optimizer=opt, seq_len=args.seq)
            est = TrainingEstimator(spec)
            one = est.estimate(setup)
            for name, par in LAYOUTS.items():
                e = (
                    one
                    if par is None
                    else estimate_ranks(spec, setup, par, estimator=est).most_loaded.estimate
                )
                states = sum(r.bytes for r in e.per_param if r.category is Category.OPTIMIZER_STATES)
                one_states = sum(r.bytes for r in one.per_param if r.category is Category.OPTIMIZER_STATES)
                grads = _phase_sum(e, Phase.OPTIMIZER, Category.GRADIENTS, skip="zero.ipg")
                acts = _phase_sum(e, Phase.FORWARD, Category.ACTIVATIONS)
                one_acts = _phase_sum(one, Phase.FORWARD, Category.ACTIVATIONS)
                same = acts == one_acts if name != "TP x2" else acts <= one_acts
                ok = e.trainable_params == one.trainable_params and states <= one_states and same
                bad += not ok
                n += 1
                print(f"{method.value:6} {opt.value:10} {name:10} {e.trainable_params:>13,} "
                      f"{states / 2**20:>8.1f} {grads / 2**20:>8.1f} {acts / 2**20:>8.1f} "
                      f"{e.device_total_bytes / 2**20:>8.0f}  {'ok' if ok else 'NO'}")  # fmt: skip
    print(f"{n} setups, {bad} breaking an invariant, {time.perf_counter() - start:.2f} s")


if __name__ == "__main__":
    main()
