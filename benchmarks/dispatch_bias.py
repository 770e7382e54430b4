"""Does a dispatch mode (peakmem's storage tracker, FakeTensorMode) change what backward holds at its peak?

While any ``TorchDispatchMode`` is active, ATen's ``isTensorSubclassLike`` is true (torch 2.13
aten/src/ATen/TensorSubclassLikeUtils.h: ``if (c10::impl::dispatch_mode_enabled()) return true;``), so the
autograd engine sums a tensor's gradient contributions out of place (torch/csrc/autograd/input_buffer.cpp
``accumulate``: ``old_var + var`` unless ``can_accumulate_inplace``, which requires ``!isTensorSubclassLike``)
and backward formulas that test ``areAnyTensorSubclassLike`` take their out-of-place branch. A plain run adds
in place. This script runs one forward + backward of tiny models (random weights, peakmem's own
``build_model`` / ``apply_adapter``) three ways and reads torch.profiler's raw CPU ``[memory]`` events (every
allocation and free, in order; no dispatch mode involved):

* ``plain``: no dispatch mode (what a real run allocates);
* ``noop``: under a pass-through ``TorchDispatchMode`` (the mode's effect alone);
* ``tracker``: under peakmem's ``LiveStorageTracker``, as ``peakmem measure`` runs.

Columns: the backward peak above the weights; the decoder layers' backward peak above the bytes alive when
the first layer's backward starts (marked by a hook on the final norm's input); how much more the mode
allocates in backward (its out-of-place sums: per layer); for the Llama cases also the backward-phase peak of
``peakmem measure`` (real tensors + tracker) and ``peakmem simulate --kernels cpu`` (FakeTensorMode +
tracker, the machinery ``peakmem derive`` measures block costs with), step 1, absolute bytes. Differences are
in units of T x H x b (tokens x hidden x bytes per element of the model dtype).

Result (torch 2.13 CPU, transformers 5.23; dispatch_bias.md): the mode allocates 8-22 T x H x b more per
layer in backward (its out-of-place sums), but none of it at a peak: plain, noop and tracker peaks agree to
the byte in every Llama case (full / LoRA, fp32 / bf16, tied / untied head, no / full checkpointing, a narrow
MLP) and in gpt2, gemma, mixtral, phi3, olmoe and qwen2; qwen3_moe's layer peak is 0.09 T x H x b higher at
H = 64 (1536 bytes at T = 128: twice at T = 256, the same at H = 128, a quarter with 8 experts, none with
moe_intermediate_size 64: a small routing-sized tensor at a tiny expert's peak, not a T x H one). measure and
simulate agree to the byte. The engine's sums come after the large temporaries they follow (the MLP's
T x I gradients, attention's) are freed, so one more T x H tensor there stays below the block's peak. A tied
head's gradient is summed out of place in a plain run too (the head's ``mm`` result is reached through a
transposed view, so ``can_accumulate_inplace`` fails either way). Where the summed tensors are the largest
alive (transformers 4.x's gpt-oss expert loop, weight-sized gradients) the extra tensor is at the peak:
formulas/moe_loop.py measures that one with the profiler.

QLoRA (``qloras``): bitsandbytes has no CPU training path here, so the model is the simulator's own
(peft on the meta model, each base Linear a ``Fake4bitLinear``: packed weight, a dequantized temporary around
each matmul in forward and backward, its output and peft's clone) materialised as real tensors; tiny Llama,
all-linear r8, amp-bf16 / bf16 x kbit_prep none / peft x dropout 0 / 0.05 x no / full checkpointing: the
mode allocates 12-38 T x H x b more per layer in backward, none of it at a peak (all 16 agree to the byte).
The adapted down projection's two input gradients (lora_A's and the 4-bit base's) are summed out of place
in a plain run too where lora_A takes the input as it is (amp-bf16, dropout 0: aten::add of T x I, in place
with dropout or peft's cast): that third T x I gradient is a real peak, after the base's dequantized weight
is freed (formulas/lora/deltas.py SRC_DEQUANT_RELIEF).

Run: ``PYTHONPATH=src python benchmarks/dispatch_bias.py [llama] [others] [qlora]`` (CPU, about a minute;
all three parts without arguments): dispatch_bias.md.
"""

