"""transformers' per-layer RoPE cos/sin buffers (formulas/rope_buffers.py), by hand on tiny specs."""

from __future__ import annotations

from dataclasses import replace

from _infer_specs import tiny
from peakmem.breakdown import Category, Phase
from peakmem.formulas.rope_buffers import rope_buffer_bytes
from peakmem.formulas.serving import estimate_inference
from peakmem.inference import InferenceSetup

# tiny(): 2 layers, head_dim 16, max_position_embeddings 1024; cos and sin per layer, 2-byte model dtype
TINY_ROPE_16BIT = 2 * 2 * 1024 * 16 * 2


def test_buffer_bytes_by_release_and_model_type() -> None:
    llama, mistral = replace(tiny(), model_type="llama"), replace(tiny(), model_type="mistral")
    assert rope_buffer_bytes(llama, (4, 35), 100, 2) == TINY_ROPE_16BIT
    assert rope_buffer_bytes(llama, (4, 31), 100, 2) == TINY_ROPE_16BIT
    assert rope_buffer_bytes(llama, (4, 37), 100, 4) == 2 * TINY_ROPE_16BIT  # an fp32 model: fp32 buffers
    assert rope_buffer_bytes(llama, (4, 30), 100, 2) == 2 * TINY_ROPE_16BIT  # 4.30: no cast, fp32
    assert rope_buffer_bytes(llama, (4, 38), 100, 2) == 0  # 4.38: cos/sin computed per forward
    assert rope_buffer_bytes(llama, (4, 29), 100, 2) == 0  # not read
    assert rope_buffer_bytes(mistral, (4, 41), 100, 2) == TINY_ROPE_16BIT
    assert rope_buffer_bytes(mistral, (4, 42), 100, 2) == 0
    qwen2, mixtral = replace(tiny(), model_type="qwen2"), replace(tiny(), model_type="mixtral")
    assert rope_buffer_bytes(qwen2, (4, 44), 100, 2) == TINY_ROPE_16BIT
    assert rope_buffer_bytes(qwen2, (4, 45), 100, 2) == 0
    assert rope_buffer_bytes(mixtral, (4, 47), 100, 2) == TINY_ROPE_16BIT
    assert rope_buffer_bytes(mixtral, (4, 48), 100, 2) == 0
    assert rope_buffer_bytes(tiny(), (4, 35), 100, 2) == 0  # a model type not in the table
    # a sequence past max_position_embeddings: forward rebuilds the cache at its length
    assert rope_buffer_bytes(llama, (4, 35), 2000, 2) == 2 * 2 * 2000 * 16 * 2


def test_hf_estimate_carries_them_in_both_phases() -> None:
    llama = replace(tiny(), model_type="llama")
    setup = InferenceSetup(context=100, prompt=60, batch=2, engine_version="4.35")
    old = estimate_inference(llama, setup)
    bare = estimate_inference(tiny(), setup)  # the same shapes, no buffers
    for phase in (Phase.PREFILL, Phase.DECODE):
        with_buffers = {p.phase: p.bytes for p in old.phases}[phase]
        assert with_buffers == {p.phase: p.bytes for p in bare.phases}[phase] + TINY_ROPE_16BIT
    items = [i for p in old.phases for i in p.items if i.category is Category.BUFFERS]
    assert {i.bytes for i in items} == {TINY_ROPE_16BIT}
    new = estimate_inference(llama, InferenceSetup(context=100, prompt=60, batch=2))
    assert new.phases == estimate_inference(tiny(), InferenceSetup(context=100, prompt=60, batch=2)).phases


def test_training_under_hf_code_at_an_old_release_holds_them_too() -> None:
    """The same buffers live on the device through training: ``--transformers 4.35`` adds them (bf16
    weights: 2 B; fp32 weights under AMP: 4 B) to the buffers, 4.38 and other frameworks do not."""
    from peakmem.estimate import estimate_training
    from peakmem.training import Framework, Precision, TrainingSetup

    llama = replace(tiny(), model_type="llama")

    def buffers(**kw: object) -> int:
        setup = TrainingSetup(seq_len=64, **kw)  # type: ignore[arg-type]
        return sum(i.bytes for i in estimate_training(llama, setup).items if i.path == "buffers")

    base = buffers(precision=Precision.BF16, transformers="4.38.0")
    assert buffers(precision=Precision.BF16, transformers="4.35.0") - base == TINY_ROPE_16BIT
    assert buffers(precision=Precision.AMP_BF16, transformers="4.35.0") - base == 2 * TINY_ROPE_16BIT
    torchtune = {"precision": Precision.BF16, "framework": Framework.TORCHTUNE}  # its own one rope cache
    assert buffers(**torchtune, transformers="4.35.0") == buffers(**torchtune, transformers="4.38.0")
