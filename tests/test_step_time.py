"""The step-time model, hand-derived on a tiny Llama.

Tiny Llama: hidden 64, 4 heads (head_dim 16), 2 KV heads, MLP 128 (gated), vocab 1000, 2 layers,
untied head. Per layer: q 64x64 + k 64x32 + v 64x32 + o 64x64 = 12,288; gate, up, down 3 x 64x128 =
24,576; matmul total 36,864 per layer, 73,728 for both. Head 1000 x 64 = 64,000. Embeddings are a
lookup (no FLOPs), norms are not matmuls. Attention width per layer: 4 x (16 + 16) = 128. At S = 32
eager attention computes all 32 keys per query; SDPA's causal kernel 32 - 32^2 / 64 = 16 on average.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from peakmem.adapters import QuantConfig
from peakmem.catalog import get_gpu
from peakmem.formulas import step_time as st
from peakmem.hf import spec_from_config
from peakmem.resolve import gpu_of_size, resolve_model
from peakmem.training import AttentionKernel, Checkpointing, Method, TrainingSetup

LLAMA: dict[str, Any] = {
    "model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
    "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 1000, "max_position_embeddings": 128,
    "tie_word_embeddings": False,
}  # fmt: skip
LAYER_MM = 2 * (4096 + 2048 + 2048 + 4096 + 3 * 8192)  # 73,728
HEAD = 1000 * 64
S = 32
MATMUL_FWD = 2 * (LAYER_MM + HEAD)  # 275,456
ATT_EAGER = 2 * 2 * S * 128  # 16,384: 2 layers x 2 (QK^T, AV) x 32 keys x width 128
ATT_CAUSAL = 2 * 2 * 16 * 128  # 8,192: the default kernel (SDPA) skips the masked half
FWD_PER_TOKEN = MATMUL_FWD + ATT_CAUSAL  # 283,648

RATES = st.Rates(
    gpu="test", tflops=1.0, mfu=0.5, mfu_source="test", pcie_gbps=10.0, pcie_source="test", hbm_gbps=1.0,
    intra_node_gbps=100.0, intra_node_source="test", inter_node_gbps=10.0, inter_node_source="test",
)  # fmt: skip


@pytest.fixture(scope="module")
def sf() -> st.SpecFlops:
    return st.spec_flops(spec_from_config(dict(LLAMA)))


def test_spec_flops_counts_matmul_params(sf: st.SpecFlops) -> None:
    assert sf.layer_matmul_params == 73_728
    assert sf.matmul_params == 73_728 + 64_000
    assert sf.attention == ((2, 128, None),)

    def forward(kernel: AttentionKernel) -> float:  # forward FLOPs per token: 2 x matmul params + attention
        return 2.0 * sf.matmul_params + sf.attention_flops_per_token(S, kernel)

    assert forward(AttentionKernel.EAGER) == MATMUL_FWD + ATT_EAGER == 291_840
    assert forward(AttentionKernel.SDPA) == FWD_PER_TOKEN == 283_648
    assert forward(AttentionKernel.FLASH) == FWD_PER_TOKEN


def test_tied_head_still_multiplies() -> None:
    tied = st.spec_flops(spec_from_config({**LLAMA, "tie_word_embeddings": True}))
    assert tied.matmul_params == 73_728 + 64_000  # the head reuses the embedding matrix


def test_training_flops_full_lora_and_recompute(sf: st.SpecFlops) -> None:
    setup = TrainingSetup(micro_batch=2, seq_len=S)
    assert st.training_flops_per_token(sf, setup) == 3 * FWD_PER_TOKEN
    # adapters: the weight matmuls' backward is 1x their forward; attention's backward stays 2x
    lora = replace(setup, method=Method.LORA)
    assert st.training_flops_per_token(sf, lora) == 2 * MATMUL_FWD + 3 * ATT_CAUSAL == 575_488
    full = replace(setup, checkpointing=Checkpointing.FULL)
    # every layer's forward again: 2 x 73,728 + the attention scores 8,192
    assert st.training_flops_per_token(sf, full) == 3 * FWD_PER_TOKEN + 147_456 + 8_192
    sel = replace(setup, checkpointing=Checkpointing.SELECTIVE)
    assert st.training_flops_per_token(sf, sel) == 3 * FWD_PER_TOKEN + 8_192
    eager = replace(setup, attention=AttentionKernel.EAGER)
    assert st.training_flops_per_token(sf, eager) == 3 * (MATMUL_FWD + ATT_EAGER)


def test_adapters_cost_six_flops_per_parameter(sf: st.SpecFlops) -> None:
    """1,000 adapter parameters: 2 FLOPs each forward, 4 backward; 2 more when a layer is recomputed."""
    lora = TrainingSetup(micro_batch=2, seq_len=S, method=Method.LORA)
    assert st.training_flops_per_token(sf, lora, adapter_params=1000) == 575_488 + 6_000
    full = replace(lora, checkpointing=Checkpointing.FULL)
    recompute = 147_456 + 8_192 + 2_000  # layers, attention scores, adapters
    assert st.training_flops_per_token(sf, full, adapter_params=1000) == 575_488 + 6_000 + recompute
    t = st.step_time(sf, lora, RATES, st.Layout(), trainable_params=1000, params=LAYER_MM + HEAD)
    assert t.compute_s == pytest.approx((575_488 + 6_000) * 2 * S / 0.5e12)


def test_encoder_attention_is_not_halved() -> None:
    bert = st.spec_flops(resolve_model("bert-base-uncased"))
    assert not bert.causal
    assert bert.span(512, None, AttentionKernel.SDPA) == 512.0


def test_sliding_window_caps_the_attention_span() -> None:
    """Window 16 at S = 32: flash-attn 2 skips blocks outside the window and above the diagonal:
    min(i + 1, 16) keys for query i, 16 - 16^2 / 64 = 12 on average; transformers gives SDPA a mask
    tensor for a window (no block skipped) and eager computes every score: 32."""
    sf = st.spec_flops(spec_from_config({**LLAMA, "model_type": "mistral", "sliding_window": 16}))
    assert sf.attention_flops_per_token(S, AttentionKernel.FLASH) == 2 * 2 * 12 * 128
    assert sf.attention_flops_per_token(S, AttentionKernel.SDPA) == ATT_EAGER
    assert sf.attention_flops_per_token(S, AttentionKernel.EAGER) == ATT_EAGER


def test_ring_collectives() -> None:
    assert st.all_reduce_s(1e9, 4, 100.0) == pytest.approx(2 * 3 / 4 * 1e9 / 100e9)
    assert st.all_gather_s(1e9, 4, 100.0) == pytest.approx(3 / 4 * 1e9 / 100e9)
    assert st.reduce_scatter_s(1e9, 8, 50.0) == pytest.approx(7 / 8 * 1e9 / 50e9)
    assert st.all_reduce_s(1e9, 1, 100.0) == 0.0


def test_single_gpu_step_is_compute(sf: st.SpecFlops) -> None:
    setup = TrainingSetup(micro_batch=2, seq_len=S, grad_accum=3)
    t = st.step_time(sf, setup, RATES, st.Layout(), trainable_params=1000, params=1000)
    tokens = 2 * S * 3
    assert t.compute_s == pytest.approx(3 * FWD_PER_TOKEN * tokens / 0.5e12)
    assert t.recompute_s == t.bubble_s == t.tp_comm_s == t.dp_comm_s == t.offload_s == 0.0
    assert t.tokens == tokens and t.gpus == 1
    assert t.total_s == pytest.approx(t.compute_s)


def test_tensor_parallel_all_reduces(sf: st.SpecFlops) -> None:
    setup = TrainingSetup(micro_batch=2, seq_len=S)
    t = st.step_time(sf, setup, RATES, st.Layout(gpus=2, tp=2), trainable_params=1000, params=1000)
    one = 2 * (2 - 1) / 2 * (2 * S * 64 * 2) / 100e9  # ring all-reduce of b x s x h bf16 over 2 GPUs
    assert t.tp_comm_s == pytest.approx(4 * 2 * one)  # 4 per layer (2 fwd + 2 bwd), 2 layers
    assert t.compute_s == pytest.approx(3 * FWD_PER_TOKEN * 2 * S / 2 / 0.5e12)  # split over tp


def test_pipeline_bubble(sf: st.SpecFlops) -> None:
    setup = TrainingSetup(micro_batch=1, seq_len=S, grad_accum=4)
    t = st.step_time(sf, setup, RATES, st.Layout(gpus=2, pp=2), trainable_params=1000, params=1000)
    assert t.bubble_s == pytest.approx(t.compute_s * (2 - 1) / 4)  # (p - 1) / m


def test_ddp_exposed_comm_and_zero3_volume(sf: st.SpecFlops) -> None:
    setup = TrainingSetup(micro_batch=1, seq_len=S)
    params = 10**9  # large enough that communication outlasts the tiny compute
    ddp = st.step_time(
        sf, setup, RATES, st.Layout(gpus=4, engine="ddp"), trainable_params=params, params=params
    )
    raw = st.all_reduce_s(params * 2, 4, 100.0)
    assert ddp.dp_comm_s == pytest.approx(raw - 2 / 3 * ddp.compute_s)
    z3 = st.step_time(
        sf, setup, RATES, st.Layout(gpus=4, engine="zero-3"), trainable_params=params, params=params
    )
    raw3 = 2 * st.all_gather_s(params * 2, 4, 100.0) + st.reduce_scatter_s(params * 2, 4, 100.0)
    assert raw3 == pytest.approx(1.5 * raw)  # Rajbhandari et al. 2020 §7.2: 1.5x DDP
    assert z3.dp_comm_s == pytest.approx(raw3 - z3.compute_s)
    # crossing nodes: 16 GPUs, 8 per node -> the inter-node link (10 GB/s here)
    big = st.step_time(
        sf, setup, RATES, st.Layout(gpus=16, engine="ddp"), trainable_params=params, params=params
    )
    assert big.dp_comm_s == pytest.approx(st.all_reduce_s(params * 2, 16, 10.0) - 2 / 3 * big.compute_s)


def test_offload_traffic(sf: st.SpecFlops) -> None:
    setup = TrainingSetup(micro_batch=1, seq_len=S, grad_accum=2)
    p = 10**6
    t = st.step_time(sf, setup, RATES, st.Layout(engine="zero-2", offload_optimizer=True), trainable_params=p,
                     params=p)  # fmt: skip
    pcie = 2 * p * 2 / 10e9
    cpu = p * st.CPU_ADAM_BYTES_PER_PARAM / (st.CPU_OPTIMIZER_GBPS * 1e9)
    assert t.offload_s == pytest.approx(pcie + cpu)
    lay = st.Layout(engine="zero-3", offload_optimizer=True, offload_params=True)
    both = st.step_time(sf, setup, RATES, lay,
                        trainable_params=p, params=p)  # fmt: skip
    assert both.offload_s == pytest.approx(pcie + cpu + 2 * 2 * p * 2 / 10e9)  # 2 micro-batches x fwd+bwd
    assert both.overheads()[0] == ("offload", both.offload_s)  # what the cost is made of, largest first
    assert all(t > 0 for _, t in both.overheads())


def test_qlora_dequantizes_every_frozen_weight_per_pass(sf: st.SpecFlops) -> None:
    """The tiny Llama's quantized weights: the 73,728 layer Linears (the head stays 16-bit). NF4 with
    double quantization, blocksize 64: 36,864 B packed + 1,152 uint8 absmax + 5 fp32 second-level
    absmax (20 B) + the 256-entry fp32 code (1,024 B) + the fp32 offset (4 B) + the 16-entry fp32 NF4
    code (64 B) = 39,128 B read; the bf16 copy written: 147,456 B; per pass at 1 GB/s (RATES.hbm_gbps)."""
    assert sf.quantized_params == LAYER_MM
    setup = TrainingSetup(method=Method.QLORA, micro_batch=2, seq_len=S, grad_accum=3)
    packed = 36_864 + 1_152 + 20 + 1_024 + 4 + 64
    assert st.dequant_bytes(sf, setup) == packed + 2 * LAYER_MM
    assert st.dequant_passes(setup) == 2  # forward and backward
    t = st.step_time(sf, setup, RATES, st.Layout(), trainable_params=1000, params=1000)
    assert t.dequant_s == pytest.approx(3 * 2 * (packed + 2 * LAYER_MM) / 1e9)  # 3 micro-batches
    assert t.total_s == pytest.approx(t.compute_s + t.dequant_s)
    full = replace(setup, checkpointing=Checkpointing.FULL)
    assert st.dequant_passes(full) == 3  # the recomputed forward dequantizes again
    lora = st.step_time(sf, replace(setup, method=Method.LORA), RATES, st.Layout(), trainable_params=1000,
                        params=1000)  # fmt: skip
    assert lora.dequant_s == 0.0 and lora.compute_s == t.compute_s
    int8 = replace(setup, quant=QuantConfig(quant="int8"))
    assert st.dequant_passes(int8) == 1  # backward only: the forward is an int8 matmul
    assert st.dequant_bytes(sf, int8) == LAYER_MM + 2 * LAYER_MM


SLOW = replace(RATES, intra_node_gbps=0.001)  # 1 MB/s: communication outlasts the tiny compute
MIXTRAL: dict[str, Any] = {
    "model_type": "mixtral", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
    "num_key_value_heads": 2, "intermediate_size": 96, "num_local_experts": 4, "num_experts_per_tok": 2,
    "vocab_size": 1000, "max_position_embeddings": 128,
}  # fmt: skip


def test_context_parallel_splits_the_work_and_rings_kv(sf: st.SpecFlops) -> None:
    """cp=2, batch 2 x 32: each rank computes half of the 64 tokens. K, V per token over both layers:
    2 x 2 kv heads x (16 + 16) = 128 elements; a rank's chunk of 32 tokens is 32 x 128 x 2 B = 8,192 B,
    sent 1 hop in forward and 2 in backward (K, V and their gradients): 24,576 B, less the attention
    core's time (8,192 FLOPs/token forward x 3 passes x 32 tokens) under which it runs."""
    assert sf.kv_elems == 128
    setup = TrainingSetup(micro_batch=2, seq_len=S)
    t = st.step_time(sf, setup, SLOW, st.Layout(gpus=2, cp=2), trainable_params=1000, params=1000)
    assert t.compute_s == pytest.approx(3 * FWD_PER_TOKEN * 32 / 0.5e12)
    attention_s = ATT_CAUSAL * 3 * 32 / 0.5e12
    assert t.cp_comm_s == pytest.approx(3 * 8_192 / 1e6 - attention_s)
    assert t.tokens == 64  # the two ranks share the sequences: one data-parallel replica
    full = st.step_time(sf, replace(setup, checkpointing=Checkpointing.FULL), SLOW, st.Layout(gpus=2, cp=2),
                        trainable_params=1000, params=1000)  # fmt: skip
    assert full.cp_comm_s == pytest.approx(4 * 8_192 / 1e6 - ATT_CAUSAL * 4 * 32 / 0.5e12)  # + recomputed hop
    fast = st.step_time(sf, setup, RATES, st.Layout(gpus=2, cp=2), trainable_params=1000, params=1000)
    assert fast.cp_comm_s == 0.0  # 100 GB/s: hidden under the attention core


