"""The derived path agrees with the formulas on every family the formulas know (issue 14, item 3).

For every model type :mod:`peakmem.hf` builds a spec for (its builders' keys, so a new family is
covered at once), the same tiny config (``tiny_models.FAMILY_CONFIGS``) goes through both paths
(:func:`peakmem.resolve.spec_for_config` with ``path="formulas"`` and ``path="derived"``, what the CLI
resolves to): exactly equal parameter counts, and peak allocated bytes within 2% (the issue's
tolerance) in three setups. Where they differ by more, ``peakmem simulate`` (an exact fake-tensor
step) said which side is wrong: those cases are strict xfails naming the side and the numbers
(``benchmarks/derive_agreement.md``, written by ``benchmarks/derive_agreement.py``, has the table).
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest

from peakmem import derived
from peakmem.hf import SUPPORTED_MODEL_TYPES
from tiny_models import FAMILY_CONFIGS

pytestmark = [pytest.mark.torch, pytest.mark.slow]

TOLERANCE = 0.02  # issue 14: "agrees with the formulas within 2% on every catalog family"
SEQ, BATCH = 128, 2
SETUPS: dict[str, dict[str, Any]] = {  # mixed-bf16 AdamW (peakmem's defaults) at batch 2 x seq 128
    "full": {"method": "full"},
    "full+ckpt": {"method": "full", "checkpointing": "full"},
    "lora": {"method": "lora"},
}

# Families the derived path cannot answer like the formulas do, and why.
EXCLUDED = {
    # hf.py reads Kimi-K2's remote-code config with DeepSeek-V3's builder; transformers 5.23 has no
    # "kimi_k2" model type, so there is no transformers model to derive from. deepseek_v3 covers the
    # modules (the same DeepseekV3ForCausalLM).
    "kimi_k2": "no transformers model type (remote code); its builder is deepseek_v3's, tested there",
    # The formulas count the text-only Gemma3ForCausalLM of a multimodal config (hf.py's note); the
    # derived path builds what from_pretrained loads, Gemma3ForConditionalGeneration with its vision
    # tower (issue 14 item 1). Different models by design; gemma3_text covers the text model.
    "gemma3": "formulas count the text model only, derived the whole vision-language model (by design)",
}

# (family, setup) -> which side ``peakmem simulate`` showed wrong (the one farther from its peak; "both"
# when both are more than 2% off), the derived-vs-formulas difference and each peak's ratio to
# simulate's (benchmarks/derive_agreement.md). Strict: when a fix lands, its xfail fails: remove it.
# Most are the formulas' (attention-heavy tiny shapes: bloom/falcon/olmo*/deepseek's attention
# temporaries, LoRA on gemma*/qwen3/gpt_neox, full checkpointing's recomputation peak); the derived
# side's are full checkpointing of gemma/phi3/qwen3 (its recompute peak, low) and mixtral (high).
# Falcon (found): its multi-query attention calls SDPA with 1 k/v head against 4 q heads and no
# enable_gqa, plus an explicit mask, so CUDA runs SDPA's math kernel (scores and softmax saved:
# simulate/kernels.py cuda_sdpa_backend); the formulas assume the flash kernel (formulas/activations.py
# kernel_choice), hence their -19% at seq 128.
# GPT-NeoX LoRA (traced): its parallel block's two LayerNorms read the same block input, one storage,
# which the formulas count twice (norms x2: T x h per layer; ~100 kB of the tiny case's 161 kB over);
# under full fine-tuning that double count hides the missing o_proj input copy of its torch.cat rotary
# (the Phi-3 note), so fixing one without the other moves full fine-tuning to 0.964.
DISAGREE: dict[tuple[str, str], str] = {
    ("gpt_neox", "lora"): "formulas high (-4.72%; vs simulate: formulas 1.061, derived 1.011)",
    ("bloom", "full"): "formulas low (+5.13%; vs simulate: formulas 0.952, derived 1.001)",
    ("bloom", "full+ckpt"): "formulas low (+10.25%; vs simulate: formulas 0.907, derived 1.000)",
    ("falcon", "full"): "formulas low (+23.72%; vs simulate: formulas 0.806, derived 0.997)",
    ("falcon", "full+ckpt"): "both, formulas more low (+4.46%; vs simulate: formulas 0.930, derived 0.971)",
    ("falcon", "lora"): "formulas low (+13.93%; vs simulate: formulas 0.883, derived 1.007)",
    ("mixtral", "full"): "derived high (+2.87%; vs simulate: formulas 0.991, derived 1.019)",
    ("mixtral", "lora"): "both, formulas more low (+11.76%; vs simulate: formulas 0.924, derived 1.032)",
    ("qwen2_moe", "full+ckpt"): "formulas low (+8.97%; vs simulate: formulas 0.927, derived 1.010)",
    ("qwen3_moe", "full+ckpt"): "formulas low (+6.11%; vs simulate: formulas 0.948, derived 1.006)",
    ("phi3", "full"): "formulas low (+2.52%; vs simulate: formulas 0.972, derived 0.997)",
    # Phi-3, full and full+ckpt (traced): its apply_rotary_pos_emb cats the rotated and pass-through
    # halves, so q is a contiguous [B, H, S, D] tensor, flash's output is one too, and o_proj reads a
    # transpose(1, 2).contiguous() copy of it (simulate: "self_attn: clone", T x heads x head_dim per
    # layer, 98,304 B over the 3 tiny layers = the whole full-setup gap) that the formulas do not count.
    # The fix needs a spec field (a rotary written with torch.cat: GPT-NeoX, Phi-3; not Llama's or
    # Falcon's, which keep q's strided layout). The derived recompute peak is fixed (0.955 -> 1.001).
    ("phi3", "full+ckpt"): "formulas low (+2.01%; vs simulate: formulas 0.981, derived 1.001)",
    ("olmo", "full"): "formulas low (+5.52%; vs simulate: formulas 0.936, derived 0.988)",
    ("olmo", "lora"): "formulas low (+6.37%; vs simulate: formulas 0.945, derived 1.006)",
    ("olmo2", "full"): "formulas low (+8.27%; vs simulate: formulas 0.911, derived 0.986)",
    ("olmo2", "full+ckpt"): "formulas low (+2.84%; vs simulate: formulas 0.971, derived 0.999)",
    ("deepseek_v2", "full"): "formulas low (+3.45%; vs simulate: formulas 0.963, derived 0.996)",
    (
        "deepseek_v2",
        "full+ckpt",
    ): "both, formulas more low (+12.43%; vs simulate: formulas 0.910, derived 1.023)",
    # BERT full: the formulas' attention backward now holds flash's scratch (0.978 -> 1.010; simulate's
    # peak is inside layer 2's flash backward, whose temporaries the formulas now match byte for byte,
    # 299,008 B); the derived side (0.971 -> 0.982) frees 84 kB more of the layer's saved tensors by then.
    ("bert", "full"): "derived low (-2.79%; vs simulate: formulas 1.010, derived 0.982)",
    ("deepseek_v3", "full"): "formulas low (+3.72%; vs simulate: formulas 0.959, derived 0.994)",
    (
        "deepseek_v3",
        "full+ckpt",
    ): "both, formulas more low (+15.62%; vs simulate: formulas 0.883, derived 1.021)",
}


def test_every_formula_family_is_covered() -> None:
    from peakmem.hf import _FAMILIES, MULTIMODAL

    assert set(SUPPORTED_MODEL_TYPES) == set(_FAMILIES) | set(MULTIMODAL)
    assert set(FAMILY_CONFIGS) | set(EXCLUDED) == set(SUPPORTED_MODEL_TYPES)
    assert not set(FAMILY_CONFIGS) & set(EXCLUDED)


@pytest.fixture(scope="module")
def specs(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    mp = pytest.MonkeyPatch()
    mp.setenv(derived.CACHE_ENV, str(tmp_path_factory.mktemp("derived-cache")))
    from peakmem.resolve import spec_for_config

    cache: dict[str, tuple[Any, Any]] = {}

    def get(family: str) -> tuple[Any, Any]:
        if family not in cache:
            config = FAMILY_CONFIGS[family]
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                cache[family] = (
                    spec_for_config(dict(config), path="formulas"),
                    spec_for_config(dict(config), path="derived"),
                )
        return cache[family]

    yield get
    mp.undo()


def _cases() -> list[Any]:
    out = []
    for family in SUPPORTED_MODEL_TYPES:
        if family in EXCLUDED:
            continue
        for setup in SETUPS:
            why = DISAGREE.get((family, setup))
            marks = [pytest.mark.xfail(reason=why, strict=True)] if why else []
            out.append(pytest.param(family, setup, id=f"{family}-{setup}", marks=marks))
    return out


@pytest.mark.parametrize("family", [f for f in SUPPORTED_MODEL_TYPES if f not in EXCLUDED])
def test_same_parameter_count(specs, family: str) -> None:  # type: ignore[no-untyped-def]
    formulas, derived_spec = specs(family)
    assert not formulas.derived_from and derived_spec.derived_from
    assert derived_spec.params == formulas.params
    # a classifier (BERT: BertForSequenceClassification) stays one: its loss reads a pooled token, not
    # vocab-wide logits (the derived spec said causal-lm: +12% on the tiny BERT, fixed in derive.py)
    assert (derived_spec.task, derived_spec.num_labels) == (formulas.task, formulas.num_labels)


@pytest.mark.parametrize(("family", "setup"), _cases())
def test_peak_agrees_within_two_percent(specs, family: str, setup: str) -> None:  # type: ignore[no-untyped-def]
    from peakmem.estimate import estimate_training
    from peakmem.training import TrainingSetup

    formulas, derived_spec = specs(family)
    run = TrainingSetup(seq_len=SEQ, micro_batch=BATCH, **SETUPS[setup])
    f = estimate_training(formulas, run).peak_allocated_bytes
    d = estimate_training(derived_spec, run).peak_allocated_bytes
    assert abs(d - f) <= TOLERANCE * f, f"derived {d:,} vs formulas {f:,}: {(d - f) / f:+.2%}"


# Families whose per-component split differs (same total): the derived path files attention-internal
# norms (q_norm/k_norm, MLA's q_a/kv_a layernorms) under "attention" where the formulas say "norms",
# an attention output projection named "dense" (gpt_neox, bloom, falcon, bert) under "mlp", OPT's
# fc1/fc2 (no mlp submodule) and BERT's pooler/classifier under "other" (simulate/derive.py
# _block_component). A fix changes the shipped derived specs too (benchmarks/derive_catalog.py).
COMPONENTS_DIFFER = {"bert", "bloom", "deepseek_v2", "deepseek_v3", "falcon", "gemma3_text", "gpt_neox",
                     "olmo2", "opt", "qwen3", "qwen3_moe"}  # fmt: skip


@pytest.mark.parametrize(
    "family",
    [
        pytest.param(f, marks=[pytest.mark.xfail(reason="component labels differ", strict=True)])
        if f in COMPONENTS_DIFFER
        else f
        for f in SUPPORTED_MODEL_TYPES
        if f not in EXCLUDED
    ],
)
def test_same_parameters_per_component(specs, family: str) -> None:  # type: ignore[no-untyped-def]
    formulas, derived_spec = specs(family)
    assert derived_spec.params_by_component() == formulas.params_by_component()
