"""torchtitan ``train_configs/*.toml`` (``peakmem train --from llama3_8b.toml --gpus 64``): the job its
trainer runs, every key mapped, left aside as memory-neutral (logging, checkpoint folders, learning
rates) or named as not modelled.

Read at torchtitan 238fa995 (2026-02-23), the last commit with TOML configs: 9810191bb (#2386, "Config
System Refactor: TOML to Python Dataclass Registry") replaced them with Python config registries, so
b5bcd76 and later releases have no TOML to read. Sources at 238fa995: ``torchtitan/config/job_config.py``
(the keys and their defaults), ``train.py`` (gradient accumulation), ``distributed/parallel_dims.py``
(``data_parallel_shard_degree = -1``: the GPUs left), ``distributed/utils.py`` ``maybe_enable_amp``,
``models/llama3/infra/parallelize.py`` (FSDP2 ``MixedPrecisionPolicy``, ``reshard_after_forward``, the TP
plan's ``SequenceParallel`` norms), ``distributed/pipeline_parallel.py`` (micro-batches, stages per
rank), ``components/quantization/float8.py`` and ``models/*/__init__.py`` (the flavours). The release of
the published runs, 9dec370 (2024-12-26, ``torchtitan/config_manager.py``), and the releases between
differ in (``_Era`` tells them apart by the keys a file uses):

* layout: the degrees sit in ``[training]`` (``data_parallel_*``, ``tensor_parallel_degree``,
  ``disable_loss_parallel``) and ``[experimental]`` (``pipeline_parallel_*``, ``context_parallel_*``,
  ``enable_async_tensor_parallel``) until 785c34c99 (2025-03-18, ``[parallelism]``);
* batch: ``training.batch_size`` until 8570415c3 (2025-06-05: ``local_batch_size``, and
  ``global_batch_size`` for gradient accumulation); PP ``pipeline_parallel_microbatches`` (default: the pp
  degree) until 5e2033c75 (2025-04-07: ``pipeline_parallel_microbatch_size``, default 1);
* compile: ``training.compile`` until 08b8b244f (2025-08-20: ``[compile] enable, components``). The loss
  is compiled with it from bbb1b616e (2025-04-02); 9dec370 runs it eagerly (e8977b007, "compiling loss
  function causes CUDA errors"): a 2024-layout file (no ``[parallelism]``) gets the eager loss;
* float8: ``[float8] enable_float8_linear`` until 57387af0e (2025-02-14: ``model.converters = ["float8"]``
  with ``[float8]``), ``recipe_name`` from 069bae286 (2025-02-27), ``[quantize.linear.float8]`` and the
  converter ``quantize.linear.float8`` from 8a2686c4a (2025-09-30);
* optimizer: ``optimizer.fused`` (off: foreach) until 6e4988550 (2025-02-24: ``implementation``, default
  fused);
* precision: without FSDP, no autocast before 0b44d4c43 (2025-06-16: DDP / one device autocast to
  ``mixed_precision_param``): fp32 weights and compute; ``training.dtype`` (pure bf16) from e99e16c91
  (2025-09-16).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from peakmem.errors import InputError
from peakmem.fromfile.mapper import _Mapper, _short, as_int, get, leaves, names_list, truthy

SOURCE = "torchtitan@238fa995"
# (model.name, model.flavor) -> peakmem catalog name, and why it is that model where the names differ.
# Checked against the flavours' arguments (models/<name>/__init__.py at 238fa995; llama2 at 9dec370
# models/llama/__init__.py): the same layers, widths, heads, experts and vocabulary as the checkpoint.
MODELS: dict[tuple[str, str], tuple[str, str]] = {
    ("llama3", "8B"): ("llama-3.1-8b", "hf_assets_path Llama-3.1-8B"),
    ("llama3", "70B"): ("llama-3.1-70b", "hf_assets_path Llama-3.1-70B"),
    ("llama3", "405B"): ("llama-3.1-405b", "hf_assets_path Llama-3.1-405B"),
    ("llama2", "7B"): ("llama-2-7b", ""),
    ("llama2", "13B"): ("llama-2-13b", ""),
    ("llama2", "70B"): ("llama-2-70b", ""),
    ("qwen3", "0.6B"): ("qwen3-0.6b", ""),
    ("qwen3", "1.7B"): ("qwen3-1.7b", ""),
    ("qwen3", "4B"): ("qwen3-4b", ""),
    ("qwen3", "8B"): ("qwen3-8b", ""),
    ("qwen3", "14B"): ("qwen3-14b", ""),
    ("qwen3", "32B"): ("qwen3-32b", ""),
    ("qwen3", "30B-A3B"): ("qwen3-30b-a3b", ""),
    ("qwen3", "235B-A22B"): ("qwen3-235b-a22b", ""),
    ("deepseek_v3", "16B"): (
        "deepseek-v2-lite",
        "the 16B flavour is DeepSeek-V2-Lite's architecture: 27 layers of width 2048, MLA (kv_lora_rank "
        "512, no q_lora), 64 routed + 2 shared experts of 1408, top-6, 1 dense layer, vocab 102400",
    ),
    ("deepseek_v3", "236B"): ("deepseek-v2", "the 236B flavour is DeepSeek-V2's architecture"),
    ("deepseek_v3", "671B"): ("deepseek-v3", ""),
    ("gpt_oss", "20b"): ("gpt-oss-20b", ""),
    ("gpt_oss", "120b"): ("gpt-oss-120b", ""),
}
# flavour suffixes that change only the attention kernel (llama3 "8B_flex", "8B_varlen")
ATTENTION_SUFFIXES = {"_flex": "FlexAttention", "_flex_attn": "FlexAttention", "_varlen": "varlen flash"}
NOT_IN_CATALOG = {
    "llama4": "the catalog's llama-4-scout / llama-4-maverick are the vision-language checkpoints; "
    "torchtitan trains the text model only",
    "flux": "a diffusion model, not a causal LM",
}
# Keys whose value does not change GPU memory (logging, data, schedules, checkpoint folders): read, never
# echoed. A section named here with None is left aside whole.
MEMORY_NEUTRAL_SECTIONS = (
    "job",
    "profiling",
    "metrics",
    "lr_scheduler",
    "checkpoint",
    "comm",
    "debug",
    "memory_estimation",
)
MEMORY_NEUTRAL_KEYS = frozenset({
    "model.hf_assets_path", "model.tokenizer_path", "model.norm_type", "model.print_after_conversion",
    "optimizer.lr", "optimizer.eps", "optimizer.beta1", "optimizer.beta2", "optimizer.weight_decay",
    "training.dataset", "training.dataset_path", "training.max_norm", "training.steps",
    "training.warmup_steps", "training.gc_freq", "training.gc_debug", "training.seed",
    "training.deterministic",
    "activation_checkpoint.early_stop", "activation_checkpoint.preserve_rng_state",
    "activation_checkpoint.determinism_check", "activation_checkpoint.debug",
    "activation_checkpoint.per_op_sac_force_recompute_mm_shapes_by_fqns",
    "activation_checkpoint.visualize_memory_budget_pareto", "activation_checkpoint.memory_budget",
    "parallelism.pipeline_parallel_expert_parallel_overlap", "parallelism.context_parallel_load_balancer",
    "float8.precompute_float8_dynamic_scale_for_fsdp", "float8.emulate",
    "quantize.linear.float8.precompute_float8_dynamic_scale_for_fsdp", "quantize.linear.float8.emulate",
    "fault_tolerance.enable", "experimental.custom_import", "experimental.custom_args_module",
    "compile.backend", "validation.enable",
})  # fmt: skip
# read only when a converter names them (the shipped configs carry them with converters commented out)
MEMORY_NEUTRAL_PREFIXES = (
    "training.dataloader.",
    "validation.",
    "fault_tolerance.",
    "quantize.grouped_mm.",
    "quantize.linear.mx.",
)

# key -> its places, newest first (the 2024 layout second), and torchtitan's default (238fa995 / 9dec370)
PLACES: dict[str, tuple[tuple[str, ...], Any]] = {
    "name": (("model.name",), "llama3"),
    "flavor": (("model.flavor",), "debugmodel"),
    "local_batch": (("training.local_batch_size", "training.batch_size"), 8),
    "global_batch": (("training.global_batch_size",), -1),
    "seq": (("training.seq_len",), 2048),
    "dp_replicate": (("parallelism.data_parallel_replicate_degree",
                      "training.data_parallel_replicate_degree"), 1),
    "dp_shard": (("parallelism.data_parallel_shard_degree", "training.data_parallel_shard_degree"), -1),
    "tp": (("parallelism.tensor_parallel_degree", "training.tensor_parallel_degree"), 1),
    "pp": (("parallelism.pipeline_parallel_degree", "experimental.pipeline_parallel_degree"), 1),
    "cp": (("parallelism.context_parallel_degree", "experimental.context_parallel_degree"), 1),
    "ep": (("parallelism.expert_parallel_degree",), 1),
    "etp": (("parallelism.expert_tensor_parallel_degree",), 1),
    "pp_schedule": (("parallelism.pipeline_parallel_schedule", "experimental.pipeline_parallel_schedule"),
                    "1F1B"),
    "pp_microbatch_size": (("parallelism.pipeline_parallel_microbatch_size",), 1),
    "pp_microbatches": (("experimental.pipeline_parallel_microbatches",), None),
    "cp_rotate": (("parallelism.context_parallel_rotate_method",
                   "experimental.context_parallel_rotate_method"), "allgather"),
    "async_tp": (("parallelism.enable_async_tensor_parallel", "experimental.enable_async_tensor_parallel"),
                 False),
    "no_loss_parallel": (("parallelism.disable_loss_parallel", "training.disable_loss_parallel"), False),
    "reshard": (("parallelism.fsdp_reshard_after_forward",), "default"),
    "mp_param": (("training.mixed_precision_param",), "bfloat16"),
    "mp_reduce": (("training.mixed_precision_reduce",), "float32"),
    "dtype": (("training.dtype",), "float32"),
    "cpu_offload": (("training.enable_cpu_offload",), False),
    "compile": (("compile.enable", "training.compile"), False),
    "compile_components": (("compile.components",), ["model", "loss"]),
    "ac_mode": (("activation_checkpoint.mode",), "selective"),
    "ac_option": (("activation_checkpoint.selective_ac_option",), "2"),
    "optimizer": (("optimizer.name",), "AdamW"),
    "implementation": (("optimizer.implementation",), "fused"),
    "fused": (("optimizer.fused",), None),
    "in_backward": (("optimizer.early_step_in_backward",), False),
    "converters": (("model.converters",), []),
    "float8_legacy": (("float8.enable_float8_linear",), False),
    "float8_recipe": (("quantize.linear.float8.recipe_name", "float8.recipe_name"), None),
    "float8_all_gather": (("quantize.linear.float8.enable_fsdp_float8_all_gather",
                           "float8.enable_fsdp_float8_all_gather"), False),
    "float8_filter": (("quantize.linear.float8.filter_fqns", "float8.filter_fqns"), []),
    "mx_recipe": (("quantize.linear.mx.recipe_name", "mx.recipe_name"), "mxfp8_cublas"),
    "mx_filter": (("quantize.linear.mx.filter_fqns", "mx.filter_fqns"), ["output"]),
}  # fmt: skip
# keys memory depends on that peakmem has no model of: named when set away from their default
UNMODELLED: dict[str, tuple[Any, str]] = {
    "parallelism.module_fqns_per_model_part": (None, "peakmem splits the layers evenly over the stages"),
    "parallelism.pipeline_parallel_layers_per_stage": (None, "peakmem splits the layers evenly"),
    "parallelism.pipeline_parallel_first_stage_less_layers": (1, "peakmem splits the layers evenly"),
    "parallelism.pipeline_parallel_last_stage_less_layers": (1, "peakmem splits the layers evenly"),
    "parallelism.pipeline_parallel_schedule_csv": ("", "a custom schedule"),
    "experimental.pipeline_parallel_split_points": ([], "peakmem splits the layers evenly"),
    "experimental.pipeline_parallel_schedule_csv": ("", "a custom schedule"),
    "experimental.enable_compiled_autograd": (False, "compiled autograd"),
    "parallelism.expert_parallel_comm_backend": ("standard", "DeepEP's buffers"),
    "float8.scaling_type_input": ("dynamic", "delayed scaling"),
    "float8.scaling_type_weight": ("dynamic", "delayed scaling"),
    "float8.scaling_type_grad_output": ("dynamic", "delayed scaling"),
}
FLOAT8_CONVERTERS = ("float8", "quantize.linear.float8")
# components/quantization/mx.py MXLinearConverter (register_model_converter "mx" / "quantize.linear.mx"); its
# recipes on SM100 (mxfp8_emulated runs torch's casts: not the GPU kernels peakmem models)
MX_CONVERTERS = ("mx", "quantize.linear.mx")
MX_RECIPES = ("mxfp8_cublas", "mxfp8_cublas_rceil")
FLOAT8_RECIPES = {
    None: "float8-tensorwise",
    "tensorwise": "float8-tensorwise",
    "rowwise": "float8-rowwise",
    "rowwise_with_gw_hp": "float8-rowwise-gw-hp",
}
HEAD_FQN = "output"  # torchtitan's name for the LM head; peakmem's float8 leaves the head in bf16
OPTIMIZERS = {"adamw": "adamw", "adam": "adam"}  # components/optimizer.py build_optimizers: torch.optim
IMPLEMENTATIONS = ("fused", "foreach", "for-loop")
# schedule -> peakmem's, and the stages per rank (pipeline_parallel.py: 2 for a multi-stage schedule)
SCHEDULES = {"1f1b": ("1f1b", 1), "interleaved1f1b": ("interleaved", 2)}


LEGACY_TRAINING_KEYS = frozenset({"data_parallel_shard_degree", "data_parallel_replicate_degree",
                                  "tensor_parallel_degree", "compile", "batch_size"})  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class _Era:
    """What a file's keys say about the torchtitan release it was written for (module docstring)."""

    layout_2024: bool  # degrees under [training] / [experimental]: 9dec370's layout, before 2025-03-18
    old_batch: bool  # training.batch_size: before 2025-06-05, so before DDP / one-device autocast

    @classmethod
    def of(cls, doc: Mapping[str, Any]) -> _Era:
        found = doc.get("training")
        training: dict[str, Any] = found if isinstance(found, dict) else {}
        layout_2024 = not isinstance(doc.get("parallelism"), dict) and (
            bool(LEGACY_TRAINING_KEYS & set(training))
            or isinstance(doc.get("experimental"), dict)
            or isinstance(doc.get("float8"), dict)
        )
        old_batch = "batch_size" in training and "local_batch_size" not in training
        return cls(layout_2024=layout_2024, old_batch=old_batch)


