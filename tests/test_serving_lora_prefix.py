"""vLLM multi-LoRA slots and prefix sharing in the KV pool, derived by hand on tiny specs."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from _infer_specs import infer_cli_equals_api, tiny
from peakmem.cli import main
from peakmem.errors import InputError
from peakmem.formulas.serving import estimate_inference, max_concurrent
from peakmem.formulas.serving.lora_slots import lora_slot_bytes
from peakmem.formulas.serving.prefix import concurrent_with_share, shared_prefix
from peakmem.inference import InferenceSetup
from peakmem.units import GiB

# tiny(): 2 layers, hidden 64, 4 heads x 16, 2 KV heads x 16, MLP 128 (gated), bf16.
# Per layer, rank x (in + out) of each Linear vLLM wraps: q 64+64, k 64+32, v 64+32, o 64+64,
# gate 64+128, up 64+128, down 128+64 = 1024.
LINEAR_IN_PLUS_OUT = 128 + 96 + 96 + 128 + 192 + 192 + 192
# max_loras 2, rank 8, 2 layers, bf16 (2 bytes): A [2, 1, 8, in] + B [2, 1, out, 8] per Linear
SLOTS_2_RANK_8 = 2 * 8 * LINEAR_IN_PLUS_OUT * 2 * 2
KV_PER_TOKEN = 2 * 2 * 2 * 16 * 2  # layers x (K, V) x KV heads x head_dim x bf16
GPU = 1 * GiB


def _vllm(**kw: object) -> InferenceSetup:
    # eager: vLLM 0.21+'s CUDA graphs (86 x 6 MiB at its defaults) would take this 1 GiB GPU's whole KV
    # pool; they have their own tests (tests/test_cuda_graphs.py)
    return InferenceSetup(engine="vllm", gpu_bytes=GPU, enforce_eager=True, **kw)  # type: ignore[arg-type]


def test_lora_slot_bytes_by_hand() -> None:
    assert SLOTS_2_RANK_8 == 65_536
    assert lora_slot_bytes(tiny(), max_loras=2, rank=8, dtype_bytes=2) == SLOTS_2_RANK_8
    # tensor parallel 2: column-parallel outputs and row-parallel inputs halve, the rest stays
    # q 64+32, k 64+16, v 64+16, o 32+64, gate 64+64, up 64+64, down 64+64
    tp2 = 2 * 8 * (96 + 80 + 80 + 96 + 128 + 128 + 128) * 2 * 2
    assert lora_slot_bytes(tiny(), max_loras=2, rank=8, dtype_bytes=2, tp=2) == tp2


def test_lora_slots_shrink_the_vllm_pool_by_exactly_their_bytes() -> None:
    spec = tiny(max_pos=2048)
    base = estimate_inference(spec, _vllm(context=1024))
    lora = estimate_inference(spec, _vllm(context=1024, max_loras=2, max_lora_rank=8))
    assert lora.extra["lora_slot_bytes"] == SLOTS_2_RANK_8
    assert lora.extra["kv_pool_lora_shrink_bytes"] == SLOTS_2_RANK_8
    pool, pool_lora = base.extra["kv_pool_bytes"], lora.extra["kv_pool_bytes"]
    assert isinstance(pool, int) and pool_lora == pool - SLOTS_2_RANK_8
    rows = {i.path: i.bytes for i in lora.items}
    assert rows["LoRA slots (2 x rank 8)"] == SLOTS_2_RANK_8
    assert lora.peak_allocated_bytes == base.peak_allocated_bytes + SLOTS_2_RANK_8


def test_lora_slots_come_on_top_of_the_pool_before_vllm_0_8() -> None:
    """vLLM V0 before 0.8 sized the KV pool before it built the LoRA manager (vllm issue #14450): the pool
    keeps its size and the slots are allocated beyond gpu_memory_utilization."""
    spec = tiny(max_pos=2048)
    old = dict(context=1024, engine_version="0.7")
    base = estimate_inference(spec, _vllm(**old))
    lora = estimate_inference(spec, _vllm(max_loras=2, max_lora_rank=8, **old))
    assert lora.extra["kv_pool_bytes"] == base.extra["kv_pool_bytes"]
    assert "kv_pool_lora_shrink_bytes" not in lora.extra
    assert lora.peak_allocated_bytes == base.peak_allocated_bytes + SLOTS_2_RANK_8
    assert any("vllm issue #14450" in a for a in lora.assumptions)


def test_lora_defaults_follow_vllm() -> None:
    spec = tiny()
    only_rank = estimate_inference(spec, _vllm(context=512, max_lora_rank=8))
    assert only_rank.extra["lora_slot_bytes"] == SLOTS_2_RANK_8 // 2  # max_loras 1 (vLLM's default)
    only_slots = estimate_inference(spec, _vllm(context=512, max_loras=2))
    assert only_slots.extra["lora_slot_bytes"] == SLOTS_2_RANK_8 * 2  # rank 16 (vLLM's default)
    assert "lora_slot_bytes" not in estimate_inference(spec, _vllm(context=512)).extra


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        (dict(max_loras=-1), "max_loras"),
        (dict(max_loras=1, max_lora_rank=12), "max_lora_rank"),
        (dict(max_lora_rank=0), "max_lora_rank"),
        (dict(prefix_tokens=-5), "prefix_tokens"),
        (dict(prefix_tokens=512, context=512), "prefix_tokens"),
        (dict(max_loras=1, engine="sglang"), "max_loras"),
        (dict(prefix_tokens=16, engine="hf"), "prefix_tokens"),
    ],
)
def test_bad_values_name_the_field(kw: dict[str, object], field: str) -> None:
    args: dict[str, object] = {"engine": "vllm", "context": 1024, **kw}
    with pytest.raises(InputError, match=field):
        InferenceSetup(**args)  # type: ignore[arg-type]


def test_concurrency_with_a_shared_prefix_by_hand() -> None:
    block = 16
    # a pool of 1,000 blocks; prefix 4096 tokens (256 full blocks), 512 own tokens (32 blocks)
    share = shared_prefix(4096, block)
    assert share.shared_tokens == 4096
    per_seq, shared = (4096 + 512) // block, 4096 // block
    assert concurrent_with_share(1000, per_sequence=per_seq, shared_bytes=shared) == (1000 - 256) // 32 == 23
    assert 1000 // per_seq == 3  # without sharing
    # a prefix of 4100 tokens: its partial block is the request's own (4612 tokens = 289 blocks, 33 own)
    assert shared_prefix(4100, block).shared_tokens == 4096
    assert concurrent_with_share(1000, per_sequence=289, shared_bytes=256) == (1000 - 256) // 33 == 22
    assert concurrent_with_share(200, per_sequence=289, shared_bytes=256) == 0  # not one fits


def test_prefix_sharing_in_the_vllm_pool() -> None:
    spec = tiny(max_pos=8192)
    plain = estimate_inference(spec, _vllm(context=4608))
    shared = estimate_inference(spec, _vllm(context=4608, prefix_tokens=4096, batch=4))
    pool = plain.extra["kv_pool_bytes"]
    assert isinstance(pool, int) and shared.extra["kv_pool_bytes"] == pool  # the pool is the same
    per_seq, prefix = 4608 * KV_PER_TOKEN, 4096 * KV_PER_TOKEN
    assert shared.extra["prefix_shared_kv_bytes"] == prefix
    assert shared.extra["max_concurrent_without_prefix_sharing"] == pool // per_seq
    assert plain.extra["max_concurrent_sequences"] == pool // per_seq
    assert shared.extra["max_concurrent_sequences"] == (pool - prefix) // (512 * KV_PER_TOKEN)
    assert shared.extra["kv_needed_bytes"] == prefix + 4 * 512 * KV_PER_TOKEN


def test_fit_infer_counts_users_with_the_shared_prefix() -> None:
    spec = tiny(max_pos=8192)
    setup = _vllm(context=4608, prefix_tokens=4096)
    conc = max_concurrent(spec, setup, GPU)
    assert conc == estimate_inference(spec, replace(setup, batch=1)).extra["max_concurrent_sequences"]
    assert conc > max_concurrent(spec, replace(setup, prefix_tokens=0), GPU)


def test_cli_equals_api(capsys: pytest.CaptureFixture[str]) -> None:
    cli = infer_cli_equals_api(capsys, "llama-3.1-8b", engine="vllm", context=8192, batch=8, gpu="a100-80gb",
                               max_loras=4, max_lora_rank=32, prefix_tokens=6000)  # fmt: skip
    # 6000 tokens: 375 full 16-token blocks, all shared; the LoRA row is in the items
    assert cli["prefix_shared_tokens"] == 6000 and cli["lora_slot_bytes"] > 0
    assert any(i["path"] == "LoRA slots (4 x rank 32)" for i in cli["items"])


def test_the_headline_names_the_slots_and_both_counts(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["infer", "llama-3.1-8b", "--engine", "vllm", "--context", "8192", "--gpu", "a100-80gb"]
    lora = ["--max-loras", "4", "--max-lora-rank", "32", "--prefix-tokens", "6000"]
    main([*argv, *lora, "--json"])
    row = json.loads(capsys.readouterr().out)["verdicts"][0]
    alone = row["max_concurrent_without_prefix_sharing"]
    assert alone < row["max_concurrent"]  # sharing the prefix holds more requests
    main([*argv, *lora])
    text = " ".join(capsys.readouterr().out.split())  # rich wraps the line
    assert (f"holds {row['max_concurrent']} sequences of 8192 tokens sharing a 6000-token prefix "
            f"({alone} without sharing)") in text  # fmt: skip
    assert "and 4 LoRA slots of rank 32" in text
    main(argv)
    plain = capsys.readouterr().out.split("\n")[0]
    assert "sharing" not in plain and "LoRA" not in plain
