# mypy: disable-error-code="no-untyped-call,no-any-return,unused-ignore"
"""``simulate_training``: a real transformers training step under fake tensors, every allocation recorded.

1. The model is built from its config on the meta device (no memory), cast to the precision's
   dtype as ``peakmem measure`` does, and every parameter and buffer is replaced by a fake CPU
   tensor of the same shape, dtype and strides (``FakeTensorMode``: metadata only, no bytes). Each
   *storage* is converted once, so tied weights stay one parameter and aliasing buffers one storage.
2. Two training steps run exactly as ``peakmem measure`` runs them, with its trainer
   (:mod:`peakmem.measure.trainer`: precision regimes, optimizers and implementations) and its
   tracker (:class:`peakmem.measure.tracker.LiveStorageTracker`: storage identity, views once,
   frees by weakref finalizers, categories, phases). Fake tensors have real storage objects
   (on the meta device), so the tracker works unchanged. :mod:`peakmem.simulate.attribution`
   names the module behind backward allocations too; ``.item()`` on a fake tensor reads a fixed
   value (:class:`peakmem.simulate.kernels.ScalarValueMode`); a model whose shapes depend on
   tensor values is a clear :class:`InputError`.
3. With ``kernels="cuda"`` (default) :mod:`peakmem.simulate.kernels` makes the CPU step allocate
   what CUDA kernels allocate; ``kernels="cpu"`` keeps the CPU's kernels (parity with ``measure``).
4. The recorded trace is replayed through :mod:`peakmem.formulas.caching_allocator` (the CUDA caching
   allocator) for ``peak_reserved_bytes``; the CUDA context and cuBLAS workspace from
   :mod:`peakmem.formulas.overhead` give ``device_total_bytes``.
"""

from __future__ import annotations

import contextlib
import gc
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from peakmem.adapters import LoraConfig as LoraSpec
from peakmem.breakdown import Category, Estimate, MemoryItem, PerParamRow, Phase, PhasePeak
from peakmem.errors import InputError
from peakmem.formulas.caching_allocator import AllocatorStats, replay
from peakmem.formulas.overhead import Overheads
from peakmem.measure.op_sac import op_context_fn
from peakmem.measure.runner import (
    ATTN_IMPL,
    _per_param_rows,
    apply_checkpoint_every,
    config_and_class,
    unique_numel,
)
from peakmem.measure.tracker import INPUT, OPTIM_STATE, LiveStorageTracker, Snapshot, StorageRecord
from peakmem.measure.trainer import make_trainer, model_dtype
from peakmem.simulate import attribution
from peakmem.simulate import kernels as kern
from peakmem.simulate.derive.build import build_with
from peakmem.simulate.fakeify import QuantInfo, fakeify_module, prepare_adapters
from peakmem.training import (
    AttentionKernel,
    Checkpointing,
    Framework,
    KernelPolicy,
    OptimizerImpl,
    Precision,
    TrainingSetup,
)

PHASES = (Phase.LOAD, Phase.FORWARD, Phase.BACKWARD, Phase.OPTIMIZER)
TOP_TENSORS = 15  # tensors listed in extra["top_tensors"]
_DROP_KEYS = ("model_type", "transformers_version", "_name_or_path", "auto_map")


def simulate_training(
    config: dict[str, Any],
    setup: TrainingSetup,
    *,
    kernels: str | KernelPolicy | None = None,
    steps: int = 2,
    model_name: str | None = None,
    overheads: Overheads | None = None,
    lora: LoraSpec | None = None,
) -> Estimate:
    """Simulate ``steps`` training steps of the model ``config`` describes under ``setup``.

    ``kernels``: ``"cuda"`` (CUDA-faithful kernels, the default unless ``setup.kernel_policy``
    says otherwise) or ``"cpu"`` (the CPU's own kernels: what ``peakmem measure --device cpu``
    allocates). ``lora``: the adapter for ``method`` lora/qlora (peft's defaults when ``None``).
    ``overheads``: CUDA context and cuBLAS workspace for ``device_total_bytes``. Returns an
    :class:`Estimate` with ``method="simulated"``; ``extra`` holds the per-step phases, the
    allocator statistics, the kernels used and the top tensors alive at the peak.
    """
    policy = _policy(kernels, setup)
    _check(setup, steps)
    t0 = time.perf_counter()
    model = build_meta_model(config, setup)
    quant = prepare_adapters(model, setup, lora)
    mode = _fake_mode()
    fakeify_module(model, mode)
    model.train()
    tracker = LiveStorageTracker()
    log = kern.KernelLog()
    t_build = time.perf_counter() - t0
    gc_was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()  # frees happen at refcount zero, deterministically
    try:
        run = _run(model, setup, steps, tracker, mode, policy, log, quant)
    except _fake_limits() as err:
        raise InputError(
            f"model_type={config.get('model_type')!r}: cannot be simulated with fake tensors: "
            f"{type(err).__name__} ({err}); an op's output depends on tensor values. "
            "Use `peakmem train` (analytic) or `peakmem measure`."
        ) from err
    finally:
        if gc_was_enabled:
            gc.enable()
    run.build_s, run.run_s = t_build, time.perf_counter() - t0 - t_build
    return _estimate(
        model, config, setup, policy, run, tracker, log, quant, overheads or Overheads(), model_name
    )


