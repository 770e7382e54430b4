"""An execution oracle for parallel training: the real PyTorch parallel code, one rank at a time, in one
CPU process.

torch's fake process group (``torch.testing._internal.distributed.fake_pg``: ``init_process_group("fake",
store=FakeStore(), rank=r, world_size=N)``) makes every collective a no-op that leaves its output buffers
allocated with the right shapes, so rank ``r`` of an N-rank job holds exactly what it would hold on a
GPU: its FSDP2 shards and all-gather buffers, its DTensor TP shards, its pipeline stage and the
micro-batches that stage keeps in flight. Values are garbage (received activations are uninitialized
memory); only the bytes matter, and nothing here branches on a value. torchtitan's
``scripts/estimate/estimation.py`` and PyTorch's ``FSDPMemTracker`` tests run the same way (there on
fake tensors; here on real CPU tensors, so the project's exact storage tracker can be reused).

The layout is applied as torchtitan applies it (pytorch/torchtitan commit
b5bcd76c66d0acb1a08b176d9639425bc55e0b2a):

* mesh ``(pp, dp, cp, tp)`` in that order, tp innermost (``torchtitan/distributed/parallel_dims.py``);
* TP (``torchtitan/models/llama3/parallelize.py`` ``apply_tp``): attention q/k/v and MLP gate/up
  ``ColwiseParallel``, o/down ``RowwiseParallel``, the token embedding ``RowwiseParallel(input_layouts=
  Replicate())`` (vocab-sharded rows), the LM head ``ColwiseParallel(output_layouts=Shard(-1),
  use_local_output=False)`` with the loss under ``loss_parallel()`` (vocab-parallel cross-entropy:
  each rank holds ``T x V/tp`` logits); with sequence parallelism (``Parallelism.sequence_parallel``) the
  norms ``SequenceParallel()``, the embedding and output projections ``output_layouts=Shard(1)``,
  attention and MLP ``PrepareModuleInput`` from ``Shard(1)`` to ``Replicate()`` and the head
  ``input_layouts=Shard(1)``;
* FSDP2 (``torchtitan/experiments/transformers_modeling_backend/parallelize.py`` ``apply_fsdp``):
  ``fully_shard`` per decoder layer and then the root (embeddings, final norm and head in the root
  unit, as accelerate's ``TRANSFORMER_BASED_WRAP`` does; torchtitan puts the embedding and
  ``[norm, lm_head]`` in units of their own, same bytes at the peak since neither reshards after
  forward), ``reshard_after_forward`` = not pp (``torchtitan/distributed/fsdp.py``
  ``get_fsdp_reshard_after_forward_policy("default", pp_enabled)``); mixed precision through
  ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=...)`` in the setup's reduce dtype
  (peakmem.defaults ``reduce_dtype``): torchtitan's fp32 (``fsdp_reduce_dtype='fp32'``) or accelerate's
  bf16 (``param``, the HF default: accelerate 1.16 ``FullyShardedDataParallelPlugin.set_mixed_precision``);
* gradient accumulation as the setup's loop runs it (peakmem.defaults ``skips_grad_sync``): torchtitan's
  (``grad_sync`` each-micro-batch) reduce-scatters in every micro-batch's backward; accelerate's
  ``no_sync`` (last-micro-batch) calls ``set_requires_gradient_sync(False)`` on the root before every
  micro-batch but the last (accelerate 1.16 accelerator.py ``Accelerator.no_sync``);
* PP (``torchtitan/distributed/pipeline_parallel.py``): contiguous stages of decoder layers, the first
  with the embedding, the last with the final norm, head and loss; ``torch.distributed.pipelining``
  ``PipelineStage`` with static input/output shapes and ``Schedule1F1B`` / ``ScheduleGPipe`` over
  ``grad_accum`` micro-batches.

Memory is the project's :class:`~peakmem.measure.tracker.LiveStorageTracker` (every storage, by
category and phase) with two additions that parallel code needs: a DTensor is counted by its local
tensor, and ``UntypedStorage.resize_`` (how FSDP2 allocates and frees its unsharded parameters:
``torch/distributed/fsdp/_fully_shard/_fsdp_param.py`` ``alloc_storage`` / ``free_storage``, which no
dispatch mode sees) is patched for the run, as ``torch/distributed/_tools/mem_tracker.py``
``MemTracker._track_resize`` does. Storage FSDP2 grows that way is an unsharded parameter. An op on a
DTensor goes to DTensor's own dispatch first (the mode answers ``NotImplemented``), so the ops its
handlers run on local tensors are seen: a redistribution's buffers, ``loss_parallel``'s temporaries.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor

from peakmem.breakdown import Category, Phase
from peakmem.defaults import reduce_dtype, skips_grad_sync
from peakmem.dtypes import parse_dtype
from peakmem.errors import InputError
from peakmem.measure.oracle_child import run_in_child
from peakmem.measure.parallel_ac import apply_full_ac, check_checkpointing
from peakmem.measure.runner import build_model
from peakmem.measure.tracker import GRAD, IGNORED, INPUT, PARAM, LiveStorageTracker
from peakmem.measure.trainer import make_optimizer
from peakmem.parallel import CpRotate, FsdpMode, Parallelism
from peakmem.training import Checkpointing, Precision, ReduceDtype, TrainingSetup

PHASES = (Phase.FORWARD, Phase.BACKWARD, Phase.OPTIMIZER)
SCHEDULES = ("1f1b", "gpipe")
MESH_DIMS = ("pp", "dp", "cp", "tp")
ORACLE_PRECISIONS = (Precision.FP32, Precision.MIXED_BF16)
# Decoder-layer Linears as torchtitan's apply_tp splits them (HF Llama/Qwen2 module names).
COLWISE = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj")
ROWWISE = ("self_attn.o_proj", "mlp.down_proj")


@dataclass(frozen=True, kw_only=True)
class RankMeasurement:
    """What one rank held: the peak of each phase over the measured steps, and its categories."""

    layout: str
    rank: int
    coordinate: dict[str, int]
    stage: int
    role: str  # "all ranks", "first stage", "last stage", "middle stage" (as peakmem.ranks names them)
    phases: dict[Phase, int]
    categories: dict[Phase, dict[Category, int]]
    steps: dict[int, dict[Phase, int]] = field(default_factory=dict)
    labels: dict[Phase, tuple[tuple[Category, str, int], ...]] = field(default_factory=dict)

    @property
    def peak_bytes(self) -> int:
        return max(self.phases.values())

    @property
    def peak_phase(self) -> Phase:
        return max(self.phases, key=lambda p: self.phases[p])


def _phantom(tensor: Any) -> bool:
    """A wrapper subclass with no memory of its own (``AsyncCollectiveTensor``, which the functional
    collectives return around their real output: its storage has no valid data pointer)."""
    if type(tensor) is torch.Tensor or isinstance(tensor, nn.Parameter):
        return False
    if getattr(tensor, "_local_tensor", None) is not None:  # DTensor: counted by its local tensor
        return False
    try:
        tensor.untyped_storage().data_ptr()
    except RuntimeError:
        return True
    return False


class ParallelTracker(LiveStorageTracker):
    """:class:`LiveStorageTracker` that counts a DTensor by its local tensor and sees
    ``UntypedStorage.resize_`` (FSDP2's unsharded parameters), tagging storage grown that way as a
    parameter. DTensor ops reach the mode as the ops their handlers run on local tensors, so a
    redistribution's buffers and ``loss_parallel``'s temporaries are seen."""

    def defers_to(self, types: Any) -> bool:
        from torch.distributed.tensor import DTensor

        return any(issubclass(t, DTensor) for t in types)

    def sid_of(self, tensor: Any, *, op: str = "untracked", tags: Any = (), name: str = "") -> int:
        if isinstance(tensor, FakeTensor):  # DTensor's sharding propagation runs ops on fake tensors
            return IGNORED
        if _phantom(tensor):
            return IGNORED
        local = getattr(tensor, "_local_tensor", None)  # DTensor: the rank's shard is the storage
        return super().sid_of(tensor if local is None else local, op=op, tags=tags, name=name)

    def __enter__(self) -> ParallelTracker:
        super().__enter__()
        original = torch.UntypedStorage.resize_
        tracker = self

        def resize_(st: torch.UntypedStorage, size: int) -> Any:
            key = id(st)
            out = original(st, size)
            sid = tracker._sids.get(key)
            if sid is not None and tracker.ledger.is_live(sid):
                if size:
                    tracker.ledger.resize(sid, size)
                else:
                    tracker.ledger.free(sid)
                    del tracker._sids[key]  # its finalizer then finds another sid and does nothing
            elif size:
                sid = tracker.ledger.alloc(
                    size, op="resize_", module=tracker._module_stack[-1] if tracker._module_stack else "",
                    tags=(PARAM,), name="FSDP unsharded parameter",
                )  # fmt: skip
                tracker._sids[key] = sid
                import weakref

                weakref.finalize(st, tracker._on_free, key, sid).atexit = False
            return out

        self._original_resize = original
        torch.UntypedStorage.resize_ = resize_  # type: ignore[method-assign,assignment]
        return self

    def __exit__(self, *exc: object) -> None:
        torch.UntypedStorage.resize_ = self._original_resize  # type: ignore[method-assign]
        super().__exit__(*exc)


# ------------------------------------------------------------------------------------------------
# The fake world and the layout


@contextmanager
def fake_world(par: Parallelism, rank: int) -> Iterator[Any]:
    """A fake process group of ``par.gpus`` ranks seen from ``rank``, and its ``(pp, dp, cp, tp)`` mesh."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    try:
        from torch.testing._internal.distributed.fake_pg import FakeStore
    except ImportError as err:  # pragma: no cover - torch builds without the testing package
        raise InputError(f"parallel oracle: torch's fake process group is not available ({err})") from err
    if dist.is_initialized():
        raise InputError("parallel oracle: a process group is already initialized in this process")
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=par.gpus)
    try:
        yield init_device_mesh("cpu", (par.pp, par.dp, par.cp, par.tp), mesh_dim_names=MESH_DIMS)
    finally:
        dist.destroy_process_group()


