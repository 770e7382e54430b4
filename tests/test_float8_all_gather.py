"""FSDP2 float8 all-gather (``--float8-all-gather``; torchao 0.18 ``enable_fsdp_float8_all_gather``,
peakmem.formulas.activations.float8): the layer units' converted Linear weights gathered in float8, the
shards' casts before the all-gather, and the Linears without their weight casts.

Hand-derived on the tiny Llama (tests/tiny_models.py LLAMA: hidden 64, 2 KV heads of 16, intermediate 176,
2 layers). One layer's parameters: q 64 x 64 = 4,096, k 32 x 64 = 2,048, v 2,048, o 4,096, gate / up
176 x 64 = 11,264 each, down 64 x 176 = 11,264, two norms of 64. All seven Linears are converted (both
dimensions divisible by 16): 46,080 elements, 1 B each gathered in float8; the norms 128 elements in bf16.
So a gathered unit is 46,080 + 256 = 46,336 B instead of 2 x 46,208 = 92,416 B.

The torch tests hold the formulas against torchao itself on this CPU: one ``Float8Linear`` with a float8
weight (what ``fsdp_post_all_gather`` hands it), ``fsdp_pre_all_gather`` on an fp32 shard, and a real
FSDP2 ``fully_shard`` of the tiny Llama under torch's fake process group (4 ranks, rank 0)."""

from __future__ import annotations

import contextlib
import io
import json
import weakref
from dataclasses import replace
from typing import Any

import pytest

import peakmem
from peakmem.cli import main
from peakmem.errors import InputError
from peakmem.formulas import model_parallel as mp
from peakmem.formulas import sharding
from peakmem.formulas.activations.float8 import (
    RECIPES,
    linear_backward_peak,
    linear_forward_peak,
    pre_all_gather_peak,
)
from peakmem.formulas.sharding import RankStates
from peakmem.formulas.technique import technique
from peakmem.hf import spec_from_config
from peakmem.parallel import Parallelism
from peakmem.training import Precision, TrainingSetup
from tiny_models import LLAMA

TENSORWISE = RECIPES[Precision.FLOAT8_TENSORWISE]
GATHERED = replace(TENSORWISE, weight_fp8=True)
CONVERTED = 4096 + 2048 + 2048 + 4096 + 3 * 11264  # one layer's converted Linear weights, elements
NORMS = 2 * 64
UNIT_BF16 = 2 * (CONVERTED + NORMS)  # 92,416 B
UNIT_FP8 = CONVERTED + 2 * NORMS  # 46,336 B
SCALE_SLACK = 64  # bytes: the fp32 scales and their reciprocals, which the formulas do not count


def _states(par: Parallelism, on: bool) -> RankStates:
    setup = TrainingSetup(precision=Precision.FLOAT8_TENSORWISE, float8_all_gather=on, seq_len=64)
    tech = technique(spec_from_config(LLAMA, name="tiny-llama"), setup)
    return sharding.rank_states(tech, setup, par, mp.stage_params(tech.spec, par, 0))


def _gathered(rs: RankStates) -> dict[str, int]:
    return {i.key: i.bytes for i in rs.gathered_forward}


FSDP4 = Parallelism(gpus=4, fsdp="full-shard")


def test_gathered_layer_unit_is_float8_linears_and_bf16_norms() -> None:
    off, on = _states(FSDP4, False), _states(FSDP4, True)
    assert _gathered(off)["fsdp.units"] == UNIT_BF16 == 92_416
    assert _gathered(on)["fsdp.units"] == UNIT_FP8 == 46_336
    # the root unit (embeddings, final norm, untied head: nothing converted) stays bf16:
    # 2 x (1000 x 64 + 64 + 1000 x 64) B
    assert _gathered(on)["fsdp.root"] == _gathered(off)["fsdp.root"] == 2 * (2 * 64_000 + 64)
    # a unit's unshard adds its all-gather output and its parameters: 2 units, the copy-in stream's pool
    # holds the root's output and one unit's
    assert on.layer_unshard_extra == 2 * UNIT_FP8
    assert on.side_pools.in_use == UNIT_FP8
    assert on.side_pools.all_gather == 2 * (2 * 64_000 + 64) + UNIT_FP8
    assert any("float8 all-gather" in n for n in on.notes)
    assert not any("float8 all-gather" in n for n in off.notes)


