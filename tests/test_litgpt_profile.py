"""Framework.LITGPT_2023 (peakmem.formulas.profiles): Lit-GPT@8641822b's LoRA layer, hand-derived on a tiny
Llama; Framework.LITGPT: what litgpt@5895df1 (2024) changed, at the end.

Tiny Llama (tests/tiny_models.py) h 64, 4 heads of 16, MLP 176; batch 1 x seq 8 (T = 8), pure bf16 (2 B),
LoRA r 8 on q and v with dropout (finetune/lora.py's defaults), adapters in bf16 (bf16-true converts the whole
model), CUDA kernels (bool dropout mask). Per layer:

* RMSNorm in bf16 (lit_gpt/rmsnorm.py), frozen weight: its input + rstd, 8*64*2 + 8*2 = 1040, twice;
* MHA: the fused qkv output kept by the v view 8*192*2 = 3072, the rotated q, k 8*128*2 = 2048; with 2 kv
  heads k, v are copied to 4 heads (model.py expand + reshape) and SDPA keeps q, k, v of 4 heads: 3072;
* SDPA output 8*64*2 = 1024, logsumexp 4*8*4 = 128; frozen MLP: gate, act, up 3*8*176*2 = 8448;
* LoRAQKVLinear: one dropout (output 8*64*2 + bool mask 8*64 = 1536), A output 8*16*2 = 256, zero_pad's
  index_copy source 8*(64+64)*2 + int64 index 128*8 = 3072 (GQA: q 64 + v 32 wide: 8*96*2 + 96*8 = 2304);
  with q, k and v all adapted zero_pad returns the B output itself: nothing more.
"""

from __future__ import annotations

import pytest

from peakmem.adapters import LoraConfig
from peakmem.breakdown import Category, MemoryItem
from peakmem.defaults import fsdp_reduce, grad_sync
from peakmem.formulas import activations as act
from peakmem.formulas import lora as L
from peakmem.formulas import profiles
from peakmem.formulas.activations.norms import rmsnorm_weight_side_bytes
from peakmem.formulas.loss import HeadActivations
from peakmem.formulas.lowbit_optim import half_ce
from peakmem.hf import spec_from_config
from peakmem.training import Framework, Method, Precision, TrainingSetup
from tiny_models import FAMILY_CONFIGS, LLAMA

T, H = 8, 64


def _saved(
    kv_heads: int, targets: tuple[str, ...], framework: Framework = Framework.LITGPT_2023
) -> dict[str, int]:
    spec = spec_from_config({**LLAMA, "num_key_value_heads": kv_heads})
    lora = LoraConfig(rank=8, alpha=16, dropout=0.05, targets=targets, adapter_dtype="base")
    setup = TrainingSetup(precision=Precision.BF16, micro_batch=1, seq_len=T, method=Method.LORA, lora=lora,
                          framework=framework)  # fmt: skip
    sh = act.shapes(spec, setup)
    la = act.layer_activations(spec, spec.groups[0].layer, sh)
    return {i.key: i.bytes for i in L.adapt_layer(spec, 0, la, sh, setup).saved}


COMMON = {"norms": 2 * 1040, "attn.sdpa_output": 1024, "attn.logsumexp": 128, "mlp.interior": 8448,
          "lora.adapter_inputs": 1536, "lora.a_outputs": 256}  # fmt: skip


def test_mha_qv_layer() -> None:
    assert _saved(4, ("q_proj", "v_proj")) == {
        **COMMON, "attn.fused_qkv": 3072, "attn.rotated_qk": 2048, "lora.fused_qkv_pad": 3072,
    }  # fmt: skip


def test_gqa_copies_kv_and_frees_the_fused_output() -> None:
    assert _saved(2, ("q_proj", "v_proj")) == {**COMMON, "attn.qkv": 3072, "lora.fused_qkv_pad": 2304}


def test_all_of_qkv_adapted_needs_no_pad() -> None:
    saved = _saved(4, ("q_proj", "k_proj", "v_proj"))
    assert "lora.fused_qkv_pad" not in saved
    assert saved["lora.adapter_inputs"] == 1536  # one dropout for the three parts (peft: three)
    assert saved["lora.a_outputs"] == 8 * 24 * 2  # r x 3 parts


def test_hf_keeps_its_own_terms() -> None:
    saved = _saved(4, ("q_proj", "v_proj"), Framework.HF)
    assert "lora.fused_qkv_pad" not in saved and "attn.fused_qkv" not in saved
    assert saved["lora.adapter_inputs"] == 2 * 1536  # one dropout per adapted module


