"""A tiny Mixtral trained for real on the CPU against peakmem's formulas, under the installed transformers:
transformers 4.x's per-expert MoE loop (formulas/activations/expert_loop.py) against 5.x's grouped_mm.

Before 5.0, Mixtral-style blocks (``MixtralSparseMoeBlock``: 4.48.1 ``models/mixtral/modeling_mixtral.py``
l. 112-150; Qwen2-MoE, OLMoE, PhiMoE and the other per-expert ``nn.Linear`` types alike,
``peakmem.transformers_versions`` EXPERT_LINEAR_MODEL_TYPES) loop over the experts, each over only the rows
routed to it, so the layer's forward interior (under a checkpoint's no_grad), its recomputation's end and its
backward's gradients in flight are one expert's, not all routed rows'; 5.x runs ``grouped_mm`` over all
``tokens x top-k`` rows at once.

The job: Mixtral with 2 layers, hidden 256, 4 heads / 2 KV heads, 4 experts of 1024, top-2, vocab 512 (so
the MoE block, not the head, sets the peak), batch 2, bf16, CPU kernels; ``--method`` lora (r16 on q/k/v/o,
experts frozen), lora-experts (also w1/w2/w3) or full; ``--checkpointing`` full or none. ``peakmem.measure``
(real steps, live-storage tracker) against ``estimate_training`` with ``transformers`` set to the installed
release. Error = formulas / measured - 1 at seq 128 / 256 / 1024 / 2048, before (main 6c9aa8f: grouped_mm
formulas for every release) and after (the loop modelled), measured 2026-12-06 (torch 2.13 CPU, transformers
4.48.1, peft 0.13.2):

    method        checkpointing  before                          after
    lora          full           +3.0 / +7.3 / +12.1 / +13.9 %   -2.2 / -0.4 / +0.1 / +0.6 %
    lora          none           +0.2 / +0.1 / +0.1 / +0.1 %     +1.3 / +1.8 / +2.3 / +2.5 %
    full          full           +0.0 / +0.0 / +10.4 / +12.6 %   +0.0 / +0.0 / -1.7 / -2.2 %
    full          none           +0.0 / +0.0 / -4.2 / -5.6 %     +0.0 / -1.4 / -2.5 / -2.9 %
    lora-experts  full           +1.8 / +3.3 / +4.9 / +6.3 %     -2.4 / -2.0 / -2.1 / -1.2 %
    lora-experts  none           +0.5 / +0.5 / +0.2 / +0.1 %     +0.5 / +1.0 / +1.3 / +1.3 %
    transformers 5.23.0 (grouped_mm, unchanged), full checkpointing, seq 1024: lora -6.7 %, full +1.8 %

What is left is not the MoE block's: every MoE saved tensor matches the tracker's one by one (seq 1024, LoRA,
no checkpointing: w1 / act / w3 outputs 3 S x I, the down outputs and the weighted outputs S x h each, the
``nonzero`` indices 16 B a row, the bf16 weight slices); 4.48.1's ``sdpa_attention_forward`` saves k and v
repeated to every head (``repeat_kv``, l. 30-31: +T x h per layer at this GQA, not modelled: every 4.x GQA
job), and peft 0.13.2's CPU dropout masks for q/k/v read below the formulas' (the LoRA rows' +1..+2.5 %;
before, grouped_mm's missing weighted outputs hid both).

Rows per expert (``--counts``, the measured batch, step 1's weights, seq 1024: 4096 routed rows a layer,
1024 balanced): layer 0 [1112, 1108, 926, 950], layer 1 [1209, 1828, 521, 538]; the formulas take the
balanced ceil(S / E) (expert_loop.py BALANCED_ROWS), which the loop's last expert (the one the
recomputation's end and the first backward step hold) is near or below here; a skewed router moves it.

Published points it bears on (all held out): fms-acceleration's Mixtral-8x7B QLoRA / LoRA rows (transformers
4.48.1: +1.4..+6.8 % -> -1.3..+2.6 %) and ms-swift's Qwen1.5-MoE LoRA (4.40: -21.5 % -> -21.4 %, reserved).

Run it with a transformers 4.x venv beside the project's (torch 2.13 CPU, transformers 4.48.1, peft 0.13.2),
e.g. ``PYTHONPATH=src /tmp/tf4-venv/bin/python benchmarks/moe_loop_4x.py --method full --checkpointing
none``, or with the project's venv for the 5.x row. Not a test; nothing imports it.
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


METHODS = {  # --method: what is trained
    "lora": ("q_proj", "k_proj", "v_proj", "o_proj"),  # attention LoRA, experts frozen
    "lora-experts": ("q_proj", "k_proj", "v_proj", "o_proj", "w1", "w2", "w3"),  # LoRA on the experts too
    "full": (),  # full fine-tuning: every expert trained
}


def routing_counts(config: dict[str, Any], setup: Any) -> list[list[int]]:
    """Rows each expert receives in each layer on the measured batch (step 1's weights, fp32 forward)."""
    import torch

    from peakmem.measure.runner import build_model, make_batch

    model = build_model(config, setup, seed=0)
    counts: list[list[int]] = []

    def hook(_module: Any, _args: Any, logits: Any) -> None:
        top = torch.topk(logits, TOP_K, dim=-1).indices.flatten()
        counts.append(torch.bincount(top, minlength=EXPERTS).tolist())

    for layer in model.model.layers:
        layer.block_sparse_moe.gate.register_forward_hook(hook)
    with torch.no_grad():
        model(**make_batch(model, setup, torch.device("cpu"), torch.Generator().manual_seed(0)))
    return counts


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seq", type=int, nargs="+", default=[128, 256, 1024, 2048])
    ap.add_argument("--checkpointing", choices=("full", "none"), default="full")
    ap.add_argument("--method", choices=tuple(METHODS), default="lora")
    ap.add_argument("--counts", action="store_true", help="print the rows each expert is routed")
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
    targets = METHODS[args.method]
    what = f"{args.method}, checkpointing {args.checkpointing}, batch {BATCH}"
    print(f"transformers {version}: tiny Mixtral, {what}")
    print("| seq | measured peak B | formulas B | error | measured fwd / bwd | formulas fwd / bwd |")
    print("|---:|---:|---:|---:|---|---|")
    for seq in args.seq:
        method = (
            {"method": Method.FULL}
            if not targets
            else {"method": Method.LORA, "lora": LoraConfig(rank=16, alpha=16, dropout=0.1, targets=targets)}
        )
        setup = TrainingSetup(
            kernel_policy=KernelPolicy.CPU, precision=Precision.BF16, micro_batch=BATCH, seq_len=seq,
            checkpointing=Checkpointing(args.checkpointing), transformers=version, **method,
        )  # fmt: skip
        got = measure_training(config, setup)
        est = estimate_training(spec_from_config(config), setup)
        m = {p.phase.value: p.bytes for p in got.phases}
        e = {p.phase.value: p.bytes for p in est.phases}
        error = est.peak_allocated_bytes / got.peak_allocated_bytes - 1
        print(f"| {seq} | {got.peak_allocated_bytes:,} | {est.peak_allocated_bytes:,} | {error:+.1%} | "
              f"{m['forward']:,} / {m['backward']:,} | {e['forward']:,} / {e['backward']:,} |")  # fmt: skip
        if args.counts:
            print(f"  rows per expert, per layer: {routing_counts(config, setup)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
