"""The typed question and the one answer to it.

A :class:`Question` is what a user asks (``train``, ``infer``, ``fit`` or ``plan``): the model, the
training or serving setup, the parallel layout, the GPUs, the device overheads and the search
knobs, each a typed value. :func:`ask` builds it from options (:mod:`peakmem.options`: the CLI's
parsed flags, the API's keyword arguments, the web's request body, ``--from``'s fields, the
callback's TrainingArguments all arrive as such a mapping); :func:`answer` answers it with typed
results, their JSON and the exit code, for every face alike.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from peakmem import options as opt
from peakmem import progress
from peakmem.accelerate_versions import ACCELERATE_CURRENT
from peakmem.bnb_versions import BNB_CURRENT
from peakmem.breakdown import Estimate
from peakmem.catalog import Gpu
from peakmem.defaults import optimizer_step
from peakmem.errors import EXIT_DOES_NOT_FIT, EXIT_OK, InputError
from peakmem.formulas.overhead import Overheads
from peakmem.inference import DEFAULT_WEIGHTS, Draft, InferenceSetup
from peakmem.model import CostLookup, ModelSpec
from peakmem.parallel import Parallelism
from peakmem.peft_versions import PEFT_CURRENT
from peakmem.post_training import PostTraining, post_training
from peakmem.resolve import Deriver, resolve_model
from peakmem.torchao_versions import TORCHAO_CURRENT
from peakmem.training import DEFAULT_SEQ_LEN, TrainingSetup
from peakmem.transformers_versions import TRANSFORMERS_CURRENT
from peakmem.validate import check_int
from peakmem.weight_formats import CheckpointWeights


@dataclass(frozen=True, kw_only=True)
class Search:
    """How far fit and plan look: fit's margin and serving mode, plan's GPUs and global batch."""

    margin: bool = False
    infer: bool = False
    max_gpus: int | None = None
    global_batch: int | None = None


@dataclass(frozen=True, kw_only=True)
class FromFiles:
    """What ``--from`` read: the files' fields (``found``: a :class:`peakmem.fromfile.FromFile`, for
    the echo and the JSON block), those the options given overrode, and engine fields of the layout
    that no option names (DeepSpeed bucket sizes)."""

    found: Any
    overridden: tuple[Any, ...] = ()
    parallel: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class Question:
    """One question. ``training`` for train, fit and plan (None for ``fit --infer``); ``inference`` for
    infer and ``fit --infer``; ``parallel`` None for a plain one-GPU job; ``defaults`` the defaults
    the framework decided (:mod:`peakmem.defaults`), as the answer's assumptions; ``from_file`` what
    ``--from`` read (its echo and JSON block), if anything; ``costs`` the block-cost lookup of a derived
    spec that the face hands in (:func:`peakmem.simulate.measuring_lookup` where torch is installed;
    None: the shipped and cached costs only), since no core module starts a fake-tensor run."""

    command: str
    spec: ModelSpec
    training: TrainingSetup | None = None
    parallel: Parallelism | None = None
    inference: InferenceSetup | None = None
    gpus: tuple[Gpu, ...] = ()
    overheads: Overheads = field(default_factory=Overheads)
    search: Search = field(default_factory=Search)
    defaults: tuple[str, ...] = ()
    from_file: FromFiles | None = None
    costs: CostLookup | None = None  # a derived spec's block costs: the face's measuring lookup, or stored
    post: PostTraining | None = None  # a preference / RL job's roles beside the policy (None: sft)


@dataclass(frozen=True, kw_only=True)
class Answer:
    """The answer: its JSON (what ``--json`` prints), its exit code, and the typed results behind it
    (``estimate`` and ``ways`` for train and infer, ``report`` for fit and plan)."""

    question: Question
    json: dict[str, Any]
    exit_code: int
    estimate: Estimate | None = None
    ways: Any = None  # peakmem.planner.WaysDown (train)
    ranks: Any = None  # the per-rank report of a sharded train
    report: Any = None  # FitReport | FitInferenceReport | PlanReport
    served: Any = None  # render.InferAnswer (infer)


def verdict_code(fits: Sequence[bool]) -> int:
    """The exit code of an answer (the one rule, DESIGN.md): 1 when there are verdicts (a GPU per
    verdict, or fit's and plan's one "does anything fit") and none fits, else 0."""
    return EXIT_DOES_NOT_FIT if fits and not any(fits) else EXIT_OK


# --- options -> question ---------------------------------------------------------------------------------
def read_from(
    given: dict[str, Any], paths: Sequence[Any], explicit: set[str], model: str | None
) -> tuple[FromFiles, str | None]:
    """``--from`` ``paths``: the files' options set into ``given`` where ``explicit`` (the options the
    user gave) has none, and the model they name unless ``model`` is given."""
    import os
    from types import SimpleNamespace

    from peakmem.fromfile import load_and_apply

    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    if not isinstance(paths, (list, tuple)) or not all(isinstance(p, (str, os.PathLike)) for p in paths):
        raise InputError(f"from_file={paths!r}: a path, or a list of paths, of framework config files")
    ns = SimpleNamespace(**given, model=model, from_file=[os.fspath(p) for p in paths])
    load_and_apply(ns, explicit | ({"model"} if model is not None else set()))
    given.update({name: getattr(ns, name) for name in given})
    read = FromFiles(found=ns.from_result, overridden=tuple(ns.from_overridden),
                     parallel=dict(getattr(ns, "from_parallel", {})))  # fmt: skip
    return read, ns.model


def ask(
    command: str, given: Mapping[str, Any], *, model: str | None = None, spec: ModelSpec | None = None,
    from_file: FromFiles | None = None, derive: Deriver | None = None, costs: CostLookup | None = None,
    config: Mapping[str, Any] | None = None,
) -> Question:  # fmt: skip
    """The question ``command`` with the options ``given`` (:func:`peakmem.options.convert` checks
    them): the model named by ``model`` (or ``spec``, one built already), the setups, the layout, the
    GPUs and the overheads, each validated where it is built. ``derive`` and ``costs``: what the face
    hands in for a model the formulas do not know (:func:`peakmem.simulate.deriver`, ``measuring_lookup``).
    ``config``: the config.json a given ``spec`` was built from (its quantization_config prices the
    weights, as it does for ``model``)."""
    from peakmem.hf.quant import checkpoint_weights
    from peakmem.resolve import resolve_config, resolve_gpus, spec_for_config

    if command not in opt.JOB_COMMANDS:
        raise InputError(f"command={command!r}: one of {', '.join(opt.JOB_COMMANDS)}")
    o = opt.convert(command, given)
    checkpoint = checkpoint_weights(config) if config is not None else None
    if spec is None:
        if not isinstance(model, str):
            raise InputError(f"model={model!r}: a catalog name, a config.json path or a Hub id (a string)")
        name, config = resolve_config(model)
        spec = spec_for_config(config, name=name, derive=derive)
        checkpoint = checkpoint_weights(config)
    gpus = resolve_gpus(o["gpu"]) if o.get("gpu") else ()
    search = Search(margin=o.get("margin", False), infer=o.get("infer", False),
                    max_gpus=o.get("max_gpus"), global_batch=o.get("global_batch"))  # fmt: skip
    if command == "plan":
        if not gpus or search.max_gpus is None:
            raise InputError("gpu, max_gpus: plan needs both (e.g. gpu='h100-80gb', max_gpus=64)")
        if len(gpus) > 1:
            raise InputError(f"gpu={o['gpu']!r}: plan takes one GPU")
    if command == "fit" and not gpus:
        raise InputError("gpu=None: fit needs --gpu NAME|SIZE[,NAME|SIZE...]")
    if search.global_batch is not None:
        check_int("global_batch", search.global_batch)
    serving = command == "infer" or search.infer
    training, defaults = (None, ()) if serving else training_setup(o, spec.max_position_embeddings)
    if training is not None and checkpoint is not None and checkpoint.weights == "mxfp4":
        training = replace(training, mxfp4_checkpoint=True)  # dequantized at load (peakmem.step_load)
    if training is not None and o.get("images") is not None:
        training, defaults = with_images(o, spec, training, defaults)
    elif any(o.get(k) is not None for k in ("images", "image_size", "min_pixels", "max_pixels")):
        named = "images" if o.get("images") is not None or serving else "image_size, min_pixels, max_pixels"
        raise InputError(f"{named}: " + ("serving a VL model's images is not modelled yet" if serving
                                         else "take them with --images N"))  # fmt: skip
    if training is not None and training.lora is not None and training.lora.rank > spec.hidden_size:
        raise InputError(
            f"lora_rank={training.lora.rank}: above {spec.name}'s hidden size {spec.hidden_size:,}; an "
            "adapter on a d x k weight has rank at most min(d, k): a larger one adds bytes that learn nothing"
        )
    if command == "fit" and serving:  # fit takes both sets: the one not asked about is checked all the same
        training_setup(o, spec.max_position_embeddings)
    elif command == "fit":  # pp and ep are the training layout's here, not a serving one's
        inference_setup({**o, "pp": 1, "ep": 1}, gpus, checkpoint, derive=derive, target=(spec, config))
    extra = from_file.parallel if from_file is not None else None
    layout = None if serving or command == "plan" else parallelism(o, extra)
    post = post_training_of(o, training, layout.dp if layout else 1) if training is not None else None
    return Question(
        command=command, spec=spec, training=training,
        parallel=layout,
        inference=inference_setup(o, gpus, checkpoint, derive=derive, target=(spec, config)) if serving
        else None, gpus=gpus,
        overheads=overheads(o, gpus),
        search=search, defaults=defaults, from_file=from_file, costs=costs, post=post,
    )  # fmt: skip


def post_training_of(o: Mapping[str, Any], training: TrainingSetup, dp: int = 1) -> PostTraining | None:
    """The post-training roles the options ask for (None: ``objective`` sft or not an option here);
    ``dp`` data-parallel ranks share the generation batch."""
    if o.get("objective", "sft") == "sft":
        unused = [
            k
            for k in ("beta", "num_generations", "completion", "steps_per_generation", "teacher", "critic")
            if o.get(k) is not None
        ]
        if unused:
            raise InputError(
                f"{', '.join(unused)}: options of a post-training job; give --objective dpo|grpo|..."
            )
        return None
    spg = o.get("steps_per_generation")
    teacher = resolve_model(o["teacher"]) if o.get("teacher") else None
    critic = resolve_model(o["critic"]) if o.get("critic") else None
    return post_training(
        o["objective"], reference=o["reference"], rollout=o["rollout"], beta=o.get("beta"),
        num_generations=o.get("num_generations"), completion=o.get("completion"),
        steps_per_generation=training.grad_accum if spg is None else spg, rollout_memory=o["rollout_memory"],
        rollout_sleep=o["rollout_sleep"], adapter=training.method.value != "full", seq=training.seq_len,
        batch=training.micro_batch, gpus=dp, teacher=teacher, critic=critic, entropy=o.get("entropy", False),
        trainer=o.get("trainer", "trl"),
    )  # fmt: skip


def training_setup(o: Mapping[str, Any], max_positions: int | None) -> tuple[TrainingSetup, tuple[str, ...]]:
    """The TrainingSetup the options ask for, and the defaults the framework decided for it."""
    from peakmem.training import (
        AttentionKernel,
        Framework,
        GradSync,
        KernelPolicy,
        LossImpl,
        Method,
        OptimizerImpl,
        OptimizerName,
        PaddedLengths,
        Precision,
        ReduceDtype,
        parse_checkpointing,
    )

    layout_prep = trl_layout_prep(o)
    o, taken = with_trl_release(o)
    seq = o["seq"] if o.get("seq") is not None else min(max_positions or DEFAULT_SEQ_LEN, DEFAULT_SEQ_LEN)
    precision = Precision.parse(o["precision"], "precision")
    optimizer = OptimizerName.parse(o["optimizer"], "optimizer")
    framework = Framework.parse(o["framework"], "framework")
    checkpointing, every = parse_checkpointing(o["checkpointing"])
    impl = o.get("optimizer_impl", opt.AUTO)
    if impl == opt.AUTO:
        row = optimizer_step(optimizer, precision, framework, transformers=o.get("transformers"))
        impl, taken = row.value, (*taken, row.assumption)
    setup = TrainingSetup(
        method=Method.parse(o["method"], "method"), precision=precision, optimizer=optimizer,
        optimizer_impl=OptimizerImpl.parse(impl, "optimizer_impl"), micro_batch=o["batch"], seq_len=seq,
        grad_accum=o["grad_accum"], checkpointing=checkpointing,
        checkpoint_every=every,
        attention=AttentionKernel.parse(o["attention"], "attention"), framework=framework,
        kernel_policy=KernelPolicy.parse(o.get("kernels", "cuda"), "kernels"),
        lora=_lora_config(o), quant=_quant_config(o), loss=LossImpl.parse(o["loss"], "loss"),
        bitsandbytes=o.get("bitsandbytes", BNB_CURRENT),
        torchao=o.get("torchao", TORCHAO_CURRENT), transformers=o.get("transformers", TRANSFORMERS_CURRENT),
        accelerate=o.get("accelerate", ACCELERATE_CURRENT),
        peft=o.get("peft", PEFT_CURRENT),
        optimizer_in_backward=o["optimizer_in_backward"], activation_offload=o["activation_offload"],
        compiled=o["compile"], liger=o["liger"], tiled_mlp=o.get("tiled_mlp", False),
        grads_set_to_none=not o.get("keep_grads", False),
        grad_sync=GradSync.parse(o.get("grad_sync", opt.AUTO), "grad_sync"),
        fsdp_reduce_dtype=ReduceDtype.parse(o.get("fsdp_reduce_dtype", opt.AUTO), "fsdp_reduce_dtype"),
        padded_lengths=PaddedLengths.parse(o.get("padded_lengths", "fixed"), "padded_lengths"),
        float8_all_gather=o.get("float8_all_gather", False), layout_prep=layout_prep,
        tiled_mlp_shards=o.get("tiled_mlp_shards") or 0,
    )  # fmt: skip
    return long_context_setup(o, setup, taken)


def with_trl_release(o: Mapping[str, Any]) -> tuple[Mapping[str, Any], tuple[str, ...]]:
    """The options with what ``trl`` (a TRL release) does to the peft model filled in where
    ``kbit_prep`` / ``adapter_dtype`` are not given (:func:`peakmem.trl_versions.peft_preparation`), and
    the line saying so; the options unchanged without ``trl``."""
    from peakmem.training import Method, Precision
    from peakmem.trl_versions import peft_preparation

    if o.get("trl") is None:
        return o, ()
    zero3 = o.get("zero", 0) == 3
    prep = peft_preparation(
        o["trl"], objective=o.get("objective") or "sft", method=Method.parse(o["method"], "method").value,
        precision=Precision.parse(o["precision"], "precision").value, quant=o.get("quant") or "nf4",
        sharded=zero3 or o.get("fsdp", "none") != "none", zero3=zero3,
    )  # fmt: skip
    if prep is None:
        return o, ()
    filled = {"kbit_prep": prep.kbit_prep, "adapter_dtype": prep.adapter_dtype}
    given = {k: v for k, v in filled.items() if v is not None and o.get(k) is None}
    explicit = [f"{k}={o[k]}" for k in filled if o.get(k) is not None and filled[k] not in (None, o[k])]
    line = prep.line + (f"; given: {', '.join(explicit)}" if explicit else "")
    return {**o, **given}, (line,)


# the options of one kind of layout, as with_trl_release reads them (TRL's sharded QLoRA: FSDP or ZeRO-3)
_TRL_LAYOUTS = (("replicated", "none", 0), ("fsdp", "full-shard", 0), ("zero3", "none", 3))


def trl_layout_prep(o: Mapping[str, Any]) -> Any:
    """What ``trl`` does to the peft model on each kind of layout (:class:`peakmem.adapters.LayoutPrep`),
    the options' own kbit_prep / adapter_dtype kept where given; None without ``trl`` or where every
    layout gets the same."""
    from peakmem.adapters import LayoutPrep, LoraConfig

    if o.get("trl") is None:
        return None
    rows: dict[str, tuple[str, str]] = {}
    peft_default = LoraConfig().adapter_dtype  # get_peft_model's autocast_adapter_dtype: fp32
    for kind, fsdp, zero in _TRL_LAYOUTS:
        filled, _ = with_trl_release({**o, "fsdp": fsdp, "zero": zero})
        rows[kind] = (filled.get("kbit_prep") or "none", filled.get("adapter_dtype") or peft_default)
    return None if len(set(rows.values())) == 1 else LayoutPrep(**rows)


def long_context_setup(
    o: Mapping[str, Any], setup: TrainingSetup, taken: tuple[str, ...]
) -> tuple[TrainingSetup, tuple[str, ...]]:
    """``setup`` under ``max_tokens_per_gpu`` (one packed row; the given seq is the longest sample) and
    the lines saying what the long-context options assume (:mod:`peakmem.formulas.long_context`)."""
    from peakmem.formulas import long_context as lc

    if setup.tiled_mlp:
        shards = setup.tiled_mlp_shards or lc.DEEPSPEED_SHARD_RULE
        taken += (f"tiled MLP: {shards} shards over each rank's tokens, MoE layers untiled ({lc.SRC_TILED})",)
    budget = o.get("max_tokens_per_gpu")
    if budget is None:
        return setup, taken
    if setup.micro_batch != 1:
        raise InputError(
            f"batch={setup.micro_batch} with max_tokens_per_gpu={budget}: the token budget decides the "
            "micro-batch (one packed row); leave batch at 1"
        )
    degree = o.get("ulysses", 1) * o.get("cp", 1)
    row = lc.token_budget_seq(budget, o.get("seq"), degree)
    line = (
        f"max_tokens_per_gpu={budget:,}: one packed row of {row:,} tokens over ulysses x cp = {degree} "
        "(verl use_dynamic_bsz); attention per sample with varlen flash, linear in tokens; a quadratic "
        "kernel counted as one sample of the whole row"
    )
    return replace(setup, seq_len=row), (*taken, line)


def with_images(
    o: Mapping[str, Any], spec: ModelSpec, setup: TrainingSetup, taken: tuple[str, ...]
) -> tuple[TrainingSetup, tuple[str, ...]]:
    """``setup`` with the image tokens the options ask for added to its sequence (the language model's
    seq = text seq + images x tokens per image: :mod:`peakmem.formulas.images`), and the line saying so."""
    from peakmem.formulas.images import Images, image_tokens, parse_image_size

    if o.get("image_size") is None:
        raise InputError(f"image_size=None: give WIDTHxHEIGHT of the {o['images']} images, e.g. 1024x1024")
    width, height = parse_image_size(o["image_size"])
    images = Images(count=o["images"], width=width, height=height, min_pixels=o.get("min_pixels"),
                    max_pixels=o.get("max_pixels"))  # fmt: skip
    tokens = image_tokens(spec, images)
    seq = setup.seq_len + tokens.total
    line = f"seq {seq:,} = {setup.seq_len:,} text + {tokens.total:,} image tokens: {tokens.assumption}"
    return replace(setup, seq_len=seq), (*taken, line)


def _lora_config(o: Mapping[str, Any]) -> Any:
    """A LoraConfig when any LoRA option is given (TrainingSetup rejects it with method full)."""
    from peakmem.adapters import LoraConfig, parse_parameters, parse_targets

    given = {
        "rank": o["lora_rank"], "alpha": o["lora_alpha"],
        "targets": parse_targets(o["lora_targets"]) if o["lora_targets"] is not None else None,
        "dropout": o["lora_dropout"], "dora": True if o["dora"] else None,
        "adapter_dtype": o["adapter_dtype"],
        "target_parameters": parse_parameters(o["lora_target_parameters"])
        if o.get("lora_target_parameters") is not None else None,
    }  # fmt: skip
    options = {k: v for k, v in given.items() if v is not None}
    return LoraConfig(**options) if options else None


def _quant_config(o: Mapping[str, Any]) -> Any:
    """A QuantConfig when quant or no_double_quant is given; None keeps NF4 + double quant."""
    from peakmem.adapters import QuantConfig

    prep = o.get("kbit_prep") or "none"
    if o["quant"] is None and not o["no_double_quant"] and prep == "none":
        return None
    quant = o["quant"] or "nf4"
    # double quantization is a 4-bit feature (bitsandbytes bnb_4bit_use_double_quant): int8 has none
    dq = not o["no_double_quant"] and quant != "int8"
    return QuantConfig(quant=quant, double_quant=dq, kbit_prep=prep)


def parallelism(o: Mapping[str, Any], extra: Mapping[str, Any] | None = None) -> Parallelism | None:
    """The Parallelism the options ask for, or None for a plain single-GPU job. ``extra``: engine
    fields read from a framework's file (DeepSpeed bucket sizes)."""
    from peakmem.parallel import AdapterWrap, CpRotate, FsdpMode, Offload, PipelineSchedule

    plain = (
        o["gpus"] == 1 and o["zero"] == 0 and o["fsdp"] == "none" and o["offload"] == "none"
        and o["offload_params"] == "none" and o["tp"] == o["pp"] == o["cp"] == o["ep"] == 1
        and o.get("ulysses", 1) == 1
    )  # fmt: skip
    layout = Parallelism(
        gpus=o["gpus"], gpus_per_node=o["gpus_per_node"], tp=o["tp"], pp=o["pp"], cp=o["cp"], ep=o["ep"],
        ulysses=o.get("ulysses", 1),
        sequence_parallel=o["sp"], zero_stage=o["zero"], fsdp=FsdpMode.parse(o["fsdp"], "fsdp"),
        fsdp_version=o["fsdp_version"],
        fsdp_adapter_wrap=AdapterWrap.parse(o.get("fsdp_adapter_wrap", "separate"), "fsdp_adapter_wrap"),
        offload_optimizer=Offload.parse(o["offload"], "offload"),
        offload_params=Offload.parse(o["offload_params"], "offload_params"),
        pp_schedule=PipelineSchedule.parse(o["pp_schedule"], "pp_schedule"),
        cp_rotate=CpRotate.parse(o.get("cp_rotate", "auto"), "cp_rotate"),
        virtual_stages=o["virtual_stages"], zero_init=not o.get("no_zero_init", False), **dict(extra or {}),
    )  # fmt: skip
    return None if plain else layout  # built either way: every value is checked


