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
* at the step, ``single_grad_partition = flat_grad_partition.to(fp32)`` (4 P/N).

ZeRO-3 (deepspeed/runtime/zero/stage3.py ``DeepSpeedZeroOptimizer_Stage3``, partition_parameters.py,
partitioned_param_coordinator.py):
* 16-bit parameter partitions ``ds_tensor`` (ceil(numel/N) each); parameters with fewer than
  ``param_persistence_threshold`` elements stay whole on every rank (``ds_persist``);
* ``grad_partitions_flat_buffer`` (16-bit, P/N, allocated at init) and one ``ipg`` bucket of
  ``reduce_bucket_size`` elements per dtype (allocated at init);
* fp32 master partition and states; at the step, fp32 gradients per sub-group of
  ``sub_group_size`` elements (``_prepare_fp32_grad_for_sub_group``);
* gathered parameters: the module being run, up to ``prefetch_bucket_size`` prefetched, and
  modules whose next use is within ``max_reuse_distance`` elements (kept across the
  forward/backward turn, ``__params_to_release``), with ``max_live_parameters`` bounding prefetch.

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
from dataclasses import dataclass

from peakmem import dtypes
from peakmem.breakdown import Category, MemoryItem, PerParamRow
from peakmem.dtypes import DType
from peakmem.model import ModelSpec
from peakmem.parallel import DS_SUB_GROUP_SIZE, FsdpMode, Offload, Parallelism
from peakmem.training import OptimizerImpl, OptimizerName, TrainingSetup
from peakmem.units import MiB

from .model_parallel import LocalTensor, StageParams, cdiv
from .model_states import precision_plan, trainable_params
from .optimizer import optimizer_rows

SRC_DDP = "torch/csrc/distributed/c10d/reducer.cpp: one flat gradient buffer per bucket (bucket_cap_mb=25)"
SRC_Z12_PARAMS = "deepspeed stage_1_and_2.py: bit16_groups_flat (full 16-bit copy on every rank)"
SRC_Z_MASTER = (
    "deepspeed stage_1_and_2.py / stage3.py: single_partition_of_fp32_groups / fp32_partitioned_groups_flat"
)
SRC_Z2_GRADS = "deepspeed stage_1_and_2.py: grads_in_partition = torch.empty(partition, dtype=16-bit)"
SRC_Z1_GRADS = "deepspeed stage 1 (partition_gradients=False): full 16-bit grads until the boundary reduce"
SRC_Z_IPG = "deepspeed setup_buckets / stage3 __init__: ipg bucket torch.empty(reduce_bucket_size)"
SRC_Z_FP32_GRAD = "deepspeed step: single_grad_partition = flat_grad_partition.to(fp32)"
SRC_Z3_PARAMS = "deepspeed partition_parameters.py: ds_tensor = ceil(numel / N) 16-bit elements"
SRC_Z3_PERSIST = "deepspeed partition_parameters.py: ds_persist when numel < param_persistence_threshold"
SRC_Z3_GRADS = "deepspeed stage3.py: grad_partitions_flat_buffer (16-bit, allocated at init)"
SRC_Z3_GATHER = (
    "deepspeed partitioned_param_coordinator.py: fetch + prefetch_bucket_size + reuse-distance keep"
)
SRC_FSDP_SHARD = "torch fsdp _fsdp_param.py _init_sharded_param: torch.chunk(dim 0), padded to chunk 0"
SRC_FSDP1_SHARD = "torch fsdp _flat_param.py: unit flattened and padded to a multiple of world size"
SRC_FSDP_GATHER = "torch fsdp: root unit unsharded fwd->bwd; current + one prefetched unit all-gathered"
SRC_FSDP_RS = "torch fsdp _fsdp_collectives.py foreach_reduce: unsharded grads + reduce-scatter input"
SRC_OFFLOAD = "ZeRO-Offload (arXiv 2101.06840) / FSDP CPUOffload: pinned CPU copies"
SRC_NVME = "deepspeed offload_config.py: NVMe swap buffers buffer_count x buffer_size, pinned"