def test_chunked_half_loss_keeps_the_logits_list() -> None:
    """16-bit logits of 100 positions x vocab 10 in chunks of 20 rows: the list (1000 elements) is alive
    in forward with one chunk's shifted copy, and in backward with one chunk's two gradients."""
    head = HeadActivations(saved=(), forward_transient=0, backward_transient=0, logits_grad=0)
    keep: list[MemoryItem] = []
    out = half_ce(head, keep, 1000, 2, autocast=False, chunk=200)
    assert [(i.key, i.bytes, i.category) for i in out.saved] == [
        ("loss.log_softmax", 2000, Category.ACTIVATIONS)
    ]
    assert (out.forward_transient, out.backward_transient, out.logits_grad) == (2400, 2800, 400)


def test_loop_defaults() -> None:
    for framework in (Framework.LITGPT, Framework.LITGPT_2023):
        setup = TrainingSetup(framework=framework, grad_accum=4)
        assert grad_sync(setup).value == "last-micro-batch" and "no_backward_sync" in grad_sync(setup).source
        assert fsdp_reduce(setup).value == "param" and "Lightning" in fsdp_reduce(setup).source


def test_a_derived_model_says_the_framework_code_is_not_applied() -> None:
    """phi-2's blocks are measured on transformers' PhiForCausalLM (a derived spec): ``--framework litgpt``
    changes its loop and loss only, and the answer says so; a formula model (llama) has no such line."""
    import peakmem

    def said(model: str) -> list[str]:
        r = peakmem.train(model, method="lora", seq=64, framework="litgpt")
        return [a for a in r["assumptions"] if "derived spec" in a]

    assert said("phi-2") and "not applied" in said("phi-2")[0]
    assert said("llama-3.2-1b") == []


# --- litgpt@5895df1 (2024): Framework.LITGPT ----------------------------------------------------------------
# RMSNorm on x.float(): the fp32 input 8*64*4 = 2048 and the fp32 rstd 8*4 = 32 per norm (frozen weight:
# no weight side), where 2023 kept the bf16 input and rstd (1040).
NORM_2024 = 8 * 64 * 4 + 8 * 4


def test_2024_rmsnorm_keeps_the_fp32_upcast() -> None:
    new, old = _saved(4, ("q_proj", "v_proj"), Framework.LITGPT), _saved(4, ("q_proj", "v_proj"))
    assert new["norms"] == 2 * NORM_2024 and old["norms"] == 2 * 1040
    assert {k: v for k, v in new.items() if k != "norms"} == {k: v for k, v in old.items() if k != "norms"}


def test_2024_mqa_rope_makes_k_all_heads() -> None:
    """One kv head: 2024 expands k (a stride-0 view) before apply_rope, so the rotated k has 4 heads
    (8*64*2) next to q (8*64*2), and v stays a view of the fused output (8*(64+16+16)*2 = 1536). 2023
    leaves the one head as it is (lit_gpt/model.py@8641822b l. 208), so SDPA gets 4 q heads and 1 k/v head
    without enable_gqa: its math kernel (scores and softmax saved; test_litgpt_attention_is_its_own)."""
    new, old = _saved(1, ("q_proj", "v_proj"), Framework.LITGPT), _saved(1, ("q_proj", "v_proj"))
    assert new["attn.rotated_qk"] == 2 * 8 * 64 * 2 and new["attn.fused_qkv"] == 8 * 96 * 2
    assert "attn.softmax" in old and "attn.rotated_qk" not in old


def _setup(framework: Framework, method: Method = Method.LORA, batch: int = 1) -> TrainingSetup:
    lora = None if method is Method.FULL else LoraConfig(rank=8, targets=("q_proj", "v_proj"))
    return TrainingSetup(precision=Precision.BF16, micro_batch=batch, seq_len=T, method=method, lora=lora,
                         framework=framework)  # fmt: skip


def test_rope_cache_at_the_training_length() -> None:
    """cos and sin, each [seq 8, head_dim 16] fp32 (build_rope_cache's ``repeat(1, 2)``): 2*8*16*4 bytes of
    buffers, and no per-forward cos/sin activation (the forward slices the buffers)."""
    spec = spec_from_config(LLAMA)
    for framework in (Framework.LITGPT, Framework.LITGPT_2023):
        assert profiles.rope_cache_bytes(spec, _setup(framework)) == 2 * 8 * 16 * 4
        sh = act.shapes(spec, _setup(framework))
        assert "embed.rotary" not in {i.key for i in act.embedding_items(spec, sh)}
    assert profiles.rope_cache_bytes(spec, _setup(Framework.HF)) == 0


