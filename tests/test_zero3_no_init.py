"""ZeRO-3 over a model built outside ``deepspeed.zero.Init`` (peakmem.formulas.zero3 ``saved_linears``,
peakmem.step_load ``zero3_module_load_phase``): torch's F.linear keeps each gathered weight for its
backward, and the whole 16-bit model goes to each GPU at ``deepspeed.initialize``.

Tiny spec (tests/test_parallel.py ``tiny``, mixed-bf16): 4 layers of Linear weights q 4,096, k 2,048,
v 2,048, o 4,096, gate/up/down 8,192 each (36,864 a layer); head 64,000 and final norm 64 (the head
side, 64,064); 276,032 parameters in all.
"""

from __future__ import annotations

import pytest

from peakmem.breakdown import Phase
from peakmem.formulas import model_parallel as mp
from peakmem.formulas import sharding, zero3
from peakmem.formulas.technique import technique
from peakmem.parallel import Offload, Parallelism
from peakmem.ranks import estimate_ranks
from peakmem.training import Checkpointing, TrainingSetup
from test_parallel import tiny

LAYER, HEAD = 36_864, 64_064


def _saved(setup: TrainingSetup, **par: object) -> tuple[int, int]:
    p = Parallelism(zero_stage=3, **par)  # type: ignore[arg-type]
    st = sharding.rank_states(technique(tiny(), setup), setup, p, mp.stage_params(tiny(), p, 0))
    fwd = sum(i.bytes for i in st.gathered_forward if i.key == "zero3.saved_linear")
    bwd = sum(i.bytes for i in st.gathered_backward if i.key == "zero3.saved_linear")
    return fwd, bwd


def test_when_torch_linear_keeps_the_gathered_weights() -> None:
    assert not zero3.saves_linear_weights(Parallelism(gpus=4, zero_stage=3))  # zero.Init: DeepSpeed's linear
    assert zero3.saves_linear_weights(Parallelism(gpus=4, zero_stage=3, zero_init=False))
    assert zero3.saves_linear_weights(Parallelism(gpus=4, zero_stage=3, memory_efficient_linear=False))
    # one rank gathers no new storage; ZeRO-2 gathers nothing
    assert not zero3.saves_linear_weights(Parallelism(gpus=1, zero_stage=3, zero_init=False))
    assert not zero3.saves_linear_weights(Parallelism(gpus=4, zero_stage=2, zero_init=False))
    # one rank with the parameters offloaded copies each one in: new storage again
    off = Parallelism(gpus=1, zero_stage=3, zero_init=False, offload_optimizer=Offload.CPU,
                      offload_params=Offload.CPU)  # fmt: skip
    assert zero3.saves_linear_weights(off)


def test_saved_elements_by_hand() -> None:
    # no checkpointing: every layer's Linear weights and the head, at the turn
    assert zero3.saved_linear_elements((10, 20, 30), (False,) * 3, 5) == (65, 65)
    # every layer checkpointed: the head at the end of forward; in backward the head, then one recomputed
    # layer at a time: the larger
    assert zero3.saved_linear_elements((10, 20, 30), (True,) * 3, 5) == (5, 30)
    # every-2: layers 0 and 2 wrapped, layer 1 keeps its 20
    assert zero3.saved_linear_elements((10, 20, 30), (True, False, True), 5) == (25, 50)


def test_the_rank_holds_them_in_bf16() -> None:
    none = TrainingSetup(seq_len=8)
    assert _saved(none, gpus=4, zero_init=False) == (2 * (4 * LAYER + HEAD),) * 2
    assert _saved(none, gpus=4) == (0, 0)  # zero.Init
    full = TrainingSetup(seq_len=8, checkpointing=Checkpointing.FULL)
    assert _saved(full, gpus=4, zero_init=False) == (2 * HEAD, 2 * max(HEAD, LAYER))
    # op-level SAC recomputes every layer's saved tensors; selective keeps the Linear inputs and weights
    assert (
        _saved(TrainingSetup(seq_len=8, checkpointing=Checkpointing.OP), gpus=4, zero_init=False)[0]
        == 2 * HEAD
    )
    selective = TrainingSetup(seq_len=8, checkpointing=Checkpointing.SELECTIVE)
    assert _saved(selective, gpus=4, zero_init=False)[0] == 2 * (4 * LAYER + HEAD)
    # every-2 (transformers: layers 0 and 2 checkpointed): layers 1 and 3 keep theirs
    every2 = TrainingSetup(seq_len=8, checkpointing=Checkpointing.FULL, checkpoint_every=2)
    assert _saved(every2, gpus=4, zero_init=False) == (2 * (2 * LAYER + HEAD), 2 * (2 * LAYER + HEAD))