def inference_setup(
    o: Mapping[str, Any], gpus: Sequence[Gpu], checkpoint: CheckpointWeights | None = None,
    derive: Deriver | None = None, target: tuple[ModelSpec, Mapping[str, Any] | None] | None = None,
) -> InferenceSetup:  # fmt: skip
    """The InferenceSetup the options ask for; weights not given: the format the checkpoint's
    quantization_config names (``checkpoint``), else bf16. A draft model is resolved as MODEL is
    (``derive`` for an architecture the formulas do not know); ``draft='mtp'``: the MTP layers of
    ``target`` (its spec and config.json), in its weight format."""
    weights = o["weights"]
    if weights is None:
        weights = checkpoint.weights if checkpoint is not None and checkpoint.weights else DEFAULT_WEIGHTS
    return InferenceSetup(
        weights=weights, checkpoint=checkpoint, kv_cache=o["kv_cache"], batch=o["batch"],
        context=o["context"],
        prompt=o["prompt"], engine=o["engine"], tp=o["tp"], gpu_bytes=gpus[0].usable_bytes if gpus else None,
        interconnect=o.get("interconnect") or _catalog_interconnect(gpus),
        attention_backend=o.get("attention_backend") or "", gpu_architecture=_catalog_architecture(gpus),
        pp=o["pp"], dp=o["dp"], ep=o["ep"], dp_attention=o["dp_attention"],
        gpu_memory_utilization=o["gpu_memory_utilization"], n_gpu_layers=o["n_gpu_layers"],
        keep_all_logits=o["keep_all_logits"], strict=o["strict"], max_loras=o["max_loras"],
        cache_implementation=o.get("cache_implementation", "dynamic"),
        max_lora_rank=o["max_lora_rank"], prefix_tokens=o["prefix_tokens"],
        draft=_draft_for(o, target, weights, derive),
        num_speculative_tokens=o.get("num_speculative_tokens"),
        enforce_eager=o.get("enforce_eager", False), max_num_seqs=o.get("max_num_seqs"),
        prefill_chunk=o.get("prefill_chunk"), vllm_entrypoint=o.get("vllm_entrypoint", "serve"),
        gpu_name=gpus[0].display_name if gpus else "",
        cudagraph_mode=o.get("cudagraph_mode", "auto"), model_runner=o.get("model_runner", "auto"),
        cuda_graph_max_bs=o.get("cuda_graph_max_bs"),
        disable_custom_all_reduce=o.get("disable_custom_all_reduce", False),
        engine_version=o.get("engine_version"), gptq_kernel=o.get("gptq_kernel"),
        forward_loop=o.get("forward_loop", False),
        ssm_cache_dtype=o.get("ssm_cache_dtype", "auto"), conv_cache_dtype=o.get("conv_cache_dtype", "auto"),
    )  # fmt: skip


