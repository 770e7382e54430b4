"""``measure_training``: build a transformers model from its config, train a few real steps, and
report what was allocated, by category and phase, as an :class:`~peakmem.breakdown.Estimate`.

On CPU every byte comes from :class:`~peakmem.measure.tracker.LiveStorageTracker` (exact live
tensor storage, views counted once). On CUDA the totals come from ``torch.cuda`` peak
statistics per phase and the device total from NVML (``pynvml``) or ``torch.cuda.mem_get_info``;
the tracker still runs to split the bytes by category.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

import torch

from peakmem.breakdown import Category, Estimate, MemoryItem, PerParamRow, Phase, PhasePeak
from peakmem.errors import InputError
from peakmem.measure.adapter import apply_adapter
from peakmem.measure.float8 import convert_float8, float8_notes
from peakmem.measure.op_sac import op_context_fn
from peakmem.measure.tracker import INPUT, LiveStorageTracker, Snapshot
from peakmem.measure.trainer import make_trainer, model_dtype
from peakmem.training import (
    AttentionKernel,
    Checkpointing,
    Framework,
    Method,
    Precision,
    TrainingSetup,
    checkpointed_layers,
)

PHASES = (Phase.LOAD, Phase.FORWARD, Phase.BACKWARD, Phase.OPTIMIZER)
DTYPE_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}
LARGEST = 12  # individual tensors listed in extra["largest_tensors"]

TRACKER_BLIND_SPOTS = (
    "CPU bytes are live tensor storage seen by a TorchDispatchMode (UntypedStorage.nbytes, views "
    "counted once, frees observed by weakref finalizers); scratch memory a kernel allocates and frees "
    "internally (oneDNN/MKL workspaces, CPU flash-attention per-thread buffers) never becomes a tensor "
    "and is not counted, nor are Python objects, autograd graph nodes and torch.utils.checkpoint's CPU "
    "RNG states (5056 B per checkpointed layer, host memory on a GPU)"
)


def measure_training(
    config: dict[str, Any],
    setup: TrainingSetup,
    *,
    device: str = "cpu",
    steps: int = 2,
    seed: int = 0,
    model_name: str | None = None,
    track: bool = True,
    cross_check: bool = False,
) -> Estimate:
    """Run ``steps`` real training steps of the model ``config`` describes and measure them.

    ``config`` is a ``config.json`` dict (``model_type`` required); weights are random
    (seeded), nothing is downloaded. ``track=False`` skips the per-category tracker on CUDA.
    ``cross_check=True`` (CPU) also records every CPU-allocator event with ``torch.profiler``
    (``profile_memory``), which sees kernel-internal scratch too, and reports that peak as
    ``extra["allocator_peak_bytes"]``: equal to the tracker's peak when nothing is hidden.
    Step 1 creates the optimizer states; step 2 is the steady state; ``extra["steps"]`` reports
    both and ``phases`` / ``peak_allocated_bytes`` the maximum over all steps.
    """
    _check_measurable(setup, device, steps)
    dev = torch.device(device)
    if dev.type == "cpu":
        track = True
    model = build_model(config, setup, seed=seed)
    model.to(device=dev, dtype=model_dtype(setup.precision))
    model = apply_adapter(model, setup)  # LoRA: peft freezes the base and adds the adapters
    convert_float8(model, setup)  # float8-*: torchao's Float8Linear in place of the eligible Linears
    model.train()
    tracker = LiveStorageTracker(device_type=dev.type) if track else None
    cuda = _CudaStats(dev) if dev.type == "cuda" else None
    gc_was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()  # frees happen at refcount zero, deterministically
    try:
        result = _run(
            model, config, setup, dev, steps, seed, tracker, cuda, cross_check and dev.type == "cpu"
        )
    finally:
        if gc_was_enabled:
            gc.enable()
    return _estimate(model, config, setup, dev, result, tracker, cuda, model_name)


# ------------------------------------------------------------------------------------------------


def _check_measurable(setup: TrainingSetup, device: str, steps: int) -> None:
    if steps < 1:
        raise InputError(f"steps={steps!r}: must be a positive integer")
    if device not in ("cpu", "cuda") and not device.startswith("cuda:"):
        raise InputError(f"device={device!r}: choose cpu or cuda")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise InputError(f"device={device!r}: no CUDA device is available")
    if setup.method == Method.QLORA:
        raise InputError("method='qlora': not measurable here (bitsandbytes 4-bit training needs CUDA)")
    if setup.framework != Framework.HF:
        raise InputError(f"framework={setup.framework.value!r}: not measurable (transformers models only)")
    setup.check_oracle_runs("measure")
    if setup.attention == AttentionKernel.FLASH and not device.startswith("cuda"):
        raise InputError("attention='flash': FlashAttention-2 runs on CUDA only; use eager or sdpa on CPU")
    if setup.precision == Precision.AMP_FP16 and device == "cpu" and not _cpu_autocast_fp16():
        raise InputError("precision='amp-fp16': this torch has no float16 autocast on CPU")


def _cpu_autocast_fp16() -> bool:
    try:
        with torch.autocast("cpu", dtype=torch.float16):
            torch.ones(1, 1) @ torch.ones(1, 1)
        return True
    except (RuntimeError, ValueError):
        return False


ATTN_IMPL = {
    AttentionKernel.EAGER: "eager",
    AttentionKernel.SDPA: "sdpa",
    AttentionKernel.FLASH: "flash_attention_2",
}
TRAINABLE_SUFFIXES = ("ForCausalLM", "ForSequenceClassification", "ForMaskedLM", "LMHeadModel")


def config_and_class(config: dict[str, Any], *, drop: tuple[str, ...]) -> tuple[Any, Any]:
    """transformers' config object for ``config`` (less the ``drop`` keys) and the model class it names:
    ``architectures[0]`` when it is a training head, else ``BertForSequenceClassification`` for BERT
    and ``AutoModelForCausalLM`` otherwise. ``measure`` and ``simulate`` build the same class."""
    import transformers

    model_type = config.get("model_type")
    if not model_type:
        raise InputError("config: model_type is missing; peakmem needs a transformers config.json")
    kwargs = {k: v for k, v in config.items() if k not in drop}
    try:
        cfg = transformers.AutoConfig.for_model(model_type, **kwargs)
    except (KeyError, ValueError, TypeError) as err:
        raise InputError(f"config: transformers cannot read this {model_type!r} config ({err})") from err
    arch = (config.get("architectures") or [None])[0]
    cls = (
        getattr(transformers, arch, None)
        if isinstance(arch, str) and arch.endswith(TRAINABLE_SUFFIXES)
        else None
    )
    if cls is None:
        cls = (
            transformers.BertForSequenceClassification
            if model_type == "bert"
            else transformers.AutoModelForCausalLM
        )
    return cfg, cls


def build_model(config: dict[str, Any], setup: TrainingSetup, *, seed: int = 0) -> torch.nn.Module:
    """The transformers model ``config`` names (``architectures[0]`` when it is a training head;
    else ``BertForSequenceClassification`` for BERT and ``AutoModelForCausalLM`` otherwise),
    built with random weights in fp32 on CPU."""
    import transformers

    cfg, cls = config_and_class(config, drop=("model_type", "transformers_version"))
    torch.manual_seed(seed)
    kwargs = {"attn_implementation": ATTN_IMPL[setup.attention]}
    builder: Any = cls
    try:
        with torch.device("cpu"):
            if cls is transformers.AutoModelForCausalLM:
                model = builder.from_config(cfg, dtype=torch.float32, **kwargs)
            else:
                model = builder._from_config(cfg, dtype=torch.float32, **kwargs)
    except (ImportError, ValueError) as err:  # e.g. flash_attention_2 without the flash-attn package
        raise InputError(
            f"attention={setup.attention.value!r}: transformers cannot build {getattr(cls, '__name__', cls)} "
            f"with attn_implementation={ATTN_IMPL[setup.attention]!r} ({err})"
        ) from err
    # HF Trainer 5.23 sets model.config.use_cache = TrainingArguments.use_cache (default False):
    # without it a training forward also builds a DynamicCache (torch.cat copies of K and V).
    if hasattr(model.config, "use_cache"):
        model.config.use_cache = False
    module: torch.nn.Module = model
    return module


def _task(model: Any) -> str:
    name = type(model).__name__
    if name.endswith("ForSequenceClassification"):
        return "sequence-classification"
    if name.endswith("ForMaskedLM"):
        return "masked-lm"
    return "causal-lm"


def make_batch(
    model: Any, setup: TrainingSetup, dev: torch.device, gen: torch.Generator
) -> dict[str, torch.Tensor]:
    """Random token ids; labels as HF computes the model's own loss from them."""
    cfg = model.config
    shape = (setup.micro_batch, setup.seq_len)
    ids = torch.randint(0, cfg.vocab_size, shape, generator=gen).to(dev)
    if _task(model) == "sequence-classification":
        labels = torch.randint(0, cfg.num_labels, (setup.micro_batch,), generator=gen).to(dev)
    else:
        labels = ids
    return {"input_ids": ids, "labels": labels}