# deepspeed/runtime/zero/offload_config.py (v0.19.8) swap-buffer defaults, in elements
DS_NVME_PARAM_BUFFER_COUNT = 5
DS_NVME_PARAM_BUFFER_SIZE = 100_000_000
DS_NVME_OPTIMIZER_BUFFER_COUNT = 4
# deepspeed stage3.py: max_reuse_distance default (stage3_max_reuse_distance, pp_int(1e9))
DS_MAX_REUSE_DISTANCE = 1_000_000_000

# NCCL communicator buffers (outside PyTorch's allocator; cudaMalloc'd by NCCL at the first collective).
# NCCL src/include/device.h (v2.2x): NCCL_STEPS=8; Simple protocol buffer NCCL_BUFFSIZE=4 MiB (docs
# "Environment variables"); LL128: NCCL_LL128_ELEMS_PER_THREAD(120) x NCCL_LL128_MAX_NTHREADS(640) x
# NCCL_STEPS x 8 B; LL: NCCL_LL_LINES_PER_THREAD(8) x NCCL_LL_MAX_NTHREADS(512) x NCCL_STEPS x 16 B.
NCCL_SIMPLE_BYTES = 4 * MiB
NCCL_LL128_BYTES = 120 * 640 * 8 * 8
NCCL_LL_BYTES = 8 * 512 * 8 * 16
NCCL_CHANNELS = 16  # assumed: NCCL picks 2-32 channels by topology (NCCL_MIN/MAX_NCHANNELS)
NCCL_CONNECTIONS = 2  # ring + tree receive connections per channel (assumed)


def nccl_communicator_bytes() -> int:
    """Device bytes one NCCL communicator takes for its receive buffers (an estimate, see above)."""
    per_conn = NCCL_SIMPLE_BYTES + NCCL_LL128_BYTES + NCCL_LL_BYTES
    return NCCL_CHANNELS * NCCL_CONNECTIONS * per_conn


def communicators(par: Parallelism) -> int:
    """Process groups with more than one rank that a rank communicates in (dp, tp, pp, cp, ep)."""
    return sum(1 for d in (par.dp * par.cp, par.tp, par.pp, par.cp, par.ep) if d > 1) if par.gpus > 1 else 0


@dataclass(frozen=True, kw_only=True)
class RankStates:
    """A rank's model states and engine buffers, split by when they are alive."""

    rows: tuple[PerParamRow, ...]  # resident model states on the GPU (all phases)
    resident: tuple[MemoryItem, ...]  # other resident buffers (buckets, persistent params)
    layer_grads: tuple[int, ...]  # per group: gradient bytes a layer adds in backward (kept)
    root_grads: int  # gradient bytes the root (embeddings/head) adds in backward (kept)
    grads_backward: tuple[MemoryItem, ...]  # gradient buffers alive throughout backward
    grads_accumulated: tuple[MemoryItem, ...]  # gradients alive in forward with grad_accum > 1
    gathered_forward: tuple[MemoryItem, ...]  # unsharded parameters in flight during forward
    gathered_backward: tuple[MemoryItem, ...]  # unsharded parameters + gradients in flight in backward
    step: tuple[MemoryItem, ...]  # optimizer-step temporaries on the GPU
    step_grads: tuple[MemoryItem, ...]  # gradients alive at the step
    cpu: tuple[MemoryItem, ...]  # pinned CPU RAM of this rank
    nvme_bytes: int
    notes: tuple[str, ...]


def _item(path: str, category: Category, nbytes: int, source: str) -> MemoryItem:
    return MemoryItem(path=path, category=category, bytes=nbytes, source=source)


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


def _state_factors(spec: ModelSpec, setup: TrainingSetup) -> list[tuple[PerParamRow, float]]:
    """Each optimizer-state row with its bytes per trainable parameter."""
    return [(r, r.bytes / r.params if r.params else 0.0) for r in optimizer_rows(spec, setup)]


def rank_states(spec: ModelSpec, setup: TrainingSetup, par: Parallelism, sp: StageParams) -> RankStates:
    """Model states and engine buffers of one rank of pipeline stage ``sp.stage``."""
    if par.fsdp is not FsdpMode.NONE:
        return _fsdp_states(spec, setup, par, sp)
    if par.zero_stage:
        return _zero_states(spec, setup, par, sp)
    return _replicated_states(spec, setup, par, sp)


