"""peakmem.simulate: the caching-allocator model (hand-derived block/segment bytes), fakeify (tied
weights, no memory), the CUDA kernel policy (what SDPA and dropout save), errors, LoRA/QLoRA.

The allocator tests are pure Python; the rest need torch (tiny configs, ~1 s each).
"""

from __future__ import annotations

import pytest

from peakmem.formulas.allocator import round_request
from peakmem.formulas.caching_allocator import CachingAllocatorModel, replay
from peakmem.units import MiB

# --- the caching-allocator model (c10/cuda/CUDACachingAllocator.cpp, default config) -------------


def test_round_size_is_512_byte_blocks_at_least_one():
    assert round_request(1) == 512
    assert round_request(512) == 512
    assert round_request(513) == 1024
    assert round_request(0) == 0  # allocate(0) returns nullptr: no block (replay skips it)


def test_small_request_takes_a_2mib_segment_and_splits():
    m = CachingAllocatorModel()
    m.malloc(1, 100)
    m.malloc(2, 1000)
    assert (m.allocated, m.reserved, m.segments) == (512 + 1024, 2 * MiB, 1)


def test_large_pool_segment_sizes():
    m = CachingAllocatorModel()
    m.malloc(1, 1 * MiB + 1)  # > kSmallSize -> 20 MiB segment (below kMinLargeAlloc)
    assert m.reserved == 20 * MiB
    m.malloc(2, 11 * MiB + 1)  # the 20 MiB segment's free 19 MiB - 512 B remainder fits it
    assert m.reserved == 20 * MiB
    m.malloc(3, 11 * MiB)  # >= 10 MiB, nothing free fits: its own segment rounded to 2 MiB
    assert m.reserved == 20 * MiB + 12 * MiB


def test_large_block_not_split_when_remainder_is_at_most_1mib():
    # 5 MiB and 3 MiB from one 20 MiB segment; free the 5 MiB block; an 11 MiB request takes the
    # 12 MiB remainder whole (12 - 11 = 1 MiB is not > kSmallSize), so allocated counts 12 MiB.
    ev = [(1, 5 * MiB), (2, 3 * MiB), (1, -5 * MiB), (3, 11 * MiB)]
    s = replay(ev)
    assert s.allocated_after[-1] == 3 * MiB + 12 * MiB
    assert s.peak_reserved == 20 * MiB
    assert s.peak_requested == 14 * MiB


def test_zero_byte_storages_take_no_block():
    s = replay([(1, 0), (2, 0), (1, 0)])
    assert (s.peak_allocated, s.peak_reserved, s.segments) == (0, 0, 0)


def test_freed_neighbours_merge_and_are_reused():
    ev = [(1, 4 * MiB), (2, 4 * MiB), (1, -4 * MiB), (2, -4 * MiB), (3, 16 * MiB)]
    s = replay(ev)
    assert s.peak_reserved == 20 * MiB  # 16 MiB fits the merged free segment: no new cudaMalloc
    assert s.segments == 1


def test_best_fit_picks_the_smallest_block_that_fits():
    m = CachingAllocatorModel()
    m.malloc(1, 6 * MiB)
    m.malloc(2, 2 * MiB)
    m.malloc(3, 3 * MiB)
    m.malloc(4, 2 * MiB)  # segment: [1:6][2:2][3:3][4:2][free 7]
    m.free(3)  # a free 3 MiB hole between allocated blocks
    m.malloc(5, 3 * MiB)  # best fit: the 3 MiB hole, not the 7 MiB tail
    assert m.live[5].addr == m.live[2].addr + 2 * MiB


# --- torch-needing tests -------------------------------------------------------------------------

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from peakmem.breakdown import Category  # noqa: E402
from peakmem.errors import InputError  # noqa: E402
from peakmem.training import (  # noqa: E402
    AttentionKernel,
    Checkpointing,
    KernelPolicy,
    Method,
    Precision,
    TrainingSetup,
)
from tiny_models import GPT2, GPT2_P, LLAMA, LLAMA_P  # noqa: E402