def is_torchtitan(doc: Mapping[str, Any]) -> bool:
    """A torchtitan JobConfig: a ``[model]`` table with ``flavor``, or its ``[job]`` / ``[parallelism]`` /
    ``[activation_checkpoint]`` tables."""
    model = doc.get("model")
    if isinstance(model, dict) and "flavor" in model and "_component_" not in model:
        return True
    return any(isinstance(doc.get(t), dict) for t in ("job", "parallelism", "activation_checkpoint"))


class _Reader:
    """The file's values by :data:`PLACES` name, remembering which keys were read."""

    def __init__(self, m: _Mapper, doc: Mapping[str, Any]) -> None:
        self.m, self.doc = m, doc
        self.read: set[str] = set()

    def value(self, name: str) -> tuple[Any, str]:
        """The value and the key it came from, or torchtitan's default and ``(torchtitan default)``."""
        places, default = PLACES[name]
        for key in places:
            self.read.add(key)
        for key in places:
            found = get(self.doc, key)
            if found is not None:
                return found, key
        return default, f"(torchtitan default {places[0]} = {_short(default)})"

    def int(self, name: str, *, low: int = 1) -> tuple[int, str]:
        raw, key = self.value(name)
        number = as_int(self.m, key, raw)
        if number is None or number < low:
            raise InputError(f"--from {self.m.name}: {key}={raw!r}: must be a whole number >= {low}")
        return number, key