def test_tensor_parallel_gathers_the_local_shards() -> None:
    # tp=2: q/k/v/gate/up split by rows, o/down by columns: every Linear halves; the norms stay whole
    on = _states(Parallelism(gpus=8, tp=2, fsdp="full-shard"), True)
    assert _gathered(on)["fsdp.units"] == CONVERTED // 2 + 2 * NORMS == 23_296


def test_pipeline_stage_keeps_its_units_gathered_in_float8() -> None:
    # pp=2: stage 0 holds 1 layer, unsharded from its forward to its backward (reshard_after_forward=False)
    par = Parallelism(gpus=8, pp=2, fsdp="full-shard")
    assert _gathered(_states(par, True))["fsdp.units"] == UNIT_FP8
    assert _gathered(_states(par, False))["fsdp.units"] == UNIT_BF16


def test_pre_all_gather_casts_hand_derived() -> None:
    # 4 ranks: each shard of dim0 / 4 rows, in the layer's parameter order q, k, v, o, gate, up, down:
    # 1,024, 512, 512, 1,024, 2,816, 2,816, 2,816 elements. Down's cast (9 B each) beside the six float8
    # shards before it (8,704 B): 8,704 + 25,344 = 34,048 B
    shards = [1024, 512, 512, 1024, 2816, 2816, 2816]
    assert pre_all_gather_peak(shards) == 8704 + 9 * 2816 == 34_048
    # an offloaded fp32 shard is first copied to the GPU (4 B per element more at its cast)
    assert pre_all_gather_peak(shards, 4) == 8704 + 13 * 2816
    # below a unit's unshard (its output and its parameters, 92,672 B): no change at 4 ranks
    assert _states(FSDP4, True).layer_unshard_extra == 2 * UNIT_FP8


def test_one_rank_casts_decide_the_unshard() -> None:
    # FSDP2 over 1 rank: the shards are whole; down's cast beside the six before it:
    # (4096 + 2048 + 2048 + 4096 + 2 x 11264) + 9 x 11264 = 34,816 + 101,376 = 136,192 B > 2 units
    rs = _states(Parallelism(gpus=1, fsdp="full-shard"), True)
    assert rs.layer_unshard_extra == 34_816 + 9 * 11_264 == 136_192
    # the first unit's unshard: the root's parameters and all-gather output beside the casts
    assert rs.first_unshard == 2 * 2 * (2 * 64_000 + 64) + 136_192


def test_linear_forward_without_the_weight_cast() -> None:
    # a wide weight (16 tokens, 64 -> 4096): its cast (9 x 4096 x 64 B) next to the input's float8 copy
    # decides the forward; arriving as float8 only the input's cast is left (9 x 16 x 64 B)
    assert linear_forward_peak(16, 64, 4096) == 16 * 64 + 9 * 4096 * 64 == 2_360_320
    assert linear_forward_peak(16, 64, 4096, weight_fp8=True) == 9 * 16 * 64 == 9_216


def test_linear_backward_without_the_weight_cast() -> None:
    # gate_proj (m 512, k 64, n 176), bf16: grad_output's second cast (9 mn) beside its first float8 copy
    # (mn) and grad_input (2 mk); the weight's float8 copy (nk, 11,264 B) no longer among them
    mn, nk, mk = 512 * 176, 176 * 64, 512 * 64
    assert linear_backward_peak(512, 64, 176, 2, TENSORWISE) == mn + nk + 2 * mk + 9 * mn == 977_920
    assert linear_backward_peak(512, 64, 176, 2, GATHERED) == mn + 2 * mk + 9 * mn == 966_656
    # the wide weight (m 16, k 64, n 4096): without the weight's cast (9 nk beside mn) the grad_weight
    # gemm decides: grad_output's float8 copy and its layout copy (2 mn) and the input's (2 mk), the
    # 16-bit grad_weight (2 nk), beside the first float8 grad_output (mn) and grad_input (2 mk)
    mn, nk, mk = 16 * 4096, 4096 * 64, 16 * 64
    assert linear_backward_peak(16, 64, 4096, 2, TENSORWISE) == mn + 9 * nk == 2_424_832
    assert linear_backward_peak(16, 64, 4096, 2, GATHERED) == 3 * mn + 2 * mk + 2 * nk + 2 * mk == 724_992