def setup(**kw: object) -> TrainingSetup:
    kw.setdefault("micro_batch", 2)
    kw.setdefault("seq_len", 64)
    return TrainingSetup(**kw)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def llama_cuda():
    from peakmem.simulate import simulate_training

    return simulate_training(LLAMA, setup())


@pytest.mark.torch
def test_fakeify_keeps_tied_weights_tied_and_allocates_nothing():
    from peakmem.simulate.fakeify import fakeify_module
    from peakmem.simulate.runner import _fake_mode, build_meta_model

    model = build_meta_model(GPT2, setup(precision=Precision.FP32))
    mode = _fake_mode()
    fakeify_module(model, mode)
    assert model.lm_head.weight is model.transformer.wte.weight
    assert sum(p.numel() for p in model.parameters()) == GPT2_P
    p = model.transformer.wte.weight
    assert isinstance(p, torch.nn.Parameter) and p.requires_grad and p.device.type == "cpu"
    assert type(p).__name__ in ("FakeTensor", "Parameter")
    assert p.untyped_storage().nbytes() == 1000 * 64 * 4


@pytest.mark.torch
def test_simulated_estimate_shape(llama_cuda):
    e = llama_cuda
    assert e.method == "simulated" and e.job == "train"
    assert e.params == LLAMA_P and e.trainable_params == LLAMA_P
    assert e.peak_reserved_bytes >= e.peak_allocated_bytes >= e.extra["requested_peak_bytes"]
    assert e.device_total_bytes == (
        e.peak_reserved_bytes + e.extra["context_bytes"] + e.extra["cublas_workspace_bytes"]
    )
    # mixed-bf16: 2 B/param weights + 4 B/param masters + AdamW 2 x 4 B/param, all alive at the peak
    cats = e.by_category()
    assert cats[Category.PARAMETERS] == 2 * LLAMA_P
    assert cats[Category.MASTER_WEIGHTS] == 4 * LLAMA_P
    assert cats[Category.OPTIMIZER_STATES] == 8 * LLAMA_P  # 'step' scalars: host memory on CUDA
    top = e.extra["top_tensors"]
    assert top[0]["bytes"] == 2 * 64 * 1000 * 4  # the saved fp32 log-softmax of the logits
    assert top[0]["module"] == "LlamaForCausalLM"
    # backward temporaries are attributed to the module whose autograd node made them
    assert {t["module"] for t in top if t["op"] == "nll_loss_backward"} == {"LlamaForCausalLM (backward)"}
    assert any("flash" in line for line in e.assumptions)


@pytest.mark.torch
def test_flash_attention_saves_output_and_fp32_logsumexp(llama_cuda):
    # per layer: output B*S*H*D bf16 (2*64*4*16*2 = 16384) + logsumexp B*H*S fp32 (2*4*64*4 = 2048)
    # + the philox RNG state torch 2.13's meta kernel returns (uint64 [2] + uint64 []: 24 B)
    items = {i.path: i.bytes for i in llama_cuda.items}
    assert items["model.layers.*.self_attn: _scaled_dot_product_flash_attention"] == 2 * (16384 + 2048 + 24)
    assert llama_cuda.extra["kernel_calls"] == {"sdpa: flash": 4}


def _saved_under_cuda_policy(fn):
    from torch._subclasses.fake_tensor import FakeTensorMode

    from peakmem.simulate.kernels import CudaDispatchMode, CudaFunctionMode, KernelLog

    saved: list[tuple[tuple[int, ...], torch.dtype]] = []

    def pack(t):
        saved.append((tuple(t.shape), t.dtype))
        return t

    log = KernelLog()
    hooks = torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t)
    with FakeTensorMode(), CudaDispatchMode(log), CudaFunctionMode(log), hooks:
        fn()
    return saved, log


@pytest.mark.torch
def test_dropout_saves_a_bool_mask_as_cuda_does():
    def fn():
        x = torch.empty(4, 16, requires_grad=True)
        torch.nn.functional.dropout(x, 0.1, True).sum().backward()

    saved, _ = _saved_under_cuda_policy(fn)
    assert saved == [((4, 16), torch.bool)]


