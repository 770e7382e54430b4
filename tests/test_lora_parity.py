"""Parity: the analytic estimate against real CPU training runs, for LoRA and for 8-bit-free optimizers.

LoRA runs are peft 0.21.2 models (``get_peft_model``, fp32 adapters by default) trained by
``peakmem.measure`` on the CPU: the runner builds the transformers model, peft wraps it, and the
tracker measures every live tensor (see ``_measure_lora``). The analytic side is
``estimate_training`` with ``KernelPolicy.CPU``. Peak within 5 % (issue 4).

Every case holds the 5 % tolerance (no expected failure); the comments above the two tests' helpers
record the deviations fixed on the way.
"""

from __future__ import annotations

import itertools
import warnings
from dataclasses import replace
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

from peakmem.adapters import LoraConfig  # noqa: E402
from peakmem.breakdown import Estimate  # noqa: E402
from peakmem.estimate import estimate_training  # noqa: E402
from peakmem.hf import spec_from_config  # noqa: E402
from peakmem.measure import runner  # noqa: E402
from peakmem.measure.parity import FAMILIES  # noqa: E402
from peakmem.training import (  # noqa: E402
    AttentionKernel,
    Checkpointing,
    KernelPolicy,
    Method,
    OptimizerImpl,
    OptimizerName,
    Precision,
    TrainingSetup,
)

pytestmark = [pytest.mark.torch, pytest.mark.slow]
PEAK_TOLERANCE = 0.05
QV = {"gpt2": ("c_attn",), "llama": ("q_proj", "v_proj"), "qwen2": ("q_proj", "v_proj")}
LAYOUTS = {  # (attention, checkpointing, batch, seq)
    "sdpa-b2s64": (AttentionKernel.SDPA, Checkpointing.NONE, 2, 64),
    "eager-b4s64": (AttentionKernel.EAGER, Checkpointing.NONE, 4, 64),
    "sdpa-ckpt-b1s128": (AttentionKernel.SDPA, Checkpointing.FULL, 1, 128),
}


# (gpt2, fp32, qv, sdpa-ckpt-b1s128) was -9.3 % until formulas/lora.py counted the frozen down projection's
# never-saved input (the MLP backward transient is net of it) and, under full checkpointing, the embedding
# output made a leaf by enable_input_require_grads (+ its dropout mask); now -2.3 %.
def _measure_lora(config: dict[str, Any], setup: TrainingSetup, lora: LoraConfig) -> Estimate:
    """peakmem.measure's runner with the model wrapped by :func:`peakmem.measure.adapter.apply_adapter`
    after ``model.to(device, dtype)``. The trainers train what requires grad, so the frozen base gets no
    gradient or optimizer state. Until the runner calls the hook itself, it is spliced in here."""
    from peakmem.measure.adapter import apply_adapter

    build, dtype_of = runner.build_model, runner.model_dtype
    dtype = dtype_of(setup.precision)
    lora_setup = replace(setup, method=Method.LORA, lora=lora)

    def build_lora(cfg: dict[str, Any], s: TrainingSetup, *, seed: int = 0) -> Any:
        return apply_adapter(build(cfg, s, seed=seed).to(dtype), lora_setup)

    runner.build_model = build_lora
    runner.model_dtype = lambda precision: None  # keep peft's adapter dtype
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return runner.measure_training(config, setup, device="cpu", steps=2)
    finally:
        runner.build_model, runner.model_dtype = build, dtype_of


# every (family, precision, targets) with two of the three layouts, rotating so that all appear
LORA_CASES = [
    (fam, prec, tg, layout)
    for i, (fam, prec, tg) in enumerate(itertools.product(FAMILIES, ("fp32", "bf16"), ("all-linear", "qv")))
    for layout in (list(LAYOUTS)[i % 3], list(LAYOUTS)[(i + 1) % 3])
]


@pytest.mark.parametrize(("family", "precision", "targets", "layout"), LORA_CASES,
                         ids=["-".join(c) for c in LORA_CASES])  # fmt: skip
def test_lora_peak_matches_measurement(family: str, precision: str, targets: str, layout: str) -> None:
    attention, ckpt, batch, seq = LAYOUTS[layout]
    lora = LoraConfig(rank=8, targets=("all-linear",) if targets == "all-linear" else QV[family])
    setup = TrainingSetup(precision=Precision(precision), attention=attention, checkpointing=ckpt,
                          micro_batch=batch, seq_len=seq, kernel_policy=KernelPolicy.CPU)  # fmt: skip
    measured = _measure_lora(FAMILIES[family], setup, lora)
    spec = spec_from_config(FAMILIES[family], name=family)
    analytic = estimate_training(spec, replace(setup, method=Method.LORA, lora=lora))
    assert analytic.trainable_params == measured.trainable_params
    err = analytic.peak_allocated_bytes / measured.peak_allocated_bytes - 1
    assert abs(err) <= PEAK_TOLERANCE, (err, measured.peak_phase, analytic.peak_phase)


# every (optimizer, family) with both implementations, precisions alternating
OPT_CASES = [
    (opt, impl, fam, ("fp32", "bf16")[(i + j) % 2])
    for i, (opt, fam) in enumerate(itertools.product(("sgd", "adafactor", "lion"), FAMILIES))
    for j, impl in enumerate(("foreach", "for-loop"))
]