def _check(config: dict[str, Any], setup: TrainingSetup, par: Parallelism, rank: int, schedule: str) -> None:
    if config.get("model_type") not in ("llama", "qwen2", "mistral"):
        raise InputError(
            f"model_type={config.get('model_type')!r}: the parallel oracle knows Llama-style decoders "
            "(llama, qwen2, mistral)"
        )
    if not 0 <= rank < par.gpus:
        raise InputError(f"rank={rank}: must be in 0..{par.gpus - 1}")
    if setup.precision not in ORACLE_PRECISIONS:
        raise InputError(
            f"precision={setup.precision.value!r}: the parallel oracle runs "
            + " or ".join(p.value for p in ORACLE_PRECISIONS)
        )
    if setup.precision is Precision.MIXED_BF16 and par.fsdp is FsdpMode.NONE:
        raise InputError(
            "precision='mixed-bf16': the oracle runs it as FSDP2's MixedPrecisionPolicy(param_dtype=bf16, "
            "reduce_dtype=fp32 or bf16); add fsdp"
        )
    if par.zero_stage or par.fsdp not in (FsdpMode.NONE, FsdpMode.FULL_SHARD) or par.fsdp_version != 2:
        raise InputError(f"layout {par.describe()!r}: the parallel oracle runs FSDP2 full-shard only")
    if par.fsdp is FsdpMode.NONE and par.dp > 1:
        raise InputError(
            f"dp={par.dp} without fsdp: the parallel oracle shards data-parallel ranks with FSDP2"
        )
    if par.ep > 1 or par.ulysses > 1 or par.virtual_stages > 1:
        raise InputError(
            f"layout {par.describe()!r}: the parallel oracle runs tp (+sp), pp, cp and FSDP2 only"
        )
    if par.sequence_parallel and par.pp > 1:
        raise InputError("sp with pp: the oracle's pipeline stages pass whole sequences")
    if par.cp > 1:
        from peakmem.measure.parallel_cp import check_cp

        check_cp(setup, par)
    refusal = check_checkpointing(setup.checkpointing, setup.checkpoint_every)
    if refusal:
        raise InputError(refusal)
    if schedule not in SCHEDULES:
        raise InputError(f"schedule={schedule!r}: choose one of {', '.join(SCHEDULES)}")
    if par.pp > 1 and schedule == "1f1b" and setup.grad_accum < par.pp:
        raise InputError(
            f"grad_accum={setup.grad_accum}: torch's Schedule1F1B needs at least pp={par.pp} micro-batches"
        )