def _trainable_fraction(spec: ModelSpec, setup: TrainingSetup) -> float:
    params = spec.params
    return trainable_params(spec, setup) / params if params else 1.0


def _opt_rows(spec: ModelSpec, setup: TrainingSetup, numel: int, total: int, label: str) -> list[PerParamRow]:
    out = []
    for r, factor in _state_factors(spec, setup):
        nbytes = math.ceil(factor * numel)
        out.append(
            PerParamRow(
                tensor=f"{r.tensor}{label}",
                dtype=r.dtype,
                bytes_per_param=nbytes / total if total else 0.0,
                bytes=nbytes,
                params=numel,
                category=Category.OPTIMIZER_STATES,
                source=r.source,
            )
        )
    return out


def _step_temporaries(
    setup: TrainingSetup, state_bytes_one: int, state_dtype_bytes: int, largest: int, label: str
) -> list[MemoryItem]:
    """Optimizer temporaries over the rank's shard (see :mod:`.optimizer` for the terms)."""
    name, impl = setup.optimizer, setup.optimizer_impl
    if name in (OptimizerName.ADAMW, OptimizerName.ADAM):
        if impl is OptimizerImpl.FOREACH:
            return [
                _item(
                    f"optimizer.foreach exp_avg_sq_sqrt{label}",
                    Category.TEMPORARIES,
                    state_bytes_one,
                    "torch/optim/adam.py _multi_tensor_adam: _foreach_sqrt(exp_avg_sqs)",
                )
            ]
        if impl is OptimizerImpl.FOR_LOOP:
            return [
                _item(
                    f"optimizer.denom + exp_avg.clone (largest tensor){label}",
                    Category.TEMPORARIES,
                    2 * largest * state_dtype_bytes,
                    "torch/optim/adam.py _single_tensor_adam",
                )
            ]
    return []


def _replicated_states(
    spec: ModelSpec, setup: TrainingSetup, par: Parallelism, sp: StageParams
) -> RankStates:
    """Single GPU, TP/PP only, or DDP: every rank holds full (local) states."""
    plan = precision_plan(setup.precision)
    numel = sp.numel
    total = spec.params
    train = math.ceil(numel * _trainable_fraction(spec, setup))
    rows = [
        _row(
            "weights", plan.weight, numel, total, Category.PARAMETERS, f"{setup.precision.value} parameters"
        ),
    ]
    if plan.master is not None:
        rows.append(
            _row(
                "master weights",
                plan.master,
                train,
                total,
                Category.MASTER_WEIGHTS,
                "fp32 master copy (Micikevicius et al. 2018 §3.1)",
            )
        )
    opt = _opt_rows(spec, setup, train, total, "")
    rows += opt
    grad_bytes = plan.grad.nbytes(train)
    resident: list[MemoryItem] = []
    notes: list[str] = []
    if par.dp > 1:
        if par.gradient_as_bucket_view:
            notes.append("DDP gradient_as_bucket_view=True: param.grad are views into the bucket buffers")
        else:
            resident.append(
                _item("DDP reducer buckets (flat gradient copy)", Category.GRADIENTS, grad_bytes, SRC_DDP)
            )
            notes.append(
                f"DDP buckets of {par.ddp_bucket_bytes // MiB} MiB hold a second copy of the "
                "gradients (gradient_as_bucket_view=False)"
            )
    layer_grads = tuple(plan.grad.nbytes(u) for _, u in sp.layer_units)
    grads_item = _item("gradients", Category.GRADIENTS, grad_bytes, "param.grad (torch AccumulateGrad)")
    step: list[MemoryItem] = []
    if plan.master is not None:
        step.append(
            _item(
                "optimizer.master_grads (fp32 copy)",
                Category.TEMPORARIES,
                plan.master.nbytes(train),
                "fp32 copy of the 16-bit grads for the master update",
            )
        )
    st = opt[0].bytes if opt else 0
    step += _step_temporaries(setup, st, _state_dtype_bytes(opt), sp.largest_tensor, "")
    return RankStates(
        rows=tuple(rows),
        resident=tuple(resident),
        layer_grads=layer_grads,
        root_grads=plan.grad.nbytes(sp.root_numel),
        grads_backward=(),
        grads_accumulated=(grads_item,),
        gathered_forward=(),
        gathered_backward=(),
        step=tuple(step),
        step_grads=(grads_item,),
        cpu=(),
        nvme_bytes=0,
        notes=tuple(notes),
    )


