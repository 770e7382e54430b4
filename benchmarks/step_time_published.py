"""The step-time model (``peakmem.formulas.step_time``) against published training throughput.

Run: ``.venv/bin/python benchmarks/step_time_published.py``.

``fit`` ranks the changes that make a job fit by their cost in step time, so what matters most is the
*ratio* between two setups (does checkpointing cost ~25 %? is QLoRA slower than LoRA?); the absolute
tokens/s hang on the assumed MFU per GPU generation (``MFU_BY_ARCH``). Points, with what each table
states (torchtune README, pytorch/torchtune@a9ea6d5; all compiled, bf16, packed data, one GPU):

* "Optimization flags": Llama-3.2-3B, batch 2 x 4096, A100, techniques added one after the other:
  chunked cross-entropy 9174 tokens/s, + activation checkpointing 7210, + optimizer in backward 7309,
  + activation offloading 7301, + 8-bit AdamW 6960; LoRA (r=64, no optimizer in backward, AdamW)
  8210; QLoRA (NF4 base) 8035.
* "Memory and training speed": Llama-3.1-8B, batch 2 x 2048: LoRA 3083 (RTX 4090) and 4699
  (RTX A6000), QLoRA 2413 (RTX 4090), full fine-tune 2579 (A6000). torchtune's 8B single-device
  configs enable activation checkpointing.

The last column is the MFU each published figure implies under this model's FLOP count: above 100 %
a figure cannot be matched by any MFU (two of torchtune's 8B rows: with the checkpointing their
configs enable, LoRA at 4699 tokens/s on an A6000 implies 140 % of its 154.8 TFLOPS dense peak), so
those rows are shown but left out of the summary. Not modelled, so left at 0: the optimizer step's
own time (8-bit AdamW, optimizer in backward),
activation offloading's copies (overlapped on side streams), compile's gains. Prints a table and
exits 0: the MFU is an assumption, and these are informative.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from peakmem.adapters import LoraConfig
from peakmem.estimate import estimate_training
from peakmem.formulas import step_time as st
from peakmem.resolve import resolve_gpu, resolve_model
from peakmem.training import Checkpointing, LossImpl, Method, OptimizerName, Precision, TrainingSetup

SRC = "torchtune README (pytorch/torchtune@a9ea6d5)"


@dataclass(frozen=True)
class Point:
    label: str
    model: str
    gpu: str
    setup: TrainingSetup
    published_tokens_per_s: float
    previous: str = ""  # the row this one's published change is relative to


_B3 = TrainingSetup(precision=Precision.BF16, micro_batch=2, seq_len=4096, loss=LossImpl.CHUNKED_COMPILED)
_B3_AC = replace(_B3, checkpointing=Checkpointing.FULL)
_B8 = TrainingSetup(precision=Precision.BF16, micro_batch=2, seq_len=2048, checkpointing=Checkpointing.FULL,
                    loss=LossImpl.CHUNKED_COMPILED)  # fmt: skip
_OFF = replace(_B3_AC, optimizer_in_backward=True, activation_offload=True)
_A100, _A6000, _4090 = "a100-80gb", "rtx-a6000", "rtx-4090"
# torchtune's adapters (recipes/configs/llama3_2/3B_lora_single_device.yaml, llama3_1/8B_lora_single_device
# .yaml): q, v, output projections and the MLP; rank 64 (3B) and 8 (8B)
_TARGETS = ("q_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
_TT3, _TT8 = (LoraConfig(rank=r, alpha=2 * r, targets=_TARGETS, adapter_dtype="base") for r in (64, 8))
_LORA3, _QLORA3 = (
    replace(_B3_AC, method=m, activation_offload=True, lora=_TT3) for m in (Method.LORA, Method.QLORA)
)
_LORA8, _QLORA8 = (replace(_B8, method=m, lora=_TT8) for m in (Method.LORA, Method.QLORA))
POINTS = (
    Point("3B chunked CE", "llama-3.2-3b", _A100, _B3, 9174),
    Point("3B + checkpointing", "llama-3.2-3b", _A100, _B3_AC, 7210, "3B chunked CE"),
    Point("3B + optimizer in backward", "llama-3.2-3b", _A100, replace(_B3_AC, optimizer_in_backward=True),
          7309, "3B + checkpointing"),
    Point("3B + activation offloading", "llama-3.2-3b", _A100, _OFF, 7301, "3B + optimizer in backward"),
    Point("3B + 8-bit AdamW", "llama-3.2-3b", _A100, replace(_OFF, optimizer=OptimizerName.ADAMW_8BIT), 6960,
          "3B + activation offloading"),
    Point("3B LoRA", "llama-3.2-3b", _A100, _LORA3, 8210, "3B + checkpointing"),
    Point("3B QLoRA", "llama-3.2-3b", _A100, _QLORA3, 8035, "3B LoRA"),
    Point("8B full (A6000)", "llama-3.1-8b", _A6000, _B8, 2579),
    Point("8B LoRA (A6000)", "llama-3.1-8b", _A6000, _LORA8, 4699, "8B full (A6000)"),
    Point("8B LoRA (4090)", "llama-3.1-8b", _4090, _LORA8, 3083),
    Point("8B QLoRA (4090)", "llama-3.1-8b", _4090, _QLORA8, 2413, "8B LoRA (4090)"),
)  # fmt: skip


def predicted(p: Point) -> tuple[float, float]:
    """(predicted tokens/s, the MFU the published figure implies)."""
    spec = resolve_model(p.model)
    rates = st.rates_for(resolve_gpu(p.gpu))
    sf = st.spec_flops(spec)
    trainable = estimate_training(spec, p.setup).trainable_params
    t = st.step_time(sf, p.setup, rates, st.Layout(), trainable_params=trainable, params=spec.params)
    adapters = trainable if p.setup.method is not Method.FULL else 0
    flops = st.training_flops_per_token(sf, p.setup, adapter_params=adapters)
    implied = p.published_tokens_per_s * flops / (rates.tflops * 1e12)
    return t.tokens_per_s, implied


def main() -> int:
    found = {p.label: predicted(p) for p in POINTS}
    pred = {k: v[0] for k, v in found.items()}
    implied = {k: v[1] for k, v in found.items()}
    pub = {p.label: p.published_tokens_per_s for p in POINTS}
    possible = {k for k, m in implied.items() if m <= 1.0}
    print(f"step-time model vs {SRC}; MFU assumed per GPU generation (step_time.MFU_BY_ARCH)\n")
    print(f"{'point':28s} {'GPU':10s} {'published':>10s} {'predicted':>10s} {'error':>7s}   "
          f"{'change vs':28s} {'published':>9s} {'predicted':>9s} {'implied MFU':>11s}")  # fmt: skip
    ratio_errors = []
    for p in POINTS:
        err = pred[p.label] / pub[p.label] - 1
        line = f"{p.label:28s} {p.gpu:10s} {pub[p.label]:10,.0f} {pred[p.label]:10,.0f} {err:+7.1%}"
        if p.previous:
            d_pub = pub[p.label] / pub[p.previous] - 1
            d_pred = pred[p.label] / pred[p.previous] - 1
            if {p.label, p.previous} <= possible:
                ratio_errors.append(abs(d_pred - d_pub))
            line += f"   {p.previous:28s} {d_pub:+9.1%} {d_pred:+9.1%}"
        else:
            line += f"   {'':28s} {'':9s} {'':9s}"
        line += f" {implied[p.label]:10.0%}" + ("" if p.label in possible else " (above peak)")
        print(line)
    print(f"\nsummary over the {len(possible)} points below the GPU's peak:")
    abs_errors = [abs(pred[k] / pub[k] - 1) for k in possible]
    print(f"absolute tokens/s: mean |error| {sum(abs_errors) / len(abs_errors):.1%}, "
          f"worst {max(abs_errors):.1%}")  # fmt: skip
    print(f"changes between rows: mean |error| {sum(ratio_errors) / len(ratio_errors):.1%} points, "
          f"worst {max(ratio_errors):.1%} points")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
