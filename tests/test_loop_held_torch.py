"""A loop that keeps its micro-batch's logits and loss (Lit-GPT's) x bitsandbytes < 0.43.2, run on the CPU.

bitsandbytes 0.50.2's Linear4bit (it runs on the CPU) with ``MatMul4Bit.forward`` patched to keep its input
as 0.42.0 does (``ctx.tensors = (A, B)``), a tiny Llama (h 64, I 176, 3 layers, vocab 1000; batch 2 x seq 32:
T = 64, bf16: c = 2 B), peft LoRA r 4 on q_proj and v_proj without dropout, CE on the bf16 logits, 3
micro-batches per step, 2 steps, measured with peakmem's storage tracker. Two loops: Lit-GPT's (finetune/
lora.py: ``logits = model(...)``, ``loss = ...``, backward, neither deleted) and one that deletes both
after backward (what HF Trainer's ``training_step`` amounts to).

Hand-derived: each layer's 4-bit Linear inputs are the first norm's output T h c = 8192 (not in layer 0,
where nothing requires grad yet), the attention output 8192, the second norm's output 8192, the product
before down_proj T I c = 22528: 38912 + 2 x 47104 = 133,120 B; the logits T V c = 128,000 B. Measured:
the optimizer step holds 261,122 B more in Lit-GPT's loop (the two + the 2-byte bf16 loss), the forward
peak 133,122 B more (it is at the loss, after the old logits were dropped).
"""

from __future__ import annotations

import gc
import json
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

import peakmem
from peakmem.breakdown import Phase
from peakmem.formulas import profiles
from peakmem.training import Framework

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")
bnb_functions = pytest.importorskip("bitsandbytes.autograd._functions")
pytestmark = pytest.mark.torch

from peakmem.measure.tracker import LiveStorageTracker  # noqa: E402

H, INTER, LAYERS, VOCAB, BATCH, SEQ, ACCUM = 64, 176, 3, 1000, 2, 32, 3
T, C = BATCH * SEQ, 2
INPUTS = T * C * (H + H + INTER) + (LAYERS - 1) * T * C * (H + H + H + INTER)
LOGITS = T * VOCAB * C
CFG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": H,
       "intermediate_size": INTER, "num_hidden_layers": LAYERS, "num_attention_heads": 4,
       "num_key_value_heads": 4, "vocab_size": VOCAB, "max_position_embeddings": SEQ,
       "tie_word_embeddings": False, "rms_norm_eps": 1e-6, "hidden_act": "silu"}  # fmt: skip


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tiny_llama")
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**CFG),
                                                          dtype=torch.bfloat16)  # fmt: skip
    model.save_pretrained(path)
    (path / "peakmem_config.json").write_text(json.dumps(CFG))
    return path


@pytest.fixture
def keeps_input(monkeypatch: pytest.MonkeyPatch) -> None:
    """MatMul4Bit as bitsandbytes 0.39-0.43.1 ran it: ``ctx.tensors = (A, B)`` when a grad is needed."""
    shipped = bnb_functions.MatMul4Bit.forward

    def forward(ctx: Any, A: Any, B: Any, out: Any = None, bias: Any = None, quant_state: Any = None) -> Any:
        result = shipped(ctx, A, B, out, bias, quant_state)
        if any(ctx.needs_input_grad[:2]):
            ctx.tensors = (A, ctx.tensors[1])
        return result

    monkeypatch.setattr(bnb_functions.MatMul4Bit, "forward", staticmethod(forward))


def _model(path: Path) -> Any:
    bc = transformers.BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                         bnb_4bit_compute_dtype=torch.bfloat16)  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = transformers.AutoModelForCausalLM.from_pretrained(
            path, quantization_config=bc, dtype=torch.bfloat16, device_map="cpu"
        )
    lora = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
    model = peft.get_peft_model(model, lora, autocast_adapter_dtype=False)
    model.train()
    return model