def _catalog_interconnect(gpus: Sequence[Gpu]) -> str:
    """How the GPUs named are joined, as the catalog says ("" unless they all say the same)."""
    return gpus[0].interconnect if len({g.interconnect for g in gpus}) == 1 else ""


def _catalog_architecture(gpus: Sequence[Gpu]) -> str:
    """The GPUs' architecture ("" unless they all have the same): SGLang's default attention backend."""
    return gpus[0].architecture if len({g.architecture for g in gpus}) == 1 else ""


MTP = "mtp"  # --draft mtp: the target's own multi-token-prediction layers
NGRAM = "ngram"  # --draft ngram: vLLM's n-gram lookup, no draft model


def _draft_for(o: Mapping[str, Any], target: tuple[ModelSpec, Mapping[str, Any] | None] | None,
               weights: str, derive: Deriver | None) -> Draft | None:  # fmt: skip
    """The draft --draft and --draft-method name: mtp, ngram, or a model (an EAGLE head among them)."""
    name, method = o.get("draft"), o.get("draft_method")
    if method is not None and name in (None, MTP, NGRAM):
        raise InputError(f"draft_method={method!r}: needs --draft naming a draft model or EAGLE head")
    if name == MTP:
        return _mtp_draft(target, weights)
    if name == NGRAM:
        return Draft(name=NGRAM, spec=None, method=NGRAM)
    return _draft(name, method, derive)