from __future__ import annotations

import gc
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile
from torch.utils._python_dispatch import TorchDispatchMode

from peakmem.adapters import ALL_LINEAR, LoraConfig, QuantConfig
from peakmem.breakdown import Phase
from peakmem.measure.adapter import apply_adapter
from peakmem.measure.runner import build_model, make_batch, measure_training
from peakmem.measure.tracker import LiveStorageTracker
from peakmem.measure.trainer import make_trainer, model_dtype
from peakmem.simulate.derive.coverage import tiny_config
from peakmem.simulate.fakeify import QuantInfo, prepare_adapters
from peakmem.simulate.runner import build_meta_model, simulate_training
from peakmem.training import Checkpointing, Method, Precision, TrainingSetup

MARK = 12_345  # a uint8 tensor of this size marks the start of backward among the profiler's events
LAYERS_MARK = 12_347  # ... and one of this size the start of the decoder layers' backward
HIDDEN = 256
BASE = {
    "model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 512, "hidden_size": HIDDEN,
    "intermediate_size": 688, "num_attention_heads": 8, "num_key_value_heads": 4,
    "max_position_embeddings": 512, "bos_token_id": 0, "eos_token_id": 0, "tie_word_embeddings": False,
}  # fmt: skip


# (vocab, tied head, layers, intermediate size, checkpointing, batch, seq): H = 256 throughout
CASES = (
    (512, False, 2, 688, Checkpointing.NONE, 2, 128),
    (32, False, 4, 688, Checkpointing.NONE, 2, 128),
    (512, True, 2, 688, Checkpointing.NONE, 2, 128),
    (32, False, 2, 128, Checkpointing.NONE, 2, 128),  # a narrow MLP (I = H / 2)
    (32, False, 2, 688, Checkpointing.FULL, 2, 128),
    (32, False, 2, 128, Checkpointing.FULL, 2, 128),
    # a tied head with few tokens: backward's last instant (all gradients alive, the embedding's gradient
    # added to the head's) is its peak, as in Llama-3.2-1B at short sequences
    (4096, True, 2, 688, Checkpointing.NONE, 1, 16),
    (4096, False, 2, 688, Checkpointing.NONE, 1, 16),
)


# other architectures (transformers' default configs shrunk as ``peakmem derive`` does), T = 2 x 64
OTHERS = ("gpt2", "gemma", "qwen3_moe", "mixtral", "phi3", "olmoe", "qwen2")
FINAL_NORMS = ("model.norm", "transformer.ln_f", "model.final_layernorm")


class _Noop(TorchDispatchMode):
    """A dispatch mode that only forwards each op: what any mode does to ATen's branch choices."""

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        return func(*args, **(kwargs or {}))


@dataclass(frozen=True)
class Profiled:
    backward_peak: int  # most bytes alive during backward, above the weights (alive before the step)
    backward_allocated: int  # sum of all allocations during backward
    layers_peak: int  # most bytes alive in the decoder layers' backward, above those alive when it starts


def real_model(config: dict[str, Any], setup: TrainingSetup) -> tuple[torch.nn.Module, QuantInfo]:
    """The model ``peakmem measure`` builds (full fine-tuning or LoRA), random weights."""
    model = build_model(config, setup)
    model.to(dtype=model_dtype(setup.precision))
    return apply_adapter(model, setup), QuantInfo()


def qlora_model(config: dict[str, Any], setup: TrainingSetup) -> tuple[torch.nn.Module, QuantInfo]:
    """QLoRA as ``peakmem simulate`` builds it (peft on the meta model, each base Linear a
    :class:`~peakmem.simulate.fakeify.Fake4bitLinear`, the float weights as ``kbit_prep`` leaves them), then
    materialised as real CPU tensors: the stand-in allocates its packed weight, dequantized temporaries,
    output and peft's clone for real."""
    model = build_meta_model(config, setup)
    quant = prepare_adapters(model, setup, setup.lora)
    model.to_empty(device="cpu")
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            if p.is_floating_point():
                p.copy_(torch.randn(p.shape, generator=gen) * 0.02)
    return model, quant