def role_of(par: Parallelism, stage: int) -> str:
    if par.pp == 1:
        return "all ranks"
    return "first stage" if stage == 0 else "last stage" if stage == par.pp - 1 else "middle stage"


def _apply_tp(model: nn.Module, mesh: Any, sp: bool) -> None:
    """torchtitan's ``apply_tp`` on an HF decoder; ``sp``: its sequence parallelism (the norms'
    ``SequenceParallel``, the embedding and the output projections leave ``Shard(1)``, attention and MLP
    all-gather their input with ``PrepareModuleInput``, the head gathers the final norm's output)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    inner: Any = model.model
    seq = Shard(1) if sp else Replicate()
    plan: dict[str, Any] = {}
    if inner.embed_tokens is not None:
        plan["model.embed_tokens"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=seq)
    if sp and inner.norm is not None:
        plan["model.norm"] = SequenceParallel()
    if getattr(model, "lm_head", None) is not None:
        plan["lm_head"] = ColwiseParallel(input_layouts=seq, output_layouts=Shard(-1), use_local_output=False)
    parallelize_module(model, mesh, plan)
    layer_plan: dict[str, Any] = {
        **{n: ColwiseParallel() for n in COLWISE},
        **{n: RowwiseParallel(output_layouts=seq) for n in ROWWISE},
    }
    if sp:
        layer_plan.update({
            "input_layernorm": SequenceParallel(),
            "post_attention_layernorm": SequenceParallel(),
            "self_attn": PrepareModuleInput(
                input_kwarg_layouts={"hidden_states": Shard(1)},
                desired_input_kwarg_layouts={"hidden_states": Replicate()},
            ),
            "mlp": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
        })  # fmt: skip
    for layer in inner.layers:
        parallelize_module(layer, mesh, layer_plan)


def _apply_fsdp(
    model: nn.Module, root: nn.Module, mesh: Any, setup: TrainingSetup, reshard_after_forward: bool
) -> None:
    """``fully_shard`` each decoder layer of ``model``, then ``root`` (the model, or the pipeline stage
    module whose forward runs, so that FSDP2's root hooks fire)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    kwargs: dict[str, Any] = {"mesh": mesh, "reshard_after_forward": reshard_after_forward}
    if setup.precision is Precision.MIXED_BF16:
        rd = reduce_dtype(setup)  # accelerate's policy (param) reduces in the param dtype
        reduce = (
            torch.bfloat16 if rd is ReduceDtype.PARAM else getattr(torch, parse_dtype(rd.value).torch_name)
        )
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=reduce)
    for layer in model.model.layers:  # type: ignore[union-attr]
        fully_shard(layer, **kwargs)
    fully_shard(root, **kwargs)