def map_torchtitan(m: _Mapper, doc: Mapping[str, Any], gpus: int | None = None) -> None:
    """Map a torchtitan TOML onto peakmem's options; ``gpus``: the command line's ``--gpus`` (the file
    does not hold the world size when ``data_parallel_shard_degree`` is -1, the rest of the GPUs)."""
    r, era = _Reader(m, doc), _Era.of(doc)
    _model(r)
    degrees = _layout(r, gpus)
    _batch(r, era, degrees)
    _precision(r, era, degrees)
    _checkpointing(r)
    _compile(r, era)
    _optimizer(r, era)
    _not_read(r)


def _model(r: _Reader) -> None:
    (name, _), (flavor, flavor_key) = r.value("name"), r.value("flavor")
    name, flavor = str(name), str(flavor)
    base, kernel = flavor, ""
    for suffix, attention in ATTENTION_SUFFIXES.items():
        if flavor.endswith(suffix) and (name, flavor[: -len(suffix)]) in MODELS:
            base, kernel = flavor[: -len(suffix)], attention
    found = MODELS.get((name, base))
    if found is None:
        why = NOT_IN_CATALOG.get(name, "no peakmem catalog model of it")
        known = sorted({n for n, _ in MODELS})
        r.m.skip("model.flavor", f"{name} {flavor}", why)
        r.m.notes.append(
            f"torchtitan's {name} {flavor} is not in peakmem's catalog ({why}; read: {', '.join(known)} "
            "flavours); give MODEL (a catalog name or config.json)"
        )
        return
    model, why = found
    r.m.set("model", model, flavor_key, f"torchtitan {name} {flavor}" + (f"; {why}" if why else ""))
    if kernel:
        r.m.skip("model.flavor", flavor, f"{kernel} attention counted as sdpa")


