"""Framework.LITGPT (peakmem.formulas.profiles): Lit-GPT@8641822b's LoRA layer, hand-derived on a tiny Llama.

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

from peakmem.adapters import LoraConfig
from peakmem.breakdown import Category, MemoryItem
from peakmem.defaults import fsdp_reduce, grad_sync
from peakmem.formulas import activations as act
from peakmem.formulas import lora as L
from peakmem.formulas.loss import HeadActivations
from peakmem.formulas.lowbit_optim import half_ce
from peakmem.hf import spec_from_config
from peakmem.training import Framework, Method, Precision, TrainingSetup
from tiny_models import LLAMA

T, H = 8, 64


def _saved(
    kv_heads: int, targets: tuple[str, ...], framework: Framework = Framework.LITGPT
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
    setup = TrainingSetup(framework=Framework.LITGPT, grad_accum=4)
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