class _Stage(nn.Module):
    """One pipeline stage of an HF decoder: (embedding) + its layers + (final norm, head).

    Calls the decoder layers as ``LlamaModel.forward`` does (transformers 5.23 modeling_llama.py: the
    shared rotary embedding's ``(cos, sin)``, no mask so SDPA runs causal), so a stage's bytes are the
    HF model's."""

    def __init__(self, model: nn.Module, first: bool, last: bool) -> None:
        super().__init__()
        self.model = model
        self.first, self.last = first, last

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        inner: Any = self.model.model
        hidden = inner.embed_tokens(x) if self.first else x
        positions = torch.arange(hidden.shape[1]).unsqueeze(0)
        pos_emb = inner.rotary_emb(hidden, positions)
        for layer in inner.layers:
            hidden = layer(hidden, attention_mask=None, position_ids=positions, position_embeddings=pos_emb)
        if not self.last:
            return hidden
        out: torch.Tensor = self.model.lm_head(inner.norm(hidden))  # type: ignore[operator]
        return out


def _cut_stage(model: Any, par: Parallelism, stage: int) -> None:
    """Keep the stage's contiguous layers (the first ``L % pp`` stages one more, as
    :func:`peakmem.formulas.model_parallel.stage_layer_counts`), drop the rest, as torchtitan's
    ``pipeline_module_split`` does by deleting modules from a deep copy."""
    from peakmem.formulas.model_parallel import stage_layer_counts

    inner: Any = model.model
    start, n = stage_layer_counts(len(inner.layers), par.pp, stage)
    inner.layers = nn.ModuleList(list(inner.layers)[start : start + n])
    if stage != 0:
        inner.embed_tokens = None
    if stage != par.pp - 1:
        inner.norm = None
        model.lm_head = None


# ------------------------------------------------------------------------------------------------
# The run


def measure_rank(
    config: dict[str, Any],
    setup: TrainingSetup,
    par: Parallelism,
    rank: int,
    *,
    steps: int = 2,
    seed: int = 0,
    schedule: str = "1f1b",
    isolate: bool = True,
) -> RankMeasurement:
    """Run ``steps`` training steps of ``config`` laid out as ``par`` and measure what ``rank`` holds.

    Step 1 creates the optimizer states; the phases report the maximum over the steps (step 2 is the
    steady state). Under PP each micro-batch's forward and backward are phases of their own, so a
    stage's forward peak includes the earlier micro-batches it still holds.

    ``isolate=True`` runs the rank in a child process (from a forkserver, :func:`_context`): a second
    fake world in the same process fails (DTensor's functional collectives resolve a destroyed group of
    the first world by name), so every rank gets a fresh process."""
    _check(config, setup, par, rank, schedule)
    if not isolate:
        return _measure_here(config, setup, par, rank, steps, seed, schedule)
    result: RankMeasurement = run_in_child(
        _context(), _measure_here, (config, setup, par, rank, steps, seed, schedule),
        f"parallel oracle, rank {rank} of {describe(par, schedule)}",
    )  # fmt: skip
    return result