@dataclass(frozen=True, kw_only=True)
class _Degrees:
    """The layout the file runs: world size and the degrees the batch and precision depend on."""

    world: int
    replicate: int
    shard: int
    tp: int
    pp: int
    fsdp: bool  # ParallelDims.fsdp_enabled: dp_shard > 1 or cp > 1


def _layout(r: _Reader, gpus: int | None) -> _Degrees:
    """The degrees, the number of GPUs, FSDP2 / HSDP / DDP, TP with its sequence-parallel norms, PP, CP,
    EP."""
    m = r.m
    rep, _ = r.int("dp_replicate")
    shard_raw, shard_key = r.value("dp_shard")
    shard = as_int(m, shard_key, shard_raw)
    tp, tp_key = r.int("tp")
    pp, pp_key = r.int("pp")
    cp, cp_key = r.int("cp")
    ep, ep_key = r.int("ep")
    etp, etp_key = r.int("etp")
    fixed = rep * cp * tp * pp
    product = f"data_parallel_replicate {rep} x cp {cp} x tp {tp} x pp {pp}"
    if shard is None or shard == 0 or shard < -1:
        raise InputError(f"--from {m.name}: {shard_key}={shard_raw!r}: -1 (the GPUs left) or a degree >= 1")
    if shard == -1:
        if gpus is None:
            raise InputError(
                f"--from {m.name}: {shard_key} = -1 (the GPUs left after {product}) and the "
                "number of GPUs is not in the file: give --gpus N"
            )
        if gpus % fixed:
            raise InputError(f"--from {m.name}: --gpus {gpus} is not a multiple of {product} = {fixed}")
        shard = gpus // fixed
        m.info("data_parallel_shard", shard, shard_key, f"--gpus {gpus} / ({product})")
        world = gpus
    else:
        world = shard * fixed
        if gpus is not None and gpus != world:
            raise InputError(
                f"--from {m.name}: --gpus {gpus} != data_parallel_shard {shard} x {product} = "
                f"{world} (torchtitan's ParallelDims asserts they are equal)"
            )
        if gpus is None:
            m.set("gpus", world, shard_key, f"data_parallel_shard {shard} x {product}")
    fsdp = shard > 1 or cp > 1  # ParallelDims.fsdp_enabled: dp_shard x cp is FSDP2's mesh
    if fsdp:
        reshard, reshard_key = r.value("reshard")
        if reshard not in ("default", "always", "never"):
            raise InputError(f"--from {m.name}: {reshard_key}={reshard!r}: default, always or never")
        # parallelize.py apply_fsdp: "default" reshards after forward unless PP runs; peakmem's FSDP2
        # full-shard under PP already keeps every unit of the stage unsharded (formulas/fsdp2.py in_layer)
        keep = reshard == "never" and pp == 1
        mode = "shard-grad-op" if keep else "full-shard"
        if rep > 1:
            mode = "hybrid-shard"
            m.set(
                "gpus_per_node",
                shard * cp * tp * pp,
                "parallelism.data_parallel_replicate_degree",
                f"HSDP: peakmem's hybrid shard shards within a node; a node of dp_shard {shard} x cp x tp "
                "x pp GPUs makes its shard group torchtitan's dp_shard x cp",
            )
            if keep:
                m.skip(reshard_key, reshard, "HSDP without resharding after forward: counted as resharded")
        m.set(
            "fsdp",
            mode,
            shard_key if shard > 1 else cp_key,
            f"FSDP2 fully_shard over dp_shard {shard} x cp {cp}"
            + (f", reshard_after_forward {reshard}" if not rep > 1 else ""),
        )
        m.set("fsdp_version", 2, "(torchtitan: FSDP2 fully_shard)")
    cpu_offload, offload_key = r.value("cpu_offload")
    if truthy(cpu_offload):
        if fsdp:  # apply_fsdp(cpu_offload=True): CPUOffloadPolicy, params, grads and states on the host
            m.set("offload_params", "cpu", offload_key, "FSDP2 CPUOffloadPolicy")
            m.set("offload", "cpu", offload_key, "FSDP2 CPUOffloadPolicy")
        else:
            m.skip(offload_key, cpu_offload, "torchtitan offloads only under FSDP: no effect")
    if tp > 1:
        m.set("tp", tp, tp_key)
        m.set("sp", True, tp_key, "torchtitan's TP plan puts SequenceParallel on the norms")
        async_tp, async_key = r.value("async_tp")
        if truthy(async_tp):
            m.skip(async_key, async_tp, "async TP (micro-pipelined collectives): estimated as plain TP")
        no_lp, no_lp_key = r.value("no_loss_parallel")
        if truthy(no_lp):
            m.skip(
                no_lp_key, no_lp, "peakmem prices loss_parallel (vocab-sharded logits), torchtitan's default"
            )
    else:
        for name in ("async_tp", "no_loss_parallel"):
            r.value(name)
    if pp > 1:
        m.set("pp", pp, pp_key)
        schedule, schedule_key = r.value("pp_schedule")
        found = SCHEDULES.get(str(schedule).lower())
        if found is None:
            m.unknown(
                schedule_key,
                schedule,
                "a schedule peakmem has no model of: counted as 1F1B",
                ("1F1B", "Interleaved1F1B"),
            )
        else:
            m.set("pp_schedule", found[0], schedule_key)
            if found[1] > 1:
                m.set(
                    "virtual_stages",
                    found[1],
                    schedule_key,
                    "pipeline_parallel.py: 2 stages per rank for a multi-stage schedule",
                )
    else:
        r.value("pp_schedule")
    if cp > 1:
        m.set("cp", cp, cp_key)
        rotate, rotate_key = r.value("cp_rotate")
        if rotate not in ("allgather", "alltoall"):
            raise InputError(f"--from {m.name}: {rotate_key}={rotate!r}: allgather or alltoall")
        m.set("cp_rotate", rotate, rotate_key)
    else:
        r.value("cp_rotate")
    if ep > 1:
        m.set("ep", ep, ep_key)
        if etp != tp and tp > 1:
            m.skip(etp_key, etp, f"experts not tensor-parallel under tp {tp}: peakmem's experts follow tp")
    return _Degrees(world=world, replicate=rep, shard=shard, tp=tp, pp=pp, fsdp=fsdp)


