"""Data-parallel engines: what one rank keeps of the model states, and their buffers.

Every term models a tensor the engine allocates (DeepSpeed 0.19.8, torch 2.13). Per rank, with
``P`` the rank's parameters after TP/PP/EP (:mod:`.model_parallel`) and ``N`` the sharding degree:

DDP (torch/nn/parallel/distributed.py, torch/csrc/distributed/c10d/reducer.cpp): full states;
the reducer allocates one flat gradient buffer per bucket (``bucket_cap_mb=25``) covering all
gradients, a second gradient-sized copy unless ``gradient_as_bucket_view=True`` makes ``param.grad``
a view into it.

ZeRO-1/2 (deepspeed/runtime/zero/stage_1_and_2.py ``DeepSpeedZeroOptimizer``):
* 16-bit parameters, full (``bit16_groups_flat``, padded to ``2 x N``);
* fp32 master partition ``single_partition_of_fp32_groups`` (P/N) and the optimizer states on it;
* stage 2: the 16-bit gradient partition ``grads_in_partition`` (``torch.empty(total_size,
  dtype=self.dtype)``), filled through the contiguous ``ipg`` bucket of ``reduce_bucket_size``
  elements (``setup_buckets``: one buffer, two when ``overlap_comm``); stage 1 keeps full 16-bit
  gradients until the reduction at the accumulation boundary;
* at the step, ``single_grad_partition = self.flatten(self.averaged_gradients[i]).to(fp32)``: the
  partition's gradient views concatenated into a 16-bit copy (2 P/N), then cast (4 P/N); the copy is
  freed before the optimizer runs (stage 3 the same, per sub-group).

ZeRO-3 (deepspeed/runtime/zero/stage3.py ``DeepSpeedZeroOptimizer_Stage3``, partition_parameters.py,
partitioned_param_coordinator.py):
* 16-bit parameter partitions ``ds_tensor`` (ceil(numel/N) each); parameters with fewer than
  ``param_persistence_threshold`` elements stay whole on every rank (``ds_persist``);
* ``grad_partitions_flat_buffer`` (16-bit, P/N, allocated at init) and one ``ipg`` bucket of
  ``reduce_bucket_size`` elements per dtype (allocated at init);
* fp32 master partition and states; at the step, fp32 gradients per sub-group of
  ``sub_group_size`` elements (``_prepare_fp32_grad_for_sub_group``);
* gathered parameters (the prefetcher's working set up to ``max_live_parameters``; none on one rank;
  without ``zero.Init`` every Linear weight torch's ``F.linear`` saved) and the gradient reduce's
  copies: :mod:`.zero3`.

FSDP (torch/distributed/fsdp): the sharded parameters keep the dtype the model was built in (fp32
for mixed precision: they are the master weights; ``MixedPrecision(param_dtype=bf16)`` only casts the
gathered copy); gradients are sharded in that dtype. FSDP2 (``_fully_shard/_fsdp_param.py``
``_init_sharded_param``) shards each parameter on dim 0 with ``torch.chunk`` and pads every shard to
the first chunk's size; FSDP1 (``_flat_param.py``) flattens each unit and pads it to a multiple of
``N``. Units are transformer layers (accelerate ``TRANSFORMER_BASED_WRAP``) plus the root (embeddings,
final norm, head), which is not resharded after forward (FSDP2 ``reshard_after_forward=None`` ->
False for the root; FSDP1 ``_runtime_utils._post_forward``). In flight: the current unit and one
prefetched (FSDP1 ``limit_all_gathers``: ``_max_num_inflight_all_gathers = 2``; FSDP2 implicit
prefetch), and in backward the unit's unsharded gradients plus the reduce-scatter input.
``shard-grad-op`` keeps every unit unsharded from its forward to its backward.

Offload (ZeRO-Offload, arXiv 2101.06840; ZeRO-Infinity, arXiv 2104.07857; FSDP ``CPUOffload``): the
fp32 master, optimizer states and fp32 gradients live in pinned CPU RAM (DeepSpeed ``pin_memory``
default True); parameter offload moves the 16-bit partitions there too. NVMe keeps them on disk
with pinned swap buffers (deepspeed/runtime/zero/offload_config.py: ``buffer_count=5``,
``buffer_size=1e8`` for parameters; ``buffer_count=4`` for the optimizer).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from fractions import Fraction

from peakmem.breakdown import Category, MemoryItem, PerParamRow
from peakmem.defaults import skips_grad_sync
from peakmem.dtypes import DType
from peakmem.parallel import AdapterWrap, FsdpMode, Offload, Parallelism
from peakmem.training import Method, ReduceDtype, TrainingSetup
from peakmem.units import MiB

from . import bnb_fsdp as _bnb
from . import fsdp1_root as _root1
from . import fsdp2 as _fsdp2
from . import fsdp_no_sync as _nosync
from . import zero3 as _zero3
from . import zero_offload as _offload
from . import zero_streams as _zs
from .activations import float8 as _f8
from .fsdp2 import SRC_FSDP_GATHER, SRC_FSDP_RS
from .fsdp_no_sync import SRC_FSDP1_MIXED
from .model_parallel import LocalTensor, StageParams, cdiv, local_tensor, stage_groups
from .optimizer import PER_PARAM_TEMPORARIES
from .technique import Technique

SRC_DDP = "torch/csrc/distributed/c10d/reducer.cpp: one flat gradient buffer per bucket (bucket_cap_mb=25)"
SRC_Z12_PARAMS = "deepspeed stage_1_and_2.py: bit16_groups_flat (full 16-bit copy on every rank)"
SRC_Z_MASTER = (
    "deepspeed stage_1_and_2.py / stage3.py: single_partition_of_fp32_groups / fp32_partitioned_groups_flat"
)
SRC_Z2_GRADS = "deepspeed stage_1_and_2.py: grads_in_partition = torch.empty(partition, dtype=16-bit)"
SRC_Z1_GRADS = "deepspeed stage 1 (partition_gradients=False): full 16-bit grads until the boundary reduce"
SRC_Z_IPG = "deepspeed setup_buckets / stage3 __init__: ipg bucket torch.empty(reduce_bucket_size)"
# DeepSpeed stage_1_and_2.py (git 38327e0, version.txt 0.16.5; the same in v0.7.0, v0.10.0, v0.14.0): stage 2
# runs ``independent_gradient_partition_epilogue`` (L764-806) after every micro-batch (engine.py
# ``allreduce_gradients`` L2048-2053); it keeps views of ``grads_in_partition`` in ``averaged_gradients``
# (``get_flat_partition(..., return_tensor_list=True)``, L1723-1760) while ``_release_ipg_buffers``
# (L676-680) drops the attribute, so the next micro-batch's ``copy_grads_in_partition`` (L1329-1363)
# ``torch.empty``s a second one, added in place (L797-800) and freed by ``zero_grad`` (L1638-1652).
# ``backward`` (L2038-2062) allocates the ipg buffer(s) every micro-batch; stage 1 releases them only
# in the boundary's epilogue (``reduce_ready_partitions_and_remove_grads`` L1424-1426).
SRC_Z2_ACCUM = (
    "deepspeed stage_1_and_2.py copy_grads_in_partition: a new grads_in_partition per micro-batch while "
    "averaged_gradients holds the accumulated one (independent_gradient_partition_epilogue)"
)
SRC_Z1_IPG = (
    "deepspeed stage_1_and_2.py backward: ipg buffers allocated per micro-batch, released at the boundary"
)
SRC_Z_FP32_GRAD = "deepspeed step: single_grad_partition = self.flatten(averaged_gradients).to(fp32)"
SRC_Z_FLATTEN = (
    "deepspeed stage_1_and_2.py step / stage3.py _prepare_fp32_grad_for_sub_group: "
    "self.flatten(self.averaged_gradients[i]) (torch.cat of the partition's gradient views), then .to(fp32)"
)
SRC_Z3_PARAMS = "deepspeed partition_parameters.py: ds_tensor = ceil(numel / N) 16-bit elements"
SRC_Z3_PERSIST = "deepspeed partition_parameters.py: ds_persist when numel < param_persistence_threshold"
SRC_Z3_GRADS = "deepspeed stage3.py: grad_partitions_flat_buffer (16-bit, allocated at init)"
SRC_FSDP_SHARD = "torch fsdp _fsdp_param.py _init_sharded_param: torch.chunk(dim 0), padded to chunk 0"
SRC_FSDP1_SHARD = "torch fsdp _flat_param.py: unit flattened and padded to a multiple of world size"
SRC_OFFLOAD = "ZeRO-Offload (arXiv 2101.06840) / FSDP CPUOffload: pinned CPU copies"
SRC_NVME = "deepspeed offload_config.py: NVMe swap buffers buffer_count x buffer_size, pinned"

# deepspeed/runtime/zero/offload_config.py (v0.19.8) swap-buffer defaults, in elements
DS_NVME_PARAM_BUFFER_COUNT = 5
DS_NVME_PARAM_BUFFER_SIZE = 100_000_000
DS_NVME_OPTIMIZER_BUFFER_COUNT = 4


@dataclass(frozen=True, kw_only=True)
class RankStates:
    """A rank's model states and engine buffers, split by when they are alive.

    Gradients as backward writes them: each layer's backward writes its (TP/PP-local, unsharded)
    weight gradients; ``grads_kept`` says what of them stays until the optimizer step, and
    ``grads_written_cap`` bounds what is alive at once where an engine takes each gradient away as
    soon as it is written."""

    table: tuple[PerParamRow, ...]  # the rank's bytes-per-parameter table (gradients included when whole)
    rows: tuple[PerParamRow, ...]  # resident model states on the GPU (all phases)
    resident: tuple[MemoryItem, ...]  # other resident buffers (buckets, persistent params)
    grads_kept: Fraction  # what of the gradient bytes written stays (1; 0; a shard, in its dtype)
    grads_written_cap: int | None  # bytes: the most of one layer's gradients alive at once (None: all)
    accumulated: tuple[MemoryItem, ...]  # gradients alive between micro-batches (accumulation)
    grads_backward: tuple[MemoryItem, ...]  # gradient buffers alive throughout each backward
    gathered_forward: tuple[MemoryItem, ...]  # unsharded parameters in flight during forward
    gathered_backward: tuple[MemoryItem, ...]  # unsharded parameters + gradients in flight in backward
    step: tuple[MemoryItem, ...]  # optimizer-step temporaries on the GPU
    step_grads: tuple[MemoryItem, ...]  # gradients the step reads
    cpu: tuple[MemoryItem, ...]  # pinned CPU RAM of this rank
    nvme_bytes: int
    notes: tuple[str, ...]
    # FSDP2: what one layer unit adds beyond gathered_* at its unshard (before its forward saves
    # anything), while its forward runs, and in its backward (the timeline adds these to the layer's
    # transients): see fsdp2.in_layer
    layer_unshard_extra: int = 0
    layer_forward_extra: int = 0
    layer_backward_extra: int = 0
    layer_backward_first_extra: int = 0  # the first unit backward reaches (no earlier reduce-scatter)
    layer_backward_last_extra: int = 0  # the last unit backward reaches (nothing to prefetch)
    # how the backward peak inside a layer shows ``layer_backward_extra`` (None: FSDP2's running units)
    layer_backward_item: MemoryItem | None = None
    # DeepSpeed ZeRO-3 before v0.16: more gathered bytes than today's engine keeps (the band's high end)
    engine_band_high: int = 0
    backward_start_extra: int = 0  # at the loss's and the head's backward (before any layer unit)
    # FSDP2: the root's unshards (see fsdp2.root_unshards): every unsharded byte at the first layer
    # unit's copy-out in a micro-batch's forward, and the root's all-gather output at backward's start
    first_unshard: int = 0
    backward_root_unshard: int = 0
    # FSDP2 under PP: what the reduce-scatters after the last micro-batch's backward add beyond the
    # accumulated gradients and the unsharded units (see fsdp2.pp_reduce)
    reduce_after_backward: int = 0
    # FSDP2 + TP: the vocab-parallel embedding's gradient as written is whole (V x H on every TP rank):
    # the bytes beyond its TP-local rows, in the gradients' dtype (see fsdp2.whole_embedding_grad)
    embedding_grad_extra: int = 0
    # FSDP2 without PP: the root unit's gradients (head, final norm, embeddings) stay unsharded, as
    # written, until the root's post-backward at the very end of backward; what that end adds beyond
    # them (see fsdp2.root_backward)
    root_grads_deferred: bool = False
    root_backward_extra: int = 0
    root_flat_grad: int = 0  # FSDP1: the root unit's flat gradient, torch.cat at the end (fsdp1_root)
    # FSDP / ZeRO: the bytes their side streams keep cached, which the default stream cannot reuse
    # (stream_pools.StreamPools; fsdp2.stream_pools, zero_streams.zero_stream_pools)
    side_pools: _fsdp2.StreamPools = _fsdp2.NO_POOLS


def _item(path: str, category: Category, nbytes: int, source: str, key: str = "") -> MemoryItem:
    return MemoryItem(path=path, category=category, bytes=nbytes, source=source, key=key)


def _scaled(row: PerParamRow, share: int, whole: int, total: int, tensor: str | None = None) -> PerParamRow:
    """``row`` for ``share`` of the ``whole`` parameters it covers (bytes and parameters in proportion,
    rounded up), its bytes/param against the model's ``total``; the row itself when it is whole."""
    if share == whole and tensor is None:
        return row
    nbytes = -(-row.bytes * share // whole) if whole else 0
    return replace(row, tensor=tensor or row.tensor, bytes=nbytes, params=-(-row.params * share // whole),
                   bytes_per_param=nbytes / total if total else 0.0)  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class _Local:
    """What of the technique's tensors one rank of a stage holds after TP/PP/EP (before sharding)."""

    numel: int  # base parameters on the rank (``sp.numel``)
    trainable: int  # trainable parameters on the rank (the base's, or the stage's adapters / tp)
    frozen_bytes: int  # the frozen base as stored, on the rank (0: full fine-tuning)
    largest: int  # elements of the largest trainable tensor on the rank


def _local(tech: Technique, par: Parallelism, sp: StageParams) -> _Local:
    if not tech.adapter:
        return _Local(numel=sp.numel, trainable=sp.numel, frozen_bytes=0, largest=sp.largest_tensor)
    # adapters per stage layer; those outside the layers (modules_to_save) with the head, on the last stage
    adapters = sum(count * layer.params for count, layer in stage_groups(tech.tspec, par.pp, sp.stage))
    if sp.stage == par.pp - 1:
        adapters += sum(t.numel for t in tech.tspec.outer)
    share = _frozen_bytes(tech, sp.numel - sp.root_numel, sp.root_numel)
    return _Local(numel=sp.numel, trainable=cdiv(adapters, par.tp), frozen_bytes=share,
                  largest=min(tech.largest_trainable, cdiv(adapters, par.tp)))  # fmt: skip


def _state_rows(tech: Technique, numel: int, label: str) -> list[PerParamRow]:
    return [_scaled(r, numel, tech.trainable, tech.params, f"{r.tensor}{label}") for r in tech.state_rows]


def _temporaries(tech: Technique, numel: int, largest: int, label: str) -> list[MemoryItem]:
    """The optimizer's step temporaries over ``numel`` of the trainable parameters (a shard): those
    sized by every parameter shrink with it, those sized by the largest tensor only below it."""
    out = []
    for i in tech.temporaries:
        if i.key in PER_PARAM_TEMPORARIES:
            nbytes = math.ceil(i.bytes * numel / tech.trainable) if tech.trainable else 0
        else:
            nbytes = i.bytes if largest >= tech.largest_trainable else math.ceil(
                i.bytes * largest / tech.largest_trainable)  # fmt: skip
        out.append(replace(i, path=f"{i.path}{label}", bytes=nbytes))
    return out


def one_tensor_step_bytes(tech: Technique) -> int:
    """Optimizer-in-backward builds one optimizer per parameter (torchtune ``optimizer_in_bwd``:
    ``{p: AdamW([p]) for p in model.parameters()}``, stepped in the parameter's post-accumulate-grad
    hook), so a step's temporaries are those of one tensor, at most the largest trainable one: a
    foreach ``exp_avg_sq_sqrt`` of that tensor, or the for-loop/Lion/Adafactor largest-tensor ones."""
    largest = tech.largest_trainable
    return sum(i.bytes for i in _temporaries(tech, largest, largest, ""))


def rank_states(tech: Technique, setup: TrainingSetup, par: Parallelism, sp: StageParams) -> RankStates:
    """Model states and engine buffers of one rank of pipeline stage ``sp.stage``: the technique's
    tensors (:func:`.technique.technique`), partitioned by the engine."""
    _f8.check_all_gather(setup, par)
    if par.fsdp is not FsdpMode.NONE:
        return _fsdp_states(tech, setup, par, sp)
    if par.zero_stage:
        return _zero_states(tech, setup, par, sp)
    return _replicated_states(tech, setup, par, sp)


def _replicated_states(
    tech: Technique, setup: TrainingSetup, par: Parallelism, sp: StageParams
) -> RankStates:
    """One GPU, TP/PP only, or DDP: every rank holds the technique's (TP/PP-local) tensors whole. On one
    GPU these are the technique's own rows and items, unchanged."""
    loc = _local(tech, par, sp)
    rows = [
        _scaled(r, loc.numel, tech.params, tech.params)
        if r is tech.frozen
        else _scaled(r, loc.trainable, tech.trainable, tech.params)
        for r in tech.rows
    ]
    grads = [r for r in rows if r.category is Category.GRADIENTS]
    grad_bytes = sum(r.bytes for r in grads)
    resident: list[MemoryItem] = []
    notes: list[str] = []
    if par.dp > 1:
        if par.gradient_as_bucket_view:
            notes.append("DDP gradient_as_bucket_view=True: param.grad are views into the bucket buffers")
        else:
            resident.append(_item("DDP reducer buckets (flat gradient copy)", Category.GRADIENTS, grad_bytes,
                                  SRC_DDP, key="ddp.buckets"))  # fmt: skip
            notes.append(
                f"DDP buckets of {par.ddp_bucket_bytes // MiB} MiB hold a second copy of the trainable "
                "gradients (only parameters that require grad are bucketed; gradient_as_bucket_view=False)"
            )
    accumulated = tuple(_item("gradients (accumulated)", Category.GRADIENTS, r.bytes, r.source, key="grads")
                        for r in grads)  # fmt: skip
    step_grads = _scaled_item(tech.step_grads, loc.trainable, tech.trainable)
    return RankStates(
        table=tuple(rows), rows=tuple(r for r in rows if r.category is not Category.GRADIENTS),
        resident=tuple(resident),
        grads_kept=Fraction(1), grads_written_cap=None, accumulated=accumulated, grads_backward=(),
        gathered_forward=(), gathered_backward=(),
        step=tuple(_temporaries(tech, loc.trainable, loc.largest, "")), step_grads=(step_grads,),
        cpu=(), nvme_bytes=0, notes=tuple(notes),
    )  # fmt: skip


def _scaled_item(item: MemoryItem, numel: int, total: int) -> MemoryItem:
    if numel == total:
        return item
    return replace(item, bytes=math.ceil(item.bytes * numel / total) if total else 0)


def _frozen_row(tech: Technique, nbytes: int, numel: int, label: str) -> PerParamRow:
    frozen = tech.frozen
    assert frozen is not None
    return replace(frozen, tensor=f"{frozen.tensor}{label}", bytes=nbytes, params=numel,
                   bytes_per_param=nbytes / tech.params if tech.params else 0.0)  # fmt: skip


def _weight_row(tech: Technique, numel: int, label: str, source: str) -> PerParamRow:
    what = "LoRA adapters" if tech.adapter else "weights"
    return _row(f"{what}{label}", tech.weight, numel, tech.params, Category.PARAMETERS, source)


def _zero_states(tech: Technique, setup: TrainingSetup, par: Parallelism, sp: StageParams) -> RankStates:
    """DeepSpeed ZeRO 1/2/3 over the technique's trainable tensors. Only parameters that require grad
    enter the optimizer's partitions; under ZeRO-1/2 a frozen base stays an ordinary module parameter,
    whole on every rank, and under ZeRO-3 ``zero.Init`` partitions every parameter, frozen or not."""
    stage, n = par.zero_stage, par.shard_degree
    total = tech.params
    loc = _local(tech, par, sp)
    sh = shard_numel(sp, par)
    part = _flat(loc.trainable, n) if tech.adapter else sh.numel  # trainable elements this rank owns
    master_dt = tech.master or tech.weight
    w16, g16 = tech.weight, tech.grad
    label = f" (1/{n} partition)"
    offload_opt = par.offload_optimizer is not Offload.NONE
    offload_par = par.offload_params is not Offload.NONE
    gpu_rows: list[PerParamRow] = []
    off_rows: list[PerParamRow] = []
    resident: list[MemoryItem] = []
    notes: list[str] = []
    if stage < 3:
        if tech.adapter:
            gpu_rows.append(_frozen_row(tech, loc.frozen_bytes, loc.numel, " (whole on every rank)"))
        gpu_rows.append(_weight_row(tech, loc.trainable, " (16-bit, full copy)" if not tech.adapter
                                    else " (full copy)", SRC_Z12_PARAMS))  # fmt: skip
    else:
        params_to = off_rows if offload_par else gpu_rows
        if tech.adapter:
            params_to.append(_frozen_row(tech, cdiv(loc.frozen_bytes, n), cdiv(loc.numel, n), label))
            params_to.append(_weight_row(tech, cdiv(loc.trainable, n), label, SRC_Z3_PARAMS))
        else:
            params_to.append(
                _row(f"weights{label}", w16, sh.numel, total, Category.PARAMETERS, SRC_Z3_PARAMS)
            )
        if sh.persistent:
            small = (tech.base_dtype if tech.adapter else w16).nbytes(sh.persistent)  # norms: never quantized
            resident.append(_item("persistent small parameters (whole on every rank)", Category.PARAMETERS,
                                  small, SRC_Z3_PERSIST, key="zero3.persistent"))  # fmt: skip
    states = [] if tech.master is None else [
        _row(f"master weights{label}", master_dt, part, total, Category.MASTER_WEIGHTS, SRC_Z_MASTER)
    ]  # pure 16-bit / fp32: the partition itself is updated  # fmt: skip
    states += _state_rows(tech, part, label)
    (off_rows if offload_opt else gpu_rows).extend(states)

    ipg_count = 2 if (stage < 3 and par.ds_overlap_comm) else 1
    ipg = _item(
        f"ZeRO ipg reduce bucket{'s x2' if ipg_count == 2 else ''} ({par.reduce_bucket_size:.0e} elements)",
        Category.GRADIENTS, ipg_count * g16.nbytes(par.reduce_bucket_size), SRC_Z_IPG, key="zero.ipg",
    )  # fmt: skip
    grad_part = _item(f"gradient partition ({g16.name}){label}", Category.GRADIENTS, g16.nbytes(part),
                      SRC_Z3_GRADS if stage == 3 else SRC_Z2_GRADS, key="zero.grad_partition")  # fmt: skip
    fp32_grad_numel = min(part, par.sub_group_size) if stage == 3 else part
    fp32_grad = _item(f"fp32 gradient partition at the step{label}", Category.TEMPORARIES,
                      master_dt.nbytes(fp32_grad_numel), SRC_Z_FP32_GRAD, key="zero.fp32_grad")  # fmt: skip
    cpu: list[MemoryItem] = [_item(f"offloaded {r.tensor}", r.category, r.bytes, SRC_OFFLOAD,
                                   key=_offload_key(r))
                             for r in off_rows]  # fmt: skip
    grads_backward: list[MemoryItem] = []
    accumulated: list[MemoryItem] = []
    step_grads: list[MemoryItem] = []
    kept = Fraction(0)  # each gradient leaves for the bucket as soon as it is written
    cap: int | None = g16.nbytes(loc.largest)
    step: list[MemoryItem] = []
    if stage == 3:
        if par.contiguous_gradients:
            resident.append(ipg)
        if offload_opt:
            cpu.append(replace(grad_part, source=SRC_Z3_GRADS, key="offload.grads"))
        else:
            resident.append(grad_part)
    elif stage == 2 or (stage == 1 and setup.grad_accum == 1 and par.pp == 1):
        grads_backward.append(ipg)
        if not offload_opt:
            grads_backward.append(grad_part)
            step_grads.append(grad_part)
            accumulated.append(grad_part)
            if stage == 2 and setup.grad_accum > 1:  # a later micro-batch's own partition (SRC_Z2_ACCUM)
                grads_backward.append(replace(grad_part, path=f"gradient partition of the next micro-batch "
                                              f"({g16.name}){label}", source=SRC_Z2_ACCUM))  # fmt: skip
    else:  # stage 1 with accumulation or pipeline: full gradients until the boundary reduction
        kept, cap = Fraction(1), None
        accumulated.append(_item(f"gradients ({g16.name}, full until the boundary reduce)",
                                 Category.GRADIENTS,
                                 g16.nbytes(loc.trainable), SRC_Z1_GRADS, key="grads"))  # fmt: skip
        step_grads.append(grad_part)
        if par.contiguous_gradients:
            between = setup.grad_accum > 1 and par.pp == 1  # kept from one backward() to the next
            grads_backward.append(replace(ipg, source=SRC_Z1_IPG) if between else ipg)
            if between:
                accumulated.append(grads_backward[-1])
    reduce: MemoryItem | None = None
    if offload_opt and stage < 3:  # ZeRO-Offload's GPU buffer and gradient checks (formulas/zero_offload.py)
        off = _offload.items(g16.nbytes(1), master_dt.nbytes(1), loc.largest, part, label)
        resident.append(off.buffer)
        reduce = off.check
        step.append(off.step_copy)
    if offload_opt:
        cpu.append(_item(f"fp32 gradient partition{label}", Category.GRADIENTS, master_dt.nbytes(part),
                         SRC_OFFLOAD, key="offload.fp32_grads"))  # fmt: skip
    else:
        flat = _item(f"flattened gradient partition at the step ({g16.name}){label}", Category.TEMPORARIES,
                     g16.nbytes(fp32_grad_numel), SRC_Z_FLATTEN, key="zero.flat_grad")  # fmt: skip
        temps = _temporaries(tech, part, min(part, loc.largest), label)
        if tech.master is None:  # .to() of its own dtype returns the flattened copy: the step's gradient
            moment = [flat, *temps]
        else:  # the flattened copy is freed before the optimizer runs: the larger of the two moments
            moment = [fp32_grad, *([flat] if flat.bytes > sum(t.bytes for t in temps) else temps)]
        # fp16: the overflow check over the partition's gradient views comes first (zero_offload.step_check)
        fp16_check = stage < 3 and g16.name == "fp16"
        check = _offload.step_check(min(part, loc.largest), label) if fp16_check else None
        step += [check] if check and check.bytes > sum(i.bytes for i in moment) else moment
    gathered_fwd: list[MemoryItem] = []
    gathered_bwd: list[MemoryItem] = []
    drift = embed = end_copies = 0
    if stage == 3:
        qlora = setup.method is Method.QLORA  # bitsandbytes' Linear4bit saves no weight.t() of F.linear
        got = _zero3.gathered(tech.spec, setup, par, sp, sp.numel - sh.persistent,
                              lambda n: _gathered(tech, n), saves=not qlora)  # fmt: skip
        gathered_fwd, gathered_bwd = list(got.forward), list(got.backward)
        drift = _gathered(tech, got.drift)
        notes.append(got.note)
        # the largest partition a layer's backward reduces (experts over the expert shard degree)
        if tech.adapter:
            part_in_layer = cdiv(loc.largest, n)
        else:
            ne = par.expert_shard_degree
            part_in_layer = max((cdiv(t.numel, ne if t.expert else n) for t in sp.tensors if t.in_layer),
                                default=cdiv(sp.largest_tensor, n))  # fmt: skip
        in_layer = _zero3.in_layer_reduce_bytes(g16, par, loc.trainable, part_in_layer, offload_opt)
        reduce = _item("ZeRO-3 gradient reduce in a layer's backward (concatenated bucket"
                       + ("; a partition's GPU copy and fp64 norm, offload)" if offload_opt else ")"),
                       Category.TEMPORARIES, in_layer, _zero3.SRC_Z3_REDUCE, key="zero3.reduce")  # fmt: skip
        embed = _zero3.input_embedding(sp, par)
        end_copies = _zero3.end_of_backward_copies(g16, par, embed, loc.trainable) if embed else 0
        if offload_opt and not tech.adapter and embed:
            step.append(_item("ZeRO-3 offload, end of backward: the embedding still gathered and its "
                              "gradient's reduce (its own gradient, partition copy and fp64 norm)",
                              Category.TEMPORARIES,
                              _zero3.end_of_backward_bytes(w16, g16, par, embed, loc.trainable),
                              _zero3.SRC_Z3_EPILOGUE, key="zero3.reduce_end"))  # fmt: skip
    pools = _zs.zero_stream_pools(
        par, grad_partition=grad_part.bytes, grad_accum=setup.grad_accum,
        gathered=max(sum(i.bytes for i in gathered_fwd), sum(i.bytes for i in gathered_bwd)),
        reduce_copies=max(
            reduce.bytes if reduce else 0,
            end_copies if stage == 3 and offload_opt and not tech.adapter and embed else 0,
            part if stage == 3 and g16.name == "fp16" else 0,  # has_overflow: bool isinf / isnan at the step
        ),
    )  # fmt: skip
    if pools is not _fsdp2.NO_POOLS:
        notes.append(_zs.ZERO_POOLS_NOTE.format(
            what="the gathered parameters and the reduce's copies" if stage == 3 else "the gradient partition"
        ))  # fmt: skip
    if tech.adapter:
        notes.append(
            f"ZeRO-{stage} with adapters: only parameters that require grad enter the optimizer's "
            + ("partitions; the frozen base stays whole on every rank (DeepSpeed partitions the "
               "optimizer's param groups only)" if stage < 3 else
               "partitions; zero.Init partitions the frozen base too (a quantized base needs "
               "bnb_4bit_quant_storage set to the float dtype to be partitioned)")
        )  # fmt: skip
    nvme = 0
    if par.offload_optimizer is Offload.NVME or par.offload_params is Offload.NVME:
        on_nvme = {"offload.params"} if par.offload_params is Offload.NVME else set()
        if par.offload_optimizer is Offload.NVME:
            on_nvme |= {"offload.states"}
        nvme = sum(c.bytes for c in cpu if c.key in on_nvme)
        cpu = [c for c in cpu if c.key not in on_nvme]
        if par.offload_params is Offload.NVME:
            cpu.append(_item("NVMe parameter swap buffers (pinned)", Category.OVERHEAD,
                             DS_NVME_PARAM_BUFFER_COUNT * w16.nbytes(DS_NVME_PARAM_BUFFER_SIZE), SRC_NVME,
                             key="nvme.param_buffers"))  # fmt: skip
        if par.offload_optimizer is Offload.NVME:
            cpu.append(_item("NVMe optimizer swap buffers (pinned, fp32 sub-groups)", Category.OVERHEAD,
                             DS_NVME_OPTIMIZER_BUFFER_COUNT * master_dt.nbytes(min(part, par.sub_group_size)),
                             SRC_NVME, key="nvme.optimizer_buffers"))  # fmt: skip
    return RankStates(
        table=tuple(gpu_rows), rows=tuple(gpu_rows), resident=tuple(resident),
        grads_kept=kept, grads_written_cap=cap,
        accumulated=tuple(accumulated), grads_backward=tuple(grads_backward),
        gathered_forward=tuple(gathered_fwd), gathered_backward=tuple(gathered_bwd),
        step=tuple(step), step_grads=tuple(step_grads), cpu=tuple(cpu), nvme_bytes=nvme, notes=tuple(notes),
        layer_backward_extra=reduce.bytes if reduce else 0,
        layer_backward_first_extra=reduce.bytes if reduce else 0, layer_backward_item=reduce,
        engine_band_high=drift, side_pools=pools,
    )  # fmt: skip


def _offload_key(row: PerParamRow) -> str:
    return "offload.params" if row.category is Category.PARAMETERS else "offload.states"


def _frozen_bytes(tech: Technique, layer_numel: int, root_numel: int) -> int:
    """Bytes of the frozen base as stored for ``layer_numel`` elements inside the layers (their average:
    quantized Linear weights with their scales, 16-bit norms) and ``root_numel`` outside them
    (embeddings, final norm, head: bitsandbytes quantizes none of them)."""
    frozen = tech.frozen
    assert frozen is not None
    layer_total = frozen.params - tech.root_numel
    layers = -(-(frozen.bytes - tech.frozen_root_bytes) * layer_numel // layer_total) if layer_total else 0
    root = -(-tech.frozen_root_bytes * root_numel // tech.root_numel) if tech.root_numel else 0
    return layers + root


def _gathered(tech: Technique, numel: int, root: bool = False) -> int:
    """Bytes of ``numel`` all-gathered base elements (of the layers, or of the root unit): 16-bit
    weights, or the frozen base as stored (a quantized base is gathered packed and dequantized per
    module in forward)."""
    if not tech.adapter:
        return tech.weight.nbytes(numel)
    return _frozen_bytes(tech, 0, numel) if root else _frozen_bytes(tech, numel, 0)


def _fsdp_states(tech: Technique, setup: TrainingSetup, par: Parallelism, sp: StageParams) -> RankStates:
    """FSDP over the technique's tensors: every parameter is sharded, frozen or not (LoRA needs
    ``use_orig_params=True`` under FSDP1; peft's ``fsdp_auto_wrap_policy`` wraps the adapters as units
    of their own); only trainable ones get gradient shards and optimizer states."""
    n = par.shard_degree
    total = tech.params
    loc = _local(tech, par, sp)
    sh = shard_numel(sp, par)
    # full fine-tuning: the model is built in the master dtype, the shards are the master weights
    shard_dt = tech.master or tech.weight if not tech.adapter else tech.weight
    gather_dt = tech.weight  # MixedPrecision(param_dtype=...) / the model dtype under autocast
    label = f" (1/{n} shard)"
    src = SRC_FSDP_SHARD if par.fsdp_version == 2 else SRC_FSDP1_SHARD
    part = cdiv(loc.trainable, n) if tech.adapter else sh.numel
    offload = par.offload_params is not Offload.NONE
    offload_opt = par.offload_optimizer is not Offload.NONE
    state = _bnb.state_share(tech, sp.numel - sp.root_numel) if tech.adapter else 0  # never sharded
    params: list[PerParamRow] = []
    if tech.adapter:
        params.append(_frozen_row(tech, cdiv(loc.frozen_bytes - state, n), cdiv(loc.numel, n), label))
        params.extend(_bnb.state_rows(tech, state))
        params.append(_weight_row(tech, part, label, src))
        if tech.master is not None:
            params.append(_row(f"master weights (adapters){label}", tech.master, part, total,
                               Category.MASTER_WEIGHTS, SRC_Z_MASTER))  # fmt: skip
    else:
        params.append(_row(f"sharded parameters ({shard_dt.name}, master){label}", shard_dt, sh.numel, total,
                           Category.PARAMETERS, src))  # fmt: skip
    opt = _state_rows(tech, part, label)
    gpu_rows: list[PerParamRow] = []
    off_rows: list[PerParamRow] = []
    (off_rows if offload else gpu_rows).extend(params)
    (off_rows if offload_opt else gpu_rows).extend(opt)
    grad_dt = shard_dt if not tech.adapter else tech.grad
    grads_item = _item(f"sharded gradients ({grad_dt.name}){label}", Category.GRADIENTS,
                       grad_dt.nbytes(part), src, key="grads")  # fmt: skip
    unit = sp.largest_unit
    unit_trainable = cdiv(loc.trainable * unit, loc.numel) if tech.adapter and loc.numel else unit
    mixed = 0 if offload else _in_layer_grad_numel(tech, par, sp, loc)
    no_sync = skips_grad_sync(setup, fsdp2=par.is_fsdp2)  # micro-batches but the last without grad sync
    grads_kept = Fraction(0) if offload else Fraction(grad_dt.bits, tech.grad.bits * n)
    if mixed:  # FSDP1, adapters inside the layer units: every unit's gradient is whole-unit sized
        grads_item = _item(f"sharded gradients of the whole units, frozen weights included ({grad_dt.name})"
                           f"{label}", Category.GRADIENTS, grad_dt.nbytes(cdiv(mixed, n)), SRC_FSDP1_MIXED,
                           key="grads")  # fmt: skip
        adapters = loc.trainable - _outer_adapters(tech, par, sp)
        if adapters:  # backward writes (and keeps a shard of) each layer unit's whole gradient
            in_layers = mixed - _mixed_root(tech, par, sp)
            grads_kept = Fraction(grad_dt.bits * in_layers, tech.grad.bits * n * adapters)
        unit_trainable = unit + unit_trainable
    cpu = [_item(f"offloaded {r.tensor}", r.category, r.bytes, SRC_OFFLOAD) for r in off_rows]
    if offload:
        cpu.append(_item(f"offloaded gradients{label}", Category.GRADIENTS, grads_item.bytes, SRC_OFFLOAD))

    def gathered(numel: int, root: bool = False) -> int:
        base = _gathered(tech, numel, root) if tech.adapter else gather_dt.nbytes(numel)
        base = _bnb.gathered_unit(base, 0 if root or not tech.adapter else _bnb.state_share(tech, numel))
        return base + (
            gather_dt.nbytes(cdiv(loc.trainable * numel, loc.numel)) if tech.adapter and not root else 0
        )

    unit_bytes, units_bytes, cast = gathered(unit), gathered(sum(c * u for c, u in sp.layer_units)), 0
    if setup.float8_all_gather:  # torchao: the layer units' converted Linear weights gathered in float8
        unit_bytes, units_bytes, cast = _float8_units(tech, par, sp, gather_dt, shard_dt if offload else None)
    gathered_fwd = [_item("FSDP root unit unsharded (embeddings, final norm, head)", Category.PARAMETERS,
                          gathered(sp.root_numel, root=True), SRC_FSDP_GATHER, key="fsdp.root")]  # fmt: skip
    rs_dt = _fsdp2.reduce_dt(tech, setup)  # the framework's reduce dtype (peakmem.defaults REDUCE_DTYPE)
    reduce_scatter = _item("FSDP reduce-scatter input (one unit's gradients)", Category.GRADIENTS,
                           rs_dt.nbytes(unit_trainable), SRC_FSDP_RS, key="fsdp.reduce_scatter")  # fmt: skip
    unshard_extra = fwd_extra = bwd_extra = bwd_first = bwd_start = bwd_last = root_extra = first = (
        root_again
    ) = 0
    pp_reduce = 0
    if par.fsdp is FsdpMode.SHARD_GRAD_OP:
        gathered_fwd.append(_item("FSDP shard-grad-op: every layer unit unsharded from forward to backward",
                                  Category.PARAMETERS, units_bytes, SRC_FSDP_GATHER,
                                  key="fsdp.units"))  # fmt: skip
        gathered_bwd = [*gathered_fwd, reduce_scatter]
    elif par.fsdp_version == 2 and sp.layers:
        # the reduce-scatter input is in the reduce dtype (accelerate: the param dtype; torchtitan
        # mixed_precision_reduce = float32, MixedPrecisionPolicy(reduce_dtype=float32))
        rs_unit = reduce_scatter.bytes
        reduces = _fsdp2.reduce_adds(par, no_sync)  # the kept reduce-scatter inputs
        kept_rs = rs_unit if reduces else 0
        fwd_items, bwd_items, in_layer = _fsdp2.in_layer(unit_bytes, units_bytes, kept_rs, par)
        unshard_extra, fwd_extra, bwd_extra, bwd_first, bwd_start, bwd_last = in_layer
        root_gathered = gathered(sp.root_numel, root=True)
        first, root_again = _fsdp2.root_unshards(root_gathered, unit_bytes, par)
        # a unit's float8 casts come before its all-gather output and parameters (float8.py)
        cast_over = max(0, cast - 2 * unit_bytes)
        first, unshard_extra = first + cast_over, unshard_extra + (cast_over if par.pp == 1 else 0)
        root_rs = 0 if tech.adapter else rs_dt.nbytes(sp.root_numel)
        if par.pp == 1:
            root_extra = _fsdp2.root_backward(kept_rs, root_rs, root_gathered) if reduces else 0
        elif not tech.adapter:
            pp_reduce = _fsdp2.pp_reduce(rs_unit, unit_bytes, root_rs, root_gathered, n)
        gathered_bwd = [*gathered_fwd, *bwd_items]
        gathered_fwd.extend(fwd_items)
    else:
        gathered_fwd.append(_item("FSDP all-gathered units (current + prefetched layer)", Category.PARAMETERS,
                                  min(2, sp.layers) * unit_bytes, SRC_FSDP_GATHER,
                                  key="fsdp.units"))  # fmt: skip
        gathered_bwd = [*gathered_fwd, reduce_scatter]
    pools = _fsdp2.NO_POOLS
    if sp.layers:
        pools = _fsdp2.stream_pools(0 if offload else grads_item.bytes, gathered(sp.root_numel, root=True),
                                    unit_bytes, version=par.fsdp_version, world=n)  # fmt: skip
    step = [] if offload_opt else _temporaries(tech, part, min(part, loc.largest), label)
    what = (
        "the frozen base as stored and the adapters"
        if tech.adapter
        else (f"sharded parameters and gradients in {shard_dt.name}, gathered copies in {gather_dt.name}")
    )
    notes = [f"FSDP{par.fsdp_version} {par.fsdp.value}: units = transformer layers + the root; {what}"]
    if setup.float8_all_gather:
        notes.append(_f8.ALL_GATHER_NOTE.format(gather=gather_dt.name))
    if pools is not _fsdp2.NO_POOLS:
        notes.append(
            f"FSDP{par.fsdp_version} side streams: the sharded gradients (reduce-scatter stream) and the "
            "all-gather outputs (unshard stream) stay cached for their own streams; reserved counts what of "
            "them the peak does not hold (the caching allocator serves a block to its own stream only)"
        )
    if tech.adapter and tech.frozen is not None and tech.frozen.dtype in ("nf4", "fp4", "int8"):
        notes.append(
            "FSDP + QLoRA: the packed base is stored as bnb_4bit_quant_storage (the float dtype) so "
            "FSDP flattens and shards it like any parameter (Answer.AI fsdp_qlora); its quantization "
            "states are no parameter: whole on every rank, never gathered"
            if tech.frozen_state_bytes
            else "FSDP + QLoRA: the quantized base is sharded with its scales (torchao NF4Tensor)"
        )
    accumulated = _fsdp2.accumulated(tech, par, sp, rs_dt, no_sync) or _nosync.unsharded_grads(
        par, adapter=bool(tech.adapter), mixed=mixed, trainable=loc.trainable, numel=loc.numel,
        grad_dt=tech.grad if tech.adapter else gather_dt, no_sync=no_sync,
    )  # fmt: skip
    kept_whole = accumulated is not None  # unsharded on the GPU, whatever the offload
    if mixed:
        kept = "; with gradient accumulation (no_sync) kept unsharded between micro-batches"
        notes.append(
            "FSDP1 with the adapters inside the layer units (use_orig_params): each unit's gradient covers "
            "the whole unit, frozen weights included" + (kept if kept_whole else "")
        )
    if setup.grad_accum > 1 and par.pp == 1:
        notes.append(_nosync.sync_note(setup, kept_whole, fsdp2=par.is_fsdp2))
    if not tech.adapter and (tech.master is not None or setup.fsdp_reduce_dtype is not ReduceDtype.AUTO):
        notes.append(_fsdp2.reduce_note(setup, rs_dt))
    accumulated = accumulated or grads_item
    # FSDP1: the root's gradients wait for each other and are cat into its flat gradient (fsdp1_root)
    root_numel = _mixed_root(tech, par, sp) if tech.adapter else sp.root_numel
    root_flat = (
        (tech.grad if tech.adapter else gather_dt).nbytes(root_numel) if _root1.holds_root_grads(par) else 0
    )
    whole_embedding = _fsdp2.whole_embedding_grad(tech, par, sp, tech.grad) if par.fsdp_version == 2 else 0
    return RankStates(
        table=tuple(gpu_rows), rows=tuple(gpu_rows), resident=(), grads_written_cap=None,
        grads_kept=grads_kept,
        accumulated=() if offload and not kept_whole else (accumulated,), grads_backward=(),
        gathered_forward=tuple(gathered_fwd), gathered_backward=tuple(gathered_bwd),
        step=tuple(step), step_grads=() if offload else (grads_item,), cpu=tuple(cpu), nvme_bytes=0,
        notes=tuple(notes), layer_unshard_extra=unshard_extra, layer_forward_extra=fwd_extra,
        layer_backward_extra=bwd_extra, layer_backward_first_extra=bwd_first, backward_start_extra=bwd_start,
        layer_backward_last_extra=bwd_last,
        root_grads_deferred=_fsdp2.root_grads_whole(tech, par, no_sync, rs_dt) or bool(root_flat),
        root_backward_extra=root_extra, root_flat_grad=root_flat,
        first_unshard=first, backward_root_unshard=root_again, reduce_after_backward=pp_reduce,
        embedding_grad_extra=whole_embedding, side_pools=pools,
    )  # fmt: skip


def _outer_adapters(tech: Technique, par: Parallelism, sp: StageParams) -> int:
    """Trainable elements outside the layers (``modules_to_save``, a LoRA head) on this stage."""
    return cdiv(sum(t.numel for t in tech.tspec.outer), par.tp) if sp.stage == par.pp - 1 else 0


def _mixed_root(tech: Technique, par: Parallelism, sp: StageParams) -> int:
    """Elements of the root unit whose gradient FSDP1 writes when adapters share it (none without)."""
    outer = _outer_adapters(tech, par, sp)
    return sp.root_numel + outer if outer else 0


def _in_layer_grad_numel(tech: Technique, par: Parallelism, sp: StageParams, loc: _Local) -> int:
    """Elements whose gradient an FSDP1 rank writes where the adapters share the layer units with the
    frozen base (``AdapterWrap.IN_LAYER``): every layer unit whole (base + adapters) and the root unit
    if it holds adapters; 0 where that is not the case (FSDP2 shards and grads per parameter: frozen
    ones get none; separate adapter units; full fine-tuning, where every parameter trains anyway)."""
    if not tech.adapter or par.fsdp_version != 1 or par.fsdp_adapter_wrap is not AdapterWrap.IN_LAYER:
        return 0
    layers = sp.numel - sp.root_numel + loc.trainable - _outer_adapters(tech, par, sp)
    return layers + _mixed_root(tech, par, sp)


def _float8_units(
    tech: Technique, par: Parallelism, sp: StageParams, gather: DType, offloaded: DType | None
) -> tuple[int, int, int]:
    """FSDP2 float8 all-gather (:mod:`.activations.float8`): (the largest layer unit's gathered bytes, all
    the stage's layer units', the most its pre-all-gather casts hold), each converted weight's TP-local
    shard cast from ``offloaded`` (an offloaded shard's dtype, copied to the GPU first) or in place."""
    spec, n = tech.spec, par.shard_degree
    source = offloaded.nbytes(1) if offloaded is not None else 0
    unit = units = cast = 0
    for count, layer in stage_groups(spec, par.pp, sp.stage):
        local = [(local_tensor(t, par, 1, in_layer=True), _f8.converted(spec, t)) for t in layer.tensors]
        f8 = [lt for lt, conv in local if conv]
        nbytes = _f8.gathered_unit_bytes(sum(lt.numel for lt, _ in local), sum(lt.numel for lt in f8), gather)
        unit, units = max(unit, nbytes), units + count * nbytes
        cast = max(cast, _f8.pre_all_gather_peak((_fsdp2_shard(lt, n) for lt in f8), source))
    return unit, units, cast


def _row(
    tensor: str,
    dtype: DType,
    numel: int,
    total_params: int,
    category: Category,
    source: str,
    factor: float = 1.0,
) -> PerParamRow:
    nbytes = math.ceil(dtype.nbytes(numel) * factor)
    return PerParamRow(
        tensor=tensor,
        dtype=dtype.name,
        bytes_per_param=nbytes / total_params if total_params else 0.0,
        bytes=nbytes,
        params=numel,
        category=category,
        source=source,
    )


@dataclass(frozen=True, kw_only=True)
class _Shard:
    """Elements of one rank's shard, by what it is sharded over."""

    numel: int  # elements this rank owns (the most loaded rank, padding included)
    persistent: int  # ZeRO-3 persistent elements also held whole on every rank


def _flat(total: int, n: int) -> int:
    """DeepSpeed flat partition: padded to ``nccl_start_alignment_factor (2) x N`` then split."""
    if n == 1:
        return total
    return cdiv(total, 2 * n) * 2


def shard_numel(sp: StageParams, par: Parallelism) -> _Shard:
    """Elements one rank owns after data-parallel sharding (dense over N, experts over N/ep)."""
    n, ne = par.shard_degree, par.expert_shard_degree
    tensors = sp.tensors
    if par.zero_stage in (1, 2):
        dense = sum(t.total for t in tensors if not t.expert)
        expert = sum(t.total for t in tensors if t.expert)
        return _Shard(numel=_flat(dense, n) + (_flat(expert, ne) if expert else 0), persistent=0)
    if par.zero_stage == 3:
        # every parameter has its ds_tensor partition (the optimizer's share); ds_persist ones also
        # keep their full 16-bit data on every rank
        owned = sum(cdiv(t.numel, ne if t.expert else n) * t.count for t in tensors)
        persistent = sum(t.total for t in tensors if t.numel < par.param_persistence_threshold)
        return _Shard(numel=owned, persistent=persistent)
    if par.fsdp is FsdpMode.NONE:
        return _Shard(numel=sp.numel, persistent=0)
    if par.fsdp_version == 2:
        return _Shard(numel=sum(_fsdp2_shard(t, ne if t.expert else n) for t in tensors), persistent=0)
    # FSDP1: one flat parameter per unit (each layer and the root), padded to a multiple of N
    root = cdiv(sp.root_numel, n) if sp.root_numel else 0
    return _Shard(numel=root + sum(c * cdiv(u, n) for c, u in sp.layer_units), persistent=0)


def _fsdp2_shard(t: LocalTensor, n: int) -> int:
    return cdiv(t.dim0, n) * t.rest * t.count