def _mtp_draft(target: tuple[ModelSpec, Mapping[str, Any] | None] | None, weights: str) -> Draft:
    """The target's MTP layers (formulas/serving/speculative.py mtp_draft_spec) as a draft."""
    from peakmem.formulas.serving.speculative import mtp_draft_spec
    from peakmem.hf.deepseek import MTP_LAYERS_KEY, QWEN_MTP_LAYERS_KEY, mtp_layers

    spec, config = target if target is not None else (None, None)
    layers = mtp_layers(config) if config is not None else 0
    if spec is None or not layers:
        name = spec.name if spec is not None else "the model"
        keys = f"{MTP_LAYERS_KEY} / {QWEN_MTP_LAYERS_KEY}"
        raise InputError(f"draft='mtp': {name}'s config.json names no MTP layers ({keys})")
    return Draft(name=MTP, spec=mtp_draft_spec(spec, layers), weights=weights, method=MTP)


def _draft(name: str | None, method: str | None, derive: Deriver | None) -> Draft | None:
    """The draft model ``name`` names (a catalog name, a config.json path or a Hub id), with the
    format its checkpoint's quantization_config names; an EAGLE / EAGLE-3 head when ``method`` says
    so or its config's architectures name one (formulas/serving/eagle.py)."""
    if name is None:
        return None
    from peakmem.formulas.serving.eagle import EAGLE_METHODS, eagle_draft_spec, method_of
    from peakmem.hf.quant import checkpoint_weights
    from peakmem.resolve import resolve_config, spec_for_config

    found, config = resolve_config(name)
    ck = checkpoint_weights(config)
    spec = spec_for_config(config, name=found, derive=derive)
    method = method or method_of(config.get("architectures")) or "draft_model"
    vocab = 0
    if method in EAGLE_METHODS:
        # llama_eagle3.py: draft_vocab_size defaults to vocab_size; fc reads 3 x target_hidden_size,
        # else 3 x the head's hidden_size
        vocab = _config_int(config, "draft_vocab_size") or spec.vocab_size
        hidden = _config_int(config, "target_hidden_size") or spec.hidden_size
        spec = eagle_draft_spec(spec, method, target_hidden=hidden, draft_vocab=vocab)
    return Draft(name=found, spec=spec, weights=ck.weights if ck is not None else "", method=method,
                 draft_vocab_size=vocab)  # fmt: skip