@pytest.mark.parametrize(
    ("options", "what"),
    [
        ({"precision": "float8-rowwise", "gpus": 4, "fsdp": "full-shard"}, "tensorwise only"),
        ({"precision": "mixed-bf16", "gpus": 4, "fsdp": "full-shard"}, "tensorwise only"),
        ({"precision": "float8-tensorwise"}, "with 1 GPU: torchao's float8 all-gather is an FSDP2 hook"),
        ({"precision": "float8-tensorwise", "gpus": 4, "zero": 3}, "zero-3: torchao's float8 all-gather"),
        ({"precision": "float8-tensorwise", "gpus": 4, "fsdp": "full-shard", "fsdp_version": 1}, "fsdp1"),
    ],
)
def test_what_it_needs_is_a_one_line_input_error(options: dict[str, Any], what: str) -> None:
    with pytest.raises(InputError, match=what) as info:
        peakmem.train("llama-3.1-8b", float8_all_gather=True, **options)
    assert "float8_all_gather=True" in str(info.value) and "\n" not in str(info.value)


def test_a_non_bool_is_one_line_input_error() -> None:
    with pytest.raises(InputError, match="float8_all_gather") as info:
        peakmem.train("llama-3.1-8b", float8_all_gather="yes", precision="float8-tensorwise")
    assert "\n" not in str(info.value)
    with pytest.raises(InputError, match="float8_all_gather"):
        TrainingSetup(precision=Precision.FLOAT8_TENSORWISE, float8_all_gather=1)  # type: ignore[arg-type]


def test_measure_and_simulate_refuse_it() -> None:
    setup = TrainingSetup(precision=Precision.FLOAT8_TENSORWISE, float8_all_gather=True)
    with pytest.raises(InputError, match="float8_all_gather=True: measure does not run it"):
        setup.check_oracle_runs("measure")


def _cli(*args: str) -> dict[str, Any]:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        main(["train", *args, "--json"])
    return json.loads(buf.getvalue())  # type: ignore[no-any-return]


def test_cli_api_and_page_agree() -> None:
    flags = {"precision": "float8-tensorwise", "gpus": 8, "fsdp": "full-shard", "seq": 4096}
    api = peakmem.train("llama-3.1-8b", float8_all_gather=True, **flags)
    assert api["setup"]["float8_all_gather"] is True
    cli = _cli("llama-3.1-8b", "--float8-all-gather", "--precision", "float8-tensorwise", "--gpus", "8",
               "--fsdp", "full-shard", "--seq", "4096")  # fmt: skip
    assert cli["peak_allocated_bytes"] == api["peak_allocated_bytes"]
    assert cli["device_total_bytes"] == api["device_total_bytes"]
    assert api["peak_allocated_bytes"] < peakmem.train("llama-3.1-8b", **flags)["peak_allocated_bytes"]
    pytest.importorskip("fastapi")
    pytest.importorskip("httpx")
    from fastapi.testclient import TestClient

    from peakmem.web import app as web

    body = {"model": "llama-3.1-8b", "float8_all_gather": True, "precision": "float8-tensorwise",
            "gpu_count": 8, "fsdp": "full-shard", "seq": 4096}  # fmt: skip
    with TestClient(web.create_app()) as client:
        page = client.post("/api/train", json=body).json()
        bad = client.post("/api/train", json={**body, "fsdp": "none"})
    assert page["peak_allocated_bytes"] == api["peak_allocated_bytes"]
    assert bad.status_code == 422 and "float8_all_gather" in bad.text


