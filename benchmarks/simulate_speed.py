"""How long ``peakmem simulate`` takes, and how much memory the simulator itself uses.

Issue 8: a Llama-3.1-70B training step simulates in under 60 s on the 2-core CI machine.

    .venv/bin/python benchmarks/simulate_speed.py [MODEL ...] [--steps N]

Prints, per model: wall time (build on the meta device + fake run + analysis), the simulated peak,
and the process's maximum RSS. Default: llama-3.1-70b, one step and two steps, mixed-bf16 AdamW,
batch 1, seq 2048, CUDA-faithful kernels.
"""

from __future__ import annotations

import argparse
import resource
import time

GiB = 2**30
LIMIT_S = 60.0  # issue 8


def main(argv: list[str] | None = None) -> int:
    from peakmem import catalog
    from peakmem.simulate import simulate_training
    from peakmem.training import TrainingSetup

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="*", default=["llama-3.1-70b"])
    ap.add_argument("--steps", type=int, nargs="*", default=[1, 2])
    args = ap.parse_args(argv)
    import torch  # noqa: F401 - import time is not simulation time
    import transformers  # noqa: F401

    worst = 0.0
    for name in args.models:
        config = dict(catalog.get_model(name).config)
        for steps in args.steps:
            t0 = time.perf_counter()
            est = simulate_training(
                config, TrainingSetup(micro_batch=1, seq_len=2048), steps=steps, model_name=name
            )
            wall = time.perf_counter() - t0
            if steps == 1:
                worst = max(worst, wall)
            rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
            print(
                f"{name}: {steps} step(s) in {wall:.1f} s (build {est.extra['timing_s']['build']} s, "
                f"run {est.extra['timing_s']['run']} s); peak {est.peak_allocated_bytes / GiB:.1f} GiB "
                f"({est.peak_phase.value}), reserved {est.peak_reserved_bytes / GiB:.1f} GiB; "
                f"max RSS {rss:.0f} MiB",
                flush=True,
            )
    print(f"one step: {'OK' if worst < LIMIT_S else 'SLOW'} ({worst:.1f} s, limit {LIMIT_S:.0f} s)")
    return 0 if worst < LIMIT_S else 1


if __name__ == "__main__":
    raise SystemExit(main())