def test_the_whole_model_loads_on_each_gpu() -> None:
    setup = TrainingSetup(seq_len=8)
    ranks = estimate_ranks(tiny(), setup, Parallelism(gpus=4, zero_stage=3, zero_init=False))
    est = ranks.most_loaded.estimate
    load = {p.phase: p for p in est.phases}[Phase.LOAD]
    assert {i.key: i.bytes for i in load.items}["load.zero3_module"] == 2 * 276_032
    with_init = estimate_ranks(tiny(), setup, Parallelism(gpus=4, zero_stage=3)).most_loaded.estimate
    assert Phase.LOAD not in {p.phase for p in with_init.phases}
    # the step holds the saved weights on top of the working set
    assert est.peak_allocated_bytes >= with_init.peak_allocated_bytes + 2 * (4 * LAYER + HEAD)


def test_torch_linear_saves_a_view_of_the_weight_storage() -> None:
    """The mechanism on the CPU: DeepSpeed's free_param swaps ``param.data`` for an empty tensor; the
    ``weight.t()`` torch's linear saved for the input's gradient still holds the gathered storage, while
    a Function that saves the Parameter itself (DeepSpeed's LinearFunctionForZeroStage3) follows the
    swap and holds nothing."""
    torch = pytest.importorskip("torch")
    weight = torch.nn.Parameter(torch.randn(8, 4))
    x = torch.randn(2, 3, 4, requires_grad=True)  # a 3-D activation: matmul folds it into one mm
    gathered = weight.data.untyped_storage().data_ptr()
    mm = torch.nn.functional.linear(x, weight).grad_fn.next_functions[0][0]  # under the unsafe view
    weight.data = torch.empty(0)  # free_param
    assert type(mm).__name__ == "MmBackward0"
    assert mm._saved_mat2.shape == (4, 8) and mm._saved_mat2.untyped_storage().data_ptr() == gathered

    class SavesTheParameter(torch.autograd.Function):
        @staticmethod
        def forward(ctx, inp, w):  # type: ignore[no-untyped-def]
            ctx.save_for_backward(inp, w)
            return inp.matmul(w.t())

        @staticmethod
        def backward(ctx, grad):  # type: ignore[no-untyped-def]
            raise NotImplementedError

    weight = torch.nn.Parameter(torch.randn(8, 4))
    y = SavesTheParameter.apply(x, weight)
    weight.data = torch.empty(0)
    assert y.grad_fn.saved_tensors[1].numel() == 0  # the Parameter, now empty


def test_zero_init_is_a_way_down() -> None:
    """Outside zero.Init, building the model under it is among the ways down (planner/fit.py), and it
    saves what the saved weights and the whole-model load cost; under zero.Init it is not offered."""
    import peakmem

    without = peakmem.train("llama-3.2-1b", gpus=4, zero=3, seq=512, no_zero_init=True)
    ways = {w["change"]: w for w in without.data["ways_down"]}
    way = ways["build the model under deepspeed.zero.Init"]
    assert way["changes"] == [["zero_init", "False", "True"]]
    with_init = peakmem.train("llama-3.2-1b", gpus=4, zero=3, seq=512)
    assert way["peak_allocated_bytes"] == with_init.data["peak_allocated_bytes"]
    assert "build the model under deepspeed.zero.Init" not in {
        w["change"] for w in with_init.data["ways_down"]
    }