class _CudaStats:
    """Per-phase ``max_memory_allocated``/``max_memory_reserved`` (reset at each phase boundary)."""

    def __init__(self, dev: torch.device) -> None:
        self.dev = dev
        self.current: tuple[int, Phase] = (0, Phase.LOAD)
        self.alloc: dict[tuple[int, Phase], int] = {}
        self.reserved: dict[tuple[int, Phase], int] = {}
        torch.cuda.synchronize(dev)
        torch.cuda.reset_peak_memory_stats(dev)

    def set_phase(self, phase: Phase, step: int) -> None:
        torch.cuda.synchronize(self.dev)
        key = self.current
        self.alloc[key] = max(self.alloc.get(key, 0), torch.cuda.max_memory_allocated(self.dev))
        self.reserved[key] = max(self.reserved.get(key, 0), torch.cuda.max_memory_reserved(self.dev))
        torch.cuda.reset_peak_memory_stats(self.dev)
        self.current = (step, phase)

    def device_total(self) -> tuple[int, str]:
        try:
            import pynvml

            pynvml.nvmlInit()
            index = self.dev.index if self.dev.index is not None else torch.cuda.current_device()
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            used = int(pynvml.nvmlDeviceGetMemoryInfo(handle).used)
            return used, "NVML used memory of the device (all processes) after the run"
        except Exception:
            free, total = torch.cuda.mem_get_info(self.dev)
            return int(total - free), "torch.cuda.mem_get_info: total minus free after the run"