@pytest.mark.torch
def test_sdpa_backend_choice():
    from peakmem.simulate.kernels import cuda_sdpa_backend

    q = torch.empty(1, 8, 16, 64, dtype=torch.bfloat16, device="meta")
    kv = torch.empty(1, 2, 16, 64, dtype=torch.bfloat16, device="meta")
    assert cuda_sdpa_backend(q, q, q, None, False) == "flash"
    assert cuda_sdpa_backend(q, kv, kv, None, True) == "flash"  # GQA native in flash
    assert cuda_sdpa_backend(q, q, q, torch.empty(1, 1, 16, 16, device="meta"), False) == "efficient"
    assert cuda_sdpa_backend(q.float(), q.float(), q.float(), None, False) == "efficient"
    assert cuda_sdpa_backend(q.float(), kv.float(), kv.float(), None, True) == "math"
    big = torch.empty(1, 8, 16, 512, dtype=torch.bfloat16, device="meta")
    assert cuda_sdpa_backend(big, big, big, None, False) == "efficient"


@pytest.mark.torch
def test_efficient_attention_with_dropout_saves_no_mask():
    def fn():
        q = torch.empty(1, 2, 64, 16, requires_grad=True)  # fp32 -> memory-efficient kernel
        torch.nn.functional.scaled_dot_product_attention(q, q, q, dropout_p=0.1).sum().backward()

    saved, log = _saved_under_cuda_policy(fn)
    assert ((1, 2, 64), torch.float32) in saved  # logsumexp rows padded to 32
    assert not any(dt == torch.bool for _, dt in saved)
    assert log.counts == {"sdpa: efficient with dropout": 1}


@pytest.mark.torch
def test_cpu_policy_keeps_the_cpu_kernels():
    from peakmem.simulate import simulate_training

    e = simulate_training(GPT2, setup(precision=Precision.FP32), kernels="cpu")
    assert e.extra["kernels"] == "cpu" and e.extra["kernel_calls"] == {}
    assert e.peak_reserved_bytes == e.device_total_bytes == e.peak_allocated_bytes
    assert KernelPolicy.parse("cpu", "kernels") == KernelPolicy.CPU


@pytest.mark.torch
@pytest.mark.parametrize(
    "config, needle",
    [
        ({"model_type": "not-a-model", "hidden_size": 8}, "cannot build this architecture offline"),
        ({"model_type": "acme_llm", "auto_map": {"AutoModelForCausalLM": "x.Y"}}, "remote code"),
        ({"hidden_size": 8}, "model_type is missing"),
    ],
)
def test_unbuildable_configs_give_a_clear_error(config, needle):
    from peakmem.simulate import simulate_training

    with pytest.raises(InputError, match=needle):
        simulate_training(config, setup())


@pytest.mark.torch
@pytest.mark.slow  # importing peft (and bitsandbytes through it) takes seconds
def test_lora_and_qlora_trainable_params_and_quantized_base():
    from peakmem.adapters import LoraConfig
    from peakmem.simulate import simulate_training

    r = 4
    # all-linear LoRA on 7 projections per layer: r * (in + out) each (lm_head is not targeted)
    per_layer = r * ((64 + 64) + 2 * (64 + 32) + (64 + 64) + 2 * (64 + 176) + (176 + 64))
    spec = LoraConfig(rank=r)
    lora = simulate_training(LLAMA, setup(method=Method.LORA, precision=Precision.BF16), lora=spec)
    assert lora.trainable_params == 2 * per_layer
    assert lora.params == LLAMA_P + 2 * per_layer
    q = simulate_training(LLAMA, setup(method=Method.QLORA, precision=Precision.BF16), lora=spec)
    assert q.trainable_params == 2 * per_layer
    rows = {r.tensor: r for r in q.per_param}
    base_linear = 2 * (64 * 64 + 2 * 64 * 32 + 64 * 64 + 3 * 64 * 176)
    assert rows["weights (quantized base)"].params == base_linear
    assert q.peak_allocated_bytes < lora.peak_allocated_bytes
    assert any("qlora" in a for a in q.assumptions)
    # adapters in fp32 (peft's autocast_adapter_dtype): 4 B/param each, gradients and AdamW states too
    rows = {(r.tensor, r.dtype): r.bytes for r in lora.per_param}
    assert rows[("weights", "fp32")] == 4 * 2 * per_layer
    dora = simulate_training(LLAMA, setup(method=Method.LORA, precision=Precision.BF16),
                             lora=LoraConfig(rank=r, dora=True))  # fmt: skip
    # DoRA adds a magnitude vector per adapted Linear (its out features)
    assert dora.trainable_params == 2 * per_layer + 2 * (64 + 32 + 32 + 64 + 176 + 176 + 64)


