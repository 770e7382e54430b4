"""Framework profiles: torch.compile, Liger, unsloth - each changed term, hand-derived on a tiny Llama.

Tiny Llama (tests/tiny_models.py): h 64, 4 heads of 16, 2 kv heads, MLP 176, vocab 1000; batch 1 x seq 8
(T = 8 tokens), pure bf16 (c = r = 2 bytes). Per layer, by hand:

* eager RMSNorm (LlamaRMSNorm): fp32 x + bf16 y + fp32 rstd = 8*64*(4+2) + 8*4 = 3104; fused or compiled:
  its input + rstd = 8*64*2 + 8*4 = 1056;
* q/k/v input 8*64*2 = 1024; q, k, v (GQA kept by SDPA) 8*(64+32+32)*2 = 2048; SDPA output 1024;
  logsumexp 1*4*8*4 = 128; compiled adds o_proj's input copy 1024;
* gated MLP, n = 8*176 = 1408: eager gate, act, up, product 4*1408*2 = 11264; Liger/compiled 3*1408*2 = 8448;
  unsloth's LoRA_MLP (gate, up) 2*1408*2 = 5632.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from peakmem.breakdown import Category
from peakmem.cli import main
from peakmem.errors import InputError
from peakmem.estimate import estimate_training
from peakmem.formulas import activations as act
from peakmem.formulas.loss import head_activations, in_place_ce, liger_chunk_rows, liger_fused_linear_ce
from peakmem.formulas.model_states import buffer_bytes
from peakmem.formulas.profiles import PROFILES, profile_assumptions, profile_setup, rope_cache_bytes
from peakmem.hf import spec_from_config
from peakmem.training import Checkpointing, Framework, Method, Precision, TrainingSetup
from tiny_models import GPT2, LLAMA, LLAMA_BUFFER_BYTES

SPEC = spec_from_config(LLAMA)
T = 8


def _setup(**kw: object) -> TrainingSetup:
    options: dict[str, object] = {"precision": Precision.BF16, "micro_batch": 1, "seq_len": T, **kw}
    return TrainingSetup(**options)  # type: ignore[arg-type]


def _layer(**kw: object) -> act.LayerActivations:
    return act.layer_activations(SPEC, SPEC.groups[0].layer, act.shapes(SPEC, _setup(**kw)))


def _by_key(la: act.LayerActivations) -> dict[str, int]:
    return {i.key: i.bytes for i in la.saved}


def test_eager_layer_is_unchanged() -> None:
    la = _layer()
    assert _by_key(la) == {
        "norms": 2 * 3104, "input.attn": 1024, "input.mlp": 1024, "attn.qkv": 2048,
        "attn.sdpa_output": 1024, "attn.logsumexp": 128, "mlp.interior": 11264,
    }  # fmt: skip
    assert la.saved_bytes == 22720
    assert la.input_saved == 0  # LlamaRMSNorm saves x.float(), a copy


def test_compiled_layer_terms() -> None:
    la = _layer(compiled=True)
    assert _by_key(la) == {
        "norms": 2 * 8 * 4, "compiled.layer_input": 1024, "input.attn": 1024, "input.mlp": 1024,
        "attn.qkv": 2048, "attn.sdpa_output": 1024, "attn.output_copy": 1024, "attn.logsumexp": 128,
        "mlp.interior": 8448,
    }  # fmt: skip
    assert la.saved_bytes == 15808
    assert la.input_saved == 1024  # the compiled graph keeps the layer's input itself


def test_compiled_under_autocast_casts_each_norm_output_once() -> None:
    # amp-bf16 (fp32 weights and residual, r = 4): the layer input 8*64*4; one bf16 cast per norm output
    # (eager: one per Linear reading it, 3 for q/k/v); the bf16 weight casts as in eager
    la = _layer(compiled=True, precision=Precision.AMP_BF16)
    keys = _by_key(la)
    assert keys["compiled.layer_input"] == 8 * 64 * 4 and la.input_saved == 8 * 64 * 4
    assert keys["input.attn"] == keys["input.mlp"] == 8 * 64 * 2
    assert keys["norms"] == 2 * 8 * 4
    eager = _by_key(_layer(precision=Precision.AMP_BF16))
    assert eager["input.attn"] == 3 * 8 * 64 * 2
    assert keys["autocast.weight_casts"] == eager["autocast.weight_casts"]


def test_compiled_torchtune_expands_kv() -> None:
    la = _layer(compiled=True, framework=Framework.TORCHTUNE)
    assert _by_key(la)["attn.qkv"] == 8 * 3 * 64 * 2
    assert la.saved_bytes == 15808 + 1024


def test_torchtune_mqa_keeps_one_kv_head() -> None:
    # one kv head: torchtune's expand(...).flatten(1, 2) is a view, SDPA keeps k, v of one head
    spec = spec_from_config({**LLAMA, "num_key_value_heads": 1})
    sh = act.shapes(spec, _setup(framework=Framework.TORCHTUNE))
    la = act.layer_activations(spec, spec.groups[0].layer, sh)
    assert _by_key(la)["attn.qkv"] == 8 * (64 + 16 + 16) * 2


def test_compiled_full_checkpointing_recomputes_the_compiled_layer() -> None:
    la = act.checkpointed(_layer(compiled=True), Checkpointing.FULL)
    assert la.saved_bytes == 8 * 64 * 2  # the layer input
    assert la.recompute == 15808 - 1024  # the rest is rebuilt, the input not twice


def test_liger_layer_terms() -> None:
    la = _layer(liger=True)
    assert _by_key(la) == {
        "norms": 2 * 1056, "input.attn": 1024, "input.mlp": 1024, "attn.qkv": 2048,
        "attn.sdpa_output": 1024, "attn.logsumexp": 128, "mlp.interior": 8448,
    }  # fmt: skip
    assert la.input_saved == 1024  # LigerRMSNorm saves X itself


def test_liger_on_a_model_type_it_does_not_patch_changes_nothing_and_says_so() -> None:
    """Liger's MODEL_TYPE_TO_APPLY_LIGER_FN has no gpt2: HF Trainer's use_liger_kernel applies nothing,
    so the estimate is the plain one, with a note; on llama (patched) it changes the answer."""
    gpt2_config = {"model_type": "gpt2", "n_layer": 2, "n_embd": 64, "n_head": 4, "vocab_size": 1000}
    gpt2 = spec_from_config(gpt2_config)
    setup = TrainingSetup(micro_batch=2, seq_len=64)
    plain = estimate_training(gpt2, setup)
    liger = estimate_training(gpt2, TrainingSetup(micro_batch=2, seq_len=64, liger=True))
    assert liger.peak_allocated_bytes == plain.peak_allocated_bytes
    assert any("Liger does not patch gpt2" in a for a in liger.assumptions)
    llama = spec_from_config(dict(LLAMA))
    assert estimate_training(
        llama, TrainingSetup(micro_batch=2, seq_len=64, liger=True)
    ).peak_allocated_bytes < (estimate_training(llama, setup).peak_allocated_bytes)


def test_unsloth_layer_uses_fused_kernels() -> None:
    # unsloth: Liger's RMSNorm terms; its LoRA_MLP keeps gate and up only: 2 * 1408 * 2
    assert _by_key(_layer(framework=Framework.UNSLOTH)) == {
        **_by_key(_layer(liger=True)),
        "mlp.interior": 5632,
    }


def test_liger_chunk_rows() -> None:
    # cdiv(V, H) = 16; cdiv(8, 16) = 1 row
    assert liger_chunk_rows(8, 1000, 64) == 1
    # Llama-3 3B, batch 2 x 4096: cdiv(128256, 3072) = 42; cdiv(8192, 42) = 196 -> 256 rows
    assert liger_chunk_rows(8192, 128256, 3072) == 256
    # never more rows than tokens: V <= H gives one factor, 5 rows rounded to 8, capped at 5
    assert liger_chunk_rows(5, 64, 64) == 5


def _head(**kw: object) -> tuple[act.Shapes, object]:
    sh = act.shapes(SPEC, _setup(**kw))
    return sh, head_activations(SPEC, sh, SPEC.vocab_size * SPEC.hidden_size)


def test_liger_fused_linear_ce_head() -> None:
    sh, head = _head(liger=True)
    out = liger_fused_linear_ce(SPEC, head, sh, head_trains=True)  # type: ignore[arg-type]
    assert {i.key: i.bytes for i in out.saved} == {
        "head.final_norm": 1056, "loss.liger_grad_input": 8 * 64 * 2, "loss.liger_grad_weight": 1000 * 64 * 2,
    }  # fmt: skip
    assert out.forward_transient == 1 * 1000 * 2 + 8 * 4  # one chunk of 16-bit logits + fp32 losses
    assert out.backward_transient == 0 and out.logits_grad == 0
    lora = liger_fused_linear_ce(SPEC, head, sh, head_trains=False)  # type: ignore[arg-type]
    assert "loss.liger_grad_weight" not in {i.key for i in lora.saved}


def test_unsloth_in_place_ce_head() -> None:
    sh, head = _head(framework=Framework.UNSLOTH)
    out = in_place_ce(SPEC, head, sh)  # type: ignore[arg-type]
    keys = {i.key: i.bytes for i in out.saved}
    assert "loss.log_softmax" not in keys
    assert keys["loss.in_place_ce"] == 8 * 1000 * 2 + 8 * 4
    assert out.logits_grad == 8 * 1000 * 2  # the logits' storage, overwritten by their gradient
    assert out.backward_transient == 0 and out.forward_transient == 8 * 4


def test_estimate_uses_the_framework_loss() -> None:
    full = estimate_training(SPEC, _setup(liger=True))
    keys = {i.key for p in full.phases for i in p.items}
    assert "loss.liger_grad_weight" in keys and "loss.log_softmax" not in keys
    uns = estimate_training(SPEC, _setup(framework=Framework.UNSLOTH))
    assert "loss.in_place_ce" in {i.key for p in uns.phases for i in p.items}


def test_unsloth_checkpointing_is_offloaded() -> None:
    ck = _setup(framework=Framework.UNSLOTH, checkpointing=Checkpointing.FULL)
    assert profile_setup(ck).activation_offload
    plain = _setup(framework=Framework.UNSLOTH)
    assert profile_setup(plain) is plain  # no checkpointing: nothing to offload, no copy
    hf = _setup(checkpointing=Checkpointing.FULL)
    assert profile_setup(hf) is hf
    # the estimate equals the explicit offload: same bytes
    explicit = _setup(framework=Framework.UNSLOTH, checkpointing=Checkpointing.FULL, activation_offload=True)
    same = estimate_training(SPEC, explicit).peak_allocated_bytes
    assert estimate_training(SPEC, ck).peak_allocated_bytes == same


def test_compile_lowers_the_estimate_of_a_long_sequence() -> None:
    long = {"micro_batch": 8, "seq_len": 256, "framework": Framework.TORCHTUNE, "precision": Precision.BF16}
    eager = estimate_training(SPEC, TrainingSetup(**long))  # type: ignore[arg-type]
    comp = estimate_training(SPEC, TrainingSetup(**long, compiled=True))  # type: ignore[arg-type]
    # activations decide this peak: per layer 16832 compiled vs 25792 eager saved bytes per 8 tokens
    assert comp.peak_allocated_bytes < eager.peak_allocated_bytes


def test_assumptions_echo() -> None:
    text = " | ".join(profile_assumptions(_setup(compiled=True, liger=True)))
    assert "torch.compile" in text and "Liger" in text
    uns = profile_assumptions(_setup(framework=Framework.UNSLOTH, checkpointing=Checkpointing.FULL))
    assert any("offloaded gradient checkpointing" in a for a in uns)
    assert any("in place" in a for a in uns)
    assert profile_assumptions(_setup()) == ()
    est = estimate_training(SPEC, _setup(compiled=True))
    assert any(a.startswith("torch.compile") for a in est.assumptions)


def test_profiles_cover_every_framework() -> None:
    assert set(PROFILES) == set(Framework)
    assert PROFILES[Framework.UNSLOTH].offloaded_checkpointing


@pytest.mark.parametrize("field", ["compiled", "liger"])
def test_flags_are_validated(field: str) -> None:
    with pytest.raises(InputError, match=field):
        TrainingSetup(**{field: "yes"})  # type: ignore[arg-type]


def test_cli_flags(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(LLAMA))
    args = ["train", str(cfg), "--precision", "bf16", "--batch", "8", "--seq", "256", "--json"]
    assert main([*args, "--framework", "unsloth", "--checkpointing", "full", "--compile", "--liger"]) == 0
    out = json.loads(capsys.readouterr().out)
    text = " ".join(out["assumptions"])
    assert "torch.compile" in text and "Liger" in text and "offloaded gradient checkpointing" in text
    assert main(args) == 0
    plain = json.loads(capsys.readouterr().out)
    assert plain["peak_allocated_bytes"] > out["peak_allocated_bytes"]


def test_lora_head_does_not_train_under_liger() -> None:
    est = estimate_training(SPEC, _setup(liger=True, method=Method.LORA))
    assert "loss.liger_grad_weight" not in {i.key for p in est.phases for i in p.items}


VALIDATION = Path(__file__).resolve().parents[2] / "shared" / "validation" / "published-measurements.json"


@pytest.mark.parametrize(("pid", "loss"), [("TT-32-02", "standard"), ("TT-32-03", "chunked-compiled")])
def test_torchtune_compiled_points_within_10_percent(pid: str, loss: str) -> None:
    """torchtune README 'Optimization flags' (Llama-3.2-3B, batch 2 x packed 4096, peak active): the rows
    with torch.compile and no checkpointing, where the layers' saved tensors decide the peak."""
    if not VALIDATION.is_file():
        pytest.skip("shared/validation is not next to this checkout")
    from peakmem.catalog import get_model
    from peakmem.training import LossImpl
    from peakmem.units import GiB

    point = next(p for p in json.loads(VALIDATION.read_text()) if p["id"] == pid)
    spec = spec_from_config(get_model("llama-3.2-3b").config)
    setup = TrainingSetup(
        precision=Precision.BF16, micro_batch=2, seq_len=4096, framework=Framework.TORCHTUNE, compiled=True,
        loss=LossImpl(loss),
    )  # fmt: skip
    predicted = estimate_training(spec, setup).peak_allocated_bytes
    assert abs(predicted / (point["value"] * GiB) - 1) <= 0.10