def _batch(r: _Reader, era: _Era, d: _Degrees) -> None:
    """Micro-batch and accumulation: train.py ``gradient_accumulation_steps = global_batch_size //
    (local_batch_size x dp)``; under PP each local batch runs as micro-batches (pipeline_parallel.py)."""
    m, pp = r.m, d.pp
    local, local_key = r.int("local_batch")
    seq, seq_key = r.int("seq")
    m.set("seq", seq, seq_key)
    global_raw, global_key = r.value("global_batch")
    total = as_int(m, global_key, global_raw)
    dp = d.replicate * d.shard  # train.py batch_degree: the data-loading mesh, dp_replicate x dp_shard
    accum = 1
    if total is not None and total > 0:
        accum, rest = divmod(total, local * dp)
        if rest or accum < 1:
            raise InputError(
                f"--from {m.name}: {global_key}={total}: not a multiple of local batch {local} x "
                f"data-parallel degree {dp} (train.py asserts it)"
            )
    if pp == 1:
        m.set("batch", local, local_key, "per device")
        if accum > 1:
            m.set("grad_accum", accum, global_key, f"{total} / (local batch {local} x dp {dp})")
            # trainer.py train_step: forward_backward_step per step, no set_requires_gradient_sync
            m.set("grad_sync", "each-micro-batch", "(torchtitan trainer.py train_step)",
                  "FSDP reduce-scatters every micro-batch")  # fmt: skip
        for name in ("pp_microbatch_size", "pp_microbatches"):
            r.value(name)
        return
    if era.layout_2024 or get(r.doc, "experimental.pipeline_parallel_microbatches") is not None:
        count_raw, count_key = r.value("pp_microbatches")
        count = as_int(m, count_key, count_raw) or pp  # 9dec370 pipeline_llama.py: default the pp degree
        micro, rest = divmod(local, count)
        why = f"local batch {local} / {count} micro-batches"
    else:
        micro, micro_key = r.int("pp_microbatch_size")
        count, rest = divmod(local, micro)
        why = f"local batch {local} / micro-batch {micro}"
        count_key = micro_key
    if rest or micro < 1:
        raise InputError(
            f"--from {m.name}: {count_key}: {why} is not whole (pipeline_parallel.py refuses it)"
        )
    m.set("batch", micro, count_key, f"the pipeline micro-batch: {why}")
    steps = f" x {accum} accumulation steps" if accum > 1 else ""
    m.set("grad_accum", count * accum, count_key, f"{count} pipeline micro-batches{steps}")