# ------------------------------------------------------------------------------------------------
# checks and the model
# ------------------------------------------------------------------------------------------------


def _policy(kernels: str | KernelPolicy | None, setup: TrainingSetup) -> KernelPolicy:
    if kernels is None:
        return setup.kernel_policy
    if isinstance(kernels, KernelPolicy):
        return kernels
    return KernelPolicy.parse(kernels, "kernels")  # type: ignore[return-value]


def _check(setup: TrainingSetup, steps: int) -> None:
    if steps < 1:
        raise InputError(f"steps={steps!r}: must be a positive integer")
    if setup.framework != Framework.HF:
        raise InputError(f"framework={setup.framework.value!r}: not simulatable (transformers models only)")
    setup.check_oracle_runs("simulate")
    if setup.checkpointing == Checkpointing.SELECTIVE:
        raise InputError("checkpointing='selective': not simulatable (transformers has no selective "
                         "recomputation of the attention core); use none or full")  # fmt: skip


def build_meta_model(config: dict[str, Any], setup: TrainingSetup) -> torch.nn.Module:
    """The transformers model ``config`` describes, on the meta device, in the precision's dtype.

    The class is the one ``peakmem measure`` builds (:func:`peakmem.measure.runner.config_and_class`).
    A config that transformers cannot build offline (unknown ``model_type``, remote code) raises
    :class:`InputError`, not a traceback.
    """
    import transformers

    model_type = config.get("model_type")
    if not model_type:
        raise InputError("config: model_type is missing; peakmem simulate needs a transformers config.json")
    known = model_type in transformers.models.auto.configuration_auto.CONFIG_MAPPING_NAMES  # type: ignore[attr-defined]
    if not known:
        remote = " (the config's auto_map names remote code)" if config.get("auto_map") else ""
        raise InputError(
            f"model_type={model_type!r}: transformers {transformers.__version__} cannot build this "
            "architecture "
            f"offline{remote}; peakmem simulate runs only transformers' own model classes and never executes "
            "remote code. Use `peakmem train` (analytic) instead."
        )
    cfg, cls = config_and_class(config, drop=(*_DROP_KEYS, "architectures"))
    if cls is transformers.AutoModelForCausalLM and type(cfg) not in cls._model_mapping:
        raise InputError(
            f"model_type={model_type!r}: transformers has no causal-LM class for it "
            f"(architectures={config.get('architectures')!r}); peakmem simulate trains *ForCausalLM, "
            "*ForSequenceClassification, *ForMaskedLM and *LMHeadModel heads"
        )
    try:  # SDPA stands in for flash-attn, which is not importable on the CPU (build_with)
        model = build_with(cls, cfg, setup.attention.value)
    except (ValueError, ImportError, TypeError, NotImplementedError) as err:
        raise InputError(f"model_type={model_type!r}: transformers cannot build it here ({err})") from err
    model.to(dtype=model_dtype(setup.precision))
    return model


def _fake_limits() -> tuple[type[Exception], ...]:
    """What a fake-tensor run raises when a model needs tensor values (data-dependent shapes)."""
    from torch._subclasses import fake_tensor as ft

    return (ft.DataDependentOutputException, ft.DynamicOutputShapeException, ft.UnsupportedOperatorException)


def _fake_mode() -> Any:
    from torch._subclasses.fake_tensor import FakeTensorMode

    return FakeTensorMode(allow_non_fake_inputs=False)