# torchtune's RoPE cache: [max_seq_len, head_dim // 2, (cos, sin)] fp32, one module shared by the layers.
# Tiny Llama: 256 positions x 16 / 2 angles x 2 x 4 B = 16384 B, whatever the batch, sequence or layers.
TINY_ROPE_CACHE = 256 * (16 // 2) * 2 * 4


def test_torchtune_rope_cache_is_a_buffer() -> None:
    tt = _setup(framework=Framework.TORCHTUNE)
    assert rope_cache_bytes(SPEC, tt) == TINY_ROPE_CACHE
    assert buffer_bytes(SPEC, tt) == LLAMA_BUFFER_BYTES + TINY_ROPE_CACHE
    assert rope_cache_bytes(SPEC, _setup(framework=Framework.TORCHTUNE, micro_batch=4)) == TINY_ROPE_CACHE
    assert buffer_bytes(SPEC, _setup()) == LLAMA_BUFFER_BYTES  # transformers: inv_freq only
    gpt2 = spec_from_config(GPT2)  # learned positions: no RoPE cache
    assert rope_cache_bytes(gpt2, tt) == 0


def test_torchtune_rope_cache_in_the_estimate() -> None:
    hf = estimate_training(SPEC, _setup())
    tt = estimate_training(SPEC, _setup(framework=Framework.TORCHTUNE))
    assert tt.by_category()[Category.BUFFERS] - hf.by_category()[Category.BUFFERS] == TINY_ROPE_CACHE
    assert any("RoPE cache" in a for a in tt.assumptions)
