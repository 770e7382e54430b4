"""The recurrent state of hybrid models as vLLM and SGLang allocate it (formulas/recurrent_state.py
``engine_state`` / ``vllm_hybrid_block``, formulas/serving/paged.py ``sglang_mamba_slots``).

Every number is derived by hand from the model's config.json (the shipped derived specs' ``config``):
conv channels x window x dtype bytes + scan elements x dtype bytes per stateful layer.
"""

from __future__ import annotations

import dataclasses

import pytest

from peakmem.errors import InputError
from peakmem.formulas.recurrent_state import StateBytes, engine_state, vllm_hybrid_block
from peakmem.formulas.serving import estimate_inference
from peakmem.formulas.serving.paged import sglang_mamba_slots
from peakmem.inference import Engine, InferenceSetup
from peakmem.resolve import resolve_model

# Qwen3.5-27B: 64 layers, full attention every 4th -> 48 gated delta-nets; conv over q, k, v =
# 16 key heads x 128 x 2 + 48 value heads x 128 = 10240 channels; delta-rule state 48 x 128 x 128;
# the config asks "mamba_ssm_dtype": "float32". Attention: 4 KV heads x 256 x (K, V) x 2 B = 4096 B/token.
Q35_CONV = 10240
Q35_SCAN = 48 * 128 * 128
Q35_ATTN_TOKEN = 4 * 256 * 2 * 2


def test_qwen3_5_vllm_keeps_the_config_fp32_and_pads_to_784_token_pages() -> None:
    spec = resolve_model("qwen3.5-27b")
    assert spec.mamba_ssm_dtype == "float32"
    state = engine_state(spec, Engine.VLLM, act_bytes=2)
    layer = Q35_CONV * 3 * 2 + Q35_SCAN * 4  # 3,207,168 B: Qwen3_5ForConditionalGenerationConfig's fp32
    assert (state.layers, state.largest_layer) == (48, layer)
    block = vllm_hybrid_block(state, attention_token_bytes=Q35_ATTN_TOKEN, block_size=16)
    # 16 * ceil(3,207,168 / (16 * 4096)) = 16 * 49 = 784 tokens (vLLM logs "Setting attention block
    # size to 784 tokens" for the same architecture at 27B)
    assert block.block == 784 and block.page == 784 * Q35_ATTN_TOKEN
    assert block.state_per_sequence == 48 * 784 * Q35_ATTN_TOKEN
    # --mamba-ssm-cache-dtype bfloat16: 61,440 + 1,572,864 B -> 16 * ceil(24.94) = 400 tokens
    bf16 = engine_state(spec, Engine.VLLM, act_bytes=2, ssm_dtype="bfloat16")
    assert bf16.largest_layer == Q35_CONV * 3 * 2 + Q35_SCAN * 2
    assert vllm_hybrid_block(bf16, attention_token_bytes=Q35_ATTN_TOKEN, block_size=16).block == 400


def test_qwen3_5_sglang_and_transformers() -> None:
    spec = resolve_model("qwen3.5-27b")
    sglang = engine_state(spec, Engine.SGLANG, act_bytes=2)
    assert sglang.conv == 48 * Q35_CONV * 3 * 2 and sglang.temporal == 48 * Q35_SCAN * 4
    hf = engine_state(spec, Engine.HF, act_bytes=2)  # transformers: conv_kernel = 4 inputs
    assert hf.conv == 48 * Q35_CONV * 4 * 2 and hf.temporal == 48 * Q35_SCAN * 4
    # tensor parallel 4: heads split, ceiling per rank
    assert engine_state(spec, Engine.SGLANG, act_bytes=2, tp=4).total == sglang.total // 4


def test_falcon_h1_vllm_keeps_the_ssm_state_in_the_model_dtype() -> None:
    # Falcon-H1-7B: 44 layers, each with Mamba-2 beside attention; conv over x, B, C = d_ssm 3072 +
    # 2 * 1 group * d_state 256 = 3584 channels, kernel 4; SSM state 24 heads x 128 x 256; no config
    # dtype and no vLLM hook: the scan state in bf16 ("auto" = the conv dtype)
    spec = resolve_model("falcon-h1-7b")
    state = engine_state(spec, Engine.VLLM, act_bytes=2)
    layer = 3584 * 3 * 2 + 24 * 128 * 256 * 2
    assert (state.layers, state.largest_layer) == (44, layer)
    # attention: 2 KV heads x 128 x (K, V) x 2 B = 1024 B/token -> 16 * ceil(1,594,368 / 16,384) = 1568
    block = vllm_hybrid_block(state, attention_token_bytes=2 * 128 * 2 * 2, block_size=16)
    assert block.block == 1568
    assert round(block.padding_pct, 2) == round(100 * (1568 * 1024 - layer) / layer, 2)
    # SGLang: fp32 scan state
    assert engine_state(spec, Engine.SGLANG, act_bytes=2).largest_layer == 3584 * 3 * 2 + 24 * 128 * 256 * 4