def _config_int(config: Mapping[str, Any], key: str) -> int:
    """A positive int config.json gives under ``key``, else 0."""
    value = config.get(key)
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InputError(f"{key}={value!r}: a positive integer in the draft's config.json")
    return value


def overheads(o: Mapping[str, Any], gpus: Sequence[Gpu] = ()) -> Overheads:
    """The device overheads: peakmem's named defaults, or a calibrated profile, unless the CUDA
    context, fragmentation, expandable segments or roundup divisions are given; the cuBLAS workspace of
    the GPUs named when they share an architecture (formulas/overhead.py ``cublas_workspace_bytes``)."""
    from peakmem.formulas.overhead import cublas_workspace_bytes
    from peakmem.units import MiB

    given: dict[str, Any] = {}
    architectures = {g.architecture for g in gpus}
    if len(architectures) == 1:
        given["cublas_workspace_bytes"] = cublas_workspace_bytes(architectures.pop())
    sizes = {g.usable_bytes for g in gpus}  # what torch's total reads
    if len(sizes) == 1:
        given["device_bytes"] = sizes.pop()
    if o.get("cuda_context_mib") is not None:
        if o["cuda_context_mib"] < 0:
            raise InputError(f"cuda_context_mib={o['cuda_context_mib']!r}: must be >= 0")
        given["context_bytes"] = int(o["cuda_context_mib"] * MiB)
        given["context_source"] = "--cuda-context-mib"
    if o.get("fragmentation") is not None:
        given["fragmentation"] = o["fragmentation"]
    if o.get("expandable_segments"):
        given["expandable_segments"] = True
    if o.get("alloc_roundup_divisions"):
        given["alloc_roundup_divisions"] = o["alloc_roundup_divisions"]
    if o.get("profile"):
        from peakmem.calibrate import load_profile

        return replace(load_profile(o["profile"]).overheads(), **given)
    return Overheads(**given)