def _float8(r: _Reader, d: _Degrees) -> str | None:
    """The float8 precision when a converter swaps the Linears, and its all-gather."""
    m = r.m
    converters_raw, conv_key = r.value("converters")
    converters = names_list(converters_raw)
    legacy, legacy_key = r.value("float8_legacy")
    recipe, recipe_key = r.value("float8_recipe")
    gather, gather_key = r.value("float8_all_gather")
    filters, filter_key = r.value("float8_filter")
    for name in converters:
        if name not in FLOAT8_CONVERTERS + MX_CONVERTERS:
            m.skip(conv_key, name, "a model converter peakmem has no model of (grouped-GEMM quantization)")
    if any(c in MX_CONVERTERS for c in converters):
        return _mx(r, conv_key)
    on = truthy(legacy) or any(c in FLOAT8_CONVERTERS for c in converters)
    if not on:
        return None
    precision = FLOAT8_RECIPES.get(recipe)
    if precision is None:
        raise InputError(
            f"--from {m.name}: {recipe_key}={recipe!r}: tensorwise, rowwise or rowwise_with_gw_hp"
        )
    source = legacy_key if truthy(legacy) else conv_key
    note = "torchao Float8Linear on FSDP2's fp32-sharded states (peakmem: float8 on mixed-bf16 states)"
    m.set("precision", precision, recipe_key if recipe else source, note)
    if truthy(gather):
        if recipe is not None:
            raise InputError(
                f"--from {m.name}: {gather_key} with {recipe_key}={recipe!r}: torchtitan refuses the pair "
                "(float8 all-gather is tensorwise only)"
            )
        if d.shard > 1:  # float8.py: parallel_dims.dp_shard_enabled and enable_fsdp_float8_all_gather
            m.set("float8_all_gather", True, gather_key)
        else:
            m.skip(gather_key, gather, "no effect without data_parallel_shard_degree > 1")
    if truthy(legacy) and filter_key.startswith("("):  # 9dec370 float8.py: fqn != "output" always
        filters, filter_key = [HEAD_FQN], "(torchtitan 9dec370: module_filter_fn leaves out the output head)"
    _head_filter(m, filters, filter_key, "float8")
    return precision