class _Run:
    def __init__(self) -> None:
        self.grad_bytes: dict[torch.dtype, int] = {}
        self.trainer: Any = None
        self.allocator_peak: int | None = None


def _run(
    model: torch.nn.Module,
    config: dict[str, Any],
    setup: TrainingSetup,
    dev: torch.device,
    steps: int,
    seed: int,
    tracker: LiveStorageTracker | None,
    cuda: _CudaStats | None,
    cross_check: bool = False,
) -> _Run:
    result = _Run()

    def phase(p: Phase, step: int) -> None:
        if tracker is not None:
            tracker.set_phase(p, step)
        if cuda is not None:
            cuda.set_phase(p, step)

    if setup.checkpointing in (Checkpointing.FULL, Checkpointing.OP):
        ckpt_kwargs: dict[str, Any] = {"use_reentrant": False}  # transformers 5.23's default
        recompute = tracker.recompute if tracker is not None else None
        if setup.checkpointing == Checkpointing.OP:  # every decoder layer under torchtitan's op policy
            ckpt_kwargs["context_fn"] = op_context_fn(recompute)
        elif recompute is not None:
            ckpt_kwargs["context_fn"] = lambda: (nullcontext(), recompute())
        enable: Any = model.activation_checkpointing_enable
        enable(activation_checkpointing_kwargs=ckpt_kwargs)
        apply_checkpoint_every(model, setup)
    selective = (
        selective_attention(ATTN_IMPL[setup.attention], tracker)
        if setup.checkpointing == Checkpointing.SELECTIVE
        else nullcontext()
    )
    gen = torch.Generator().manual_seed(seed)
    if tracker is not None:
        tracker.register_module(model)
    ctx = tracker if tracker is not None else nullcontext()
    prof = _allocator_profiler() if cross_check else nullcontext()
    baseline = tracker.ledger.current if tracker is not None else 0
    with prof, ctx, selective:
        phase(Phase.LOAD, 0)
        trainer = make_trainer(model, setup, dev, tracker)
        result.trainer = trainer
        if tracker is not None:
            tracker.watch_gradients(model.named_parameters())
        for step in range(1, steps + 1):
            for _ in range(setup.grad_accum):
                phase(Phase.FORWARD, step)
                batch = make_batch(model, setup, dev, gen)
                if tracker is not None:
                    _tag_inputs(tracker, batch)
                with trainer.autocast():
                    loss = model(**batch).loss
                if setup.grad_accum > 1:
                    loss = loss / setup.grad_accum
                phase(Phase.BACKWARD, step)
                trainer.backward(loss)
                del loss, batch
            phase(Phase.OPTIMIZER, step)
            result.grad_bytes = _grad_bytes(trainer.params)
            trainer.step()
            trainer.zero_grad()
            if tracker is not None:
                tracker.tag_optimizer_states(trainer.optimizer)
        phase(Phase.LOAD, steps + 1)  # closes the last segment
    if cross_check:
        result.allocator_peak = baseline + _allocator_peak(prof)
    return result


