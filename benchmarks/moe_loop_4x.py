"""A tiny Mixtral trained for real on the CPU against peakmem's formulas, under the installed transformers:
the gap transformers 4.x's per-expert MoE loop leaves (not modelled yet).

Why: peakmem measures a derived MoE block with the project's transformers (5.x), whose experts run
``grouped_mm`` over all ``tokens x top-k`` routed rows at once. Before 5.0, Mixtral-style blocks
(``MixtralSparseMoeBlock``: 4.48.1 ``models/mixtral/modeling_mixtral.py`` l. 112-150; Qwen2-MoE and the other
per-expert ``nn.Linear`` types alike, ``peakmem.transformers_versions`` EXPERT_LINEAR_MODEL_TYPES) loop over
the experts, each over only the rows routed to it, so the layer's forward interior (under a checkpoint's
no_grad) and its backward's gradients in flight are one expert's, not all routed rows'. peakmem models that
loop for gpt-oss only (formulas/moe_loop.py). This script shows what the others' loop changes.

The job: Mixtral with 2 layers, hidden 256, 4 heads / 2 KV heads, 4 experts of 1024, top-2, vocab 512 (so
the MoE block, not the head, sets the peak), batch 2, bf16, LoRA r16 on q/k/v/o (experts frozen), full
checkpointing, CPU kernels; ``peakmem.measure`` (real steps, live-storage tracker) against
``estimate_training`` with ``transformers`` set to the installed release. Measured 2026-12-06 (session 15):

    transformers 4.48.1: seq 128 +3.0 %, 256 +7.3 %, 1024 +12.1 %, 2048 +13.9 % (formulas above
                         the measurement; forward 56.0 vs 34.8 MB at seq 1024: one expert's interior)
    transformers 5.23.0: seq 1024 -6.7 % (grouped_mm; backward 87.0 vs 93.2 MB)

Published points it bears on: fms-acceleration's Mixtral-8x7B QLoRA / LoRA rows (transformers 4.48.1:
+1.4..+6.8 %, two held-out high misses) and ms-swift's Qwen1.5-MoE LoRA (4.46: -21.5 %).

Run it with a transformers 4.x venv beside the project's (torch 2.13 CPU, transformers 4.48.1, peft 0.13.2),
e.g. ``PYTHONPATH=src /tmp/tf4-venv/bin/python benchmarks/moe_loop_4x.py``, or with the project's venv for
the 5.x row. Not a test; nothing imports it.
"""

from __future__ import annotations

import argparse
from typing import Any

LAYERS, HIDDEN, HEADS, KV_HEADS, EXPERTS, TOP_K, INTER, VOCAB, BATCH = 2, 256, 4, 2, 4, 2, 1024, 512, 2


def _shim_4x() -> None:
    """peakmem's measure calls 5.x names: map them onto a 4.x transformers / peft (no-ops on 5.x)."""
    import transformers

    if not transformers.__version__.startswith("4."):
        return
    import peft
    from transformers.modeling_utils import PreTrainedModel

    from_config = PreTrainedModel._from_config.__func__  # type: ignore[attr-defined]

    def _from_config(cls: Any, config: Any, **kw: Any) -> Any:
        if "dtype" in kw:
            kw["torch_dtype"] = kw.pop("dtype")
        return from_config(cls, config, **kw)

    def _enable(self: Any, activation_checkpointing_kwargs: Any = None) -> Any:
        return self.gradient_checkpointing_enable(
            gradient_checkpointing_kwargs=activation_checkpointing_kwargs
        )

    lora_config = peft.LoraConfig

    def _lora(**kw: Any) -> Any:
        return lora_config(
            **{k: v for k, v in kw.items() if k not in ("target_parameters", "lora_bias") or v}
        )

    PreTrainedModel._from_config = classmethod(_from_config)  # type: ignore[assignment]
    PreTrainedModel.activation_checkpointing_enable = _enable  # type: ignore[attr-defined]
    peft.LoraConfig = _lora


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seq", type=int, nargs="+", default=[128, 256, 1024, 2048])
    args = ap.parse_args(argv)
    _shim_4x()
    import transformers

    from peakmem.adapters import LoraConfig
    from peakmem.estimate import estimate_training
    from peakmem.hf import spec_from_config
    from peakmem.measure import measure_training
    from peakmem.measure.parity import FAMILIES
    from peakmem.training import Checkpointing, KernelPolicy, Method, Precision, TrainingSetup

    config = {
        **FAMILIES["llama"], "model_type": "mixtral", "architectures": ["MixtralForCausalLM"],
        "sliding_window": None, "num_hidden_layers": LAYERS, "hidden_size": HIDDEN,
        "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS, "num_local_experts": EXPERTS,
        "num_experts_per_tok": TOP_K, "intermediate_size": INTER, "vocab_size": VOCAB,
    }  # fmt: skip
    version = transformers.__version__
    print(f"transformers {version}: tiny Mixtral, LoRA r16 on q/k/v/o, full checkpointing, batch {BATCH}")
    print("| seq | measured peak B | formulas B | error | measured fwd / bwd | formulas fwd / bwd |")
    print("|---:|---:|---:|---:|---|---|")
    for seq in args.seq:
        setup = TrainingSetup(
            kernel_policy=KernelPolicy.CPU, precision=Precision.BF16, micro_batch=BATCH, seq_len=seq,
            method=Method.LORA, checkpointing=Checkpointing.FULL, transformers=version,
            lora=LoraConfig(rank=16, alpha=16, dropout=0.1, targets=("q_proj", "k_proj", "v_proj", "o_proj")),
        )  # fmt: skip
        got = measure_training(config, setup)
        est = estimate_training(spec_from_config(config), setup)
        m = {p.phase.value: p.bytes for p in got.phases}
        e = {p.phase.value: p.bytes for p in est.phases}
        error = est.peak_allocated_bytes / got.peak_allocated_bytes - 1
        print(f"| {seq} | {got.peak_allocated_bytes:,} | {est.peak_allocated_bytes:,} | {error:+.1%} | "
              f"{m['forward']:,} / {m['backward']:,} | {e['forward']:,} / {e['backward']:,} |")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