def _head_filter(m: Any, filters: Any, filter_key: str, what: str) -> None:
    """A converter's ``filter_fqns`` against peakmem's: every Linear of the blocks converted, the output
    head left out; any other filter is named as not modelled."""
    extra = [f for f in names_list(filters) if f != HEAD_FQN]
    if extra:
        m.skip(filter_key, extra, "peakmem converts every Linear of the blocks (only the head is left out)")
    if HEAD_FQN not in names_list(filters):
        m.skip(filter_key, filters, f"the output head in {what}: peakmem leaves the head in bf16")


def _mx(r: _Reader, conv_key: str) -> str:
    """torchtitan's MX converter: MXFP8 Linears (every Linear of the blocks, the output head left out)."""
    m = r.m
    recipe, recipe_key = r.value("mx_recipe")
    if recipe not in MX_RECIPES:
        raise InputError(
            f"--from {m.name}: {recipe_key}={recipe!r}: {' or '.join(MX_RECIPES)} (SM100 kernels)"
        )
    m.set("precision", "float8-mxfp8", recipe_key if not recipe_key.startswith("(") else conv_key,
          f"torchao MXFP8 Linears ({recipe}) on FSDP2's fp32-sharded states")  # fmt: skip
    filters, filter_key = r.value("mx_filter")
    _head_filter(m, filters, filter_key, "MXFP8")
    return "float8-mxfp8"


def _precision(r: _Reader, era: _Era, d: _Degrees) -> None:
    """fp32 parameters, with FSDP2's ``MixedPrecisionPolicy(param_dtype, reduce_dtype)`` where FSDP runs
    (no autocast), autocast under DDP / one device (from 2025-06-16), none with TP or PP alone
    (``maybe_enable_amp``); ``training.dtype = "bfloat16"``: everything in bf16."""
    m = r.m
    dtype, dtype_key = r.value("dtype")
    param, param_key = r.value("mp_param")
    reduce, reduce_key = r.value("mp_reduce")
    if param not in ("bfloat16", "float32"):
        raise InputError(f"--from {m.name}: {param_key}={param!r}: bfloat16 or float32")
    if dtype not in ("bfloat16", "float32"):
        raise InputError(f"--from {m.name}: {dtype_key}={dtype!r}: bfloat16 or float32")
    if dtype == "bfloat16":
        m.set("precision", "bf16", dtype_key, "parameters, gradients and optimizer states in bf16")
    elif d.fsdp:
        precision = "mixed-bf16" if param == "bfloat16" else "fp32"
        m.set(
            "precision",
            precision,
            param_key,
            "FSDP2 MixedPrecisionPolicy: fp32 sharded parameters, bf16 compute, no autocast"
            if precision == "mixed-bf16"
            else "fp32 everywhere",
        )
        reduce_to = {"float32": "fp32", "bfloat16": "bf16"}.get(str(reduce))
        if reduce_to is None:
            raise InputError(f"--from {m.name}: {reduce_key}={reduce!r}: float32 or bfloat16")
        m.set("fsdp_reduce_dtype", reduce_to, reduce_key, "FSDP2 MixedPrecisionPolicy(reduce_dtype)")
    elif d.tp > 1 or d.pp > 1:
        m.set(
            "precision", "fp32", param_key, "maybe_enable_amp: no mixed precision with TP or PP without FSDP"
        )
    elif era.old_batch or era.layout_2024:
        m.set(
            "precision", "fp32", param_key, "no autocast under DDP / one device before 2025-06-16 (0b44d4c43)"
        )
    else:
        precision = "amp-bf16" if param == "bfloat16" else "fp32"
        m.set("precision", precision, param_key, "maybe_enable_amp: torch.autocast under DDP / one device")
    _float8(r, d)