def apply_checkpoint_every(model: torch.nn.Module, setup: TrainingSetup) -> None:
    """Full checkpointing of every N-th layer: after ``activation_checkpointing_enable()`` wrapped every
    decoder layer, unwrap those peakmem.training.checkpointed_layers leaves out (transformers 5.23
    ``GradientCheckpointingLayer`` checkpoints its forward only while ``gradient_checkpointing`` is True)."""
    if setup.checkpoint_every == 1:
        return
    from transformers.modeling_layers import GradientCheckpointingLayer

    layers = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]
    wrapped = checkpointed_layers(len(layers), setup.checkpoint_every, setup.framework)
    for layer, wraps in zip(layers, wrapped, strict=True):
        layer.gradient_checkpointing = wraps


@contextmanager
def selective_attention(impl: str, tracker: LiveStorageTracker | None) -> Iterator[None]:
    """Selective activation checkpointing (Korthikanti et al. 2022, arXiv 2205.05198, Section 4.2):
    recompute only the attention core in backward.

    transformers 5.23 routes every attention module through ``ALL_ATTENTION_FUNCTIONS.get_interface(
    config._attn_implementation, eager_attention_forward)`` (modeling_llama.py, modeling_gpt2.py):
    for the duration of the run, the ``impl`` entry of that (process-wide) mapping is replaced by a
    wrapper that runs the model's own attention function under ``torch.utils.checkpoint``
    (non-reentrant). Saved for backward: the core's inputs (q, k, v after RoPE, the mask); dropped
    and recomputed: GQA's repeated k/v, the scores, softmax, dropout mask and output, or SDPA's
    saved output and logsumexp. The attention weights are not returned (the layers discard them).
    """
    import sys

    from torch.utils.checkpoint import checkpoint
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    had_local = impl in ALL_ATTENTION_FUNCTIONS._local_mapping
    previous = ALL_ATTENTION_FUNCTIONS._local_mapping.get(impl)

    def base_for(module: Any) -> Any:
        if impl == "eager":
            return sys.modules[type(module).__module__].eager_attention_forward
        return previous if had_local else ALL_ATTENTION_FUNCTIONS._global_mapping[impl]

    def context() -> tuple[Any, Any]:
        return nullcontext(), (tracker.recompute() if tracker is not None else nullcontext())

    def attention(module: Any, query: Any, key: Any, value: Any, attention_mask: Any, **kwargs: Any) -> Any:
        base = base_for(module)

        def core(q: Any, k: Any, v: Any, mask: Any) -> Any:
            return base(module, q, k, v, mask, **kwargs)[0]

        out = checkpoint(core, query, key, value, attention_mask, use_reentrant=False, context_fn=context)
        return out, None

    ALL_ATTENTION_FUNCTIONS[impl] = attention
    try:
        yield
    finally:
        if had_local:
            ALL_ATTENTION_FUNCTIONS[impl] = previous
        else:
            del ALL_ATTENTION_FUNCTIONS[impl]  # type: ignore[no-untyped-call]


