"""``--transformers VERSION``: what transformers 4.x did differently for a training step's bytes, by hand on
tiny specs (peakmem.transformers_versions): the loss's shifted-logits copy before 4.49 and the MoE experts
as per-expert Linears, which bitsandbytes quantizes, before 5.0."""

from __future__ import annotations

import subprocess
import sys

import pytest

import peakmem
from peakmem.adapters import LoraConfig, QuantConfig
from peakmem.breakdown import Phase
from peakmem.errors import InputError
from peakmem.estimate import estimate_training
from peakmem.formulas.loss import HeadActivations, transformers_head
from peakmem.formulas.qlora import base_bytes, dequant_temporaries, quantized_params
from peakmem.hf import spec_from_config
from peakmem.step_setup import setup_that_runs
from peakmem.training import KernelPolicy, TrainingSetup
from peakmem.transformers_versions import TRANSFORMERS_CURRENT, experts_are_linears, release_facts

LLAMA = {
    "model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 512, "hidden_size": 64,
    "intermediate_size": 128, "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2,
}  # fmt: skip
MIXTRAL = {
    **LLAMA, "model_type": "mixtral", "architectures": ["MixtralForCausalLM"], "num_local_experts": 4,
    "num_experts_per_tok": 2,
}  # fmt: skip
B, S, V = 2, 32, 512
LOGITS, SHIFTED = B * S * V, B * (S - 1) * V


@pytest.mark.parametrize(
    ("version", "linears", "copy", "upcast"),
    [("5.23.0", False, False, "loss"), ("5.0.0", False, False, "loss"), ("4.57.1", True, False, "loss"),
     ("4.49.0", True, False, "loss"), ("4.48.1", True, True, "loss"), ("4.46.0", True, True, "loss"),
     ("4.45.2", True, True, "model"), ("4.31.0", True, True, "model"), ("4.30.2", True, True, "none")],
)  # fmt: skip
def test_the_rows_in_force(version: str, linears: bool, copy: bool, upcast: str) -> None:
    row = release_facts(version)
    assert (row.moe_expert_linears, row.shifted_logits_copy, row.upcast) == (linears, copy, upcast)


def _forward_transient(version: str, precision: str, batch: int = B) -> int:
    from peakmem.formulas.activations import shapes

    setup = TrainingSetup(precision=precision, micro_batch=batch, seq_len=S, kernel_policy=KernelPolicy.CPU)  # type: ignore[arg-type]
    sh = shapes(spec_from_config(LLAMA, name="t"), setup)
    head = HeadActivations(saved=(), forward_transient=-1, backward_transient=0, logits_grad=0)
    return transformers_head(
        spec_from_config(LLAMA, name="t"), head, sh, release_facts(version)
    ).forward_transient


def test_the_loss_copies_by_hand() -> None:
    # 4.46-4.48 ForCausalLMLoss: the bf16 logits, their fp32 upcast and the fp32 shifted copy at once
    assert _forward_transient("4.48.1", "bf16") == 2 * LOGITS + 4 * LOGITS + 4 * SHIFTED
    # 4.31-4.45: the model's logits.float() frees the bf16 logits; then the shifted fp32 copy
    assert _forward_transient("4.45.0", "bf16") == 4 * LOGITS + 4 * SHIFTED
    # before 4.31, under autocast: bf16 logits, the bf16 shifted copy, log_softmax's fp32 cast of it
    assert _forward_transient("4.30.0", "amp-bf16") == 2 * LOGITS + 2 * SHIFTED + 4 * SHIFTED
    # fp32 logits: nothing to upcast, the copy is fp32
    assert _forward_transient("4.48.1", "fp32") == 4 * LOGITS + 4 * SHIFTED
    assert _forward_transient("4.49.0", "bf16") == -1  # no copy: the head as 5.23 runs it


def test_a_batch_of_one_copies_nothing() -> None:
    # logits[..., :-1, :] of a contiguous [1, S, V] tensor is contiguous: .contiguous() returns the view
    logits, shifted = S * V, (S - 1) * V
    assert _forward_transient("4.48.1", "bf16", batch=1) == 2 * logits + 4 * logits
    # 4.31-4.45: the model's logits.float(), bf16 and fp32 logits at once, then no shifted copy
    assert _forward_transient("4.45.0", "bf16", batch=1) == 2 * logits + 4 * logits
    # before 4.31 under autocast: log_softmax still casts the (uncopied) slice to fp32
    assert _forward_transient("4.30.0", "amp-bf16", batch=1) == 2 * logits + 4 * shifted


def _forward_peak(version: str) -> int:
    setup = TrainingSetup(method="lora", precision="bf16", micro_batch=B, seq_len=S,  # type: ignore[arg-type]
                          kernel_policy=KernelPolicy.CPU, transformers=version)  # fmt: skip
    est = estimate_training(spec_from_config(LLAMA, name="t"), setup)
    return next(p.bytes for p in est.phases if p.phase is Phase.FORWARD)


def test_the_step_sees_one_shifted_fp32_copy_more() -> None:
    # and before 4.54 the SDPA path saves k and v repeated to the 4 heads (tests/test_sdpa_repeat_kv.py):
    # 2 x T x 2 x 16 bf16 more in the forward's one layer
    repeated = 2 * B * S * (4 - 2) * 16 * 2
    assert _forward_peak("4.48.1") - _forward_peak(TRANSFORMERS_CURRENT) == 4 * SHIFTED + repeated
    assert _forward_peak("4.49.0") == _forward_peak(TRANSFORMERS_CURRENT) + repeated
    assert _forward_peak("4.54.0") == _forward_peak(TRANSFORMERS_CURRENT)


