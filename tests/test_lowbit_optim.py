"""Low-bit optimizer states, GaLore, offloading and chunked losses, by hand on small tensors."""

from __future__ import annotations

from peakmem.formulas import lowbit_optim as O
from peakmem.model import Tensor


def T(*shape: int, component: str = "mlp", kind: str = "linear_weight") -> Tensor:
    return Tensor(name="x", module="x", shape=shape, component=component, kind=kind)  # type: ignore[arg-type]


def test_bnb_8bit_small_tensors_stay_fp32() -> None:
    qs = O.bnb_8bit_states([(T(100), 3), (T(4096), 1), (T(300, 300), 2)])
    assert qs.fp32 == 3 * 2 * 100 * 4
    assert qs.quantized == 2 * 4096 + 2 * 2 * 90000
    assert qs.scales == 4 * (2 * 16 + 2 * 2 * 352)  # ceil(90000 / 256) = 352 blocks
    assert qs.maps == 2 * 256 * 4  # dynamic + udynamic, shared
    assert qs.params_quantized == 4096 + 180000 and qs.params_fp32 == 300


def test_bnb_paged_split() -> None:
    qs = O.bnb_8bit_states([(T(300, 300), 1), (T(200, 200), 1)], paged=True)
    assert qs.pageable == 0  # both below 1e5 elements: ordinary device tensors
    qs = O.bnb_8bit_states([(T(400, 400), 1), (T(200, 200), 1)], paged=True)
    assert qs.pageable == 2 * 160000


def test_ao_4bit_states() -> None:
    from peakmem.formulas import torchao_optim as ao

    qs = ao.ao_states([(T(4096), 1), (T(4000), 1), (T(64, 64), 1)], ao.AO_4BIT)
    assert qs.quantized == 2 * (2048 + 2048)
    assert qs.scales == 2 * 4 * (32 + 32)
    assert qs.maps == 2 * 2 * 16 * 4
    assert qs.fp32 == 2 * 4000 * 4  # 4000 is not a multiple of 128


def test_gpt2_xl_8bit_adamw_about_10_bytes_per_param() -> None:
    """The seed: mixed precision + 8-bit AdamW = 2 (weights) + 2 (grads) + 4 (master) + 2 (states) = 10."""
    from peakmem.catalog import get_model
    from peakmem.hf import spec_from_config

    spec = spec_from_config(dict(get_model("gpt2-xl").config), name="gpt2-xl")
    qs = O.bnb_8bit_states(spec.tensors())
    per_param = (2 + 2 + 4) + qs.total / spec.params
    assert 10.0 < per_param < 10.1
    assert qs.quantized == 2 * qs.params_quantized


def test_galore() -> None:
    g = O.galore_states(
        [
            (T(256, 64), 2),
            (
                T(64),
                1,
            ),
        ],
        rank=8,
    )
    assert g.projections == 2 * 8 * 64 * 4
    assert g.low_rank_states == 2 * 2 * 8 * 256 * 4
    assert g.full_states == 2 * 64 * 4


