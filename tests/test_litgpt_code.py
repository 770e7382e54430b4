"""A derived model under ``--framework litgpt``: its blocks measured on the config Lit-GPT's model code
amounts to (peakmem.formulas.profiles.code_config: no dropout, torch's fused tanh-GELU), filed under the
user's config's block keys.

Hand-derived: the translated config; the family key's code part. Torch tier: one fake step of a tiny
Phi block with transformers' "gelu_new" and resid_pdrop 0.1 saves exactly the tensors the Python GELU
and the two residual dropouts add over the translated config's.
"""

from __future__ import annotations

import pytest

from peakmem import block_costs
from peakmem.formulas.activations.shapes import derived_family
from peakmem.formulas.profiles import LITGPT_CODE, code_config
from peakmem.training import Framework, Method, Precision, TrainingSetup, family_code, family_key

PHI = {"model_type": "phi", "hidden_act": "gelu_new", "resid_pdrop": 0.1, "embd_pdrop": 0.0,
       "attention_dropout": 0.0, "hidden_size": 64, "initializer_range": 0.02}  # fmt: skip


def test_code_config_zeroes_dropouts_and_fuses_the_tanh_gelu() -> None:
    out = code_config(PHI, LITGPT_CODE)
    assert out == {**PHI, "hidden_act": "gelu_pytorch_tanh", "resid_pdrop": 0.0}
    assert code_config(PHI, "") == PHI  # transformers' own code: the config as it is
    # Gemma's key, and an exact GELU (Lit-GPT's gelu_approximate "none") left alone
    gemma = {"hidden_activation": "gelu_pytorch_tanh", "hidden_act": "gelu", "hidden_dropout": 0.05}
    assert code_config(gemma, LITGPT_CODE) == {**gemma, "hidden_dropout": 0.0}


def test_the_family_key_carries_the_code_and_gives_it_back() -> None:
    plain = family_key(precision="bf16", kernel="sdpa", policy="cuda", method="full")
    coded = family_key(precision="bf16", kernel="sdpa", policy="cuda", method="full", code=LITGPT_CODE)
    assert (plain, coded) == ("bf16|sdpa|cuda|full", "bf16|sdpa|cuda|full|code=litgpt")
    assert family_code(coded) == (plain, LITGPT_CODE) and family_code(plain) == (plain, "")
    for framework, code in ((Framework.HF, ""), (Framework.TORCHTUNE, ""), (Framework.LITGPT, LITGPT_CODE),
                            (Framework.LITGPT_2023, LITGPT_CODE)):  # fmt: skip
        setup = TrainingSetup(precision=Precision.BF16, method=Method.LORA, framework=framework)
        assert family_code(derived_family(setup))[1] == code


@pytest.fixture
def derive(monkeypatch: pytest.MonkeyPatch, tmp_path):  # type: ignore[no-untyped-def]
    pytest.importorskip("transformers")
    monkeypatch.setenv(block_costs.CACHE_ENV, str(tmp_path))
    from peakmem.simulate import derive as mod

    return mod


@pytest.mark.torch
def test_the_python_gelu_and_residual_dropouts_save_what_litgpt_code_does_not(derive) -> None:  # type: ignore[no-untyped-def]
    """transformers' NewGELUActivation, 0.5 * x * (1 + tanh(c * (x + 0.044715 * x**3))), saves tanh's
    output t and both factors of the last product (0.5 * x and 1 + t) beyond the input the fused GELU
    also keeps: 3 x tokens x intermediate x 2 B in bf16; PhiDecoderLayer's resid_dropout on the attention
    and MLP outputs saves two bool masks: 2 x tokens x hidden. Measured: exactly that, per block."""
    from peakmem.simulate.derive import step

    config = dict(derive.tiny_config("phi"), hidden_act="gelu_new", resid_pdrop=0.1, num_hidden_layers=2)
    setup = TrainingSetup(precision=Precision.BF16, micro_batch=2, seq_len=64)
    hf = step.measure_one(config, setup, cut="none")
    lit = step.measure_one(code_config(config, LITGPT_CODE), setup, cut="none")
    tokens, hidden, inter = 2 * 64, config["hidden_size"], config["intermediate_size"]
    (hf_key, hf_block), (lit_key, lit_block) = min(hf.items()), min(lit.items())
    assert hf_key != lit_key  # the keys hash the block's module types: NewGELUActivation vs the fused one
    assert hf_block.saved - lit_block.saved == 3 * tokens * inter * 2 + 2 * tokens * hidden


@pytest.mark.torch
def test_costs_of_the_translated_config_are_filed_under_the_users_keys(derive) -> None:  # type: ignore[no-untyped-def]
    from peakmem.model import LAST_BLOCK
    from peakmem.simulate.derive import costs

    config = dict(derive.tiny_config("phi"), hidden_act="gelu_new", resid_pdrop=0.1, num_hidden_layers=2)
    measured = code_config(config, LITGPT_CODE)
    key = derive.spec_from_model(derive.build_meta(config), config).groups[0].layer.derived.key
    other = derive.spec_from_model(derive.build_meta(measured), measured).groups[0].layer.derived.key
    found = costs._filed_under({other: "block", other + LAST_BLOCK: "last"}, measured, config)  # type: ignore[dict-item]
    assert found == {key: "block", key + LAST_BLOCK: "last"}


def test_litgpt_unties_a_tied_head_and_leaves_other_frameworks_tied() -> None:
    """Lit-GPT's GPT has its own lm_head (profiles.SRC_LITGPT_UNTIED): a tied config gains a second vocab
    x hidden weight under --framework litgpt, counted in the frozen base (2 B per element in bf16);
    transformers' code keeps it shared. Hand-derived: vocab 1,000 x hidden 64 x 2 B = 128,000 B."""
    from peakmem.estimate import estimate_training
    from peakmem.formulas.profiles import code_spec
    from peakmem.hf import spec_from_config

    tied = spec_from_config({
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1000,
        "tie_word_embeddings": True,
    })  # fmt: skip
    base: dict[Framework, int] = {}
    for framework in (Framework.HF, Framework.LITGPT):
        setup = TrainingSetup(precision=Precision.BF16, method=Method.LORA, framework=framework)
        spec = code_spec(tied, setup)
        assert spec.tie_word_embeddings is (framework is Framework.HF)
        est = estimate_training(tied, setup)
        base[framework] = next(i.bytes for i in est.items if i.path == "base weights (frozen)")
    assert base[Framework.LITGPT] - base[Framework.HF] == 1000 * 64 * 2
    litgpt = TrainingSetup(precision=Precision.BF16, method=Method.LORA, framework=Framework.LITGPT)
    untied = code_spec(tied, litgpt)
    assert code_spec(untied, litgpt) is untied  # applied once
