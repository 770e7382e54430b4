"""Parallelism: how a training job is laid out over GPUs, and what each engine keeps where.

Degrees (Megatron-LM's layout, arXiv 2104.04473 §3): world size ``gpus = dp x tp x pp x cp``
(``x ulysses``: DeepSpeed-Ulysses sequence parallelism, :mod:`peakmem.formulas.long_context`, whose
ranks shard model states as data-parallel ones do: deepspeed/runtime/engine.py
``seq_data_parallel_group``);
expert parallelism ``ep`` is carved out of the data-parallel ranks (``ep`` divides ``dp x cp``,
Megatron-Core ``parallel_state.initialize_model_parallel`` with expert tensor parallel = tp).

Sharding engines over the data-parallel ranks (exclusive):

* ``zero_stage`` 0-3: DeepSpeed ZeRO (Rajbhandari et al. 2020, arXiv 1910.02054 §5);
  stage 0 with ``dp > 1`` is plain DDP (torch/nn/parallel/distributed.py).
* ``fsdp``: PyTorch FSDP (``full-shard``, ``shard-grad-op``, ``hybrid-shard``), version 1 (flat
  parameters, torch/distributed/fsdp/_flat_param.py) or 2 (per-parameter DTensor shards,
  torch/distributed/fsdp/_fully_shard/).

Bucket defaults are the engines' own:

* DDP ``bucket_cap_mb=25`` (torch/nn/parallel/distributed.py ``DistributedDataParallel.__init__``:
  ``bucket_bytes_cap = int(bucket_cap_mb * 1024 * 1024)``), ``gradient_as_bucket_view=False``;
* DeepSpeed (deepspeed/runtime/zero/config.py ``DeepSpeedZeroConfig``, v0.19.8):
  ``reduce_bucket_size=5e8``, ``allgather_bucket_size=5e8``, ``stage3_prefetch_bucket_size=5e7``,
  ``stage3_max_live_parameters=1e9``, ``stage3_param_persistence_threshold=1e5`` (all in elements),
  ``overlap_comm`` = True for stage 3 only (``overlap_comm_valid``), ``contiguous_gradients=True``.

Validation that only needs the degrees is in ``__post_init__``; validation that needs the model
(heads, layers, experts) is :func:`validate_for`.
"""

from __future__ import annotations

from dataclasses import dataclass

from peakmem.choice import Choice
from peakmem.errors import InputError, require
from peakmem.model import ModelSpec
from peakmem.units import MiB
from peakmem.validate import MAX_DEVICE_BYTES, MAX_ELEMENTS, MAX_GPUS, check_bool, check_int, coerce_choice


class FsdpMode(Choice):
    NONE = "none"
    FULL_SHARD = "full-shard"  # params, grads, optimizer states sharded (ZeRO-3-like)
    SHARD_GRAD_OP = "shard-grad-op"  # params kept unsharded between forward and backward (ZeRO-2-like)
    HYBRID_SHARD = "hybrid-shard"  # full shard inside a node, replicate across nodes


class Offload(Choice):
    NONE = "none"
    CPU = "cpu"
    NVME = "nvme"


class PipelineSchedule(Choice):
    ONE_F_ONE_B = "1f1b"  # PipeDream-Flush (Narayanan et al. 2021, arXiv 2104.04473 §2.2.1)
    INTERLEAVED = "interleaved"  # virtual stages (same paper §2.2.2)


class AdapterWrap(Choice):
    """Where FSDP's auto-wrap policy puts the LoRA adapters (``formulas.sharding``, FSDP1 only).

    * ``separate``: in units of their own, apart from the frozen base (peft ``fsdp_auto_wrap_policy``,
      torchtune ``lora_fsdp_wrap_policy``): only the adapters' units get gradients;
    * ``in-layer``: inside the transformer-layer units with the frozen weights (Lightning Fabric
      ``FSDPStrategy(auto_wrap_policy={Block})`` in Lit-GPT ``finetune/lora.py``): under FSDP1
      ``use_orig_params=True`` a unit's ``FlatParameter`` requires grad when any of its parameters does,
      so autograd writes the gradient of the whole unit, frozen weights included (torch
      ``distributed/fsdp/_flat_param.py`` ``_validate_tensors_to_flatten``: "permit non-uniform
      ``requires_grad``", ``flat_param_requires_grad or tensor.requires_grad``; the class docstring of
      ``FullyShardedDataParallel``: "higher than expected gradient memory usage").
    """

    SEPARATE = "separate"
    IN_LAYER = "in-layer"