@pytest.mark.torch
def test_value_dependent_model_gives_a_clear_error(monkeypatch):
    from torch._subclasses.fake_tensor import DynamicOutputShapeException

    from peakmem.simulate import runner

    def boom(*args, **kwargs):
        raise DynamicOutputShapeException(torch.ops.aten.nonzero.default)

    monkeypatch.setattr(runner, "_run", boom)
    with pytest.raises(InputError, match="cannot be simulated with fake tensors"):
        runner.simulate_training(LLAMA, setup())


@pytest.mark.torch
def test_model_without_sdpa_falls_back_to_eager():
    from peakmem.simulate import simulate_training

    bloom = {
        "model_type": "bloom", "architectures": ["BloomForCausalLM"], "vocab_size": 1000,
        "hidden_size": 64, "n_layer": 2, "n_head": 4,
    }  # fmt: skip
    e = simulate_training(bloom, setup(precision=Precision.FP32))
    assert any("falls back to 'eager'" in a for a in e.assumptions)


@pytest.mark.torch
def test_checkpointing_recomputes_with_the_cuda_kernels():
    from peakmem.simulate import simulate_training

    # GPT-2 keeps dropout 0.1: the recomputed forward must draw the same bool masks as the forward
    s = setup(precision=Precision.FP32, checkpointing=Checkpointing.FULL)
    e = simulate_training(GPT2, s)
    plain = simulate_training(GPT2, setup(precision=Precision.FP32))
    assert e.peak_allocated_bytes < plain.peak_allocated_bytes
    assert any("recomputed:" in i.path for p in e.phases for i in p.items)


@pytest.mark.torch
def test_amp_follows_cuda_autocast_fp32_lists():
    from torch._subclasses.fake_tensor import FakeTensorMode

    from peakmem.simulate.kernels import CudaFunctionMode, KernelLog

    log = KernelLog()
    with FakeTensorMode(), CudaFunctionMode(log), torch.autocast("cpu", dtype=torch.bfloat16):
        x = torch.empty(4, 8, dtype=torch.bfloat16)
        w = torch.empty(8, 8)
        assert torch.softmax(x, dim=-1).dtype == torch.float32  # CPU autocast: bf16
        assert torch.exp(x).dtype == torch.float32
        assert torch.nn.functional.layer_norm(x, (8,)).dtype == torch.float32
        assert torch.nn.functional.linear(x, w).dtype == torch.bfloat16  # lower-precision list: unchanged
        assert torch.exp(x.float()).dtype == torch.float32
    assert log.counts["autocast fp32 (CUDA list): exp"] == 1  # only the 16-bit call is changed


@pytest.mark.torch
def test_an_architecture_the_analytic_adapter_does_not_know_is_simulated():
    from peakmem.simulate import simulate_training

    granite = {
        "model_type": "granite", "architectures": ["GraniteForCausalLM"], "vocab_size": 1000,
        "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "max_position_embeddings": 256,
    }  # fmt: skip
    e = simulate_training(granite, setup(precision=Precision.FP32), kernels="cpu")
    # embed + 2 x (q, k, v, o, gate, up, down, 2 norms) + norm + untied head
    per_layer = 64 * 64 + 2 * 64 * 32 + 64 * 64 + 3 * 64 * 128 + 2 * 64
    assert e.params == 1000 * 64 + 2 * per_layer + 64 + 1000 * 64
    assert e.peak_allocated_bytes > 4 * 4 * e.params  # weights, grads and AdamW states at least


