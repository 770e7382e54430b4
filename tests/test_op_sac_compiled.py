"""Op-level selective activation checkpointing under per-block torch.compile (torchtitan's default for
Llama3-8B: ``--training.compile`` with ``selective_ac_option = "op"``).

The compiled block's partitioner saves only the MUST_SAVE outputs its backward reads
(peakmem.formulas.activations.op_sac module doc): the MLP's output projection's output, which eager op SAC
keeps in its cache, only joins the residual stream, so the compiled block does not keep it. Hand-derived on
a tiny Llama from its config; measured against torch 2.13 Inductor by benchmarks/sac_compile_activations.py
(compile takes ~15 s a case on this CPU: no parity test here)."""

from __future__ import annotations

from peakmem.breakdown import Category, Phase
from peakmem.estimate import estimate_training
from peakmem.formulas.activations.op_sac import op_saved_linears, unread_outputs
from peakmem.hf import spec_from_config
from peakmem.measure.parity import FAMILIES
from peakmem.training import Checkpointing, KernelPolicy, Precision, TrainingSetup

LLAMA4 = {**FAMILIES["llama"], "num_hidden_layers": 4}
BATCH, SEQ = 1, 128


def _layer_activations(
    compiled: bool, policy: KernelPolicy = KernelPolicy.CPU, precision: Precision = Precision.FP32
) -> dict[str, int]:
    """One layer's forward-phase activation items, by the path after ``layers[i:j].``."""
    setup = TrainingSetup(precision=precision, checkpointing=Checkpointing.OP, micro_batch=BATCH,
                          seq_len=SEQ, kernel_policy=policy, compiled=compiled)  # fmt: skip
    est = estimate_training(spec_from_config(LLAMA4, name="llama4"), setup)
    forward = next(p for p in est.phases if p.phase is Phase.FORWARD)
    out: dict[str, int] = {}
    for i in forward.items:
        if i.category is Category.ACTIVATIONS and i.path.startswith("layers["):
            key = i.path.split("].", 1)[1]
            out[key] = out.get(key, 0) + i.bytes
    return out


def test_compiled_op_sac_keeps_the_input_q_v_and_gate_not_down() -> None:
    """fp32, CPU (nothing of SDPA kept): per layer the input T x h, q T x a*d, v T x g*d and gate T x I, each
    x 4 layers x 4 bytes; eager keeps down's T x h as well."""
    t = BATCH * SEQ
    h, inter = LLAMA4["hidden_size"], LLAMA4["intermediate_size"]
    kv = LLAMA4["num_key_value_heads"] * (h // LLAMA4["num_attention_heads"])
    layers = LLAMA4["num_hidden_layers"]
    compiled, eager = _layer_activations(True), _layer_activations(False)
    kept = ("q_proj", "v_proj", "gate_proj")
    assert set(compiled) == {"layer input (checkpoint)", *(f"{k} output (op SAC: saved mm)" for k in kept)}
    assert sum(compiled.values()) == layers * 4 * t * (h + h + kv + inter)
    assert eager["down_proj output (op SAC: saved mm)"] == layers * 4 * t * h
    assert sum(eager.values()) - sum(compiled.values()) == layers * 4 * t * h


def test_compiled_op_sac_keeps_sdpa_outputs_where_the_policy_names_them() -> None:
    """bf16 on CUDA: flash SDPA is in the save list and its backward reads its output and logsumexp: kept
    compiled as in eager (only down's output goes)."""
    bf16 = Precision("mixed-bf16")
    compiled = _layer_activations(True, KernelPolicy.CUDA, bf16)
    eager = _layer_activations(False, KernelPolicy.CUDA, bf16)
    assert {k: v for k, v in eager.items() if not k.startswith("down_proj")} == compiled
    assert any(k.startswith("attn.") for k in compiled)


def test_unread_outputs_is_the_mlp_output_projection_unless_a_post_mlp_norm_reads_it() -> None:
    llama = spec_from_config(LLAMA4, name="llama4").first_layer
    assert unread_outputs(llama) == frozenset({"mlp.down_proj"})
    assert "mlp.down_proj" in op_saved_linears(llama)
    gemma2 = spec_from_config({**LLAMA4, "model_type": "gemma2", "head_dim": 16}).first_layer
    assert unread_outputs(gemma2) == frozenset()  # post_feedforward_layernorm reads down's output
    qwen2 = spec_from_config(FAMILIES["qwen2"], name="qwen2").first_layer
    assert "mlp.down_proj" not in op_saved_linears(qwen2)  # down is the 4th counted matmul: not kept anyway