def _allocator_profiler() -> Any:
    from torch.profiler import ProfilerActivity, profile

    return profile(activities=[ProfilerActivity.CPU], profile_memory=True)


def _allocator_peak(prof: Any) -> int:
    """Peak of the running sum of the CPU allocator's ``[memory]`` events (bytes above the start)."""
    events = [
        e
        for e in prof.profiler.kineto_results.events()
        if e.name() == "[memory]" and str(e.device_type()).endswith("CPU")
    ]
    events.sort(key=lambda e: e.start_ns())
    cur = peak = 0
    for e in events:
        cur += e.nbytes()
        peak = max(peak, cur)
    return peak


def _tag_inputs(tracker: LiveStorageTracker, batch: dict[str, torch.Tensor]) -> None:
    for t in batch.values():  # a function, so no loop variable outlives the batch
        tracker.tag(t, INPUT)


def _grad_bytes(params: list[torch.nn.Parameter]) -> dict[torch.dtype, int]:
    seen: set[int] = set()
    out: dict[torch.dtype, int] = {}
    for p in params:
        if p.grad is not None and id(p.grad.untyped_storage()) not in seen:
            seen.add(id(p.grad.untyped_storage()))
            out[p.grad.dtype] = out.get(p.grad.dtype, 0) + p.grad.untyped_storage().nbytes()
    return out


# ------------------------------------------------------------------------------------------------


def _items(snap: Snapshot) -> tuple[MemoryItem, ...]:
    return tuple(
        MemoryItem(path=label, category=cat, bytes=b, source="measured: live tensor storage")
        for cat, label, b in snap.by_label()
        if b > 0
    )


def _untracked(total: int, snap: Snapshot | None) -> tuple[MemoryItem, ...]:
    """CUDA: bytes torch.cuda counted at a peak that the tensor tracker did not see."""
    gap = total - (snap.bytes if snap is not None else 0)
    if gap <= 0:
        return ()
    return (
        MemoryItem(
            path="untracked by the tensor tracker (allocator rounding, workspaces)",
            category=Category.TEMPORARIES,
            bytes=gap,
            source="torch.cuda.max_memory_allocated minus tracked tensor bytes",
        ),
    )


