"""FSDP2 sharding simulated in one CPU process: torch's fake process group runs ``fully_shard`` with a
world size of N, so each rank's local shards can be compared with peakmem's per-rank formula
(:func:`peakmem.formulas.sharding.shard_numel`, torch.chunk on dim 0 padded to chunk 0)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from peakmem.formulas import model_parallel as mp  # noqa: E402
from peakmem.formulas import sharding  # noqa: E402
from peakmem.parallel import FsdpMode, Parallelism  # noqa: E402
from test_parallel import TINY_CONFIG, tiny  # noqa: E402

pytestmark = pytest.mark.torch


@contextmanager
def fake_world(world_size: int, rank: int) -> Iterator[Any]:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    try:
        from torch.testing._internal.distributed.fake_pg import FakeStore
    except ImportError:  # pragma: no cover - torch builds without the testing package
        pytest.skip("torch.testing._internal.distributed.fake_pg is not available in this torch build")
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
    try:
        yield init_device_mesh("cpu", (world_size,))
    finally:
        dist.destroy_process_group()


def _sharded_llama(mesh: Any, mp_policy: Any = None) -> Any:
    from torch.distributed.fsdp import fully_shard
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**{k: v for k, v in TINY_CONFIG.items() if k != "model_type"}))
    kwargs = {"mesh": mesh} if mp_policy is None else {"mesh": mesh, "mp_policy": mp_policy}
    for layer in model.model.layers:  # accelerate TRANSFORMER_BASED_WRAP: one unit per decoder layer
        fully_shard(layer, **kwargs)
    fully_shard(model, **kwargs)
    return model


def _padded_local_numel(model: Any) -> int:
    """Elements each rank stores: FSDP2 allocates every shard padded to chunk 0's size."""
    from torch.distributed.fsdp._fully_shard._fsdp_state import _get_module_fsdp_state

    total = 0
    for module in (model, *model.model.layers):
        group = _get_module_fsdp_state(module)._fsdp_param_group
        total += sum(p.padded_sharded_param_size.numel() for p in group.fsdp_params)
    return total


@pytest.mark.parametrize("world_size", [2, 3, 5, 8])
def test_fsdp2_local_shards_match_formula(world_size: int) -> None:
    par = Parallelism(gpus=world_size, fsdp=FsdpMode.FULL_SHARD)
    expected = sharding.shard_numel(mp.stage_params(tiny(), par, 0), par).numel
    for rank in (0, world_size - 1):
        with fake_world(world_size, rank) as mesh:
            model = _sharded_llama(mesh)
            local = sum(p.to_local().numel() for p in model.parameters())
            assert _padded_local_numel(model) == expected  # every rank stores the padded shard
            if rank == 0:
                assert local == expected  # rank 0 holds the full first chunk: the most loaded rank
            else:
                assert local <= expected


def test_fsdp2_mixed_precision_keeps_fp32_shards_and_grads() -> None:
    """MixedPrecisionPolicy(param_dtype=bf16): the sharded parameters (peakmem's master weights) and
    their gradients stay fp32 and sharded after a forward/backward over the fake world of 3."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    par = Parallelism(gpus=3, fsdp=FsdpMode.FULL_SHARD)
    expected = sharding.shard_numel(mp.stage_params(tiny(), par, 0), par).numel
    with fake_world(3, 0) as mesh:
        model = _sharded_llama(mesh, MixedPrecisionPolicy(param_dtype=torch.bfloat16))
        ids = torch.randint(0, 1000, (2, 16))
        model(input_ids=ids, labels=ids).loss.backward()
        params = list(model.parameters())
        assert {p.dtype for p in params} == {torch.float32}
        assert all(p.grad is not None and p.grad.to_local().dtype == torch.float32 for p in params)
        assert sum(p.grad.to_local().numel() for p in params) == expected


@pytest.mark.slow
def test_fsdp2_mem_tracker_categories_match_formula() -> None:
    """torch's FSDPMemTracker (torch/distributed/_tools/fsdp2_mem_tracker.py) over one steady-state
    fp32 AdamW step in a fake world of 4: sharded parameters, optimizer states and the unsharded root
    unit at the peak equal peakmem's per-rank terms; one layer unit is all-gathered at a time on CPU
    (FSDPMemTracker's "All Gather" is the flat all-gather output FSDP2 keeps until the next unit's
    all-gather: peakmem's kept unit; the running unit's extra bytes are layer transients)."""
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker

    from peakmem.formulas.technique import technique
    from peakmem.training import Precision, TrainingSetup

    par = Parallelism(gpus=4, fsdp=FsdpMode.FULL_SHARD)
    sp = mp.stage_params(tiny(), par, 0)
    setup = TrainingSetup(precision=Precision.FP32)
    states = sharding.rank_states(technique(tiny(), setup), setup, par, sp)
    rows = {r.tensor: r.bytes for r in states.rows}
    gathered = {i.path: i.bytes for i in states.gathered_forward}
    with fake_world(4, 0) as mesh:
        model = _sharded_llama(mesh)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
        ids = torch.randint(0, 1000, (2, 64))
        model(input_ids=ids, labels=ids).loss.backward()  # step 1 creates the states
        opt.step()
        opt.zero_grad()
        tracker = FSDPMemTracker(model, opt)
        tracker.track_inputs((ids,))
        with tracker:
            model(input_ids=ids, labels=ids).loss.backward()
            opt.step()
            opt.zero_grad()
        peak = {
            getattr(k, "value", k): v
            for k, v in tracker.get_tracker_snapshot("peak")[torch.device("cpu")].items()
        }
    n_params = len(list(model.parameters()))
    assert peak["Sharded Param"] == rows["sharded parameters (fp32, master) (1/4 shard)"] == 4 * 276_032 // 4
    opt_bytes = sum(b for t, b in rows.items() if "AdamW" in t)
    assert peak["OptState"] == opt_bytes + 4 * n_params  # + AdamW's fp32 `step` scalar per parameter
    assert peak["Unsharded Param"] == gathered["FSDP root unit unsharded (embeddings, final norm, head)"]
    kept = gathered["FSDP2 all-gather output kept until the next unit's all-gather (one unit)"]
    assert peak["All Gather"] == kept == 4 * 36_992