def _nf4(numel: int) -> int:
    """Packed 4-bit (numel/2) + fp32 absmax per 64 + the 16-entry fp32 code, per Linear."""
    return numel // 2 + numel // 64 * 4 + 64


def test_experts_are_quantized_per_expert_before_5() -> None:
    spec = spec_from_config(MIXTRAL, name="t")
    h, i, e = 64, 128, 4
    fused, linears = QuantConfig(quant="nf4"), QuantConfig(quant="nf4", expert_linears=True)
    # transformers 4.x: w1, w3 (I x H) and w2 (H x I) per expert, each a Linear4bit; 5.x: 3 x E x I x H bf16
    assert base_bytes(spec, fused) - base_bytes(spec, linears) == 3 * e * i * h * 2 - 3 * e * _nf4(i * h)
    assert quantized_params(spec, linears) - quantized_params(spec, fused) == 3 * e * i * h
    # the dequantized temporary: one expert's I x H weight (not the fused 2I x H gate_up), bf16
    assert dequant_temporaries(spec, linears, tokens=1, compute_bytes=2).forward == i * h * 2
    assert dequant_temporaries(spec, fused, tokens=1, compute_bytes=2).forward == h * h * 2  # q_proj


def test_the_setup_that_runs_quantizes_the_experts_by_version() -> None:
    mixtral, llama = spec_from_config(MIXTRAL, name="t"), spec_from_config(LLAMA, name="t")
    old = TrainingSetup(method="qlora", transformers="4.48.1")  # type: ignore[arg-type]
    assert setup_that_runs(mixtral, old).quant == QuantConfig(
        quant="nf4", double_quant=True, expert_linears=True
    )
    assert setup_that_runs(mixtral, TrainingSetup(method="qlora")).quant is None  # type: ignore[arg-type]
    assert setup_that_runs(llama, old).quant is None
    assert not experts_are_linears("4.48.1", "gpt_oss")  # 3-D parameters in 4.x too


def test_the_api_answer_and_its_warning() -> None:
    flags = {"method": "qlora", "batch": 1, "seq": 512, "precision": "bf16", "lora_targets": "q_proj,v_proj"}
    old, new = (
        peakmem.train("mixtral-8x7b", transformers="4.48.1", **flags),
        peakmem.train("mixtral-8x7b", **flags),
    )
    # ~45 G expert parameters: 4-bit (~0.5 B each) under 4.48.1, bf16 (2 B) under 5.23
    assert old["peak_allocated_bytes"] < new["peak_allocated_bytes"] / 2
    assert not any("experts stay 16-bit" in w for w in old["warnings"])
    assert any("experts stay 16-bit" in w for w in new["warnings"])


@pytest.mark.parametrize("bad", ["four", "4", "4.48.1.2.3", ""])
def test_a_malformed_release_is_a_one_line_error(bad: str) -> None:
    with pytest.raises(InputError, match=r"^transformers="):
        TrainingSetup(transformers=bad)
    with pytest.raises(InputError, match=r"^transformers="):
        peakmem.train("llama-3.2-1b", transformers=bad)


def test_the_cli_flag() -> None:
    run = [sys.executable, "-m", "peakmem", "train", "llama-3.2-1b", "--json"]
    bad = subprocess.run([*run, "--transformers", "x"], capture_output=True, text=True, check=False)
    assert bad.returncode == 2 and bad.stderr.strip().count("\n") == 0 and "transformers='x'" in bad.stderr
    ok = subprocess.run(
        [*run, "--transformers", "4.48.1", "--method", "lora"], capture_output=True, text=True, check=False
    )
    assert ok.returncode == 0, ok.stderr


def test_lora_targets_are_not_touched() -> None:
    """The names stay as given; the release only says that they match each expert's Linear (4.x)."""
    lora = LoraConfig(targets=("q_proj",))
    setup = TrainingSetup(method="lora", lora=lora, transformers="4.48.1")  # type: ignore[arg-type]
    ran = setup_that_runs(spec_from_config(MIXTRAL, name="t"), setup).lora
    assert ran == LoraConfig(targets=("q_proj",), expert_linears=True)


OPT = {
    "model_type": "opt", "architectures": ["OPTForCausalLM"], "vocab_size": 512, "hidden_size": 64,
    "ffn_dim": 128, "num_hidden_layers": 1, "num_attention_heads": 4, "max_position_embeddings": 64,
    "word_embed_proj_dim": 64, "do_layer_norm_before": True, "activation_function": "relu",
    "dropout": 0.1, "attention_dropout": 0.0,
}  # fmt: skip


def _clamp_items(config: dict[str, object], version: str, precision: str = "mixed-fp16") -> list[int]:
    from peakmem.formulas.activations import shapes
    from peakmem.formulas.activations.attention import attention_terms

    spec = spec_from_config(config, name="t")
    setup = TrainingSetup(
        precision=precision, micro_batch=B, seq_len=S, attention="eager", transformers=version
    )  # type: ignore[arg-type]
    items = attention_terms(spec, spec.groups[0].layer, shapes(spec, setup))[0]
    return [i.bytes for i in items if i.key == "attn.clamp"]


@pytest.mark.parametrize(
    ("version", "kept"), [("4.29.0", True), ("4.48.1", True), ("4.49.0", False), ("5.23.0", False)]
)
def test_opt_keeps_its_clamped_scores_before_4_49(version: str, kept: bool) -> None:
    # OPTAttention 4.30.0-4.48.1: torch.max(scores + mask, finfo.min) keeps its B x heads x S x S fp16 input
    assert _clamp_items(OPT, version) == ([B * 4 * S * S * 2] if kept else [])


def test_the_clamp_is_opts_alone() -> None:
    assert _clamp_items(LLAMA, "4.29.0") == []