# --- against torchao on this CPU ----------------------------------------------------------------------
class _Live:
    """A dispatch mode counting the live bytes of plain tensors' storages (a tensor subclass's ops defer
    to it, and its ops on plain tensors come back here), with a log of (serial of the storage allocated,
    live bytes) after every allocation and free."""

    def __init__(self, *given: Any) -> None:
        import torch
        from torch.utils._python_dispatch import TorchDispatchMode
        from torch.utils._pytree import tree_flatten

        live = self

        class Mode(TorchDispatchMode):  # type: ignore[no-untyped-call]
            def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
                if any(t is not torch.Tensor for t in types):
                    return NotImplemented
                out = func(*args, **(kwargs or {}))
                for t in tree_flatten(out)[0]:
                    if type(t) is torch.Tensor:
                        live.add(t)
                return out

        self.mode = Mode()  # type: ignore[no-untyped-call]
        self.bytes = 0
        self.serial: dict[int, int] = {}  # id(storage) -> serial, while it lives
        self.log: list[tuple[int, int]] = []
        for t in given:
            self.add(t)

    def add(self, t: Any) -> None:
        st = t.untyped_storage()
        if id(st) in self.serial:
            return
        n = st.nbytes()
        self.serial[id(st)] = len(self.log) + 1
        self.bytes += n
        self.log.append((len(self.log) + 1, self.bytes))
        weakref.finalize(st, self.free, id(st), n).atexit = False

    def free(self, key: int, n: int) -> None:
        if self.serial.pop(key, None) is not None:
            self.bytes -= n
            self.log.append((0, self.bytes))


@pytest.mark.torch
@pytest.mark.parametrize("shape", [(512, 64, 176), (16, 64, 4096), (512, 176, 64)])
@pytest.mark.parametrize("weight_fp8", [False, True])
def test_linear_temporaries_agree_with_torchao(shape: tuple[int, int, int], weight_fp8: bool) -> None:
    """torchao's Float8Linear (tensorwise) forward and backward on a bf16 input, its weight a parameter
    or already float8 (``hp_tensor_to_float8_dynamic`` with the WEIGHT role: what
    ``fsdp_post_all_gather`` builds): forward's bytes beyond the input, weight and output, backward's
    beyond them and the incoming gradient, equal the formulas' to within the scales."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("torchao")
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    from torchao.float8.float8_scaling_utils import hp_tensor_to_float8_dynamic
    from torchao.float8.float8_training_tensor import GemmInputRole

    m, k, n = shape
    lin = torch.nn.Sequential(torch.nn.Linear(k, n, bias=False, dtype=torch.bfloat16))
    mod = convert_to_float8_training(lin, config=Float8LinearConfig())[0]
    weight = mod.weight
    if weight_fp8:
        w8 = hp_tensor_to_float8_dynamic(mod.weight.detach(), torch.float8_e4m3fn, mod.linear_mm_config,
                                         gemm_input_role=GemmInputRole.WEIGHT)  # fmt: skip
        mod.weight = torch.nn.Parameter(w8, requires_grad=False)
        weight = w8._data
    x = torch.randn(m, k, dtype=torch.bfloat16, requires_grad=True)
    grad = torch.randn(m, n, dtype=torch.bfloat16)
    live = _Live(x, weight, grad)
    with live.mode:
        base, start = live.bytes, len(live.log)
        out = mod(x)
        made = live.serial[id(out.untyped_storage())]
        after = next(i for i, (s, _) in enumerate(live.log[start:]) if s == made)
        events = [b - base for _, b in live.log[start:]]
        out_bytes = out.untyped_storage().nbytes()
        forward = max(max(events[:after], default=0), max(b - out_bytes for b in events[after:]))
        base, start = live.bytes, len(live.log)
        out.backward(grad)
        backward = max(b for _, b in live.log[start:]) - base
    recipe = GATHERED if weight_fp8 else TENSORWISE
    expected_fwd = linear_forward_peak(m, k, n, weight_fp8=weight_fp8)
    expected_bwd = linear_backward_peak(m, k, n, 2, recipe)
    assert 0 <= forward - expected_fwd <= SCALE_SLACK, (forward, expected_fwd)
    assert 0 <= backward - expected_bwd <= SCALE_SLACK, (backward, expected_bwd)


@pytest.mark.torch
def test_pre_all_gather_cast_agrees_with_torchao() -> None:
    """``fsdp_pre_all_gather`` on fp32 shards, one after another, their float8 results kept (as FSDP2's
    ``_get_param_all_gather_inputs`` keeps them until the copy-in): the most bytes alive beyond the shards
    is :func:`pre_all_gather_peak`'s, to within the scales."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("torchao")
    from torchao.float8.float8_training_tensor import LinearMMConfig
    from torchao.float8.fsdp_utils import WeightWithDynamicFloat8CastTensor

    sizes = [1024, 512, 2816, 2816]
    shards = [torch.randn(n) for n in sizes]
    wrapped = [WeightWithDynamicFloat8CastTensor(s, LinearMMConfig(), torch.float8_e4m3fn) for s in shards]
    live = _Live(*shards)
    kept = []
    with live.mode:
        base, start = live.bytes, len(live.log)
        for w in wrapped:
            kept.append(w.fsdp_pre_all_gather(None))
        peak = max(b for _, b in live.log[start:]) - base
    expected = pre_all_gather_peak(sizes)
    assert 0 <= peak - expected <= len(sizes) * SCALE_SLACK, (peak, expected)