def test_full_finetuning_runs_the_whole_head() -> None:
    """finetune/full.py calls model(input_ids): no head chunks; the adapter scripts chunk 128 positions."""
    assert profiles.head_chunk(_setup(Framework.LITGPT, Method.FULL)) == 0
    assert profiles.head_chunk(_setup(Framework.LITGPT)) == profiles.LITGPT_LM_HEAD_CHUNK
    assert profiles.head_chunk(_setup(Framework.HF)) == 0


def test_one_row_shifted_logits_are_a_view() -> None:
    """``logits[..., :-1, :].reshape(-1, V)`` of one row is a view: forward holds the 1000 logits (2 B) and
    the log-softmax output only; with a shifted copy, one more logits-sized tensor."""
    head = HeadActivations(saved=(), forward_transient=0, backward_transient=0, logits_grad=0)
    view = half_ce(head, [], 1000, 2, autocast=False, shifted_copy=False)
    copy = half_ce(head, [], 1000, 2, autocast=False)
    assert (view.forward_transient, copy.forward_transient) == (2000, 4000)
    assert view.backward_transient == copy.backward_transient == 4000


def test_gemma_norm_weight_side_in_the_input_dtype() -> None:
    """Full fine-tuning keeps y for the norm weight's gradient: transformers' GemmaRMSNorm multiplies in
    fp32 (T*h*4), Lit-GPT's ``x_normed.to(dtype) * (1 + weight)`` in bf16 (T*h*2)."""
    spec = spec_from_config(FAMILY_CONFIGS["gemma"])
    hf = act.shapes(spec, _setup(Framework.HF, Method.FULL))
    lit = act.shapes(spec, _setup(Framework.LITGPT, Method.FULL))
    assert rmsnorm_weight_side_bytes(spec, hf, 64) == T * 64 * 4
    assert rmsnorm_weight_side_bytes(spec, lit, 64) == T * 64 * 2


def test_the_rope_cat_makes_sdpas_output_a_copy_for_the_projection() -> None:
    """Lit-GPT's apply_rope + torch.cat hands SDPA a q contiguous per head ([B, H, T, D]); the kernel writes
    its output in q's layout, so ``y.transpose(1, 2).reshape(B, T, C)`` copies it for the projection,
    which a full fine-tune's proj saves beside SDPA's own output: 8*64*2 = 1024 more bytes a layer, MHA or
    GQA; transformers' q (a transposed view of the projection) gets an output already in the projection's
    layout."""
    full = {}
    for framework in (Framework.LITGPT, Framework.LITGPT_2023, Framework.HF):
        for kv in (4, 2):
            spec = spec_from_config({**LLAMA, "num_key_value_heads": kv})
            sh = act.shapes(spec, _setup(framework, Method.FULL))
            la = act.layer_activations(spec, spec.groups[0].layer, sh)
            full[framework, kv] = {i.key: i.bytes for i in la.saved}
    for kv in (4, 2):
        assert full[Framework.LITGPT, kv]["attn.output_copy"] == 8 * 64 * 2
        assert full[Framework.LITGPT_2023, kv]["attn.output_copy"] == 8 * 64 * 2
        assert "attn.output_copy" not in full[Framework.HF, kv]


def test_sdpa_writes_its_output_in_the_layout_of_q() -> None:
    """The torch fact behind it, on the CPU kernel (CUDA's flash kernel the same: flash_api.cpp mha_fwd's
    ``at::empty_like(q)`` of the transposed q keeps its strides)."""
    torch = pytest.importorskip("torch")
    b, h, t, d = 1, 4, 8, 16
    per_head = torch.randn(b, h, t, d, dtype=torch.bfloat16)  # Lit-GPT: contiguous per head after the cat
    view = torch.randn(b, t, h, d, dtype=torch.bfloat16).transpose(1, 2)  # transformers: a transposed view
    for q, copies in ((per_head, True), (view, False)):
        y = torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
        assert (not y.transpose(1, 2).is_contiguous()) is copies