# --- the answer ------------------------------------------------------------------------------------------
def answer(q: Question) -> Answer:
    """The answer to ``q``: one function, which the CLI prints, the Python API returns, the web serves
    and the Trainer callback checks. Notes the measuring of a derived model's blocks left
    (:mod:`peakmem.progress`: a kernel fallback the libraries announced) join its assumptions."""
    with progress.collecting() as notes:
        if q.command == "plan":
            got = _plan(q)
        elif q.command == "fit":
            got = _fit_infer(q) if q.search.infer else _fit(q)
        elif q.command == "infer":
            got = _infer(q)
        else:
            got = _train(q)
    if not notes:
        return got
    listed = got.json.get("assumptions")
    if isinstance(listed, list):
        listed.extend(notes)
    est = replace(got.estimate, assumptions=(*got.estimate.assumptions, *notes)) if got.estimate else None
    return replace(got, estimate=est)


def _with_from(q: Question, out: dict[str, Any]) -> dict[str, Any]:
    if q.from_file is not None:
        out["from_file"] = q.from_file.found.json(q.from_file.overridden)
    return out


def _plan(q: Question) -> Answer:
    from peakmem import planner

    assert q.training is not None and q.search.max_gpus is not None
    report = planner.plan(q.spec, q.training, q.gpus[0], q.search.max_gpus, q.search.global_batch,
                          overheads=q.overheads, costs=q.costs)  # fmt: skip
    out = planner.plan_json(report)
    out["defaults"] = list(q.defaults)
    return Answer(question=q, json=out, exit_code=verdict_code([bool(report.layouts)]),
                  report=report)  # fmt: skip