class CpRotate(Choice):
    """How context-parallel ranks pass K/V around the ring (``formulas.model_parallel.cp_ring``)."""

    AUTO = "auto"  # torch's all-gather under FSDP2 (torchtitan), else Megatron/TE's p2p ring
    P2P = "p2p"  # Megatron-Core / Transformer Engine AttnFuncWithCPAndKVP2P: double-buffered send/recv
    ALLGATHER = "allgather"  # torch context_parallel's default rotate (set_rotate_method)
    ALLTOALL = "alltoall"  # torch context_parallel's set_rotate_method("alltoall")


DDP_BUCKET_CAP_MB = 25  # torch/nn/parallel/distributed.py: bucket_cap_mb default
DDP_BUCKET_BYTES = DDP_BUCKET_CAP_MB * MiB  # int(bucket_cap_mb * 1024 * 1024)
# deepspeed/runtime/zero/config.py (v0.19.8) defaults, in elements
DS_REDUCE_BUCKET_SIZE = 500_000_000  # reduce_bucket_size: pp_int(5e8)
DS_ALLGATHER_BUCKET_SIZE = 500_000_000  # allgather_bucket_size: pp_int(5e8)
DS_PREFETCH_BUCKET_SIZE = 50_000_000  # stage3_prefetch_bucket_size: pp_int(5e7)
DS_MAX_LIVE_PARAMETERS = 1_000_000_000  # stage3_max_live_parameters: pp_int(1e9)
DS_PARAM_PERSISTENCE_THRESHOLD = 100_000  # stage3_param_persistence_threshold: pp_int(1e5)
DS_SUB_GROUP_SIZE = 1_000_000_000  # sub_group_size: pp_int(1e9)
DEFAULT_GPUS_PER_NODE = 8  # DGX/HGX nodes
_NO_DEVICE = "bytes or elements; no device holds more"