def test_scalar_mode_forgets_a_freed_overflow_flag() -> None:
    """The overflow flag of ``_amp_foreach_non_finite_check_and_unscale_`` reads 0; once it is freed, a
    new tensor at the same address (Adam's step count) reads 1 again: a reused address read as 0 made
    Adam divide by zero in a full test run."""
    from peakmem.simulate.kernels import ScalarValueMode

    with ScalarValueMode():
        for _ in range(50):
            flag = torch.zeros(1)
            torch._amp_foreach_non_finite_check_and_unscale_([torch.ones(2)], flag, torch.ones(1))
            assert flag.item() == 0.0
            del flag
            step = torch.zeros(())  # often where the flag was
            assert step.item() == 1.0


def test_options_simulate_does_not_run_are_refused_by_name() -> None:
    """simulate executes the transformers model eagerly with its own loss: a chunked loss, activation
    offloading or torch.compile would be labelled with a setup it did not run (CLI: exit 2)."""
    from peakmem.cli import main
    from peakmem.training import LossImpl

    with pytest.raises(InputError, match=r"^loss='chunked', activation_offload=True: simulate does not run"):
        setup(loss=LossImpl.CHUNKED, activation_offload=True).check_oracle_runs("simulate")
    assert main(["simulate", "gpt2", "--compile"]) == 2


@pytest.mark.torch
def test_math_attention_upcasts_16_bit_and_saves_no_mask():
    """attention.cpp ``_scaled_dot_product_attention_math`` (Falcon-7B's call: 1 k/v head, no enable_gqa,
    a bool mask): q, k, v kept in fp32, the fp32 softmax saved, the mask added in place (not saved)."""

    def fn():
        q = torch.empty(2, 4, 16, 8, dtype=torch.bfloat16, requires_grad=True)
        kv = torch.empty(2, 1, 16, 8, dtype=torch.bfloat16, requires_grad=True)
        mask = torch.ones(2, 1, 16, 16, dtype=torch.bool).tril()
        out = torch.nn.functional.scaled_dot_product_attention(q, kv, kv, attn_mask=mask)
        assert out.dtype == torch.bfloat16
        out.sum().backward()

    saved, log = _saved_under_cuda_policy(fn)
    assert log.counts == {"sdpa: math": 1}
    assert ((2, 4, 16, 16), torch.float32) in saved  # softmax
    assert not any(dt in (torch.bool, torch.bfloat16) for _, dt in saved)


GPT_OSS = {
    "model_type": "gpt_oss", "architectures": ["GptOssForCausalLM"], "vocab_size": 256, "hidden_size": 64,
    "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "head_dim": 16, "num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": 16,
    "layer_types": ["sliding_attention", "full_attention"],
}  # fmt: skip


@pytest.mark.torch
def test_flash_on_a_model_without_sdpa_is_measured_without_scores():
    """gpt-oss has a flash path (its sink kernels) but no SDPA one: flash is measured with SDPA standing in
    (derive/build.py build_with), not on the eager fallback, which materialises each layer's scores: the
    eager step's peak is above the flash step's by at least one layer's bf16 scores (batch x heads x seq x
    seq), and the flash step's attention line names SDPA."""
    from peakmem.simulate import simulate_training

    b, s = 2, 64
    # bf16 weights: gpt-oss's experts run torch._grouped_mm, which takes bf16 only
    flash = simulate_training(GPT_OSS, setup(precision=Precision.BF16, attention=AttentionKernel.FLASH))
    eager = simulate_training(GPT_OSS, setup(precision=Precision.BF16, attention=AttentionKernel.EAGER))
    assert any("attention implementation 'sdpa'" in a for a in flash.assumptions)
    assert eager.peak_allocated_bytes - flash.peak_allocated_bytes >= b * 4 * s * s * 2
