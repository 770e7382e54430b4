"""FSDP1 in the parallel oracle: the real ``FullyShardedDataParallel`` on torch's fake process group, one
rank, on CPU (:mod:`peakmem.measure.parallel` runs FSDP2, TP, PP and CP; this adds FSDP1 data parallel).

The layout is the one Lit-GPT's Lightning ``FSDPStrategy(auto_wrap_policy={Block})`` and accelerate's
``TRANSFORMER_BASED_WRAP`` build: one unit per decoder layer (``ModuleWrapPolicy({LlamaDecoderLayer})``)
and the root (embeddings, final norm, head), ``FULL_SHARD``, ``limit_all_gathers=True``,
``use_orig_params=True`` (Lightning's default), ``device_id`` the CPU (torch 2.13 FSDP1 runs there with
the fake process group). Gradient accumulation skips the sync as Fabric's ``no_backward_sync`` and
accelerate do (``FullyShardedDataParallel.no_sync`` on every micro-batch but the last) when the setup's
loop does (peakmem.defaults ``skips_grad_sync``). Full precision only (fp32): FSDP1's ``MixedPrecision``
is not mapped here. Memory is :class:`~peakmem.measure.parallel.ParallelTracker` (FSDP1 allocates and
frees its unsharded flat parameters with ``UntypedStorage.resize_``, as FSDP2 does).
"""

from __future__ import annotations

import gc
from contextlib import nullcontext
from typing import Any

import torch

from peakmem.breakdown import Phase
from peakmem.defaults import skips_grad_sync
from peakmem.errors import InputError
from peakmem.measure.oracle_child import run_in_child
from peakmem.measure.parallel import PHASES, ParallelTracker, _context
from peakmem.measure.parallel_ac import apply_full_ac
from peakmem.measure.runner import build_model
from peakmem.measure.tracker import GRAD, INPUT
from peakmem.measure.trainer import make_optimizer
from peakmem.parallel import FsdpMode, Parallelism
from peakmem.training import Checkpointing, Precision, TrainingSetup


def measure_fsdp1_rank(
    config: dict[str, Any], setup: TrainingSetup, par: Parallelism, rank: int = 0, *, steps: int = 2
) -> dict[Phase, int]:
    """The peak bytes of each phase that ``rank`` of an FSDP1 full-shard layout holds over ``steps``
    training steps of a Llama-style ``config`` (step 2 is the steady state), in a child process forked
    from the oracle's warm server (a fake world per process)."""
    if par.fsdp is not FsdpMode.FULL_SHARD or par.fsdp_version != 1 or par.gpus != par.dp:
        raise InputError(
            f"layout {par.describe()!r}: the FSDP1 oracle runs FSDP1 full-shard data parallel only"
        )
    if setup.precision is not Precision.FP32:
        raise InputError(f"precision={setup.precision.value!r}: the FSDP1 oracle runs fp32")
    result: dict[Phase, int] = run_in_child(
        _context(), _measure, (config, setup, par, rank, steps), f"FSDP1 oracle, rank {rank}"
    )
    return result


def _measure(config: dict[str, Any], setup: TrainingSetup, par: Parallelism, rank: int, steps: int) -> Any:
    import torch.distributed as dist
    from torch.distributed.fsdp import FullyShardedDataParallel, ShardingStrategy
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy
    from torch.testing._internal.distributed.fake_pg import FakeStore

    gc.collect()
    gc.disable()  # frees at refcount zero, deterministically
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=par.gpus)
    try:
        model = build_model(config, setup, seed=0)
        model.train()
        tracker = ParallelTracker(device_type="cpu")
        if setup.checkpointing is Checkpointing.FULL:
            apply_full_ac(model, tracker)
        layer: Any = model.model.layers[0]  # type: ignore[union-attr,index]  # inside a checkpoint wrapper if any
        layer_cls = type(getattr(layer, "_checkpoint_wrapped_module", layer))
        fsdp = FullyShardedDataParallel(
            model, auto_wrap_policy=ModuleWrapPolicy({layer_cls}), device_id=torch.device("cpu"),
            sharding_strategy=ShardingStrategy.FULL_SHARD, use_orig_params=True, limit_all_gathers=True,
        )  # fmt: skip
        tracker.register_module(fsdp)
        params = [p for p in fsdp.parameters() if p.requires_grad]
        optimizer = make_optimizer(setup.optimizer, setup.optimizer_impl, params)
        no_sync = skips_grad_sync(setup)
        gen = torch.Generator().manual_seed(0)
        vocab = int(config["vocab_size"])
        with tracker:
            tracker.set_phase(Phase.LOAD, 0)
            tracker.watch_gradients(fsdp.named_parameters())
            for step in range(1, steps + 1):
                ids = torch.randint(
                    0, vocab, (setup.micro_batch * setup.grad_accum, setup.seq_len), generator=gen
                )
                tracker.tag(ids, INPUT)
                chunks = torch.split(ids, setup.micro_batch)
                for i, chunk in enumerate(chunks):
                    skip = no_sync and i < len(chunks) - 1
                    with fsdp.no_sync() if skip else nullcontext():
                        tracker.set_phase(Phase.FORWARD, step)
                        loss = fsdp(input_ids=chunk, labels=chunk).loss / setup.grad_accum
                        tracker.set_phase(Phase.BACKWARD, step)
                        loss.backward()
                    del loss
                del ids, chunks, chunk
                tracker.set_phase(Phase.OPTIMIZER, step)
                for p in params:
                    if p.grad is not None:
                        tracker.tag(p.grad, GRAD)
                optimizer.step()
                optimizer.zero_grad(set_to_none=setup.grads_set_to_none)
                tracker.tag_optimizer_states(optimizer)
            tracker.set_phase(Phase.LOAD, steps + 1)
        phases: dict[Phase, int] = {}
        for snap in tracker.ledger.peaks():
            if snap.phase in PHASES:
                phases[snap.phase] = max(phases.get(snap.phase, 0), snap.bytes)
        return phases
    finally:
        dist.destroy_process_group()
