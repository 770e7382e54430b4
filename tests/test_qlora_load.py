"""A bitsandbytes QLoRA base loaded by from_pretrained and prepared by peft (formulas/qlora_load.py,
peakmem.step_load): the caching-allocator model under a capacity, the load's replay by hand, peft's fp32
upcast measured on the CPU, and the load phase of a training estimate (warm-up block where a GPU is named)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from peakmem.adapters import QuantConfig
from peakmem.formulas import qlora, qlora_load
from peakmem.formulas.caching_allocator import CachingAllocatorModel
from peakmem.hf import spec_from_config
from peakmem.step_load import bnb_base_tensors
from peakmem.units import MiB
from tiny_models import LLAMA

BASE = qlora_load.BaseTensor


def test_a_new_segment_over_capacity_frees_the_cached_whole_segments() -> None:
    """CUDACachingAllocator malloc: alloc_block fails, release_cached_blocks frees every segment no block
    of is allocated, alloc_block again; without a capacity the cached 60 MiB stays."""
    for capacity, reserved, releases in ((None, 130 * MiB, 0), (100 * MiB, 70 * MiB, 1)):
        m = CachingAllocatorModel(capacity=capacity)
        m.malloc(1, 60 * MiB)
        m.free(1)
        m.malloc(2, 70 * MiB)  # larger than the cached block: a new segment
        assert (m.reserved, m.releases, m.ooms) == (reserved, releases, 0)


def test_a_segment_with_a_live_block_is_not_released() -> None:
    m = CachingAllocatorModel(capacity=100 * MiB)
    m.malloc(1, 60 * MiB)
    m.free(1)
    m.malloc(2, 20 * MiB)  # a slice of the cached 60 MiB segment
    m.malloc(3, 70 * MiB)
    assert (m.reserved, m.releases, m.ooms) == (130 * MiB, 1, 1)


def test_load_replay_by_hand() -> None:
    """Embedding 20 MiB (bf16) upcast to 40 and back, a quantized weight (5 MiB, its 20 MiB staging copy),
    a head like the embedding, 1 MiB of adapters. Live: load 20, 45, 25, 45; upcasts 85, 65, 105, 85;
    adapters 86; casts back 106, 66, 86, 46."""
    embed = BASE(loaded=20 * MiB, upcast=40 * MiB, back=20 * MiB)
    got = qlora_load.replay_load((embed, BASE(loaded=5 * MiB, staging=20 * MiB), embed), (MiB,), 0)
    assert (got.peak_live, got.end_live) == (106 * MiB, 46 * MiB)
    # each 40 MiB fp32 copy cuts its own segment beside the loads' (20 + 20 + 5 -> 20 MiB segments: 45 + 40 +
    # 40; the adapters' 2 MiB; the 16-bit copies back in the freed 20 MiB blocks)
    assert got.peak_reserved == 20 * MiB + 20 * MiB + 20 * MiB + 40 * MiB + 40 * MiB + 2 * MiB
    # a 200 MiB warm-up block is allocated first (the load's allocated peak), then takes every large request
    warmed = qlora_load.replay_load((embed, BASE(loaded=5 * MiB, staging=20 * MiB), embed), (MiB,), 200 * MiB)
    assert (warmed.peak_live, warmed.peak_reserved) == (200 * MiB, 200 * MiB + 2 * MiB)


@pytest.mark.parametrize("prep", ["none", "peft", "trl", "axolotl"])
@pytest.mark.parametrize("tied", [False, True])
def test_base_tensors_end_as_the_weight_rows_store_them(prep: str, tied: bool) -> None:
    """What the load leaves (each tensor's last step) is qlora.base_bytes's storage for the same preparation;
    what it loads first is the unprepared storage."""
    spec = spec_from_config({**LLAMA, "tie_word_embeddings": tied}, name="tiny-llama")
    quant = QuantConfig(quant="nf4", double_quant=True, kbit_prep=prep)
    tensors = bnb_base_tensors(spec, quant)
    assert sum(t.back or t.upcast or t.loaded for t in tensors) == qlora.base_bytes(spec, quant)
    assert sum(t.loaded for t in tensors) == qlora.base_bytes(spec, replace(quant, kbit_prep="none"))
    assert sum(t.staging for t in tensors) == 2 * qlora.quantized_params(spec, quant)


@pytest.mark.parametrize("name", ["mixtral-8x7b", "qwen3-30b-a3b", "gemma-2-2b"])
def test_base_tensors_of_catalog_models(name: str) -> None:
    """The same sums on MoE bases whose experts are one bitsandbytes Linear each (transformers 4.x) and a
    tied one."""
    from peakmem.resolve import resolve_model

    spec = resolve_model(name)
    quant = QuantConfig(quant="nf4", double_quant=True, kbit_prep="trl", expert_linears=True)
    tensors = bnb_base_tensors(spec, quant)
    assert sum(t.back or t.upcast or t.loaded for t in tensors) == qlora.base_bytes(spec, quant)
    assert sum(t.staging for t in tensors) == 2 * qlora.quantized_params(spec, quant)


@pytest.mark.torch
def test_peft_upcast_peak_measured_on_the_cpu(tmp_path: Path) -> None:
    """peft's prepare_model_for_kbit_training over a real bitsandbytes nf4 base on the CPU: the most alive
    beyond the loaded base, under peakmem's storage tracker, equals the replay's (staging copies left out:
    they belong to the load before it) within bitsandbytes' quant-state bookkeeping."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    peft = pytest.importorskip("peft")
    pytest.importorskip("bitsandbytes")
    from peakmem.measure.tracker import LiveStorageTracker

    # bitsandbytes 0.50.2's CPU 4-bit packing wants output widths in multiples of 32
    shape = {**LLAMA, "hidden_size": 256, "intermediate_size": 704, "tie_word_embeddings": False}
    config = transformers.AutoConfig.for_model(**{k: v for k, v in shape.items() if k != "architectures"})
    transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).save_pretrained(tmp_path)
    bnb = transformers.BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                          bnb_4bit_compute_dtype=torch.bfloat16)  # fmt: skip
    model = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path, quantization_config=bnb, dtype=torch.bfloat16, device_map="cpu"
    )
    tracker = LiveStorageTracker()
    with tracker:
        for p in model.parameters():  # the loaded base, as allocated before: its frees are then seen
            tracker.sid_of(p.data)
        start = tracker.ledger.live_snapshot().bytes
        peft.prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    measured = max(s.bytes for s in tracker.ledger.peaks()) - start

    spec = spec_from_config(shape, name="tiny-llama")
    tensors = tuple(replace(t, staging=0) for t in bnb_base_tensors(spec, QuantConfig(kbit_prep="peft")))
    got = qlora_load.replay_load(tensors, (), 0)
    formula = got.peak_live - sum(t.loaded for t in tensors)
    # each upcast nets +2 B an element (fp32 in, bf16 out); the head (1000 x 256), last, peaks with its fp32
    # copy (4 B) beside its bf16 one: the embedding 1000 x 256 and five norms of 256 before it
    assert formula == 2 * 1000 * 256 + 2 * 5 * 256 + 4 * 1000 * 256
    assert abs(measured - formula) <= 4096