def _state_dtype_bytes(opt: list[PerParamRow]) -> int:
    if not opt:
        return 4
    return dtypes.ALL[opt[0].dtype].bits // 8 if opt[0].dtype in dtypes.ALL else 4


def _zero_states(spec: ModelSpec, setup: TrainingSetup, par: Parallelism, sp: StageParams) -> RankStates:
    plan = precision_plan(setup.precision)
    stage, n = par.zero_stage, par.shard_degree
    total = spec.params
    frac = _trainable_fraction(spec, setup)
    sh = shard_numel(sp, par)
    part = math.ceil(sh.numel * frac)  # trainable elements this rank owns
    master_dt = plan.master or plan.weight
    w16, g16 = plan.weight, plan.grad
    label = f" (1/{n} partition)"
    offload_opt = par.offload_optimizer is not Offload.NONE
    offload_par = par.offload_params is not Offload.NONE
    gpu_rows: list[PerParamRow] = []
    off_rows: list[PerParamRow] = []
    resident: list[MemoryItem] = []
    notes: list[str] = []
    if stage < 3:
        gpu_rows.append(
            _row("weights (16-bit, full copy)", w16, sp.numel, total, Category.PARAMETERS, SRC_Z12_PARAMS)
        )
    else:
        (off_rows if offload_par else gpu_rows).append(
            _row(f"weights{label}", w16, sh.numel, total, Category.PARAMETERS, SRC_Z3_PARAMS)
        )
        if sh.persistent:
            resident.append(
                _item(
                    "persistent small parameters (whole on every rank)",
                    Category.PARAMETERS,
                    w16.nbytes(sh.persistent),
                    SRC_Z3_PERSIST,
                )
            )
    states = [_row(f"master weights{label}", master_dt, part, total, Category.MASTER_WEIGHTS, SRC_Z_MASTER)]
    if plan.master is None:
        states = []  # pure 16-bit / fp32: the partition itself is updated
    states += _opt_rows(spec, setup, part, total, label)
    (off_rows if offload_opt else gpu_rows).extend(states)

    ipg_count = 2 if (stage < 3 and par.ds_overlap_comm) else 1
    ipg = _item(
        f"ZeRO ipg reduce bucket{'s x2' if ipg_count == 2 else ''} ({par.reduce_bucket_size:.0e} elements)",
        Category.GRADIENTS,
        ipg_count * g16.nbytes(par.reduce_bucket_size),
        SRC_Z_IPG,
    )
    grad_part = _item(
        f"gradient partition (16-bit){label}",
        Category.GRADIENTS,
        g16.nbytes(part),
        SRC_Z3_GRADS if stage == 3 else SRC_Z2_GRADS,
    )
    fp32_grad_numel = min(part, DS_SUB_GROUP_SIZE) if stage == 3 else part
    fp32_grad = _item(
        f"fp32 gradient partition at the step{label}",
        Category.TEMPORARIES,
        master_dt.nbytes(fp32_grad_numel),
        SRC_Z_FP32_GRAD,
    )
    cpu: list[MemoryItem] = [
        _item(f"offloaded {r.tensor}", r.category, r.bytes, SRC_OFFLOAD) for r in off_rows
    ]
    grads_backward: list[MemoryItem] = []
    grads_accum: list[MemoryItem] = []
    step_grads: list[MemoryItem] = []
    layer_grads: tuple[int, ...] = tuple(0 for _ in sp.layer_units)
    root_grads = 0
    step: list[MemoryItem] = []
    if stage == 3:
        if par.contiguous_gradients:
            resident.append(ipg)
        if offload_opt:
            cpu.append(
                _item(
                    f"gradient partition (16-bit){label}", Category.GRADIENTS, grad_part.bytes, SRC_Z3_GRADS
                )
            )
        else:
            resident.append(grad_part)
    elif stage == 2 or (stage == 1 and setup.grad_accum == 1 and par.pp == 1):
        grads_backward.append(ipg)
        if not offload_opt:
            grads_backward.append(grad_part)
            step_grads.append(grad_part)
            grads_accum.append(grad_part)
    else:  # stage 1 with accumulation or pipeline: full 16-bit grads until the boundary reduction
        layer_grads = tuple(g16.nbytes(math.ceil(u * frac)) for _, u in sp.layer_units)
        root_grads = g16.nbytes(math.ceil(sp.root_numel * frac))
        full = _item(
            "gradients (16-bit, full until the boundary reduce)",
            Category.GRADIENTS,
            g16.nbytes(math.ceil(sp.numel * frac)),
            SRC_Z1_GRADS,
        )
        grads_accum.append(full)
        step_grads.append(grad_part)
        if par.contiguous_gradients:
            grads_backward.append(ipg)
    if offload_opt:
        cpu.append(
            _item(f"fp32 gradient partition{label}", Category.GRADIENTS, master_dt.nbytes(part), SRC_OFFLOAD)
        )
    else:
        if plan.master is not None:
            step.append(fp32_grad)
        opt_rows = [r for r in gpu_rows if r.category is Category.OPTIMIZER_STATES]
        step += _step_temporaries(
            setup,
            opt_rows[0].bytes if opt_rows else 0,
            _state_dtype_bytes(opt_rows),
            min(part, sp.largest_tensor),
            label,
        )
    gathered_fwd: list[MemoryItem] = []
    gathered_bwd: list[MemoryItem] = []
    if stage == 3:
        non_persistent = sp.numel - sh.persistent
        fetch = min(
            non_persistent, sp.largest_tensor + min(par.prefetch_bucket_size, par.max_live_parameters)
        )
        kept = min(non_persistent, DS_MAX_REUSE_DISTANCE // 2 + fetch)
        gathered_fwd.append(
            _item(
                "ZeRO-3 gathered parameters (module + prefetch)",
                Category.PARAMETERS,
                w16.nbytes(fetch),
                SRC_Z3_GATHER,
            )
        )
        gathered_bwd.append(
            _item(
                "ZeRO-3 gathered parameters (kept within max_reuse_distance + prefetch)",
                Category.PARAMETERS,
                w16.nbytes(kept),
                SRC_Z3_GATHER,
            )
        )
        gathered_bwd.append(
            _item(
                "ZeRO-3 unsharded gradients of the running module",
                Category.GRADIENTS,
                g16.nbytes(sp.largest_tensor),
                SRC_Z3_GATHER,
            )
        )
        notes.append(
            "ZeRO-3 working set: the running module plus prefetch_bucket_size, and at the "
            "forward/backward turn the parameters within max_reuse_distance/2 (approximate)"
        )
    nvme = 0
    if par.offload_optimizer is Offload.NVME or par.offload_params is Offload.NVME:
        nvme_rows = [
            r
            for r in off_rows
            if (r.category is Category.PARAMETERS) == (par.offload_params is Offload.NVME)
            or (r.category is not Category.PARAMETERS and par.offload_optimizer is Offload.NVME)
        ]
        nvme = sum(r.bytes for r in nvme_rows)
        names = {f"offloaded {r.tensor}" for r in nvme_rows}
        cpu = [c for c in cpu if c.path not in names]
        if par.offload_params is Offload.NVME:
            cpu.append(
                _item(
                    "NVMe parameter swap buffers (pinned)",
                    Category.OVERHEAD,
                    DS_NVME_PARAM_BUFFER_COUNT * w16.nbytes(DS_NVME_PARAM_BUFFER_SIZE),
                    SRC_NVME,
                )
            )
        if par.offload_optimizer is Offload.NVME:
            sub = min(part, DS_SUB_GROUP_SIZE)
            cpu.append(
                _item(
                    "NVMe optimizer swap buffers (pinned, fp32 sub-groups)",
                    Category.OVERHEAD,
                    DS_NVME_OPTIMIZER_BUFFER_COUNT * master_dt.nbytes(sub),
                    SRC_NVME,
                )
            )
    return RankStates(
        rows=tuple(gpu_rows),
        resident=tuple(resident),
        layer_grads=layer_grads,
        root_grads=root_grads,
        grads_backward=tuple(grads_backward),
        grads_accumulated=tuple(grads_accum),
        gathered_forward=tuple(gathered_fwd),
        gathered_backward=tuple(gathered_bwd),
        step=tuple(step),
        step_grads=tuple(step_grads),
        cpu=tuple(cpu),
        nvme_bytes=nvme,
        notes=tuple(notes),
    )


def _fsdp_states(spec: ModelSpec, setup: TrainingSetup, par: Parallelism, sp: StageParams) -> RankStates:
    plan = precision_plan(setup.precision)
    n = par.shard_degree
    total = spec.params
    frac = _trainable_fraction(spec, setup)
    sh = shard_numel(sp, par)
    shard_dt = plan.master or plan.weight  # the dtype the model is built in: sharded params = master
    gather_dt = plan.weight  # MixedPrecision(param_dtype=...) / the model dtype under autocast
    label = f" (1/{n} shard)"
    src = SRC_FSDP_SHARD if par.fsdp_version == 2 else SRC_FSDP1_SHARD
    part = math.ceil(sh.numel * frac)
    offload = par.offload_params is not Offload.NONE
    offload_opt = par.offload_optimizer is not Offload.NONE
    param_row = _row(
        f"sharded parameters ({shard_dt.name}, master){label}",
        shard_dt,
        sh.numel,
        total,
        Category.PARAMETERS,
        src,
    )
    opt = _opt_rows(spec, setup, part, total, label)
    gpu_rows: list[PerParamRow] = []
    off_rows: list[PerParamRow] = []
    (off_rows if offload else gpu_rows).append(param_row)
    (off_rows if offload_opt else gpu_rows).extend(opt)
    grad_shard = shard_dt.nbytes(part)
    grads_item = _item(f"sharded gradients ({shard_dt.name}){label}", Category.GRADIENTS, grad_shard, src)
    unit_shards = tuple(shard_dt.nbytes(math.ceil(cdiv(u, n) * frac)) for _, u in sp.layer_units)
    root_shard = shard_dt.nbytes(math.ceil(cdiv(sp.root_numel, n) * frac)) if sp.root_numel else 0
    cpu = [_item(f"offloaded {r.tensor}", r.category, r.bytes, SRC_OFFLOAD) for r in off_rows]
    if offload:
        cpu.append(_item(f"offloaded gradients{label}", Category.GRADIENTS, grad_shard, SRC_OFFLOAD))
    unit = sp.largest_unit
    gathered_fwd = [
        _item(
            "FSDP root unit unsharded (embeddings, final norm, head)",
            Category.PARAMETERS,
            gather_dt.nbytes(sp.root_numel),
            SRC_FSDP_GATHER,
        ),
    ]
    if par.fsdp is FsdpMode.SHARD_GRAD_OP:
        gathered_fwd.append(
            _item(
                "FSDP shard-grad-op: every layer unit unsharded from forward to backward",
                Category.PARAMETERS,
                gather_dt.nbytes(sum(c * u for c, u in sp.layer_units)),
                SRC_FSDP_GATHER,
            )
        )
        gathered_bwd = list(gathered_fwd)
    else:
        two_units = _item(
            "FSDP all-gathered units (current + prefetched layer)",
            Category.PARAMETERS,
            gather_dt.nbytes(min(2, sp.layers) * unit),
            SRC_FSDP_GATHER,
        )
        gathered_fwd.append(two_units)
        gathered_bwd = list(gathered_fwd)
    gathered_bwd.append(
        _item(
            "FSDP unsharded gradients + reduce-scatter input (one unit)",
            Category.GRADIENTS,
            2 * gather_dt.nbytes(unit),
            SRC_FSDP_RS,
        )
    )
    step: list[MemoryItem] = []
    if not offload_opt:
        opt_rows = [r for r in gpu_rows if r.category is Category.OPTIMIZER_STATES]
        step += _step_temporaries(
            setup,
            opt_rows[0].bytes if opt_rows else 0,
            _state_dtype_bytes(opt_rows),
            sp.largest_tensor,
            label,
        )
    notes = [
        f"FSDP{par.fsdp_version} {par.fsdp.value}: units = transformer layers + the root; sharded "
        f"parameters and gradients in {shard_dt.name}, gathered copies in {gather_dt.name}"
    ]
    return RankStates(
        rows=tuple(gpu_rows),
        resident=(),
        layer_grads=tuple(0 for _ in unit_shards) if offload else unit_shards,
        root_grads=0 if offload else root_shard,
        grads_backward=(),
        grads_accumulated=() if offload else (grads_item,),
        gathered_forward=tuple(gathered_fwd),
        gathered_backward=tuple(gathered_bwd),
        step=tuple(step),
        step_grads=() if offload else (grads_item,),
        cpu=tuple(cpu),
        nvme_bytes=0,
        notes=tuple(notes),
    )


def load_bytes_per_rank(spec: ModelSpec, setup: TrainingSetup, par: Parallelism, sp: StageParams) -> int:
    """CPU RAM one rank uses to load the model before the engine shards or moves it.

    Each rank materialises its (TP/PP-local) model in the dtype it is built in (fp32 for
    mixed/amp precision, as DeepSpeed's estimator assumes: ``4 * num_gpus_per_node`` bytes/param);
    with ``zero_init`` (deepspeed.zero.Init, FSDP ``cpu_ram_efficient_loading``) under ZeRO-3/FSDP
    only one layer at a time is materialised (the estimator's ``largest_layer_params * 4``)."""
    plan = precision_plan(setup.precision)
    dt = plan.master or plan.weight
    sharded_init = par.zero_stage == 3 or par.fsdp is not FsdpMode.NONE
    if par.zero_init and sharded_init:
        return dt.nbytes(max(sp.largest_tensor, sp.largest_unit))
    return dt.nbytes(sp.numel)


@dataclass(frozen=True, kw_only=True)
class ModelStateTerms:
    """Per-GPU and per-node-CPU model-state bytes in the terms DeepSpeed's estimator uses
    (``estimate_zero2/zero3_model_states_mem_needs`` in stage_1_and_2.py / stage3.py): parameters,
    gradients, master weights, optimizer states and fp32 gradients, plus (stage 3) the largest
    module's gathered parameters and gradients. No activations, buckets or context."""

    gpu: dict[str, int]
    cpu_per_node: dict[str, int]

    @property
    def gpu_bytes(self) -> int:
        return sum(self.gpu.values())

    @property
    def cpu_bytes(self) -> int:
        """CPU RAM per node: the larger of the pinned offload and the model-loading peak."""
        pinned = sum(v for k, v in self.cpu_per_node.items() if k != "model loading")
        return max(pinned, self.cpu_per_node.get("model loading", 0))


def zero_model_state_terms(spec: ModelSpec, setup: TrainingSetup, par: Parallelism) -> ModelStateTerms:
    """peakmem's ZeRO model states for one rank (pp=tp=1), itemised for a side-by-side check."""
    from .model_parallel import stage_params

    sp = stage_params(spec, par, 0)
    st = rank_states(spec, setup, par, sp)
    gpu: dict[str, int] = {}
    for r in st.rows:
        gpu[r.tensor] = gpu.get(r.tensor, 0) + r.bytes
    for i in (*st.resident, *st.step_grads, *st.step):
        if "ipg" in i.path or "foreach" in i.path or "denom" in i.path:
            continue  # buckets and optimizer temporaries: not model states in DeepSpeed's estimator
        gpu[i.path] = gpu.get(i.path, 0) + i.bytes
    if par.zero_stage == 3:
        plan = precision_plan(setup.precision)
        gpu["largest module gathered (16-bit params + grads)"] = plan.weight.nbytes(sp.largest_tensor) + (
            plan.grad.nbytes(sp.largest_tensor)
        )
    per_node = par.ranks_per_node
    cpu = {f"{i.path} x{per_node} ranks": i.bytes * per_node for i in st.cpu}
    cpu["model loading"] = load_bytes_per_rank(spec, setup, par, sp) * per_node
    return ModelStateTerms(gpu=gpu, cpu_per_node=cpu)