def _checkpointing(r: _Reader) -> None:
    """``[activation_checkpoint]``: ``full``; ``selective`` with ``op`` (the op-level SAC policy) or an
    integer N (every N-th block checkpointed whole: ``every-N``); ``none``."""
    m = r.m
    mode, mode_key = r.value("ac_mode")
    option, option_key = r.value("ac_option")
    if mode == "none":
        m.set("checkpointing", "none", mode_key)
    elif mode == "full":
        m.set("checkpointing", "full", mode_key)
    elif mode == "selective":
        text = str(option).strip()
        if text == "op":
            m.set("checkpointing", "op", option_key, "torchtitan's op-level selective AC policy")
        elif text.isdigit() and int(text) >= 1:
            every = int(text)
            m.set(
                "checkpointing",
                "full" if every == 1 else f"every-{every}",
                option_key,
                f"every {every}-th block checkpointed whole",
            )
        else:
            raise InputError(f"--from {m.name}: {option_key}={option!r}: 'op' or a whole number >= 1")
    elif mode == "memory_budget":
        m.unknown(mode_key, mode, "the compiler's memory-budget partitioner", ("none", "selective", "full"))
    else:
        raise InputError(f"--from {m.name}: {mode_key}={mode!r}: none, selective, full or memory_budget")


def _compile(r: _Reader, era: _Era) -> None:
    m = r.m
    on, key = r.value("compile")
    components_raw, comp_key = r.value("compile_components")
    if not truthy(on):
        return
    if key == "training.compile":  # before 2025-08-20: the model, and the loss from 2025-04-02
        m.set("compile", True, key, "each block under torch.compile")
        m.kernel("compile", True)
        if not era.layout_2024:
            m.set("loss", "compiled", key, "the cross-entropy compiled with the model (from bbb1b616e)")
        else:
            m.notes.append(f"{m.src(key)}: a 2024-layout file (9dec370) runs the loss eagerly (e8977b007)")
        return
    components = names_list(components_raw)
    if "model" in components:
        m.set("compile", True, comp_key, "each block under torch.compile")
        m.kernel("compile", True)
    if "loss" in components:
        m.set("loss", "compiled", comp_key, "the cross-entropy under torch.compile")
    for name in components:
        if name not in ("model", "loss"):
            m.skip(comp_key, name, "a compile component peakmem does not know")


def _optimizer(r: _Reader, era: _Era) -> None:
    m = r.m
    name, name_key = r.value("optimizer")
    found = OPTIMIZERS.get(str(name).lower())
    if found is None:
        m.unknown(name_key, name, "an optimizer peakmem has no model of", tuple(OPTIMIZERS))
    else:
        m.set("optimizer", found, name_key)
    fused, fused_key = r.value("fused")
    impl, impl_key = r.value("implementation")
    if fused is not None:  # before 2025-02-24: fused on, else foreach (9dec370 optimizer.py)
        m.set("optimizer_impl", "fused" if truthy(fused) else "foreach", fused_key)
    elif impl_key.startswith("(") and era.layout_2024:
        m.set("optimizer_impl", "foreach", "(torchtitan 9dec370 default: optimizer.fused off -> foreach)")
    elif impl in IMPLEMENTATIONS:
        m.set("optimizer_impl", impl, impl_key)
    else:
        raise InputError(f"--from {m.name}: {impl_key}={impl!r}: one of {', '.join(IMPLEMENTATIONS)}")
    early, early_key = r.value("in_backward")
    if truthy(early):
        m.set("optimizer_in_backward", True, early_key)


def _not_read(r: _Reader) -> None:
    """Every key left: memory-neutral ones aside, a set unmodelled one or an unknown one is named."""
    m = r.m
    validation = get(r.doc, "validation.enable")
    if truthy(validation):
        why = "the evaluation forward (no_grad, validation.local_batch_size) is not modelled"
        m.skip("validation.enable", validation, why)
    if truthy(get(r.doc, "fault_tolerance.enable")):
        m.skip("fault_tolerance.enable", True, "torchft replica groups")
    for key in ("experimental.custom_import", "experimental.custom_args_module"):
        if get(r.doc, key):
            m.skip(key, get(r.doc, key), "a custom module peakmem does not read")
    for key, value in leaves(r.doc):
        if key in r.read or key in MEMORY_NEUTRAL_KEYS or key.split(".")[0] in MEMORY_NEUTRAL_SECTIONS:
            continue
        if key in UNMODELLED:
            default, why = UNMODELLED[key]
            if value != default and value not in (None, [], ""):
                m.skip(key, value, f"{why}: not modelled")
            continue
        if key.startswith(MEMORY_NEUTRAL_PREFIXES):
            continue
        m.skip(key, value, f"not a key peakmem reads ({SOURCE} config/job_config.py)")