def _context() -> Any:
    """A forkserver started once, with torch, transformers' Llama-family modules and this module
    imported (about 4 s): each rank is forked from that single-threaded server, warm and clean (a fork
    of a process whose threads hold locks, as a test session's may, can deadlock)."""
    import multiprocessing

    global _CONTEXT
    if _CONTEXT is None:
        _CONTEXT = multiprocessing.get_context("forkserver")
        _CONTEXT.set_forkserver_preload(list(PRELOAD))
        os.environ[WARM_ENV] = "1"  # inherited by the server (started now), which then warms up
        try:
            from multiprocessing import forkserver

            forkserver.ensure_running()
        finally:
            del os.environ[WARM_ENV]
    return _CONTEXT


WARM_ENV = "PEAKMEM_PARALLEL_ORACLE_SERVER"


def _warm_up() -> None:
    """In the forkserver only (``WARM_ENV`` set when this module is preloaded there): build a tiny model
    of each known family and step it once, so that transformers' lazy modules and torch's first-call
    paths are loaded before any rank is forked (about 4 s once instead of per rank). One intra-op
    thread, in the server and so in every rank (tiny models; a process forked after OpenMP ran a
    parallel region can hang in its next one)."""
    torch.set_num_threads(1)
    setup = TrainingSetup(precision=Precision.FP32, micro_batch=1, seq_len=8)
    for family in ("llama", "qwen2", "mistral"):
        model = build_model({**TINY_LLAMA, "model_type": family, "architectures": None}, setup)
        ids = torch.randint(0, 8, (1, 8))
        model(input_ids=ids, labels=ids).loss.backward()


_CONTEXT: Any = None
PRELOAD = (
    "torch", "torch.distributed.fsdp", "torch.distributed.pipelining", "torch.distributed.tensor.parallel",
    "torch.testing._internal.distributed.fake_pg", "transformers", "transformers.models.llama.modeling_llama",
    "transformers.models.qwen2.modeling_qwen2", "transformers.models.mistral.modeling_mistral",
    "peakmem.measure.parallel",
)  # fmt: skip


def _measure_here(
    config: dict[str, Any],
    setup: TrainingSetup,
    par: Parallelism,
    rank: int,
    steps: int,
    seed: int,
    schedule: str,
) -> RankMeasurement:
    gc_was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()  # frees at refcount zero, deterministically
    try:
        with fake_world(par, rank) as mesh:
            return _measure(config, setup, par, rank, mesh, steps, seed, schedule)
    finally:
        if gc_was_enabled:
            gc.enable()