def test_vllm_speculative_tokens_widen_the_conv_window() -> None:
    spec = resolve_model("qwen3-next-80b-a3b")
    # 8192 conv channels: conv_kernel - 1 + num_spec = 3 + 2 inputs (mamba_utils.py
    # gated_delta_net_state_shape)
    plain = engine_state(spec, Engine.VLLM, act_bytes=2)
    spec2 = engine_state(spec, Engine.VLLM, act_bytes=2, spec_tokens=2)
    assert spec2.conv - plain.conv == 36 * 8192 * 2 * 2
    # SGLang keeps its draft states apart: the slot is unchanged
    assert engine_state(spec, Engine.SGLANG, act_bytes=2, spec_tokens=2).conv == 36 * 8192 * 3 * 2


def test_hybrid_block_rules() -> None:
    state = StateBytes(conv=0, temporal=0, layers=2, largest_layer=548_864)
    # Qwen3-Next at tp 2 (1 KV head per rank: 1024 B/token): vLLM 0.10.2 logs 544 tokens and 1.49 %
    block = vllm_hybrid_block(state, attention_token_bytes=1024, block_size=16)
    assert block.block == 544 and f"{block.padding_pct:.2f}" == "1.49"
    assert block.state_per_sequence == 2 * 544 * 1024
    # speculative decoding: 1 + num_speculative_tokens pages per stateful layer (MambaSpec
    # num_speculative_blocks, mamba_cache_mode "none")
    spec2 = vllm_hybrid_block(state, attention_token_bytes=1024, block_size=16, spec_blocks=2)
    assert spec2.state_per_sequence == 3 * 2 * 544 * 1024
    # a larger block asked for stays (vLLM overrides only a smaller one)
    assert vllm_hybrid_block(state, attention_token_bytes=1024, block_size=1024).block == 1024
    # no attention layer: the state unpadded
    alone = vllm_hybrid_block(StateBytes(conv=10, temporal=20, layers=1, largest_layer=30),
                              attention_token_bytes=0, block_size=16)  # fmt: skip
    assert (alone.page, alone.state_per_sequence) == (30, 30)


def test_sglang_mamba_pool_split() -> None:
    # mamba_full_memory_ratio 0.9: 0.9 / 1.9 of 19 GB = 9 GB of 1 MB states
    assert sglang_mamba_slots(19_000_000_000, 1_000_000) == (9000, 9_000_000_000)


def test_sglang_concurrency_is_capped_by_the_mamba_pool() -> None:
    spec = resolve_model("qwen3-next-80b-a3b")
    setup = InferenceSetup(engine="sglang", batch=1, context=1024, gpu_bytes=200 * 2**30)
    est = estimate_inference(spec, setup)
    state = 36 * (8192 * 3 * 2 + 524288 * 4)
    slots = est.extra["mamba_cache_slots"]
    assert isinstance(slots, int) and est.extra["mamba_pool_bytes"] == slots * state
    rest = est.extra["kv_pool_bytes"]  # the token pool and the MambaPool together
    assert isinstance(rest, int) and slots == int(rest * 0.9 / 1.9) // state
    # 1024-token requests: 12 layers x 2048 B x 1024 tokens = 25 MB of KV each, far below the KV pool's
    # share, so the MambaPool's slots bound the running requests
    assert est.extra["max_concurrent_sequences"] == slots


def test_a_state_without_a_conv_window_is_kept_whole() -> None:
    # conv_kernel 0: the model-dtype state is no convolution (MiniMax's lightning-attention state,
    # heads x head_dim x head_dim in the model dtype in vLLM too): the engines keep all of it
    spec = resolve_model("qwen3-next-80b-a3b")
    no_conv = dataclasses.replace(spec, groups=tuple(
        dataclasses.replace(g, layer=dataclasses.replace(
            g.layer, derived=dataclasses.replace(g.layer.derived, conv_kernel=0)))
        if g.layer.derived is not None else g
        for g in spec.groups
    ))  # fmt: skip
    assert engine_state(no_conv, Engine.VLLM, act_bytes=2).conv == 36 * 32768 * 2


def test_bad_state_dtype_names_the_field() -> None:
    spec = resolve_model("qwen3-next-80b-a3b")
    with pytest.raises(InputError, match="mamba_ssm_cache_dtype"):
        engine_state(spec, Engine.VLLM, act_bytes=2, ssm_dtype="fp8")