def enter_fake_modes(stack: Any, mode: Any, tracker: Any, dmode: Any, fmode: Any) -> None:
    """The modes a fake training run executes under, in order (simulate and the derived path's block
    measurement): transformers' patches, the fake mode, scalar values, the tracker, backward/forward
    attribution, then the kernel dispatch and function modes when the policy has them."""
    stack.enter_context(_transformers_patches())
    stack.enter_context(mode)
    stack.enter_context(kern.ScalarValueMode())
    stack.enter_context(tracker)
    stack.enter_context(attribution.BackwardModuleMode(tracker))
    stack.enter_context(attribution.ForwardNodeTagger(tracker))
    if dmode is not None:
        stack.enter_context(dmode)
    if fmode is not None:
        stack.enter_context(fmode)


@contextlib.contextmanager
def _transformers_patches() -> Iterator[None]:
    """transformers treats fake tensors as tracing and then builds explicit attention masks for
    a possibly packed batch (``masking_utils.find_packed_sequence_indices``); the simulated batch
    is one unpacked sequence per row, for which the real run finds none, so it returns ``None``."""
    try:
        from transformers import masking_utils
    except ImportError:
        yield
        return
    orig = getattr(masking_utils, "find_packed_sequence_indices", None)
    if orig is None:
        yield
        return
    masking_utils.find_packed_sequence_indices = lambda *a, **k: None
    try:
        yield
    finally:
        masking_utils.find_packed_sequence_indices = orig


# ------------------------------------------------------------------------------------------------
# the run
# ------------------------------------------------------------------------------------------------


@dataclass
class _Run:
    trainer: Any = None
    grad_bytes: dict[Any, int] = field(default_factory=dict)
    host_sids: set[int] = field(default_factory=set)  # storages in host memory on CUDA
    build_s: float = 0.0
    run_s: float = 0.0


def _run(
    model: torch.nn.Module,
    setup: TrainingSetup,
    steps: int,
    tracker: LiveStorageTracker,
    mode: Any,
    policy: KernelPolicy,
    log: kern.KernelLog,
    quant: QuantInfo,
) -> _Run:
    from contextlib import nullcontext

    result = _Run()
    dev = torch.device("cpu")
    if setup.checkpointing in (Checkpointing.FULL, Checkpointing.OP):
        again = lambda: _recompute(tracker, policy, log)  # noqa: E731
        ctx = (
            op_context_fn(again)
            if setup.checkpointing == Checkpointing.OP
            else lambda: (nullcontext(), again())
        )
        kwargs = {"use_reentrant": False, "context_fn": ctx}
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)  # type: ignore[operator]
        apply_checkpoint_every(model, setup)
    tracker.register_module(model)
    quant.register(tracker)
    fmode = kern.function_mode(policy, log)
    dmode = kern.dispatch_mode(policy, log)
    shape = (setup.micro_batch, setup.seq_len)
    with contextlib.ExitStack() as stack:
        enter_fake_modes(stack, mode, tracker, dmode, fmode)
        tracker.set_phase(Phase.LOAD, 0)
        trainer = make_trainer(model, setup, dev, tracker)
        result.trainer = trainer
        tracker.watch_gradients(model.named_parameters())
        for step in range(1, steps + 1):
            for _ in range(setup.grad_accum):
                tracker.set_phase(Phase.FORWARD, step)
                batch = _batch(model, shape)
                for t in batch.values():
                    tracker.tag(t, INPUT)
                with trainer.autocast():
                    loss = (
                        model(**batch, use_cache=False).loss
                        if _takes_use_cache(model)
                        else model(**batch).loss
                    )
                if setup.grad_accum > 1:
                    loss = loss / setup.grad_accum
                tracker.set_phase(Phase.BACKWARD, step)
                trainer.backward(loss)
                del loss, batch, t
            tracker.set_phase(Phase.OPTIMIZER, step)
            result.grad_bytes = _grad_bytes(trainer.params)
            trainer.step()
            trainer.zero_grad()
            tracker.tag_optimizer_states(trainer.optimizer)
            if policy == KernelPolicy.CUDA and setup.optimizer_impl != OptimizerImpl.FUSED:
                result.host_sids |= _host_step_sids(tracker, trainer.optimizer)
        tracker.set_phase(Phase.LOAD, steps + 1)  # closes the last segment
    return result


@contextlib.contextmanager
def _recompute(tracker: LiveStorageTracker, policy: KernelPolicy, log: kern.KernelLog) -> Iterator[None]:
    """Checkpointing's recomputation runs inside backward, where the torch-function modes entered
    around the step are not active: enter the kernel policy again so that the recomputed forward
    allocates (and saves) what the original forward did."""
    with contextlib.ExitStack() as stack:
        stack.enter_context(tracker.recompute())
        fmode = kern.function_mode(policy, log)
        if fmode is not None:
            stack.enter_context(fmode)
        yield