def _unsharded_unit_bytes(float8_all_gather: bool) -> int:
    """Bytes of the unsharded parameters FSDP2 re-allocates for the tiny Llama's first layer unit (4 fake
    ranks, rank 0): ``FSDPModule.unshard`` all-gathers and copies out, as the unit's pre-forward does;
    the first one builds the unsharded parameters, every later one re-allocates their storage
    (_fsdp_param.py ``alloc_storage``: a storage resized up)."""
    import torch
    import torch.distributed as dist
    import transformers
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from torch.testing._internal.distributed.fake_pg import FakeStore
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    from peakmem.measure.float8 import _eligible

    config = transformers.LlamaConfig(**{k: v for k, v in LLAMA.items() if k != "architectures"})
    model = transformers.LlamaForCausalLM(config)
    f8 = Float8LinearConfig(enable_fsdp_float8_all_gather=float8_all_gather)
    convert_to_float8_training(model, config=f8, module_filter_fn=_eligible)
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=4)
    grown: list[int] = []
    original = torch.UntypedStorage.resize_

    def resize_(st: Any, size: int) -> Any:
        if size:
            grown.append(size)
        return original(st, size)

    try:
        mesh = init_device_mesh("cpu", (4,))
        mp_policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for layer in model.model.layers:
            fully_shard(layer, mesh=mesh, mp_policy=mp_policy)
        fully_shard(model, mesh=mesh, mp_policy=mp_policy)
        unit = model.model.layers[0]
        unit.unshard()
        unit.reshard()
        torch.UntypedStorage.resize_ = resize_  # type: ignore[method-assign,assignment]
        unit.unshard()
        unit.reshard()
    finally:
        torch.UntypedStorage.resize_ = original  # type: ignore[method-assign]
        dist.destroy_process_group()
    return sum(grown)


@pytest.mark.torch
def test_fsdp2_unshards_the_float8_unit() -> None:
    """torch 2.13 FSDP2 (``fully_shard`` per decoder layer and the root, bf16 param dtype) over a fake
    process group, the tiny Llama converted by torchao (torchtitan's filter) with and without
    ``enable_fsdp_float8_all_gather``: one layer unit's unsharded parameters are the formula's gathered
    unit, 46,336 B (92,416 B without)."""
    pytest.importorskip("torch")
    pytest.importorskip("torchao")
    pytest.importorskip("transformers")
    import torch.distributed as dist

    if dist.is_initialized():
        pytest.skip("a process group is already initialized in this process")
    assert _unsharded_unit_bytes(False) == UNIT_BF16
    assert _unsharded_unit_bytes(True) == UNIT_FP8 == _gathered(_states(FSDP4, True))["fsdp.units"]
