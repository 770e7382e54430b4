"""The estimate's sharded replay against the parallel oracle's own recorded allocations (issue 27).

    PYTHONPATH=src .venv/bin/python benchmarks/replay_vs_oracle.py          (about 1-2 min a row, CPU)

For each layout of a small grid in Llama-3.1-70B's TP8 ratios (peakmem.measure.parallel_ac.REGIME_70B,
widened so that a rank's logits and layer tensors leave the small pool), rank 0 of the parallel oracle
(peakmem.measure.parallel: real torch FSDP2 / DTensor TP / loss_parallel code on fake process groups,
CPU) runs two steps; its ledger (every storage allocated, resized and freed, in order) is replayed
through the same caching-allocator model (formulas/caching_allocator.py ``replay``). Printed beside it:
the estimate's allocated peak, its closed-form reserved (fragmentation fraction given: no replay), its
default-stream replay, FSDP's side-stream pools and the reserved it reports (replay + pools, never below
the closed form).

What differs, so read the two as neighbours, not as equals: the CPU has one stream, so the oracle's
trace puts the all-gather and reduce-scatter outputs in the same pool as everything else (the estimate
keeps them apart, as a GPU does); the oracle runs transformers' Llama, whose loss is computed inside
the model (torchtitan computes it outside and deletes the logits first); tensors here are MiB, not GiB,
so 2 MiB / 20 MiB segment rounding weighs more than at 70B. It sets nothing.

Measured 2026-12-06, after h-fsdpbf16's layer-end and norm-stage terms (torch 2.13 CPU; MiB; "wide":
hidden 512, ffn 1792, vocab 8192; 2 layers unless said; mixed-bf16, AdamW foreach; 9 min on 2 cores;
2026-12-05 the replayed column read +4.7 / -1.8 / +5.4 / -1.3 / -5.9 / -4.3 %):

| layout | mb x seq | AC | oracle reserved | closed form | replay + pools | closed | replayed |
|---|---|---|---:|---:|---:|---:|---:|
| fsdp2 2 x tp8+sp (REGIME_70B) | 4 x 512 | full | 34.0 | 25.4 | 34.0 + 1.6 | -25.3 % | +4.8 % |
| fsdp2 2 x tp8+sp, wide | 4 x 2048 | full | 198.0 | 175.7 | 194.0 + 6.5 | -11.3 % | +1.3 % |
| fsdp2 4, wide | 2 x 2048 | full | 582.0 | 550.8 | 572.0 + 37.5 | -5.4 % | +4.7 % |
| fsdp2 2 x tp8+sp, wide | 4 x 2048 | none | 278.0 | 259.7 | 268.0 + 6.5 | -6.6 % | -1.2 % |
| fsdp2 2 x tp8+sp, wide, 4 layers | 8 x 2048 | full | 406.0 | 343.4 | 382.0 + 8.2 | -15.4 % | -3.9 % |
| fsdp2 2 x tp4+sp x cp2, wide | 2 x 4096 | full | 200.0 | 177.7 | 190.0 + 9.4 | -11.2 % | -0.3 % |

The allocated peaks agree within 1.4 % (oracle 21.3 / 155.6 / 475.3 / 234.7 / 306.1 / 155.7 MiB).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from typing import Any

from peakmem.estimate import TrainingEstimator
from peakmem.formulas import step_sequence
from peakmem.formulas.allocator import DEFAULT_FRAGMENTATION
from peakmem.formulas.overhead import Overheads
from peakmem.parallel import FsdpMode, Parallelism
from peakmem.training import Checkpointing, Precision, TrainingSetup

MiB = 1 << 20
WIDE = {"vocab_size": 8192, "hidden_size": 512, "intermediate_size": 1792}  # the regime's ratios, x2
TP8_SP = {"gpus": 16, "tp": 8, "sequence_parallel": True}  # FSDP2 over 2 ranks x TP8, as the oracle's tests
GRID: tuple[dict[str, Any], ...] = (
    {"par": TP8_SP, "mb": 4, "seq": 512, "config": {}},
    {"par": TP8_SP, "mb": 4, "seq": 2048, "config": WIDE},
    {"par": {"gpus": 4}, "mb": 2, "seq": 2048, "config": WIDE},
    {"par": TP8_SP, "mb": 4, "seq": 2048, "config": WIDE, "ck": "none"},
    {"par": TP8_SP, "mb": 8, "seq": 2048, "config": {**WIDE, "num_hidden_layers": 4}},
    {"par": {"gpus": 16, "tp": 4, "cp": 2, "sequence_parallel": True}, "mb": 2, "seq": 4096, "config": WIDE},
)


def _layout(row: dict[str, Any]) -> tuple[dict[str, Any], TrainingSetup, Parallelism]:
    from peakmem.measure.parallel_ac import REGIME_70B

    config = {**REGIME_70B, **row["config"]}
    setup = TrainingSetup(precision=Precision.MIXED_BF16, micro_batch=row["mb"], seq_len=row["seq"],
                          checkpointing=Checkpointing(row.get("ck", "full")))  # fmt: skip
    return config, setup, Parallelism(**row["par"], fsdp=FsdpMode.FULL_SHARD)


def oracle(row: dict[str, Any]) -> dict[str, Any]:
    """Rank 0 of the oracle in this process (one fake world per process), its trace replayed."""
    import torch

    from peakmem.formulas.caching_allocator import replay
    from peakmem.measure import parallel

    trackers: list[Any] = []
    init = parallel.ParallelTracker.__init__

    def keep(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        trackers.append(self)

    parallel.ParallelTracker.__init__ = keep  # type: ignore[method-assign]
    torch.set_num_threads(2)
    config, setup, par = _layout(row)
    start = time.perf_counter()
    parallel.measure_rank(config, setup, par, 0, steps=2, isolate=False)
    stats = replay(trackers[-1].ledger._events)
    return {"allocated": stats.peak_allocated, "reserved": stats.peak_reserved,
            "seconds": time.perf_counter() - start}  # fmt: skip


def estimate(row: dict[str, Any]) -> dict[str, int]:
    config, setup, par = _layout(row)
    from peakmem.hf import spec_from_config

    spec = spec_from_config(config)
    seen: list[step_sequence.Replayed] = []
    original = step_sequence.replay_steps

    def record(step: step_sequence.StepTensors, steps: int = 2) -> step_sequence.Replayed:
        seen.append(original(step, steps))
        return seen[-1]

    step_sequence.replay_steps = record  # step_parts calls it through the module
    try:
        est, rs, _ = TrainingEstimator(spec).rank(setup, par)
    finally:
        step_sequence.replay_steps = original
    closed = TrainingEstimator(spec, Overheads(fragmentation=DEFAULT_FRAGMENTATION)).estimate(setup, par)
    return {
        "allocated": est.peak_allocated_bytes, "closed": closed.peak_reserved_bytes,
        "replay": seen[-1].reserved if seen else 0,
        "pools": rs.side_pools.reduce_scatter + rs.side_pools.all_gather, "reserved": est.peak_reserved_bytes,
    }  # fmt: skip


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "--oracle":
        print(json.dumps(oracle(json.loads(sys.argv[2]))))
        return 0
    print("| layout | mb x seq | AC | oracle alloc | oracle reserved | est alloc | closed | replay + pools "
          "| est reserved | vs oracle |")  # fmt: skip
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for row in GRID:
        run = subprocess.run([sys.executable, __file__, "--oracle", json.dumps(row)],
                             capture_output=True, text=True, check=True)  # fmt: skip
        o = json.loads(run.stdout.strip().splitlines()[-1])
        e = estimate(row)
        _, setup, par = _layout(row)
        print(f"| {par.describe()} | {row['mb']} x {row['seq']} | {setup.checkpointing.value} "
              f"| {o['allocated'] / MiB:.1f} | {o['reserved'] / MiB:.1f} | {e['allocated'] / MiB:.1f} "
              f"| {e['closed'] / MiB:.1f} | {e['replay'] / MiB:.1f} + {e['pools'] / MiB:.1f} "
              f"| {e['reserved'] / MiB:.1f} | {100 * (e['reserved'] / o['reserved'] - 1):+.1f} % |",
              flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