def _measure(
    config: dict[str, Any],
    setup: TrainingSetup,
    par: Parallelism,
    rank: int,
    mesh: Any,
    steps: int,
    seed: int,
    schedule: str,
) -> RankMeasurement:
    from torch.distributed.tensor.parallel import loss_parallel

    coord = dict(zip(MESH_DIMS, mesh.get_coordinate(), strict=True))
    stage = coord["pp"]
    model = build_model(config, setup, seed=seed)
    model.train()
    if par.pp > 1:
        _cut_stage(model, par, stage)
    if par.tp > 1:
        _apply_tp(model, mesh["tp"], par.sequence_parallel)
    tracker = ParallelTracker(device_type="cpu")
    if setup.checkpointing is Checkpointing.FULL:  # after TP, before FSDP2, as torchtitan
        apply_full_ac(model, tracker)
    stage_module = _Stage(model, stage == 0, stage == par.pp - 1) if par.pp > 1 else None
    if par.cp > 1:
        from peakmem.measure.parallel_cp import use_cp_attention

        use_cp_attention(model)
    if par.fsdp is FsdpMode.FULL_SHARD:
        root = stage_module if stage_module is not None else model
        # torchtitan shards FSDP over dp x cp (its dp_shard_cp mesh)
        fsdp_mesh = mesh["dp", "cp"]._flatten("dp_cp") if par.cp > 1 else mesh["dp"]
        _apply_fsdp(model, root, fsdp_mesh, setup, reshard_after_forward=par.pp == 1)
    tracker.register_module(model)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = make_optimizer(setup.optimizer, setup.optimizer_impl, _param_groups(params))
    gen = torch.Generator().manual_seed(seed)
    lp: Callable[[], Any] = loss_parallel if par.tp > 1 else nullcontext
    vocab = int(config["vocab_size"])
    step_fn = (
        _pipeline_step(stage_module, par, stage, setup, schedule, tracker, lp, vocab, mesh["pp"].get_group())
        if par.pp > 1
        else _plain_step(model, setup, tracker, lp, mesh["cp"] if par.cp > 1 else None, par.cp_ring.value,
                         no_sync=par.fsdp is not FsdpMode.NONE and skips_grad_sync(setup, fsdp2=par.is_fsdp2))
    )  # fmt: skip
    with tracker:
        tracker.set_phase(Phase.LOAD, 0)
        tracker.watch_gradients(model.named_parameters())
        for step in range(1, steps + 1):
            ids = torch.randint(
                0, vocab, (setup.micro_batch * setup.grad_accum, setup.seq_len), generator=gen
            )
            tracker.tag(ids, INPUT)
            step_fn(ids, step)
            del ids
            tracker.set_phase(Phase.OPTIMIZER, step)
            _tag_gradients(tracker, params)  # FSDP2 and DTensor grads bypass AccumulateGrad's hook
            optimizer.step()
            optimizer.zero_grad(set_to_none=setup.grads_set_to_none)
            tracker.tag_optimizer_states(optimizer)
        tracker.set_phase(Phase.LOAD, steps + 1)  # closes the last segment
    phases: dict[Phase, int] = {}
    cats: dict[Phase, dict[Category, int]] = {}
    per_step: dict[int, dict[Phase, int]] = {}
    labels: dict[Phase, tuple[tuple[Category, str, int], ...]] = {}
    for snap in tracker.ledger.peaks():
        if snap.phase not in PHASES:
            continue
        per_step.setdefault(snap.step, {})[snap.phase] = snap.bytes
        if snap.bytes > phases.get(snap.phase, -1):
            phases[snap.phase] = snap.bytes
            cats[snap.phase] = snap.by_category()
            labels[snap.phase] = tuple(snap.by_label())
    return RankMeasurement(
        layout=describe(par, schedule), rank=rank, coordinate=coord, stage=stage,
        role=role_of(par, stage), phases=phases, categories=cats, steps=per_step, labels=labels,
    )  # fmt: skip


def _param_groups(params: list[nn.Parameter]) -> Any:
    """One param group of DTensors and one of plain tensors: a foreach kernel takes one kind (TP without
    SP leaves the norms plain, replicated tensors; torchtitan's SP makes them DTensors too)."""
    dtensors = [p for p in params if hasattr(p, "_local_tensor")]
    plain = [p for p in params if not hasattr(p, "_local_tensor")]
    return [{"params": g} for g in (dtensors, plain) if g]


def _tag_gradients(tracker: ParallelTracker, params: list[nn.Parameter]) -> None:
    for p in params:
        if p.grad is not None:
            tracker.tag(p.grad, GRAD)


def describe(par: Parallelism, schedule: str = "1f1b") -> str:
    parts = [f"{name}{getattr(par, name)}" for name in ("tp", "pp", "cp") if getattr(par, name) > 1]
    if par.sequence_parallel:
        parts[0] += "+sp"
    if par.cp > 1 and par.cp_ring is not CpRotate.ALLGATHER:
        parts[-1] += f"+{par.cp_ring.value}"
    if par.fsdp is FsdpMode.FULL_SHARD:
        parts.append(f"fsdp{par.dp}")
    if par.pp > 1:
        parts.append(schedule)
    return " x ".join(parts) or "single"


def _plain_step(
    model: nn.Module,
    setup: TrainingSetup,
    tracker: ParallelTracker,
    lp: Callable[[], Any],
    cp_mesh: Any = None,
    rotate: str = "allgather",
    no_sync: bool = False,
) -> Callable[[torch.Tensor, int], None]:
    def run(ids: torch.Tensor, step: int) -> None:
        chunks = torch.split(ids, setup.micro_batch)
        for i, chunk in enumerate(chunks):
            if no_sync:  # accelerate's no_sync under FSDP2: reduce-scatter in the last micro-batch only
                model.set_requires_gradient_sync(i == len(chunks) - 1)  # type: ignore[operator]
            tracker.set_phase(Phase.FORWARD, step)
            # the positions of the whole sequence: under SP the embedding's output is the rank's
            # sequence shard, from which LlamaModel would derive too few
            positions = torch.arange(chunk.shape[1]).unsqueeze(0)
            labels = chunk
            cp: Any = nullcontext()
            if cp_mesh is not None:  # CP shards the micro-batch's own buffers in place, as torchtitan
                from peakmem.measure.parallel_cp import cp_context

                chunk, labels = chunk.clone(), chunk.clone()
                cp = cp_context(cp_mesh, [chunk, labels, positions], [1, 1, 1], rotate)
            with lp(), cp:
                loss = model(input_ids=chunk, labels=labels, position_ids=positions).loss
                if setup.grad_accum > 1:
                    loss = loss / setup.grad_accum
                tracker.set_phase(Phase.BACKWARD, step)
                loss.backward()
            del loss

    return run