def profiled_step(
    config: dict[str, Any], setup: TrainingSetup, how: str, build: Any = real_model
) -> Profiled:
    """One forward + backward under ``how`` (plain, noop, tracker), from the profiler's memory events;
    the forward under the precision's autocast (the trainer's, on the CPU)."""
    model, quant = build(config, setup)
    model.train()
    if setup.checkpointing == Checkpointing.FULL:  # as peakmem's runner does (transformers' default kwargs)
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    batch = make_batch(model, setup, torch.device("cpu"), torch.Generator().manual_seed(0))
    tracker = LiveStorageTracker(device_type="cpu") if how == "tracker" else None
    if tracker is not None:
        tracker.register_module(model)
        quant.register(tracker)
    modes: dict[str, AbstractContextManager[Any] | None] = {"plain": nullcontext(), "noop": _Noop()}
    mode = modes.get(how) or tracker
    assert mode is not None
    norm = next((m for n, m in model.named_modules() if n.endswith(FINAL_NORMS)), None)

    def mark_layers(_: Any, args: tuple[torch.Tensor, ...], __: Any) -> None:
        def hook(_: torch.Tensor) -> None:
            torch.empty(LAYERS_MARK, dtype=torch.uint8)

        args[0].register_hook(hook)

    if norm is not None:
        norm.register_forward_hook(mark_layers)
    autocast = make_trainer(model, setup, torch.device("cpu"), None).autocast()
    gc.collect()
    gc.disable()
    try:
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof, mode:
            with autocast:
                loss = model(**batch).loss
            mark = torch.empty(MARK, dtype=torch.uint8)
            del mark
            loss.backward()
            del loss
    finally:
        gc.enable()
    events = sorted(
        (e.start_ns(), e.nbytes())
        for e in prof.profiler.kineto_results.events()
        if e.name() == "[memory]" and str(e.device_type()).endswith("CPU")
    )
    live = peak = allocated = layers_peak = 0
    seen = False
    layers_start = None
    for _, nbytes in events:
        if abs(nbytes) == MARK:
            seen = True
            continue
        if abs(nbytes) == LAYERS_MARK:
            layers_start = live if layers_start is None else layers_start
            continue
        live += nbytes
        if seen:
            peak = max(peak, live)
            allocated += max(nbytes, 0)
        if layers_start is not None:
            layers_peak = max(layers_peak, live - layers_start)
    return Profiled(peak, allocated, layers_peak)


def phase_peak(est: Any, phase: Phase) -> int:
    """Step 1's peak in ``phase`` of a measured or simulated :class:`~peakmem.estimate.Estimate`."""
    return int(est.extra["steps"][0]["phases"][phase.value])


PEAK_COLUMNS = ("plain bwd", "noop - plain", "tracker - plain", "layers bwd plain", "noop - plain",
                "tracker - plain", "noop extra allocs / layer")  # fmt: skip


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def _peaks(
    config: dict[str, Any], setup: TrainingSetup, unit: int, layers: int, build: Any = real_model
) -> list[str]:
    """The :data:`PEAK_COLUMNS` cells: the plain run's peaks in bytes, the modes' differences in ``unit``."""
    p = {how: profiled_step(config, setup, how, build) for how in ("plain", "noop", "tracker")}
    plain = p["plain"]
    extra = (p["noop"].backward_allocated - plain.backward_allocated) / unit / layers
    return [
        str(plain.backward_peak),
        *(f"{(p[how].backward_peak - plain.backward_peak) / unit:+.2f}" for how in ("noop", "tracker")),
        str(plain.layers_peak),
        *(f"{(p[how].layers_peak - plain.layers_peak) / unit:+.2f}" for how in ("noop", "tracker")),
        f"{extra:.2f}",
    ]