def test_chunked_and_fused_loss_heads() -> None:
    from types import SimpleNamespace

    from peakmem.formulas import activations as act
    from peakmem.formulas.loss import head_activations
    from peakmem.hf import spec_from_config
    from peakmem.training import Precision, TrainingSetup

    cfg = {
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 1000, "hidden_size": 64,
        "intermediate_size": 96, "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2,
    }  # fmt: skip
    spec = spec_from_config(cfg, name="t")
    sh = act.shapes(spec, TrainingSetup(precision=Precision.BF16, micro_batch=2, seq_len=64))
    head = head_activations(spec, sh, 1000 * 64)
    t, v = 128, 1000
    assert O.adapt_head_loss(spec, head, sh, SimpleNamespace(loss="standard")) is head
    chunked = O.adapt_head_loss(spec, head, sh, SimpleNamespace(loss="chunked"))
    assert chunked.forward_transient == t * v * 2 + (t // 8) * v * 4  # all 16-bit chunks + one fp32 upcast
    assert chunked.backward_transient == 2 * (t // 8) * v * 4 + (t // 8) * v * 2
    compiled = O.adapt_head_loss(spec, head, sh, SimpleNamespace(loss="chunked-compiled"))
    assert any(i.bytes == t * v * 2 + 2 * t * 4 for i in compiled.saved)  # + fp32 row max and logsumexp
    assert compiled.forward_transient == 0  # the upcast is fused: no fp32 chunk (tests/test_compile_torch.py)
    assert compiled.backward_transient == compiled.logits_grad == (t // 8) * v * 2
    fused = O.adapt_head_loss(spec, head, sh, SimpleNamespace(loss="fused"))
    assert all(i.bytes < t * v for i in fused.saved)


def test_step_tricks() -> None:
    from types import SimpleNamespace

    from peakmem.breakdown import Category, MemoryItem
    from peakmem.formulas.activations import LayerActivations

    item = MemoryItem(path="x", category=Category.ACTIVATIONS, bytes=100)
    la = LayerActivations(saved=(item,), core=0, layer_input=10, forward_transient=5, backward_transient=7)
    off, grads = O.step_tricks(la, 40, SimpleNamespace(activation_offload=True, optimizer_in_backward=False))
    assert (off.saved_bytes, off.backward_transient, off.forward_transient, grads) == (0, 207, 105, 40)
    inb, grads = O.step_tricks(la, 40, SimpleNamespace(activation_offload=False, optimizer_in_backward=True))
    assert (inb.saved_bytes, inb.backward_transient, grads) == (100, 47, 0)


def test_gpt2_xl_seed_claims_through_the_estimator() -> None:
    """Seed: 8-bit AdamW ~ 10 bytes/param of model states; QLoRA at batch 1 x 1024 under 10 GB."""
    from peakmem.adapters import LoraConfig
    from peakmem.catalog import get_model
    from peakmem.estimate import estimate_training
    from peakmem.hf import spec_from_config
    from peakmem.training import Method, OptimizerName, Precision, TrainingSetup

    spec = spec_from_config(dict(get_model("gpt2-xl").config), name="gpt2-xl")
    eight = estimate_training(spec, TrainingSetup(optimizer=OptimizerName.ADAMW_8BIT, seq_len=1024))
    assert 10.0 < eight.model_state_bytes / spec.params < 10.1
    qlora = estimate_training(
        spec,
        TrainingSetup(method=Method.QLORA, precision=Precision.BF16, seq_len=1024, lora=LoraConfig(rank=16)),
    )
    assert qlora.device_total_bytes < 10 * 10**9
    assert qlora.per_param[0].bytes < spec.params  # the NF4 base: about half a byte per parameter


def test_published_finetune_points_within_15_percent(capsys: object) -> None:
    """benchmarks/accuracy_finetune.py: torchtune LoRA / QLoRA / 8-bit AdamW and HF 8-bit Adam points."""

    import pytest

    from _bench import load_benchmark

    module = load_benchmark("accuracy_finetune")
    if not module.DEFAULT_PATH.exists():
        pytest.skip("shared/validation is not next to this checkout")
    rows = dict(module.run(module.DEFAULT_PATH))
    assert {"TT-32-07", "TT-32-08", "TT-32-09"} <= set(rows)
    assert all(abs(err) <= module.TOLERANCE for err in rows.values()), rows


def test_offloaded_activations_in_cpu_ram_by_hand() -> None:
    """Full checkpointing keeps each layer's input (tokens x hidden x 2 bytes in bf16): offloading puts every
    layer's in pinned CPU RAM; under 1F1B the first of 2 stages holds 2 micro-batches of its layers."""
    from peakmem.catalog import get_model
    from peakmem.estimate import estimate_training
    from peakmem.hf import spec_from_config
    from peakmem.parallel import Parallelism
    from peakmem.ranks import estimate_ranks
    from peakmem.training import Checkpointing, Precision, TrainingSetup

    spec = spec_from_config(get_model("llama-3.2-1b").config, name="llama-3.2-1b")
    setup = TrainingSetup(micro_batch=2, seq_len=512, checkpointing=Checkpointing.FULL,
                          activation_offload=True, precision=Precision.MIXED_BF16, grad_accum=4)  # fmt: skip
    layer_input = 2 * 512 * spec.hidden_size * 2
    assert estimate_training(spec, setup).extra["cpu_activation_bytes"] == spec.num_layers * layer_input
    ranks = estimate_ranks(spec, setup, Parallelism(gpus=2, pp=2)).ranks
    first = next(r.estimate for r in ranks if r.estimate.extra["stage"] == 0)
    assert first.extra["cpu_activation_bytes"] == 2 * (spec.num_layers // 2) * layer_input
