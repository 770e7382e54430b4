"""torchao's low-bit AdamW states (peakmem.formulas.torchao_optim), by hand on small tensors, and against
the states torchao 0.18.0 itself allocates on the CPU (AdamW4bit / AdamW8bit / AdamWFp8, one step)."""

from __future__ import annotations

import pytest

from peakmem.formulas import torchao_optim as ao
from peakmem.model import Tensor


def T(*shape: int) -> Tensor:
    return Tensor(name="x", module="x", shape=shape, component="mlp", kind="linear_weight")


# 4096 elements in 64 x 64 (quantized by every format); 4000 (>= 4096? no: full states);
# 4352 = 17 x 256 (a multiple of 128 and 256); 4160 = 32.5 x 128 (a multiple of neither 128 nor 256)
TENSORS = [(T(64, 64), 2), (T(4000), 1), (T(17, 256), 1), (T(4160), 1)]


def test_ao_8bit_by_hand() -> None:
    qs = ao.ao_states(TENSORS, ao.AO_8BIT, state_bytes=2)
    assert qs.quantized == 2 * (2 * 4096 + 4352)  # one uint8 code per element, two states
    assert qs.scales == 2 * 4 * (2 * 16 + 17)  # fp32 scale per 256 elements
    assert qs.maps == 2 * 3 * 256 * 4  # a 256-entry fp32 qmap per state per quantized tensor
    assert qs.fp32 == 2 * 2 * (4000 + 4160)  # zeros_like(p) in bf16
    assert qs.params_quantized == 2 * 4096 + 4352 and qs.params_fp32 == 8160


def test_ao_fp8_by_hand() -> None:
    qs = ao.ao_states(TENSORS, ao.AO_FP8, state_bytes=4)
    assert qs.quantized == 2 * (2 * 4096 + 4352)
    assert qs.scales == 2 * 4 * (2 * 16 + 17)
    assert qs.maps == 0  # no lookup table in OptimStateFp8
    assert qs.fp32 == 2 * 4 * (4000 + 4160)


def test_ao_4bit_by_hand() -> None:
    qs = ao.ao_states(TENSORS, ao.AO_4BIT, state_bytes=4)
    assert qs.quantized == 2 * (2 * 2048 + 2176)  # two 4-bit codes a byte
    assert qs.scales == 2 * 4 * (2 * 32 + 34)  # fp32 scale per 128
    assert qs.maps == 2 * 3 * 16 * 4
    assert qs.fp32 == 2 * 4 * (4000 + 4160)


def test_estimator_rows_follow_the_state_dtype() -> None:
    """pure bf16: the unquantized tensors' states are bf16 (zeros_like(p)); mixed-bf16 steps fp32 masters."""
    from peakmem.estimate import estimate_training
    from peakmem.hf import spec_from_config
    from peakmem.training import OptimizerName, Precision, TrainingSetup

    cfg = {"model_type": "llama", "vocab_size": 1024, "hidden_size": 256, "intermediate_size": 512,
           "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
           "max_position_embeddings": 512, "tie_word_embeddings": False}  # fmt: skip
    spec = spec_from_config(cfg)
    for prec, small in ((Precision.BF16, 2), (Precision.MIXED_BF16, 4)):
        setup = TrainingSetup(precision=prec, optimizer=OptimizerName.ADAMW_FP8, seq_len=64)
        rows = [r for r in estimate_training(spec, setup).per_param if r.category.value == "optimizer_states"]
        # every llama tensor here has >= 4096 elements and a multiple of 256 but the norms (256 elements)
        norms = 2 * 2 + 1  # two per layer and the final one
        assert (
            sum(r.bytes for r in rows)
            == 2 * (spec.params - 256 * norms) * (1 + 4 / 256) + 2 * small * 256 * norms
        )


torch = pytest.importorskip("torch")
pytest.importorskip("torchao")


@pytest.mark.torch
@pytest.mark.parametrize(
    ("cls", "fmt"), [("AdamW4bit", ao.AO_4BIT), ("AdamW8bit", ao.AO_8BIT), ("AdamWFp8", ao.AO_FP8)]
)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_states_match_torchao(
    cls: str, fmt: ao.AoFormat, dtype: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bytes of every storage in the optimizer's state after one step, as torchao allocated them.

    The step runs eagerly: torchao 0.18 wraps its per-parameter step in ``torch.compile`` (optim/adam.py
    ``single_param_adam``), which compiled once per tensor shape here (86 s of CPU for these six cases,
    4 s eager); the states are created by ``_new_buffer`` before that step and are the same either way."""
    import torchao.optim

    monkeypatch.setattr(torch, "compile", lambda fn, **_: fn)

    dt = getattr(torch, dtype)
    params = []
    for t, n in TENSORS:
        for _ in range(n):
            p = torch.nn.Parameter(torch.randn(t.shape, dtype=dt))
            p.grad = torch.randn_like(p)
            params.append(p)
    opt = getattr(torchao.optim, cls)(params, lr=1e-3)
    opt.step()
    real = 0
    for p in params:
        for name in ("exp_avg", "exp_avg_sq"):
            s = opt.state[p][name]
            parts = [getattr(s, a) for a in s.tensor_attrs] if hasattr(s, "tensor_attrs") else [s]
            real += sum(x.untyped_storage().nbytes() for x in parts)
    assert ao.ao_states(TENSORS, fmt, state_bytes=dt.itemsize).total == real