def _pipeline_step(
    module: Any,
    par: Parallelism,
    stage: int,
    setup: TrainingSetup,
    schedule: str,
    tracker: ParallelTracker,
    lp: Callable[[], Any],
    vocab: int,
    group: Any,
) -> Callable[[torch.Tensor, int], None]:
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    first, last = stage == 0, stage == par.pp - 1
    model = module.model
    mb, seq = setup.micro_batch, setup.seq_len
    hidden = int(model.config.hidden_size)
    dtype = torch.bfloat16 if setup.precision is Precision.MIXED_BF16 else torch.float32
    with torch.device("meta"):
        act = torch.empty(mb, seq, hidden, dtype=dtype)
        example_in = torch.empty(mb, seq, dtype=torch.long) if first else act
        example_out = torch.empty(mb, seq, vocab, dtype=dtype) if last else act
    # Static shapes and grads: torch's runtime shape inference sends metadata objects, which a fake
    # process group cannot carry (PipelineStage docstring: input_args/output_args/*_grads).
    pipe = PipelineStage(
        module, stage, par.pp, torch.device("cpu"), input_args=example_in, output_args=example_out,
        input_grads=None if first else (act,), output_grads=None if last else (act,), group=group,
    )  # fmt: skip
    # Every stage votes STATIC (complete static metadata, no DTensor between stages: _utils.py
    # InferenceMode.needs_dynamic); the vote travels by send/recv, which a fake group does not carry.
    static = torch.ones(1, dtype=torch.int32)
    pipe._warmup_forward_vote = lambda *a, **k: static  # type: ignore[method-assign]
    pipe._warmup_backward_result = lambda *a, **k: static  # type: ignore[method-assign]
    loss_fn = model.loss_function  # transformers' ForCausalLMLoss: fp32 upcast, shifted labels

    def loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = loss_fn(logits, labels, vocab_size=vocab)
        return out

    cls = Schedule1F1B if schedule == "1f1b" else ScheduleGPipe
    sched = cls(pipe, n_microbatches=setup.grad_accum, loss_fn=loss)
    current = {"step": 0}
    forward, backward = pipe.forward_one_chunk, pipe.backward_one_chunk

    def fwd(*a: Any, **k: Any) -> Any:
        tracker.set_phase(Phase.FORWARD, current["step"])
        return forward(*a, **k)

    def bwd(*a: Any, **k: Any) -> Any:
        tracker.set_phase(Phase.BACKWARD, current["step"])
        return backward(*a, **k)

    pipe.forward_one_chunk = fwd  # type: ignore[method-assign]
    pipe.backward_one_chunk = bwd  # type: ignore[method-assign]

    def run(ids: torch.Tensor, step: int) -> None:
        current["step"] = step
        args = (ids,) if first else ()
        target = ids if last else None
        losses: list[torch.Tensor] | None = [] if last else None
        with lp():  # torchtitan runs the whole step in its train context (loss_parallel included)
            sched.step(*args, target=target, losses=losses, return_outputs=False)  # as torchtitan
        del losses

    return run


# ------------------------------------------------------------------------------------------------
# Parity: the oracle against peakmem's per-rank estimate