def llamas() -> None:
    head = ["vocab, tied, layers, I, ckpt, b x s", "setup", "T x H x b", *PEAK_COLUMNS, "measure bwd",
            "simulate bwd", "sim - measure"]  # fmt: skip
    print(_row(head) + "\n" + _row(["---"] * len(head)))
    for vocab, tied, layers, inter, ckpt, batch, seq in CASES:
        config = {**BASE, "num_hidden_layers": layers, "vocab_size": vocab, "tie_word_embeddings": tied,
                  "intermediate_size": inter}  # fmt: skip
        for method in (Method.FULL, Method.LORA):
            for precision in (Precision.FP32, Precision.BF16):
                setup = TrainingSetup(
                    method=method, precision=precision, micro_batch=batch, seq_len=seq, checkpointing=ckpt
                )
                unit = batch * seq * HIDDEN * model_dtype(precision).itemsize
                mb = phase_peak(measure_training(config, setup, steps=1), Phase.BACKWARD)
                sb = phase_peak(simulate_training(config, setup, kernels="cpu", steps=1), Phase.BACKWARD)
                name = f"{vocab}, {tied}, {layers}, {inter}, {ckpt.value}, {batch}x{seq}"
                cells = [
                    name,
                    f"{method.value} {precision.value}",
                    str(unit),
                    *_peaks(config, setup, unit, layers),
                ]
                print(_row([*cells, str(mb), str(sb), f"{(sb - mb) / unit:+.2f}"]), flush=True)


def others() -> None:
    head = ["model_type", "setup", "T x H x b", *PEAK_COLUMNS]
    print("\n" + _row(head) + "\n" + _row(["---"] * len(head)))
    for model_type in OTHERS:
        config = tiny_config(model_type)
        hidden = next(config[k] for k in ("hidden_size", "n_embd") if isinstance(config.get(k), int))
        layers = next(config[k] for k in ("num_hidden_layers", "n_layer") if isinstance(config.get(k), int))
        for method in (Method.FULL, Method.LORA):
            setup = TrainingSetup(method=method, precision=Precision.BF16, micro_batch=2, seq_len=64)
            unit = setup.micro_batch * setup.seq_len * hidden * 2
            try:
                cells = _peaks(config, setup, unit, layers)
            except Exception as err:  # an architecture this transformers cannot build or run here
                cells = [f"failed: {type(err).__name__}"]
            print(_row([model_type, f"{method.value} bf16", str(unit), *cells]), flush=True)


def qloras() -> None:
    """QLoRA through the simulator's 4-bit stand-in on real tensors (bitsandbytes has no CPU training path
    here): tiny Llama, all-linear r8, T = 2 x 128."""
    head = ["precision, kbit_prep, dropout, ckpt", "T x H x b", *PEAK_COLUMNS]
    print("\n" + _row(head) + "\n" + _row(["---"] * len(head)))
    config = {**BASE, "num_hidden_layers": 2}
    for precision in (Precision.AMP_BF16, Precision.BF16):
        for prep in ("none", "peft"):
            for dropout in (0.0, 0.05):
                for ckpt in (Checkpointing.NONE, Checkpointing.FULL):
                    setup = TrainingSetup(
                        method=Method.QLORA, precision=precision, micro_batch=2, seq_len=128,
                        checkpointing=ckpt, quant=QuantConfig(kbit_prep=prep),
                        lora=LoraConfig(targets=(ALL_LINEAR,), dropout=dropout),
                    )  # fmt: skip
                    unit = setup.micro_batch * setup.seq_len * HIDDEN * 2  # bf16 compute
                    cells = _peaks(config, setup, unit, 2, qlora_model)
                    name = f"{precision.value}, {prep}, {dropout}, {ckpt.value}"
                    print(_row([name, str(unit), *cells]), flush=True)


if __name__ == "__main__":
    import sys

    parts = {"llama": llamas, "others": others, "qlora": qloras}
    for part in sys.argv[1:] or parts:
        parts[part]()