def _estimate(
    model: torch.nn.Module,
    config: dict[str, Any],
    setup: TrainingSetup,
    dev: torch.device,
    result: _Run,
    tracker: LiveStorageTracker | None,
    cuda: _CudaStats | None,
    model_name: str | None,
) -> Estimate:
    params = unique_numel(model.parameters())
    trainer = result.trainer
    trainable = unique_numel(trainer.params)
    snaps = tracker.ledger.peaks() if tracker is not None else []
    snaps = [s for s in snaps if not (s.phase == Phase.LOAD and s.step > 0)]  # the closing marker
    steps_report: dict[int, dict[str, Any]] = {}
    for s in snaps:
        rep = steps_report.setdefault(s.step, {"step": s.step, "phases": {}, "categories": {}})
        rep["phases"][s.phase.value] = s.bytes
        rep["categories"][s.phase.value] = {c.value: b for c, b in s.by_category().items()}

    phase_bytes: dict[Phase, int] = {}
    phase_snap: dict[Phase, Snapshot] = {}
    for s in snaps:
        if s.bytes > phase_bytes.get(s.phase, -1):
            phase_bytes[s.phase], phase_snap[s.phase] = s.bytes, s
    assumptions = [
        f"measured: {len([k for k in steps_report if k > 0])} real training step(s) of a randomly "
        f"initialized {type(model).__name__} (seeded), built from its config; nothing downloaded",
        "step 1 creates the optimizer states; step 2 is the steady state; extra['steps'] reports both",
        "loss: the model's own loss (labels = input_ids for language models, as HF computes it); "
        f"no gradient clipping; zero_grad(set_to_none={setup.grads_set_to_none}); "
        "Python's garbage collector paused during the run",
        f"dropout as the config sets it; attention implementation {ATTN_IMPL[setup.attention]!r}; "
        "use_cache=False (HF Trainer's default), so no KV cache is built in training",
        "activations = tensors saved for backward (with checkpointing: also those the recomputation in "
        "backward saves) plus the input batch; temporaries = every other live tensor",
    ]
    if setup.optimizer.value == "adafactor":
        assumptions.append("adafactor: torch.optim.Adafactor (not transformers.optimization.Adafactor)")
    if setup.optimizer.value == "lion":
        assumptions.append("lion: peakmem's Lion (Chen et al. 2023 Algorithm 2); torch has none")
    assumptions.extend(float8_notes(model, setup))
    if setup.precision.states in (Precision.MIXED_BF16, Precision.MIXED_FP16):
        assumptions.append(
            "mixed precision: fp32 masters made at load; at the step each 16-bit gradient is upcast to an "
            "fp32 master gradient and freed, the optimizer steps the masters, fp32 gradients are freed and "
            "the masters copied into the 16-bit weights (peakmem.measure.trainer.MasterWeightTrainer)"
        )
    if setup.checkpointing == Checkpointing.SELECTIVE:
        assumptions.append(
            "selective checkpointing: the model's attention function (scores, softmax, dropout, attention "
            "over V) runs under torch.utils.checkpoint (non-reentrant); its inputs q, k, v, mask are saved"
        )
    if setup.checkpointing == Checkpointing.FULL:
        every = (
            f", then only every {setup.checkpoint_every}th layer kept wrapped (peakmem.training."
            "checkpointed_layers)"
            if setup.checkpoint_every > 1
            else ""
        )
        assumptions.append(
            "checkpointing: model.activation_checkpointing_enable(), use_reentrant=False "
            f"(transformers 5.23 default){every}"
        )
    if setup.checkpointing == Checkpointing.OP:
        assumptions.append(
            "op-level selective checkpointing: every decoder layer under torch.utils.checkpoint "
            "(non-reentrant) with torchtitan's op policy (peakmem.measure.op_sac)"
        )

    by_key = {(s.step, s.phase): s for s in snaps}
    overall: Snapshot | None = max(snaps, key=lambda s: (s.bytes, -s.step)) if snaps else None
    if cuda is not None:
        # The CUDA allocator's own peaks decide the bytes; the tracker's snapshot of the same
        # (step, phase) splits them by category.
        cuda_alloc = {k: v for k, v in cuda.alloc.items() if not (k[1] == Phase.LOAD and k[0] > 0)}
        peak_key = max(cuda_alloc, key=lambda k: (cuda_alloc[k], -k[0]))
        peak_alloc = cuda_alloc[peak_key]
        peak_reserved = max(cuda.reserved.values())
        device_total, how = cuda.device_total()
        peak_phase = peak_key[1]
        overall = by_key.get(peak_key)
        phase_bytes, phase_snap = {}, {}
        for (step, ph), b in cuda_alloc.items():
            rep = steps_report.setdefault(step, {"step": step, "phases": {}, "categories": {}})
            rep.setdefault("cuda_max_allocated", {})[ph.value] = b
            if b > phase_bytes.get(ph, -1):
                phase_bytes[ph] = b
                if (step, ph) in by_key:
                    phase_snap[ph] = by_key[(step, ph)]
        assumptions.append(
            "CUDA: peak_allocated/reserved from torch.cuda.max_memory_allocated/reserved, reset at "
            f"each phase boundary; device total: {how}"
        )
        if tracker is not None:
            assumptions.append(
                "CUDA: categories come from the live-storage tracker (device tensors only, request sizes "
                "before the caching allocator's 512-byte rounding) at the same step and phase; the "
                "difference to torch.cuda's peak is shown as temporaries"
            )
    else:
        assert overall is not None
        peak_alloc = overall.bytes
        peak_reserved = peak_alloc
        device_total = peak_alloc
        peak_phase = overall.phase
        assumptions.append(
            "CPU: no caching allocator or CUDA context, so peak_reserved_bytes and "
            "device_total_bytes are set equal to peak_allocated_bytes"
        )
    assumptions.append(TRACKER_BLIND_SPOTS)

    items: tuple[MemoryItem, ...] = _items(overall) if overall is not None else ()
    if cuda is not None:
        items += _untracked(peak_alloc, overall)
    phases = tuple(
        PhasePeak(
            phase=ph,
            bytes=phase_bytes[ph],
            items=(_items(phase_snap[ph]) if ph in phase_snap else ())
            + (_untracked(phase_bytes[ph], phase_snap.get(ph)) if cuda is not None else ()),
        )
        for ph in PHASES
        if ph in phase_bytes
    )
    extra: dict[str, Any] = {
        "device": str(dev),
        "steps": [steps_report[k] for k in sorted(steps_report) if k > 0],
        "load_bytes": steps_report.get(0, {}).get("phases", {}).get("load", 0),
    }
    if result.allocator_peak is not None:
        extra["allocator_peak_bytes"] = result.allocator_peak
    if overall is not None:
        extra["peak_step"] = overall.step
        extra["largest_tensors"] = [
            {
                "label": r.label,
                "category": r.category.value,
                "op": r.op,
                "dtype": r.dtype,
                "shape": list(r.shape),
                "bytes": r.nbytes,
                "name": r.name,
            }
            for r in overall.largest(LARGEST)
        ]
    return Estimate(
        method="measured", job="train",
        model_name=model_name or str(config.get("_name_or_path") or config.get("model_type")),
        params=params, trainable_params=trainable,
        per_param=_per_param_rows(model, trainer, result, trainable),
        items=items, phases=phases, peak_phase=peak_phase,
        peak_allocated_bytes=peak_alloc, peak_reserved_bytes=peak_reserved, device_total_bytes=device_total,
        assumptions=tuple(assumptions), setup=_setup_echo(setup, dev), extra=extra,
    )  # fmt: skip