# A tiny Llama (RoPE, RMSNorm, SwiGLU, GQA, untied head) whose heads, KV heads, MLP width and vocab all
# divide by 2 and whose 2 layers split into 2 stages; hidden 128 and vocab 512 make activations, FSDP
# units and the logits all matter, and one rank runs in about a second.
TINY_LLAMA: dict[str, Any] = {
    "model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 512, "hidden_size": 128,
    "intermediate_size": 344, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "max_position_embeddings": 256, "bos_token_id": 0, "eos_token_id": 0,
}  # fmt: skip
# The grid: every degree alone (TP with and without torchtitan's SP), the 2-D products and the 3-D one
# (8 ranks).
GRID: tuple[Parallelism, ...] = (
    Parallelism(gpus=4, fsdp=FsdpMode.FULL_SHARD),
    Parallelism(gpus=2, tp=2),
    Parallelism(gpus=2, tp=2, sequence_parallel=True),
    Parallelism(gpus=2, pp=2),
    Parallelism(gpus=4, tp=2, fsdp=FsdpMode.FULL_SHARD),
    Parallelism(gpus=4, tp=2, sequence_parallel=True, fsdp=FsdpMode.FULL_SHARD),
    Parallelism(gpus=4, pp=2, fsdp=FsdpMode.FULL_SHARD),
    Parallelism(gpus=4, tp=2, pp=2),
    Parallelism(gpus=8, tp=2, pp=2, fsdp=FsdpMode.FULL_SHARD),
    # context parallelism (measure/parallel_cp.py): torch's context_parallel, all-gather rotate (its
    # default; what cp_rotate "auto" means under FSDP2); FSDP shards over dp x cp, as torchtitan
    Parallelism(gpus=2, cp=2, cp_rotate=CpRotate.ALLGATHER),
    Parallelism(gpus=4, cp=2, fsdp=FsdpMode.FULL_SHARD),
    Parallelism(gpus=4, tp=2, cp=2, cp_rotate=CpRotate.ALLGATHER),
    Parallelism(gpus=8, tp=2, cp=2, fsdp=FsdpMode.FULL_SHARD),
    Parallelism(gpus=8, tp=2, sequence_parallel=True, cp=2, fsdp=FsdpMode.FULL_SHARD),
    Parallelism(gpus=8, cp=4, fsdp=FsdpMode.FULL_SHARD),
)


@dataclass(frozen=True, kw_only=True)
class PhaseCheck:
    """One phase of one rank: the oracle's bytes and the estimate's (None: the layout is not one
    peakmem can express, e.g. GPipe)."""

    layout: str
    rank: int
    role: str
    phase: Phase
    oracle: int
    estimate: int | None

    @property
    def error(self) -> float | None:
        return None if self.estimate is None else (self.estimate - self.oracle) / self.oracle


def rank_types(par: Parallelism) -> tuple[int, ...]:
    """One rank per pipeline stage (coordinate (stage, 0, 0, 0)): ranks differ by stage only (every
    TP/FSDP rank of a stage holds the same padded shard sizes; FSDP2 pads every shard to chunk 0's)."""
    per_stage = par.gpus // par.pp
    return tuple(stage * per_stage for stage in range(par.pp))


def compare_rank(
    config: dict[str, Any], setup: TrainingSetup, par: Parallelism, rank: int, *, schedule: str = "1f1b"
) -> tuple[PhaseCheck, ...]:
    """The oracle's per-phase peaks of ``rank`` next to ``peakmem.ranks.estimate_ranks`` for the same
    rank type (``setup`` should carry ``KernelPolicy.CPU``: the CPU's kernels decide the bytes)."""
    from peakmem.hf import spec_from_config
    from peakmem.ranks import estimate_ranks

    m = measure_rank(config, setup, par, rank, schedule=schedule)
    ana: dict[Phase, int] = {}
    if schedule == "1f1b":  # peakmem's pipeline schedules are 1F1B and interleaved
        spec = spec_from_config(config, name=str(config.get("model_type")))
        est = estimate_ranks(spec, setup, par).role(m.role).estimate
        ana = {p.phase: p.bytes for p in est.phases}
    return tuple(
        PhaseCheck(layout=m.layout, rank=rank, role=m.role, phase=ph, oracle=b, estimate=ana.get(ph))
        for ph, b in m.phases.items()
    )


def table(rows: list[PhaseCheck], tolerance: float) -> str:
    head = f"{'layout':28} {'rank':>4} {'role':12} {'phase':9} {'oracle':>10} {'estimate':>10} {'error':>8}"
    lines = [head, "-" * len(head)]
    for r in rows:
        est = "n/a" if r.estimate is None else str(r.estimate)
        err = "" if r.error is None else f"{r.error:+.2%}" + ("" if abs(r.error) <= tolerance else "!")
        lines.append(
            f"{r.layout:28} {r.rank:>4} {r.role:12} {r.phase.value:9} {r.oracle:>10} {est:>10} {err:>8}"
        )
    checked = [r for r in rows if r.error is not None]
    ok = sum(abs(r.error) <= tolerance for r in checked if r.error is not None)
    lines.append(f"{ok}/{len(checked)} phase peaks within {tolerance:.0%} ('!' marks a miss)")
    return "\n".join(lines)


__all__ = [
    "GRID",
    "TINY_LLAMA",
    "ParallelTracker",
    "PhaseCheck",
    "RankMeasurement",
    "compare_rank",
    "fake_world",
    "measure_rank",
    "rank_types",
    "role_of",
    "table",
]


if os.environ.get(WARM_ENV) == "1":  # preloaded by the oracle's own forkserver: see _context
    _warm_up()