def test_expert_parallel_all_to_all_and_expert_gradients() -> None:
    """Tiny Mixtral (2 MoE layers, top-2 of 4 experts): a token goes out as 2 x 2 = 4 copies of 64 bf16
    values over the two layers; batch 1 x 32 gives 32 x 4 x 64 x 2 = 16,384 B per all-to-all pass,
    3/4 of it off-rank with ep=4, 4 passes (dispatch and combine, forward and backward). Expert weights
    2 x 4 x (192 x 64 + 64 x 96) = 147,456 of 300,864 are split 4 ways, so DDP all-reduces
    153,408 + 147,456 / 4 = 190,272 gradients."""
    spec = spec_from_config(dict(MIXTRAL))
    msf = st.spec_flops(spec)
    assert (msf.moe_copies, msf.expert_params, spec.params) == (4, 147_456, 300_864)
    setup = TrainingSetup(micro_batch=1, seq_len=S)
    lay = st.Layout(gpus=4, ep=4, engine="ddp")
    t = st.step_time(msf, setup, SLOW, lay, trainable_params=spec.params, params=spec.params)
    assert t.ep_comm_s == pytest.approx(4 * 3 / 4 * 16_384 / 1e6)
    hidden = 2 / 3 * t.compute_s
    assert t.dp_comm_s == pytest.approx(st.all_reduce_s(190_272 * 2, 4, 0.001) - hidden)
    full = st.step_time(msf, replace(setup, checkpointing=Checkpointing.FULL), SLOW, lay,
                        trainable_params=spec.params, params=spec.params)  # fmt: skip
    assert full.ep_comm_s == pytest.approx(6 * 3 / 4 * 16_384 / 1e6)  # the recomputed forward's two


def test_rates_tables() -> None:
    h100 = st.rates_for(get_gpu("h100-80gb"))
    assert h100.mfu == 0.40 and h100.tflops == pytest.approx(989.4)
    assert h100.intra_node_gbps == 450.0 and h100.inter_node_gbps == 50.0 and h100.pcie_gbps == 63.0
    a100 = st.rates_for(get_gpu("a100-80gb"))
    assert a100.mfu == 0.50 and a100.intra_node_gbps == 300.0
    rtx = st.rates_for(get_gpu("rtx-4090"))
    assert rtx.intra_node_gbps == rtx.pcie_gbps == 31.5  # no NVLink: peer-to-peer over PCIe
    plain = st.rates_for(gpu_of_size("24GB"))
    assert plain.borrowed_from and plain.tflops == a100.tflops
    assert any("ASSUMPTION" in n for n in plain.notes())