@dataclass(frozen=True, kw_only=True)
class Parallelism:
    """The parallel layout of one training job. ``dp=0`` derives dp from ``gpus``."""

    gpus: int = 1
    gpus_per_node: int = DEFAULT_GPUS_PER_NODE
    dp: int = 0
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    ulysses: int = 1  # DeepSpeed-Ulysses / ALST sequence-parallel degree
    sequence_parallel: bool = False
    zero_stage: int = 0
    fsdp: FsdpMode = FsdpMode.NONE
    fsdp_version: int = 2
    fsdp_adapter_wrap: AdapterWrap = AdapterWrap.SEPARATE
    offload_optimizer: Offload = Offload.NONE
    offload_params: Offload = Offload.NONE
    pp_schedule: PipelineSchedule = PipelineSchedule.ONE_F_ONE_B
    cp_rotate: CpRotate = CpRotate.AUTO
    virtual_stages: int = 1
    ddp_bucket_bytes: int = DDP_BUCKET_BYTES
    gradient_as_bucket_view: bool = False
    reduce_bucket_size: int = DS_REDUCE_BUCKET_SIZE
    allgather_bucket_size: int = DS_ALLGATHER_BUCKET_SIZE
    prefetch_bucket_size: int = DS_PREFETCH_BUCKET_SIZE
    max_live_parameters: int = DS_MAX_LIVE_PARAMETERS
    param_persistence_threshold: int = DS_PARAM_PERSISTENCE_THRESHOLD
    sub_group_size: int = DS_SUB_GROUP_SIZE  # ZeRO-3: the optimizer steps its partition in such sub-groups
    overlap_comm: bool | None = None  # None: DeepSpeed's default (True for stage 3 only)
    contiguous_gradients: bool = True
    zero_init: bool = True  # deepspeed.zero.Init / FSDP cpu_ram_efficient_loading: no full copy per rank
    memory_efficient_linear: bool = True  # DeepSpeed zero_optimization.memory_efficient_linear (zero.Init)

    def __post_init__(self) -> None:
        # Types, ranges and physical limits first (the Python API passes anything), then how the
        # degrees combine.
        for attr, enum in (
            ("fsdp", FsdpMode),
            ("offload_optimizer", Offload),
            ("offload_params", Offload),
            ("pp_schedule", PipelineSchedule),
            ("cp_rotate", CpRotate),
            ("fsdp_adapter_wrap", AdapterWrap),
        ):
            coerce_choice(self, attr, enum)
        for name in ("gpus", "gpus_per_node", "tp", "pp", "cp", "ep", "ulysses", "virtual_stages"):
            check_int(name, getattr(self, name), maximum=MAX_GPUS, what="GPUs; no cluster has more")
        check_int("dp", self.dp, minimum=0, maximum=MAX_GPUS, what="GPUs; no cluster has more")
        check_int("zero", self.zero_stage, minimum=0)
        check_int("fsdp_version", self.fsdp_version)
        for name in ("ddp_bucket_bytes", "reduce_bucket_size", "allgather_bucket_size"):
            check_int(name, getattr(self, name), maximum=MAX_DEVICE_BYTES, what=_NO_DEVICE)
        for name in (
            "prefetch_bucket_size", "max_live_parameters", "param_persistence_threshold", "sub_group_size"
        ):  # fmt: skip
            check_int(name, getattr(self, name), minimum=0, maximum=MAX_ELEMENTS, what=_NO_DEVICE)
        for name in (
            "sequence_parallel",
            "gradient_as_bucket_view",
            "contiguous_gradients",
            "zero_init",
            "memory_efficient_linear",
        ):
            check_bool(name, getattr(self, name))
        check_bool("overlap_comm", self.overlap_comm, optional=True)
        model_par = self.tp * self.pp * self.cp * self.ulysses
        names, values = "tp*pp*cp", f"{self.tp}*{self.pp}*{self.cp}"
        if self.ulysses > 1:
            names, values = f"{names}*ulysses", f"{values}*{self.ulysses}"
        if self.dp == 0:
            if self.gpus % model_par:
                raise InputError(
                    f"gpus={self.gpus} is not divisible by {names} = {values} "
                    f"= {model_par}; data-parallel degree dp = gpus/({names}) must be an integer"
                )
            object.__setattr__(self, "dp", self.gpus // model_par)
        world = self.dp * model_par
        if world != self.gpus:
            raise InputError(f"dp*{names} = {self.dp}*{values} = {world} != gpus={self.gpus}")
        require(self.zero_stage in (0, 1, 2, 3), "zero", self.zero_stage, "must be 0, 1, 2 or 3")
        require(self.fsdp_version in (1, 2), "fsdp_version", self.fsdp_version, "must be 1 or 2")
        if self.zero_stage and self.fsdp is not FsdpMode.NONE:
            raise InputError(
                f"zero={self.zero_stage} and fsdp={self.fsdp.value!r} are exclusive: "
                "DeepSpeed ZeRO and PyTorch FSDP both shard the same states; choose one"
            )
        if self.dp * self.cp % self.ep:
            raise InputError(
                f"ep={self.ep} does not divide dp*cp = {self.dp}*{self.cp} = {self.dp * self.cp}: "
                "expert-parallel ranks are taken from the data-parallel ranks"
            )
        if self.sequence_parallel and self.tp == 1:
            raise InputError(
                "sequence_parallel=True needs tp > 1 (it splits along the tensor-parallel group)"
            )
        if self.pp_schedule is PipelineSchedule.INTERLEAVED:
            require(self.pp > 1, "pp", self.pp, "the interleaved schedule needs pp > 1")
            require(
                self.virtual_stages > 1,
                "virtual_stages",
                self.virtual_stages,
                "the interleaved schedule needs virtual_stages > 1",
            )
        else:
            require(
                self.virtual_stages == 1,
                "virtual_stages",
                self.virtual_stages,
                "only the interleaved schedule has virtual stages",
            )
        if self.offload_params is not Offload.NONE:
            sharded_params = self.zero_stage == 3 or self.fsdp in (FsdpMode.FULL_SHARD, FsdpMode.HYBRID_SHARD)
            require(
                sharded_params,
                "offload_params",
                self.offload_params.value,
                "parameter offload needs sharded parameters: zero=3 or fsdp=full-shard/hybrid-shard",
            )
        if self.offload_optimizer is not Offload.NONE:
            require(
                self.zero_stage > 0 or self.fsdp is not FsdpMode.NONE,
                "offload_optimizer",
                self.offload_optimizer.value,
                "optimizer offload needs ZeRO (zero=1..3) or FSDP",
            )
        if self.fsdp is not FsdpMode.NONE and Offload.NVME in (self.offload_optimizer, self.offload_params):
            raise InputError("offload=nvme is a DeepSpeed ZeRO-Infinity feature; FSDP offloads to cpu only")
        if self.offload_params is not Offload.NONE and self.fsdp is not FsdpMode.NONE:
            require(
                self.offload_optimizer is not Offload.NONE,
                "offload_optimizer",
                self.offload_optimizer.value,
                "FSDP CPUOffload(offload_params=True) moves parameters, gradients and the optimizer step "
                "to the CPU together; set the optimizer offload too",
            )

    # --- derived ---------------------------------------------------------------------------------
    @property
    def nodes(self) -> int:
        return -(-self.gpus // self.gpus_per_node)

    @property
    def ranks_per_node(self) -> int:
        return min(self.gpus, self.gpus_per_node)

    @property
    def shard_degree(self) -> int:
        """Ranks that one copy of the (tp/pp-local) model states is sharded over: dp x cp (x ulysses)
        for ZeRO and FSDP full/grad-op shard (Megatron's distributed optimizer shards over dp x cp too);
        the ranks of one node for hybrid shard; 1 without sharding."""
        if self.zero_stage == 0 and self.fsdp is FsdpMode.NONE:
            return 1
        seq = self.cp * self.ulysses  # ranks that split one sequence
        group = self.dp * seq
        if self.fsdp is FsdpMode.HYBRID_SHARD:
            per_node_model_par = max(1, self.ranks_per_node // (self.tp * self.pp * seq))
            return max(1, min(group, per_node_model_par * seq))
        return group

    @property
    def expert_shard_degree(self) -> int:
        """Ranks that expert states are sharded over: (dp x cp) / ep (expert data parallel)."""
        return max(1, self.shard_degree // self.ep) if self.shard_degree > 1 else 1

    @property
    def engine(self) -> str:
        if self.fsdp is not FsdpMode.NONE:
            return f"fsdp{self.fsdp_version}-{self.fsdp.value}"
        if self.zero_stage:
            return f"zero-{self.zero_stage}"
        if self.dp > 1:
            return "ddp"
        return "none"

    @property
    def is_fsdp2(self) -> bool:
        """The model is sharded by FSDP2 (``fully_shard``)."""
        return self.fsdp is not FsdpMode.NONE and self.fsdp_version == 2

    @property
    def cp_ring(self) -> CpRotate:
        """:attr:`cp_rotate` resolved: ``auto`` is torch's all-gather rotate where FSDP2 shards (torchtitan
        runs torch's ``context_parallel``), Megatron/TE's p2p ring otherwise."""
        if self.cp_rotate is not CpRotate.AUTO:
            return self.cp_rotate
        return CpRotate.ALLGATHER if self.is_fsdp2 else CpRotate.P2P

    @property
    def ds_overlap_comm(self) -> bool:
        return self.zero_stage == 3 if self.overlap_comm is None else self.overlap_comm

    @property
    def is_single_gpu(self) -> bool:
        return self.gpus == 1

    def describe(self) -> str:
        parts = [f"{self.gpus} GPU" + ("s" if self.gpus > 1 else "")]
        for name in ("dp", "tp", "pp", "cp", "ep", "ulysses"):
            value = getattr(self, name)
            if value > 1:
                parts.append(f"{name}={value}")
        if self.sequence_parallel:
            parts.append("sp")
        if self.engine != "none":
            parts.append(self.engine)
        if self.offload_optimizer is not Offload.NONE:
            parts.append(f"optimizer->{self.offload_optimizer.value}")
        if self.offload_params is not Offload.NONE:
            parts.append(f"params->{self.offload_params.value}")
        if self.pp > 1:
            sched = self.pp_schedule.value
            parts.append(sched if self.virtual_stages == 1 else f"{sched} (v={self.virtual_stages})")
        return ", ".join(parts)


def validate_for(spec: ModelSpec, par: Parallelism) -> None:
    """Check the degrees against the model; each error names every number involved."""
    for g in spec.groups:
        att = g.layer.attention
        if att.num_heads % par.tp:
            raise InputError(f"tp={par.tp} does not divide num_attention_heads={att.num_heads} ({spec.name})")
        if att.num_kv_heads % par.tp:
            raise InputError(
                f"tp={par.tp} does not divide num_key_value_heads={att.num_kv_heads} ({spec.name}); "
                "Megatron-style TP gives each rank whole KV heads"
            )
        mlp = g.layer.mlp
        if mlp.intermediate_size % par.tp:
            raise InputError(
                f"tp={par.tp} does not divide intermediate_size={mlp.intermediate_size} ({spec.name})"
            )
        if par.ep > 1 and mlp.is_moe and mlp.num_experts % par.ep:
            raise InputError(f"ep={par.ep} does not divide num_experts={mlp.num_experts} ({spec.name})")
    if par.ep > 1 and not spec.is_moe:
        raise InputError(f"ep={par.ep} needs a mixture-of-experts model; {spec.name} has no experts")
    layers = spec.num_layers
    if par.pp > layers:
        raise InputError(
            f"pp={par.pp} is larger than num_hidden_layers={layers} ({spec.name}): "
            "every pipeline stage needs at least one layer"
        )
    chunks = par.pp * par.virtual_stages
    if chunks > layers:
        raise InputError(
            f"pp*virtual_stages = {par.pp}*{par.virtual_stages} = {chunks} > num_hidden_layers={layers} "
            f"({spec.name}): every model chunk needs at least one layer"
        )