# (adafactor, foreach, llama, fp32) was -6.0 % until formulas/optimizer.py counted the foreach step's
# var_estimates over the whole group (now 0.0 %).
@pytest.mark.parametrize(("optimizer", "impl", "family", "precision"), OPT_CASES,
                         ids=["-".join(c) for c in OPT_CASES])  # fmt: skip
def test_optimizer_grid_peak_matches_measurement(
    optimizer: str, impl: str, family: str, precision: str
) -> None:
    from peakmem.measure import measure_training

    setup = TrainingSetup(precision=Precision(precision), optimizer=OptimizerName(optimizer),
                          optimizer_impl=OptimizerImpl(impl), micro_batch=2, seq_len=64,
                          kernel_policy=KernelPolicy.CPU)  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        measured = measure_training(FAMILIES[family], setup)
    analytic = estimate_training(spec_from_config(FAMILIES[family], name=family), setup)
    err = analytic.peak_allocated_bytes / measured.peak_allocated_bytes - 1
    assert abs(err) <= PEAK_TOLERANCE, (err, measured.peak_phase, analytic.peak_phase)


BERT = {
    "model_type": "bert", "architectures": ["BertForSequenceClassification"], "vocab_size": 1000,
    "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
    "max_position_embeddings": 128,
}  # fmt: skip


@pytest.mark.parametrize(("precision", "targets"), [("fp32", ("all-linear",)), ("bf16", ("query", "value"))])
def test_lora_bert_sequence_classification(precision: str, targets: tuple[str, ...]) -> None:
    """peft's SEQ_CLS: the classifier is a trainable modules_to_save copy; all-linear adapts the pooler."""
    setup = TrainingSetup(precision=Precision(precision), attention=AttentionKernel.EAGER, micro_batch=4,
                          seq_len=64, kernel_policy=KernelPolicy.CPU)  # fmt: skip
    lora = LoraConfig(rank=8, targets=targets)
    measured = _measure_lora(BERT, setup, lora)
    analytic = estimate_training(
        spec_from_config(BERT, name="bert"), replace(setup, method=Method.LORA, lora=lora)
    )
    assert analytic.trainable_params == measured.trainable_params
    err = analytic.peak_allocated_bytes / measured.peak_allocated_bytes - 1
    assert abs(err) <= PEAK_TOLERANCE, err


@pytest.mark.parametrize(("quant", "double_quant"), [("nf4", True), ("fp4", False)])
def test_qlora_on_cpu_matches_measurement(quant: str, double_quant: bool, tmp_path: Any) -> None:
    """bitsandbytes 0.50.2 runs 4-bit layers on the CPU (dequantize + F.linear, as CUDA does for training
    batches): a tiny Llama loaded with BitsAndBytesConfig, LoRA by peft, trained by peakmem.measure. The
    tracker sees parameter storage but not the QuantState tensors made at load (absmax, code; their bytes
    are checked against bitsandbytes in test_bnb_storage_torch.py), so the analytic side is compared
    without them."""
    pytest.importorskip("bitsandbytes")
    import torch
    import transformers

    from peakmem.adapters import QuantConfig
    from peakmem.measure.adapter import apply_adapter

    cfg = FAMILIES["llama"]
    torch.manual_seed(0)
    base = transformers.AutoModelForCausalLM.from_config(
        transformers.AutoConfig.for_model(**{k: v for k, v in cfg.items() if k != "architectures"}),
        dtype=torch.bfloat16,
    )
    base.save_pretrained(tmp_path)
    bnb_config = transformers.BitsAndBytesConfig(
        load_in_4bit=True, bnb_4bit_quant_type=quant, bnb_4bit_use_double_quant=double_quant,
        bnb_4bit_compute_dtype=torch.bfloat16,
    )  # fmt: skip
    lora = LoraConfig(rank=8)
    setup = TrainingSetup(precision=Precision.BF16, micro_batch=2, seq_len=64, kernel_policy=KernelPolicy.CPU)

    def build(config: dict[str, Any], s: TrainingSetup, *, seed: int = 0) -> Any:
        model = transformers.AutoModelForCausalLM.from_pretrained(
            tmp_path, quantization_config=bnb_config, dtype=torch.bfloat16, device_map="cpu"
        )
        return apply_adapter(model, replace(setup, method=Method.LORA, lora=lora))

    saved = runner.build_model, runner.model_dtype
    runner.build_model, runner.model_dtype = build, lambda precision: None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            measured = runner.measure_training(cfg, setup, device="cpu", steps=2)
    finally:
        runner.build_model, runner.model_dtype = saved
    qc = QuantConfig(quant=quant, double_quant=double_quant)
    spec = spec_from_config(cfg, name="llama")
    analytic = estimate_training(spec, replace(setup, method=Method.QLORA, lora=lora, quant=qc))
    from peakmem.formulas.qlora import base_bytes, base_rows

    quant_states = base_bytes(spec, qc) - sum(
        (r.params // 2 if "absmax" in r.storage else r.bytes) for r in base_rows(spec, qc)
    )
    assert analytic.trainable_params == measured.trainable_params
    err = (analytic.peak_allocated_bytes - quant_states) / measured.peak_allocated_bytes - 1
    assert abs(err) <= PEAK_TOLERANCE, err