def _fit(q: Question) -> Answer:
    from peakmem import planner

    assert q.training is not None
    if q.post is not None:
        return _fit_post(q)
    report = planner.fit(q.spec, q.training, q.gpus, overheads=q.overheads, margin=q.search.margin,
                         par=q.parallel, costs=q.costs)  # fmt: skip
    out = _with_from(q, planner.fit_json(report))
    out["defaults"] = list(q.defaults)
    return Answer(question=q, json=out, exit_code=verdict_code([report.any_fits]),
                  report=report)  # fmt: skip


def _fit_infer(q: Question) -> Answer:
    from peakmem import planner

    assert q.inference is not None
    report = planner.fit_inference(q.spec, q.inference, q.gpus, overheads=q.overheads)
    code = verdict_code([report.any_fits])
    return Answer(question=q, json=planner.fit_inference_json(report), exit_code=code, report=report)


def _infer(q: Question) -> Answer:
    from peakmem.answers import infer_answer

    assert q.inference is not None
    served = infer_answer(q.spec, q.inference, q.gpus, q.overheads)
    code = verdict_code([v.fits for v in served.verdicts])
    return Answer(question=q, json=served.json, exit_code=code, estimate=served.estimate, served=served)


def _train(q: Question) -> Answer:
    from peakmem import planner
    from peakmem.answers import answer_json, verdicts_of, weight_warnings
    from peakmem.estimate import with_alternatives

    assert q.training is not None
    if q.post is not None:
        return _train_post(q)
    capacity = min((g.usable_bytes for g in q.gpus), default=None)
    found = planner.train_answer(
        q.spec, q.training, q.parallel, overheads=q.overheads, capacity_bytes=capacity, costs=q.costs
    )
    est = with_alternatives(q.spec, q.training, found.estimate, q.gpus, overheads=q.overheads,
                                   par=q.parallel, costs=q.costs)  # fmt: skip
    if q.defaults:
        est = replace(est, assumptions=(*est.assumptions, *q.defaults))
    est = replace(est, warnings=weight_warnings(q.spec, training=q.training))
    out = _with_from(q, answer_json(est, q.gpus, found.ways))
    code = verdict_code([v.fits for v in verdicts_of(est, q.gpus)])
    return Answer(question=q, json=out, exit_code=code, estimate=est, ways=found.ways, ranks=found.ranks)