def _takes_use_cache(model: torch.nn.Module) -> bool:
    """Whether ``forward`` accepts ``use_cache`` (decoders: a training step builds no KV cache)."""
    import inspect

    return "use_cache" in inspect.signature(model.forward).parameters


def _batch(model: torch.nn.Module, shape: tuple[int, int]) -> dict[str, torch.Tensor]:
    """Token ids (values do not matter to fake tensors); labels as HF computes the model's loss."""
    ids = torch.zeros(shape, dtype=torch.long)
    if type(model).__name__.endswith("ForSequenceClassification"):
        return {"input_ids": ids, "labels": torch.zeros((shape[0],), dtype=torch.long)}
    return {"input_ids": ids, "labels": ids}


def _grad_bytes(params: list[torch.nn.Parameter]) -> dict[Any, int]:
    seen: set[int] = set()
    out: dict[Any, int] = {}
    for p in params:
        if p.grad is not None and id(p.grad.untyped_storage()) not in seen:
            seen.add(id(p.grad.untyped_storage()))
            out[p.grad.dtype] = out.get(p.grad.dtype, 0) + p.grad.untyped_storage().nbytes()
    return out


def _host_step_sids(tracker: LiveStorageTracker, optimizer: Any) -> set[int]:
    """The scalar ``step`` tensors of a non-fused, non-capturable torch optimizer: host memory on CUDA."""
    out: set[int] = set()
    for state in optimizer.state.values():
        step = state.get("step")
        if isinstance(step, torch.Tensor) and step.dim() == 0:
            out.add(tracker.sid_of(step, tags=(OPTIM_STATE,), name="step"))
    return out


# ------------------------------------------------------------------------------------------------
# the result
# ------------------------------------------------------------------------------------------------


def _device_events(tracker: LiveStorageTracker, host: set[int]) -> list[tuple[int, int]]:
    events: list[tuple[int, int]] = tracker.ledger._events  # the ledger's (sid, delta) log
    if not host:
        return events
    return [(sid, 0) if sid in host else (sid, d) for sid, d in events]


def _segments(tracker: LiveStorageTracker) -> list[tuple[int, int, int, Phase]]:
    return list(tracker.ledger.segments())


def _live_at(
    tracker: LiveStorageTracker, events: list[tuple[int, int]], index: int
) -> tuple[StorageRecord, ...]:
    live: dict[int, int] = {}
    for sid, delta in events[:index]:
        if delta == 0:
            continue
        new = live.get(sid, 0) + delta
        if new <= 0 and delta < 0:
            live.pop(sid, None)
        else:
            live[sid] = new
    recs = tracker.ledger.records
    out = []
    for sid, b in live.items():
        r = recs[sid]
        if r.nbytes != b:
            r = replace(r, nbytes=b)
        out.append(r)
    return tuple(out)


@dataclass(frozen=True)
class _Peak:
    step: int
    phase: Phase
    index: int
    requested: int
    allocated: int
    reserved: int


def _peaks(
    tracker: LiveStorageTracker, events: list[tuple[int, int]], stats: AllocatorStats, policy: KernelPolicy
) -> list[_Peak]:
    """Per (step, phase): the event index where the reported allocated bytes peak (the caching
    allocator's block bytes under the CUDA policy, raw storage bytes under the CPU policy)."""
    req = [0]
    for _, d in events:
        req.append(req[-1] + d)
    metric = stats.allocated_after if policy == KernelPolicy.CUDA else tuple(req)
    best: dict[tuple[int, Phase], _Peak] = {}
    for start, end, step, phase in _segments(tracker):
        if phase == Phase.LOAD and step > 0:
            continue
        idx = max(range(start, end + 1), key=lambda k: (metric[k], -k))
        res = max(stats.reserved_after[start : end + 1])
        key = (step, phase)
        cand = _Peak(step, phase, idx, req[idx], metric[idx], res)
        old = best.get(key)
        if old is None or cand.allocated > old.allocated:
            best[key] = _Peak(step, phase, idx, req[idx], metric[idx], max(res, old.reserved if old else 0))
    return list(best.values())