def _lora_terms(config: dict[str, object], targets: tuple[str, ...]) -> dict[str, int]:
    spec = spec_from_config(config)
    lora = LoraConfig(rank=8, alpha=16, dropout=0.05, targets=targets, adapter_dtype="base", qkv_slices=True)
    setup = TrainingSetup(precision=Precision.BF16, micro_batch=1, seq_len=T, method=Method.LORA, lora=lora,
                          framework=Framework.LITGPT_2023)  # fmt: skip
    sh = act.shapes(spec, setup)
    la = act.layer_activations(spec, spec.groups[0].layer, sh)
    saved = L.adapt_layer(spec, 0, la, sh, setup).saved
    return {i.key: i.bytes for i in saved if i.key.startswith("lora.")}


@pytest.mark.parametrize("targets", [("q_proj", "v_proj"), ("q_proj", "k_proj", "v_proj"), ("k_proj",)])
def test_a_fused_attention_linear_takes_the_slices_of_separate_modules(targets: tuple[str, ...]) -> None:
    """Lit-GPT's LoRAQKVLinear is the same module whether transformers fuses q / k / v (Phi-3's
    qkv_proj) or not (Llama): the same adapters, inputs, A outputs and zero pad (same heads and width)."""
    phi3, llama = FAMILY_CONFIGS["phi3"], FAMILY_CONFIGS["llama"]
    assert _lora_terms(phi3, targets) == _lora_terms(llama, targets)
    spec = spec_from_config(phi3)
    lora = LoraConfig(rank=8, targets=targets, qkv_slices=True)
    widths = {m.leaf: m.out_features for m in L.resolve_targets(spec, lora)}
    head = 64 // 4
    assert widths == {k: (4 if k == "q_proj" else 2) * head for k in targets}


def test_the_litgpt_profile_names_slices() -> None:
    lora = LoraConfig(rank=8, targets=("q_proj", "v_proj"))
    for framework, slices in ((Framework.LITGPT_2023, True), (Framework.HF, False)):
        setup = TrainingSetup(method=Method.LORA, lora=lora, framework=framework)
        assert profiles.profile_setup(setup).lora.qkv_slices is slices  # type: ignore[union-attr]


def test_falcon_7b_adapters_as_litgpt_shapes_them() -> None:
    """litgpt/lora.py@5895df1 LoRAQKVLinear on Falcon-7B (n_embd 4544, n_head 71, n_query_groups 1,
    head_size 64), lora_query and lora_value at r = 32: lora_A (2 x 32, 4544), lora_B (4544 + 64, 32) a
    layer, 32 layers. transformers' peft cannot name them (Falcon's one query_key_value)."""
    import peakmem
    from peakmem.errors import InputError

    r = peakmem.train(
        "falcon-7b", method="lora", framework="litgpt", lora_targets="q_proj,v_proj", lora_rank=32
    )
    adapters = next(b for b in r.data["bytes_per_param"] if b["tensor"] == "LoRA adapters (A, B)")
    assert adapters["params"] == 32 * (2 * 32 * 4544 + (4544 + 64) * 32)
    with pytest.raises(InputError, match="matches no module"):
        peakmem.train("falcon-7b", method="lora", lora_targets="q_proj,v_proj")


def test_litgpt_attention_is_its_own_not_the_checkpoints_class() -> None:
    """Falcon's transformers class hands SDPA a materialised mask and one k/v head (the math kernel);
    Lit-GPT's CausalSelfAttention calls it with ``is_causal`` and, from 2024, k/v expanded to every head
    (flash on CUDA, no scores). Lit-GPT 2023 kept one k/v head for MQA (math, broadcast)."""
    from peakmem.formulas.activations.kernels import call_backend, sdpa_mask

    spec = spec_from_config(FAMILY_CONFIGS["falcon"])
    att = spec.first_layer.attention
    assert att.num_kv_heads == 1 < att.num_heads
    hf, litgpt = profiles.PROFILES[Framework.HF], profiles.PROFILES[Framework.LITGPT]
    old = profiles.PROFILES[Framework.LITGPT_2023]
    assert sdpa_mask(spec, att, T, hf) and not sdpa_mask(spec, att, T, litgpt)
    assert call_backend(spec, att, hf, half=True, seq=T) == ("math", 1)
    assert call_backend(spec, att, litgpt, half=True, seq=T) == ("flash", att.num_heads)
    assert call_backend(spec, att, old, half=True, seq=T) == ("math", 1)
