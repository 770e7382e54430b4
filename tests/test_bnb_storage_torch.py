"""QLoRA base storage against what bitsandbytes 0.50.2 really stores (it quantizes on the CPU).

``tests/test_quant_torch.py`` (inference) checks NF4 +- double quant on 4096x4096 / 14336x4096 and int8
on 14336x4096; here: the shapes and formats QLoRA adds (FP4, GPT-2 XL's 1600x6400, NF4 without double
quant on 4096x14336), and whole models loaded by transformers with ``BitsAndBytesConfig`` on the CPU:
which modules are replaced (Linear4bit / Linear8bitLt), which stay 16-bit (embeddings, norms, head,
MoE routers, fused experts), and the byte total of every parameter and QuantState.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest

from peakmem.adapters import QuantConfig
from peakmem.formulas.qlora import base_bytes
from peakmem.formulas.weights import bnb_4bit_bytes, bnb_int8_bytes
from peakmem.hf import spec_from_config

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
bnb_functional = pytest.importorskip("bitsandbytes.functional")
pytestmark = pytest.mark.torch

from test_quant_torch import nbytes, quant_state_bytes  # noqa: E402


@pytest.mark.slow
@pytest.mark.parametrize(
    ("shape", "quant_type", "double_quant"),
    [((6400, 1600), "fp4", False), ((6400, 1600), "nf4", True), ((14336, 4096), "nf4", False),
     ((4096, 4096), "fp4", True)],
)  # fmt: skip
def test_4bit_bytes_real_shapes(shape: tuple[int, int], quant_type: str, double_quant: bool) -> None:
    weight = torch.randn(*shape, dtype=torch.bfloat16)
    packed, state = bnb_functional.quantize_4bit(weight, blocksize=64, compress_statistics=double_quant,
                                                 quant_type=quant_type)  # fmt: skip
    stored = nbytes(packed) + quant_state_bytes(state)
    assert stored == bnb_4bit_bytes(shape[0] * shape[1], blocksize=64, double_quant=double_quant)


def test_int8_bytes_gpt2_xl_shape() -> None:
    weight = torch.randn(6400, 1600, dtype=torch.float16)  # GPT-2 XL c_fc: out 6400, in 1600
    cb, scb, _ = bnb_functional.int8_vectorwise_quant(weight)
    assert nbytes(cb) + nbytes(scb) == bnb_int8_bytes(1600, 6400)


TINY_MIXTRAL = {
    "model_type": "mixtral", "architectures": ["MixtralForCausalLM"], "vocab_size": 256, "hidden_size": 128,
    "intermediate_size": 192, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "num_local_experts": 4, "num_experts_per_tok": 2,
}  # fmt: skip
TINY_LLAMA = {
    "model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 256, "hidden_size": 128,
    "intermediate_size": 320, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
}  # fmt: skip


def _stored_bytes(model: Any) -> int:
    """Every parameter storage once, plus each quantized parameter's QuantState / SCB."""
    seen: set[int] = set()
    total = 0
    for p in model.parameters():
        key = p.untyped_storage().data_ptr()
        if key in seen:
            continue
        seen.add(key)
        total += p.untyped_storage().nbytes()
        state = getattr(p, "quant_state", None)
        if state is not None:
            total += quant_state_bytes(state)
        scb = getattr(p, "SCB", None)
        if scb is not None:
            total += nbytes(scb)
    return total


@pytest.fixture(scope="module")
def saved_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = {}
    for name, cfg in (("mixtral", TINY_MIXTRAL), ("llama", TINY_LLAMA)):
        config = transformers.AutoConfig.for_model(**cfg)
        torch.manual_seed(0)
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
        path = tmp_path_factory.mktemp(name)
        model.save_pretrained(path)
        out[name] = path
    return out


@pytest.mark.slow
@pytest.mark.parametrize("family", ["mixtral", "llama"])
@pytest.mark.parametrize(("quant", "double_quant"), [("nf4", True), ("fp4", False), ("int8", False)])
def test_transformers_bnb_model_bytes(
    saved_models: dict[str, Path], family: str, quant: str, double_quant: bool
) -> None:
    if quant == "int8":
        bc = transformers.BitsAndBytesConfig(load_in_8bit=True)
    else:
        bc = transformers.BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=quant,
                                             bnb_4bit_use_double_quant=double_quant,
                                             bnb_4bit_compute_dtype=torch.bfloat16)  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = transformers.AutoModelForCausalLM.from_pretrained(
            saved_models[family], quantization_config=bc, dtype=torch.bfloat16, device_map="cpu"
        )
    cfg = TINY_MIXTRAL if family == "mixtral" else TINY_LLAMA
    spec = spec_from_config(cfg, name=family)
    qc = QuantConfig(quant=quant, double_quant=double_quant)
    assert _stored_bytes(model) == base_bytes(spec, qc)
    if family == "mixtral":
        # the router is a MixtralTopKRouter (a bare Parameter), not quantized by bitsandbytes
        assert type(model.model.layers[0].mlp.gate).__name__ == "MixtralTopKRouter"


SHAPES_8BIT = [(5000,), (100,), (300, 300), (64, 64), (63, 65), (4095,), (4096,), (1000, 257)]


@pytest.mark.parametrize(("name", "n_states"), [("AdamW8bit", 2), ("Lion8bit", 1), ("PagedAdamW8bit", 2)])
def test_bnb_8bit_optimizer_state_bytes(name: str, n_states: int) -> None:
    """bitsandbytes' 8-bit optimizers step on the CPU: every state tensor (values, absmax, shared qmaps)."""
    from peakmem.formulas.lowbit_optim import bnb_8bit_states
    from peakmem.model import Tensor

    optim = pytest.importorskip("bitsandbytes.optim")
    params = [torch.nn.Parameter(torch.randn(*s)) for s in SHAPES_8BIT]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        opt = getattr(optim, name)(params, lr=1e-3)
        for p in params:
            p.grad = torch.randn_like(p)
        opt.step()
    storages = {v.untyped_storage().data_ptr(): v.untyped_storage().nbytes()
                for st in opt.state.values() for v in st.values() if isinstance(v, torch.Tensor)}  # fmt: skip
    tensors = [(Tensor(name=str(i), module="m", shape=s, component="mlp", kind="other"), 1)
               for i, s in enumerate(SHAPES_8BIT)]  # fmt: skip
    assert sum(storages.values()) == bnb_8bit_states(tensors, n_states=n_states).total