def _estimate(
    model: torch.nn.Module,
    config: dict[str, Any],
    setup: TrainingSetup,
    policy: KernelPolicy,
    run: _Run,
    tracker: LiveStorageTracker,
    log: kern.KernelLog,
    quant: QuantInfo,
    ov: Overheads,
    model_name: str | None,
) -> Estimate:
    events = _device_events(tracker, run.host_sids)
    stats = replay(events)
    peaks = _peaks(tracker, events, stats, policy)
    overall = max((p for p in peaks if p.step > 0), key=lambda p: (p.allocated, -p.step))
    snaps: dict[tuple[int, Phase], Snapshot] = {}
    for p in peaks:
        snaps[(p.step, p.phase)] = Snapshot(
            step=p.step,
            phase=p.phase,
            event_index=p.index,
            bytes=p.requested,
            records=_live_at(tracker, events, p.index),
        )
    steps_report: dict[int, dict[str, Any]] = {}
    for p in peaks:
        rep = steps_report.setdefault(
            p.step, {"step": p.step, "phases": {}, "categories": {}, "reserved": {}}
        )
        rep["phases"][p.phase.value] = p.allocated
        rep["reserved"][p.phase.value] = p.reserved
        rep["categories"][p.phase.value] = {
            c.value: b for c, b in snaps[(p.step, p.phase)].by_category().items()
        }
    phase_best: dict[Phase, _Peak] = {}
    for p in peaks:
        if p.allocated > (phase_best[p.phase].allocated if p.phase in phase_best else -1):
            phase_best[p.phase] = p
    peak_snap = snaps[(overall.step, overall.phase)]
    rounding = overall.allocated - overall.requested
    items = _items(peak_snap) + _rounding_item(rounding)
    phases = tuple(
        PhasePeak(phase=ph, bytes=phase_best[ph].allocated,
                  items=_items(snaps[(phase_best[ph].step, ph)])
                  + _rounding_item(phase_best[ph].allocated - phase_best[ph].requested))
        for ph in PHASES if ph in phase_best
    )  # fmt: skip
    peak_alloc = overall.allocated
    if policy == KernelPolicy.CUDA:
        peak_reserved = stats.peak_reserved
        device_total = peak_reserved + ov.context_bytes + ov.cublas_workspace_bytes
    else:
        peak_reserved = device_total = peak_alloc
    trainable = unique_numel(p for p in model.parameters() if p.requires_grad)
    params = unique_numel(model.parameters()) + quant.params
    extra: dict[str, Any] = {
        "kernels": policy.value,
        "steps": [steps_report[k] for k in sorted(steps_report) if k > 0],
        "load_bytes": steps_report.get(0, {}).get("phases", {}).get("load", 0),
        "peak_step": overall.step,
        "requested_peak_bytes": overall.requested,
        "allocator": {
            "peak_allocated_bytes": stats.peak_allocated, "peak_reserved_bytes": stats.peak_reserved,
            "segments": stats.segments, "allocations": stats.allocations,
        },
        "kernel_calls": dict(log.counts),
        "top_tensors": _top(peak_snap),
        "timing_s": {"build": round(run.build_s, 3), "run": round(run.run_s, 3)},
    }  # fmt: skip
    if policy == KernelPolicy.CUDA:
        extra["context_bytes"] = ov.context_bytes
        extra["cublas_workspace_bytes"] = ov.cublas_workspace_bytes
    return Estimate(
        method="simulated", job="train",
        model_name=model_name or str(config.get("_name_or_path") or config.get("model_type")),
        params=params, trainable_params=trainable,
        per_param=_rows(model, run, trainable, host_steps=bool(run.host_sids)) + quant.rows(),
        items=items, phases=phases, peak_phase=overall.phase,
        peak_allocated_bytes=peak_alloc, peak_reserved_bytes=peak_reserved, device_total_bytes=device_total,
        assumptions=_assumptions(model, setup, policy, log, quant, ov, steps_report),
        setup=_setup_echo(setup, policy), extra=extra,
    )  # fmt: skip


def _rows(model: torch.nn.Module, run: _Run, trainable: int, *, host_steps: bool) -> tuple[PerParamRow, ...]:
    """The bytes-per-parameter rows, as ``measure`` builds them; without the optimizer's ``step``
    scalars when they live in host memory (CUDA policy, non-fused optimizer)."""
    rows = _per_param_rows(model, run.trainer, run, trainable)
    return tuple(r for r in rows if not (host_steps and r.tensor == "optimizer step"))


