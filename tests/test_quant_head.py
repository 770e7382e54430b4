"""A quantized LM head (Lightning Fabric's BitsandbytesPrecision, Lit-GPT's QLoRA), hand-derived.

formulas/qlora.py SRC_FABRIC_BNB: every torch.nn.Linear, the lm_head included, becomes a 4-bit Linear
quantized from fp16; formulas/quant_head.py: each head chunk's MatMul4Bit dequantizes the whole weight (fp16)
and casts it to the compute dtype (bf16), both alive at once, in forward and in backward.

Tiny Llama (tests/tiny_models.py): hidden 64, vocab 1000, untied head of 64,000 elements; pure bf16 (c = 2 B),
nf4 without double quantization. The head in nf4: 32,000 packed bytes + 1,000 fp32 absmax (one per 64) + the
16-entry fp32 code = 36,064 B, where 16-bit it is 128,000 B.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import peakmem
from peakmem.adapters import LoraConfig, QuantConfig
from peakmem.breakdown import Category, MemoryItem
from peakmem.errors import InputError
from peakmem.formulas import activations as act
from peakmem.formulas import profiles, qlora
from peakmem.formulas.loss import HeadActivations
from peakmem.formulas.quant_head import head_rows, quantized_head
from peakmem.hf import spec_from_config
from peakmem.training import Framework, Method, Precision, TrainingSetup
from tiny_models import LLAMA

V, H, C = 1000, 64, 2
HEAD = V * H
HEAD_NF4 = HEAD // 2 + (HEAD // 64) * 4 + 16 * 4
NF4 = QuantConfig(quant="nf4", double_quant=False)


def _setup(
    framework: Framework, *, batch: int = 1, seq: int = 16, method: Method = Method.QLORA
) -> TrainingSetup:
    lora = LoraConfig(rank=4, alpha=8, dropout=0.0, targets=("q_proj", "v_proj"), adapter_dtype="base")
    return TrainingSetup(precision=Precision.BF16, micro_batch=batch, seq_len=seq, method=method, lora=lora,
                         quant=NF4 if method is Method.QLORA else None, framework=framework)  # fmt: skip


def test_fabric_quantizes_the_head_from_fp16() -> None:
    lit = profiles.profile_setup(_setup(Framework.LITGPT))
    assert lit.quant is not None and lit.quant.quantize_head and lit.quant.state_dtype == "fp16"
    old = profiles.profile_setup(_setup(Framework.LITGPT_2023))
    assert old.quant == lit.quant  # Lightning@71aed75 alike
    assert profiles.profile_setup(_setup(Framework.HF)).quant == NF4  # transformers keeps the head 16-bit
    assert profiles.profile_setup(_setup(Framework.LITGPT, method=Method.LORA)).quant is None


def test_state_dtype_is_validated() -> None:
    with pytest.raises(InputError, match="state_dtype='int4'"):
        QuantConfig(state_dtype="int4")


def test_dequantized_weight_bytes() -> None:
    fabric = profiles.fabric_quant(NF4)
    assert qlora.dequantized_weight_bytes(HEAD, NF4, C) == HEAD * 2  # bf16 state: one weight
    assert qlora.dequantized_weight_bytes(HEAD, fabric, C) == HEAD * 2 + HEAD * 2  # fp16 + its bf16 copy
    dq = profiles.fabric_quant(QuantConfig(quant="nf4", double_quant=True))
    assert qlora.dequantized_weight_bytes(HEAD, dq, C) == 4 * HEAD + (HEAD // 64) * 4  # + fp32 absmax


def test_storage_counts_the_head_in_nf4() -> None:
    spec = spec_from_config(LLAMA)
    fabric = profiles.fabric_quant(NF4)
    assert qlora.base_bytes(spec, NF4) - qlora.base_bytes(spec, fabric) == HEAD * C - HEAD_NF4
    # outside the layers: the 16-bit embedding and final norm, the nf4 head
    assert qlora.root_bytes(spec, fabric) == HEAD * C + H * C + HEAD_NF4
    assert qlora.root_bytes(spec, NF4) == 2 * HEAD * C + H * C


def test_head_matmuls_dequantize_the_whole_weight() -> None:
    """Batch 1 x seq 16 (T = 16 < the 128-position chunk: one matmul of 16 rows). Forward, inside the model:
    no earlier chunk, the fp16 + bf16 weights 4 x 64,000 = 256,000 (more than the bf16 weight + the logits,
    128,000 + 16 x 1000 x 2 = 160,000), the loss's log-softmax output (32,000) not made yet: 224,000.
    Backward: the loss's 96,000 less the first CE gradient (32,000), plus 256,000: 320,000."""
    spec = spec_from_config(LLAMA)
    setup = profiles.profile_setup(_setup(Framework.LITGPT))
    sh = act.shapes(spec, setup)
    assert head_rows(sh, setup) == 16
    log_softmax = MemoryItem("log_softmax", Category.ACTIVATIONS, 16 * V * C, "test", "loss.log_softmax")
    lm_in = MemoryItem("lm_head input", Category.ACTIVATIONS, 16 * H * C, "test", "head.lm_head_input")
    head = HeadActivations(saved=(lm_in, log_softmax), forward_transient=64_000, backward_transient=96_000,
                           logits_grad=32_000)  # fmt: skip
    out = quantized_head(spec, head, sh, setup)
    assert (out.in_model, out.backward_transient) == (224_000, 320_000)
    assert (out.forward_transient, out.logits_grad, out.saved) == (64_000, 32_000, head.saved)
    hf = profiles.profile_setup(_setup(Framework.HF))
    assert quantized_head(spec, head, act.shapes(spec, hf), hf) is head


def test_chunked_head_counts_the_earlier_chunks() -> None:
    """Batch 2 x seq 256 (T = 512, chunks of 2 x 128 = 256 rows): earlier chunk 256 x 1000 x 2 = 512,000;
    the bf16 weight + the chunk's logits 128,000 + 512,000 = 640,000 beat the two weights (256,000); less
    the 1,024,000 B log-softmax output not made yet: 128,000."""
    spec = spec_from_config(LLAMA)
    setup = profiles.profile_setup(_setup(Framework.LITGPT, batch=2, seq=256))
    sh = act.shapes(spec, setup)
    assert head_rows(sh, setup) == 256
    log_softmax = MemoryItem("log_softmax", Category.ACTIVATIONS, 512 * V * C, "test", "loss.log_softmax")
    head = HeadActivations(saved=(log_softmax,), forward_transient=0, backward_transient=0, logits_grad=0)
    assert quantized_head(spec, head, sh, setup).in_model == 128_000


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> str:
    import json

    path: Path = tmp_path_factory.mktemp("llama") / "config.json"
    path.write_text(json.dumps({**LLAMA, "tie_word_embeddings": False}))
    return str(path)


def test_estimate_stores_the_head_in_nf4(tiny: str) -> None:
    opts = dict(method="qlora", precision="bf16", batch=1, seq=16, lora_rank=4, lora_alpha=8,
                lora_dropout=0.0, lora_targets="q_proj,v_proj", adapter_dtype="base", no_double_quant=True,
                loss="half")  # fmt: skip
    lit = peakmem.train(tiny, framework="litgpt", **opts).data
    old = peakmem.train(tiny, framework="litgpt-2023", **opts).data
    hf = peakmem.train(tiny, **opts).data
    params = Category.PARAMETERS.value
    assert hf["breakdown"][params] - lit["breakdown"][params] == HEAD * C - HEAD_NF4
    assert old["breakdown"][params] == lit["breakdown"][params]