def unique_numel(params: Any) -> int:
    seen: set[int] = set()
    total = 0
    for p in params:
        if id(p) not in seen:
            seen.add(id(p))
            total += p.numel()
    return total


def _per_param_rows(
    model: torch.nn.Module, trainer: Any, result: Any, trainable: int
) -> tuple[PerParamRow, ...]:
    """Measured bytes-per-parameter rows; ``result.grad_bytes`` maps grad dtype -> bytes (also used by
    :mod:`peakmem.simulate`)."""
    rows: list[PerParamRow] = []
    src = "measured: storage bytes of the real tensors"

    def row(tensor: str, dtype: str, nbytes: int, n: int, cat: Category) -> None:
        rows.append(
            PerParamRow(
                tensor=tensor,
                dtype=dtype,
                bytes_per_param=nbytes / n if n else 0.0,
                bytes=nbytes,
                params=n,
                category=cat,
                source=src,
            )
        )

    by_dtype: dict[torch.dtype, list[int]] = {}
    seen: set[int] = set()
    for p in model.parameters():
        key = id(p.untyped_storage())
        if key in seen:
            continue
        seen.add(key)
        acc = by_dtype.setdefault(p.dtype, [0, 0])
        acc[0] += p.untyped_storage().nbytes()
        acc[1] += p.numel()
    for dt, (b, n) in by_dtype.items():
        row("weights", DTYPE_NAMES.get(dt, str(dt)), b, n, Category.PARAMETERS)
    for dt, b in result.grad_bytes.items():
        row("gradients", DTYPE_NAMES.get(dt, str(dt)), b, trainable, Category.GRADIENTS)
    masters = getattr(trainer, "masters", None)
    if masters:
        row(
            "master weights",
            "fp32",
            sum(m.untyped_storage().nbytes() for m in masters),
            trainable,
            Category.MASTER_WEIGHTS,
        )
    states: dict[tuple[str, str], int] = {}
    for st in trainer.optimizer.state.values():
        for k, v in st.items():
            if isinstance(v, torch.Tensor):
                skey = (str(k), DTYPE_NAMES.get(v.dtype, str(v.dtype).removeprefix("torch.")))
                states[skey] = states.get(skey, 0) + v.untyped_storage().nbytes()
    for (sname, sdtype), sbytes in states.items():
        row(f"optimizer {sname}", sdtype, sbytes, trainable, Category.OPTIMIZER_STATES)
    return tuple(rows)


def _setup_echo(setup: TrainingSetup, dev: torch.device) -> dict[str, object]:
    """The setup as the estimates echo it (JSON-ready: LoRA / quant configs as dicts), and the device."""
    from peakmem.estimate import setup_dict

    return {**setup_dict(setup), "device": str(dev)}