def _items(snap: Snapshot) -> tuple[MemoryItem, ...]:
    out = [
        MemoryItem(path=label, category=cat, bytes=b, source="simulated: fake-tensor storage")
        for cat, label, b in snap.by_label()
        if b > 0
    ]
    return tuple(out)


def _rounding_item(nbytes: int) -> tuple[MemoryItem, ...]:
    if nbytes <= 0:
        return ()
    return (MemoryItem(path="caching-allocator block rounding (512 B blocks, unsplit remainders)",
                       category=Category.TEMPORARIES, bytes=nbytes,
                       source="peakmem.formulas.caching_allocator (CUDACachingAllocator.cpp)"),)  # fmt: skip


def _top(snap: Snapshot) -> list[dict[str, Any]]:
    return [
        {"bytes": r.nbytes, "category": r.category.value, "module": r.module or f"({r.phase.value})",
         "op": r.op, "dtype": r.dtype, "shape": list(r.shape), "name": r.name, "step": r.step,
         "phase": r.phase.value}
        for r in snap.largest(TOP_TENSORS)
    ]  # fmt: skip


def _setup_echo(setup: TrainingSetup, policy: KernelPolicy) -> dict[str, object]:
    """The setup as the estimates echo it (JSON-ready: LoRA / quant configs as dicts), and the policy."""
    from peakmem.estimate import setup_dict

    return {**setup_dict(setup), "kernel_policy": policy.value}


def _attention_line(model: torch.nn.Module, setup: TrainingSetup) -> str:
    asked = ATTN_IMPL[setup.attention]
    used = getattr(model.config, "_attn_implementation", asked)
    line = f"attention implementation {used!r}"
    if setup.attention == AttentionKernel.FLASH and used == "sdpa":
        line += " (for 'flash_attention_2': SDPA's flash kernel allocates as FlashAttention-2 does)"
    elif used != asked:
        line += f" ({type(model).__name__} has no {asked!r} path; transformers falls back to {used!r})"
    return line


def _assumptions(
    model: torch.nn.Module,
    setup: TrainingSetup,
    policy: KernelPolicy,
    log: kern.KernelLog,
    quant: QuantInfo,
    ov: Overheads,
    steps_report: dict[int, Any],
) -> tuple[str, ...]:
    n_steps = len([k for k in steps_report if k > 0])
    out = [
        f"simulated: {n_steps} training step(s) of {type(model).__name__} built from its config on the meta "
        "device and run on fake tensors (FakeTensorMode, no memory, no math), with the same trainer and "
        "storage tracker as `peakmem measure`; step 1 creates the optimizer states, step 2 is the "
        "steady state",
        kern.describe(policy, log),
        "bytes are storage sizes of the tensors the step creates (views counted once), frees at the "
        "instant the last reference goes; scratch a CUDA kernel allocates internally is modelled only where "
        "peakmem.simulate.kernels says so",
        "loss: the model's own loss (labels = input_ids); no gradient clipping; "
        f"zero_grad(set_to_none={setup.grads_set_to_none})",
        _attention_line(model, setup),
        "activations = tensors saved for backward (and recomputed ones with checkpointing) plus the input "
        "batch; temporaries = every other live tensor",
    ]  # fmt: skip
    if setup.precision in (Precision.MIXED_BF16, Precision.MIXED_FP16):
        out.append(
            "mixed precision: fp32 masters made at load; at the step each 16-bit gradient is upcast to an "
            "fp32 master gradient and freed (peakmem.measure.trainer.MasterWeightTrainer)"
        )
    if policy == KernelPolicy.CUDA:
        out.append(
            "peak_allocated_bytes: the caching-allocator model's allocated blocks (512 B rounding, unsplit "
            "remainders) at the peak; peak_reserved_bytes: its segments (2 MiB small / 20 MiB / "
            "2 MiB-rounded "
            "large, best-fit reuse, splitting, no release: a GPU with room to spare)"
        )
        out.append(
            f"device_total_bytes = reserved + CUDA context {ov.context_bytes} B ({ov.context_source}) + "
            f"cuBLAS workspace {ov.cublas_workspace_bytes} B"
        )
        if setup.optimizer_impl != OptimizerImpl.FUSED:
            out.append(
                "optimizer 'step' scalars of non-fused torch optimizers live in host memory on CUDA: "
                "not counted on the device"
            )
    else:
        out.append(
            "kernels='cpu': no caching allocator or CUDA context; peak_reserved_bytes and "
            "device_total_bytes equal peak_allocated_bytes"
        )
    out.extend(quant.assumptions())
    return tuple(out)