def test_training_estimate_has_the_load_phase() -> None:
    """A QLoRA Qwen3-8B (vocabulary 151,936 x 4,096, untied) on TRL, one 16-token row: the load is the peak
    (the fp32 embedding and head of prepare_model_for_kbit_training beside the 4-bit layers). At transformers
    5.x no warm-up block; at 4.57 with a 40 GB GPU named, the block (the 16-bit meta model less the head,
    over the factor 4, as fp16 elements) stays reserved beside the fp32 embedding's and head's own segments;
    with no GPU named it is not modelled (its size needs the free memory)."""
    import peakmem

    def train(**kw: object) -> dict[str, object]:
        return peakmem.train("qwen3-8b", method="qlora", seq=16, batch=1, kbit_prep="trl", **kw).data

    d5, d457, dgpu = (
        train(transformers="5.2.0"),
        train(transformers="4.57.1"),
        train(transformers="4.57.1", gpu="a100-40gb"),
    )
    assert d5["peak_phase"] == "load" and d5["phases"] == d457["phases"] == dgpu["phases"]
    head = 151_936 * 4_096
    block = (8_190_735_360 - head) * 2 // 4 * 2
    paths = [i["path"] for i in dgpu["items"]]
    assert any(p.startswith(f"caching_allocator_warmup block: {block:,} B") for p in paths)
    assert not any(p.startswith("caching_allocator_warmup") for p in (i["path"] for i in d457["items"]))
    assert d5["peak_reserved_bytes"] == d457["peak_reserved_bytes"] < block + 2 * 4 * head
    assert dgpu["peak_reserved_bytes"] >= block + 2 * 4 * head


def test_the_loads_reserve_is_capped_at_the_gpus_free_memory() -> None:
    """Where the load's replay outgrows the GPU named (its total less the CUDA context), the CUDA allocator
    frees its cached segments and retries: the load's reserve is capped there while its allocated peak fits
    (on 10 and 11 GiB; not on 12 GiB, where the replay's 11.03 GiB fits)."""
    import peakmem
    from peakmem.units import GiB

    def train(gpu: str) -> dict[str, object]:
        return peakmem.train(
            "qwen3-8b", method="qlora", seq=16, batch=1, kbit_prep="trl", transformers="4.57.1", gpu=gpu
        ).data

    for size in (10, 11):
        d = train(f"{size}GiB")
        assert d["peak_allocated_bytes"] <= size * GiB - d["context_bytes"] == d["peak_reserved_bytes"]
    roomy = train("12GiB")
    assert roomy["peak_reserved_bytes"] < 12 * GiB - roomy["context_bytes"]