def _measure(path: Path, *, keep: bool, steps: int = 2) -> dict[tuple[Phase, int], int]:
    model = _model(path)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4, foreach=False)
    tracker = LiveStorageTracker(device_type="cpu")
    tracker.register_module(model)
    gen = torch.Generator().manual_seed(0)
    gc.collect()
    gc.disable()  # frees at refcount zero
    try:
        with tracker:
            tracker.set_phase(Phase.LOAD, 0)
            tracker.watch_gradients(model.named_parameters())
            logits = loss = None
            for step in range(1, steps + 1):
                for _ in range(ACCUM):
                    tracker.set_phase(Phase.FORWARD, step)
                    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=gen)
                    logits = model(input_ids=ids).logits
                    loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, VOCAB),
                                                             ids[:, 1:].reshape(-1))  # fmt: skip
                    tracker.set_phase(Phase.BACKWARD, step)
                    (loss / ACCUM).backward()
                    if not keep:
                        logits = loss = None
                    del ids
                tracker.set_phase(Phase.OPTIMIZER, step)
                opt.step()
                opt.zero_grad()
                tracker.tag_optimizer_states(opt)
            tracker.set_phase(Phase.LOAD, steps + 1)
    finally:
        gc.enable()
    return {(s.phase, s.step): s.bytes for s in tracker.ledger.peaks()}


def _estimate(path: Path, monkeypatch: pytest.MonkeyPatch, *, keep: bool) -> dict[str, Any]:
    hf = profiles.PROFILES[Framework.HF]
    monkeypatch.setitem(profiles.PROFILES, Framework.HF, replace(hf, loop_keeps_output=keep))
    out: dict[str, Any] = peakmem.train(
        str(path / "peakmem_config.json"), method="qlora", precision="bf16", batch=BATCH, seq=SEQ,
        lora_rank=4, lora_alpha=8, lora_targets="q_proj,v_proj", adapter_dtype="base", lora_dropout=0.0,
        bitsandbytes="0.41.1", no_double_quant=True, grad_accum=ACCUM, kernels="cpu",
        optimizer_impl="for-loop", loss="half",
    ).to_dict()  # fmt: skip
    return out


def test_litgpt_loop_keeps_the_previous_micro_batch(
    saved: Path, keeps_input: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    kept, dropped = _measure(saved, keep=True), _measure(saved, keep=False)
    step2 = {p: (kept[(p, 2)], dropped[(p, 2)]) for p in (Phase.FORWARD, Phase.OPTIMIZER)}
    loss_bytes = C  # the bf16 scalar ``loss`` the loop keeps too (not modelled)
    assert step2[Phase.OPTIMIZER][0] - step2[Phase.OPTIMIZER][1] == INPUTS + LOGITS + loss_bytes
    assert step2[Phase.FORWARD][0] - step2[Phase.FORWARD][1] == INPUTS + loss_bytes
    est = _estimate(saved, monkeypatch, keep=True)
    base = _estimate(saved, monkeypatch, keep=False)
    assert est["phases"]["optimizer"] - base["phases"]["optimizer"] == INPUTS + LOGITS
    assert est["phases"]["forward"] - base["phases"]["forward"] == INPUTS  # the peak at the loss
    # the whole step against the estimate with the profile's loop: the peak and its phase within 3 %
    measured = max(kept[(p, 2)] for p in (Phase.FORWARD, Phase.BACKWARD, Phase.OPTIMIZER))
    measured_phase = max((Phase.FORWARD, Phase.BACKWARD, Phase.OPTIMIZER), key=lambda p: kept[(p, 2)])
    assert est["peak_phase"] == measured_phase.value
    assert abs(est["peak_allocated_bytes"] / measured - 1) < 0.03
    for phase in ("forward", "optimizer"):
        assert abs(est["phases"][phase] / kept[(Phase(phase), 2)] - 1) < 0.03