def _train_post(q: Question) -> Answer:
    from peakmem.answers import answer_json, verdicts_of, weight_warnings
    from peakmem.jobs import estimate_post_training

    assert q.training is not None and q.post is not None
    device = min((g.memory_bytes for g in q.gpus), default=None)  # vLLM's share is of the whole device
    est = estimate_post_training(q.spec, q.training, q.post, gpu_bytes=device, overheads=q.overheads,
                                 costs=q.costs, par=q.parallel)  # fmt: skip
    est = replace(est, assumptions=(*est.assumptions, *q.defaults),
                  warnings=weight_warnings(q.spec, training=q.training))  # fmt: skip
    out = _with_from(q, answer_json(est, q.gpus))
    code = verdict_code([v.fits for v in verdicts_of(est, q.gpus)])
    return Answer(question=q, json=out, exit_code=code, estimate=est)


def _fit_post(q: Question) -> Answer:
    from peakmem.planner.post_training import fit_post_training, post_fit_json

    assert q.training is not None and q.post is not None
    report = fit_post_training(q.spec, q.training, q.post, q.gpus, overheads=q.overheads, costs=q.costs,
                               par=q.parallel)  # fmt: skip
    out = _with_from(q, post_fit_json(report))
    code = verdict_code([g.verdict.fits or bool(g.fitting) or g.combined is not None for g in report.gpus])
    return Answer(question=q, json=out, exit_code=code, report=report)
