"""Post-training jobs: the policy's training step composed with its reference and rollout engine.

DESIGN.md "Jobs of several models": a job is roles (here the policy, the reference, the rollout
engine) and phases, each with what is resident; the peak is the largest phase. Every role's bytes
come from the engines a single-model job uses: the policy's update is :func:`estimate_training` of
the step TRL runs (its batch, its fused log-prob head), the rollout is :func:`estimate_inference`
of ``generate`` on the policy, a reference forward is one no-grad layer's temporaries
(:func:`layer_transient_bytes`) and TRL's log-prob head (:mod:`peakmem.formulas.logprob_head`).

What each phase holds (TRL 1.16, ``grpo_trainer.py`` / ``dpo_trainer.py``):

* **rollout** (GRPO, RLOO): ``_generate_single_turn`` runs ``unwrap_model_for_generation(...).generate``
  on ``batch x steps_per_generation`` completions per device at once (the generation batch,
  ``GRPOConfig.__post_init__``); the policy's weights and optimizer states stay resident (gradients
  are freed by ``zero_grad(set_to_none=True)``). ``num_generations`` only groups the completions
  (``RepeatSampler``): the per-device batch is the same for 2 or 8.
* **scoring**: the old-policy and reference log-probs under ``torch.no_grad()``, in chunks of
  ``per_device_train_batch_size`` (``_get_per_token_logps_and_entropies(batch_size=...)``); DPO's
  reference forward runs *after* the policy's forward, in ``_compute_loss``, so the policy's saved
  activations are alive during it; ``precompute_ref_log_probs`` runs it once before training instead.
* **forward / backward / optimizer**: the policy's update. DPO concatenates chosen and rejected
  (``2 x batch`` sequences).
* a **vLLM** engine colocated (``vllm_mode="colocate"``) takes ``vllm_gpu_memory_utilization`` of the
  whole device (``requested_memory = total x utilization``, vLLM ``v1/worker/gpu_worker.py``) in every
  phase, unless sleep mode (``vllm_enable_sleep_mode``: ``llm.sleep(level=2)`` after each generation,
  ``trl/generation/vllm_generation.py``) frees its weights and KV cache outside rollout. A vLLM
  server runs on GPUs of its own: ``peakmem infer`` sizes them.

On several GPUs (data parallel: DeepSpeed ZeRO or FSDP through accelerate, as TRL runs) each rank holds
the policy's update as :func:`peakmem.ranks.estimate_ranks` prices it, and the reference as TRL prepares
it (``trl/models/utils.py``): ``prepare_deepspeed`` keeps ZeRO-3 ("we shard both the active and reference
model") and otherwise builds the reference with ZeRO disabled (stage 0: a whole copy per rank);
``prepare_fsdp`` wraps it with the policy's FSDP plugin (sharded; ``shard-grad-op`` does not reshard after
forward, so its reference is counted whole). A sharded reference's forward gathers its layers as the
policy's forward does. HF ``generate`` under ZeRO-3 gathers the whole 16-bit policy first
(``unwrap_model_for_generation``: ``deepspeed.zero.GatheredParameters(model.parameters())`` with
``ds3_gather_for_generation`` True, the default); under FSDP it runs layer by layer.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from peakmem.breakdown import Band, Category, Estimate, MemoryItem, Phase, PhasePeak, Range
from peakmem.errors import InputError
from peakmem.estimate import estimate_training
from peakmem.formulas.fsdp2 import SRC_FSDP_GATHER
from peakmem.formulas.logprob_head import no_grad_head_bytes
from peakmem.formulas.overhead import Overheads
from peakmem.formulas.serving.estimate import estimate_inference
from peakmem.formulas.serving.forward import layer_transient_bytes
from peakmem.inference import Engine, InferenceSetup
from peakmem.model import CostLookup, ModelSpec
from peakmem.parallel import FsdpMode, Parallelism
from peakmem.post_training import Objective, PostTraining, Reference, Rollout
from peakmem.ranks import estimate_ranks
from peakmem.step_fsdp import NoGradForward
from peakmem.training import KernelPolicy, LossImpl, Method, Precision, TrainingSetup

SRC_TRL = "trl 1.16 grpo_trainer.py / dpo_trainer.py"
SRC_GENERATE = "transformers generate on the policy (peakmem.formulas.serving.generate)"
SRC_VLLM = "vLLM v1/worker/gpu_worker.py: requested_memory = total x gpu_memory_utilization"
INT64, FP32 = 8, 4
# per completion, kept from rollout to update (GRPOTrainer._generate_and_score_completions' output):
# prompt_completion_ids and attention_mask over the sequence (int64), completion_mask (int64) and four
# fp32 vectors over the completion (old, sampling and reference log-probs, the advantage's broadcast)
KEPT_SEQ_INT64 = 2
KEPT_COMPLETION_FP32 = 4
# item key prefix -> role (else: policy)
ROLES = {"reference": "reference", "rollout": "rollout engine", "teacher": "teacher", "critic": "critic"}
SRC_DISTILL = "trl 1.16 distillation_trainer.py DistillationTrainer (_compute_loss, _get_last_hidden_state)"
SRC_TRL_SHARD = "trl 1.16 models/utils.py prepare_deepspeed / prepare_fsdp / unwrap_model_for_generation"
# the policy's gathered working set in its forward's items (formulas/sharding.py, step_fsdp.py)
POLICY_GATHERED = ("zero3.gathered", "fsdp.root", "fsdp.units", "fsdp.first_unshard")
NO_GATHER = NoGradForward()  # one GPU, DDP, ZeRO 0-2: nothing gathered


def _weights_format(setup: TrainingSetup) -> str:
    """The policy's weights as ``generate`` reads them: the parameters' own dtype (TRL generates outside
    autocast), nf4 for a QLoRA base."""
    if setup.method is Method.QLORA:
        return "nf4"
    if setup.precision in (Precision.MIXED_BF16, Precision.BF16):
        return "bf16"
    return "fp16" if setup.precision is Precision.MIXED_FP16 else "fp32"


def _act_bytes(setup: TrainingSetup) -> int:
    """Bytes of an activation (and of DeepSpeed's 16-bit parameters): fp32 runs keep 4, the rest 2."""
    return FP32 if setup.precision is Precision.FP32 else 2


def update_setup(setup: TrainingSetup, post: PostTraining) -> TrainingSetup:
    """The training step TRL runs: chosen + rejected concatenated for paired objectives, and the fused
    log-prob head over the completion (with the entropy for online objectives)."""
    if setup.loss is LossImpl.COMPILED:  # the plain cross-entropy compiled: these objectives run none
        raise InputError(
            f"loss='compiled' with objective={post.objective.value!r}: its update runs the trainer's own "
            "log-prob / divergence head, not the plain cross-entropy; loss compiled is for sft / pre-training"
        )
    if post.teacher is not None:  # DistillationTrainer: the chunked divergence against the teacher
        return replace(
            setup,
            loss=LossImpl.DIVERGENCE,
            scored_tokens=post.completion,
            teacher_hidden=post.teacher.head_in_features,
            divergence_jsd=0 < post.beta < 1,
        )
    if post.verl:  # verl's actor: the full logits, then the log-probs
        from peakmem.ppo import actor_setup

        return actor_setup(setup, post)
    loss = LossImpl.LOGPROB_ENTROPY if post.online else LossImpl.LOGPROB
    batch = 2 * setup.micro_batch if post.paired else setup.micro_batch
    return replace(setup, micro_batch=batch, loss=loss, scored_tokens=post.completion)


def _item(path: str, category: Category, nbytes: int, key: str, source: str = SRC_TRL) -> MemoryItem:
    return MemoryItem(path=path, category=category, bytes=nbytes, source=source, key=key)


def _phase(phase: Phase, *parts: MemoryItem) -> PhasePeak:
    items = tuple(i for i in parts if i.bytes)
    return PhasePeak(phase=phase, bytes=sum(i.bytes for i in items), items=items)


def no_grad_forward_bytes(spec: ModelSpec, setup: TrainingSetup, sequences: int, completion: int) -> int:
    """A no-grad forward of ``sequences`` sequences (a reference or old-policy pass): the largest of one
    layer's temporaries with the residual stream, and TRL's log-prob head beside the final hidden states."""
    layer, head, _ = _no_grad_parts(spec, setup, sequences, completion)
    return max(layer, head)


def _no_grad_parts(
    spec: ModelSpec, setup: TrainingSetup, sequences: int, completion: int
) -> tuple[int, int, int]:
    """(one layer's temporaries with the residual stream, TRL's log-prob head with the final hidden
    states, the residual stream) of a no-grad forward of ``sequences`` sequences."""
    act = _act_bytes(setup)
    tokens = sequences * setup.seq_len
    triton = setup.kernel_policy is KernelPolicy.CUDA
    head = no_grad_head_bytes(spec, tokens - sequences, sequences * completion, act, triton=triton)
    residual = tokens * spec.hidden_size * act
    return layer_transient_bytes(spec, tokens, act), head + residual, residual


def _resident(train: Estimate) -> int:
    """What the policy holds through the whole step: the items every phase of the update holds (its
    weights, master weights and optimizer states, ZeRO's buffers), less the gradients, freed between steps
    (``zero_grad(set_to_none=True)``) but for ZeRO's persistent gradient partition."""
    common: Counter[tuple[str, Category, int]] | None = None
    for p in train.phases:
        kept = (i for i in p.items if i.category is not Category.GRADIENTS or i.key.startswith("zero."))
        here = Counter((i.path, i.category, i.bytes) for i in kept)
        common = here if common is None else common & here
    return sum(n * nbytes for (_, _, nbytes), n in (common or Counter()).items())


def reference_shards(par: Parallelism | None) -> int:
    """Ranks one reference copy is sharded over, as TRL prepares it: ZeRO-3 and FSDP full / hybrid shard
    as the policy; ZeRO 0-2 build it with ZeRO disabled and FSDP shard-grad-op keeps it gathered after its
    forward (a whole copy per rank)."""
    if par is None or par.zero_stage in (1, 2) or par.fsdp is FsdpMode.SHARD_GRAD_OP:
        return 1
    return par.shard_degree


class _Roles:
    """The items every phase shares: the policy between steps, the reference's weights, the vLLM share;
    ``fsdp``: a sharded model's no-grad forward on the rank (its layers gathered one by one,
    :attr:`peakmem.ranks.RankEstimate.no_grad_forward`), ``teacher_fsdp`` the teacher's."""

    def __init__(
        self,
        train: Estimate,
        single: Estimate,
        post: PostTraining,
        gpu_bytes: int | None,
        *,
        shards: int = 1,
        zero3_full: int = 0,
        fsdp: NoGradForward = NO_GATHER,
        teacher_fsdp: NoGradForward | None = None,
    ) -> None:
        self.zero3_full = zero3_full
        self.policy = _item(
            "policy: weights and optimizer states (gradients freed between steps)",
            Category.PARAMETERS,
            _resident(train),
            "policy.resident",
        )
        self.weights = _item(
            "policy weights (no optimizer yet)",
            Category.PARAMETERS,
            sum(r.bytes for r in train.per_param if r.category is Category.PARAMETERS),
            "policy.weights",
        )
        # a separate reference is a copy of the full weights in the policy's dtype (rows over all parameters)
        copy = sum(
            r.bytes
            for r in single.per_param
            if r.category is Category.PARAMETERS and r.params == single.params
        )
        sharded = f", sharded over {shards} ranks" if shards > 1 else ""
        self.reference = _item(
            f"reference model weights (a frozen copy{sharded})",
            Category.PARAMETERS,
            -(-copy // shards) if post.reference is Reference.SEPARATE else 0,
            "reference.weights",
            SRC_TRL_SHARD if shards > 1 else SRC_TRL,
        )
        if post.teacher is not None:  # loaded like the student: its weights in the student's dtype
            teacher_bytes = copy * post.teacher.params // single.params
            self.reference = _item(
                f"teacher {post.teacher.name} weights (frozen{sharded})",
                Category.PARAMETERS,
                -(-teacher_bytes // shards),
                "teacher.weights",
                SRC_DISTILL,
            )
        self.fsdp = fsdp
        self.teacher_fsdp = fsdp if teacher_fsdp is None else teacher_fsdp
        share = (
            int(post.rollout_memory * gpu_bytes) if post.rollout is Rollout.VLLM_COLOCATE and gpu_bytes else 0
        )
        self.vllm = _item(
            f"vLLM rollout engine: {post.rollout_memory:g} of the GPU (its weights and KV pool)",
            Category.KV_CACHE,
            share,
            "rollout.vllm",
            SRC_VLLM,
        )
        self.awake = _item(
            self.vllm.path, Category.KV_CACHE, 0 if post.rollout_sleep else share, "rollout.vllm", SRC_VLLM
        )

    @property
    def generate_gathered(self) -> tuple[MemoryItem, ...]:
        """What HF ``generate`` on a sharded policy gathers: the whole 16-bit model under ZeRO-3
        (``ds3_gather_for_generation``), the layers one by one under FSDP."""
        if self.zero3_full:
            what = "policy gathered whole for generate (ZeRO-3, ds3_gather_for_generation)"
            return (_item(what, Category.PARAMETERS, self.zero3_full, "rollout.gathered", SRC_TRL_SHARD),)
        # every decode step gathers every unit; the KV cache, not a layer's temporaries, is what else is
        # alive, so a unit's unshard counts whole (an upper bound by one unit where prefill's peak)
        return self.gathered_for("policy", 0, 0, 0)

    def gathered_for(self, role: str, layer: int, head: int, residual: int) -> tuple[MemoryItem, ...]:
        """A sharded model's gathered layers during a no-grad forward of ``role`` (reference, policy: the
        policy's layers; teacher: its own) whose temporaries are ``layer`` / ``head`` with ``residual``
        hidden states (:meth:`peakmem.step_fsdp.NoGradForward.extra`): its working set, and what FSDP2's
        unshards add to it."""
        fsdp = self.teacher_fsdp if role == "teacher" else self.fsdp
        unshard = _item(f"{role}: FSDP2 unshards in its no-grad forward (a unit's all-gather output and "
                        "parameters, or the root's output at the first unit)", Category.PARAMETERS,
                        fsdp.extra(layer, head, residual), f"{role}.unshard", SRC_FSDP_GATHER)  # fmt: skip
        return (
            *(replace(i, path=f"{role}: {i.path}", key=f"{role}.gathered", source=SRC_TRL_SHARD)
              for i in fsdp.gathered),
            unshard,
        )  # fmt: skip


def check_data_parallel(par: Parallelism) -> None:
    """TRL's trainers run data parallel (DDP, ZeRO, FSDP through accelerate); other layouts are not
    modelled for post-training jobs."""
    for name in ("tp", "pp", "cp", "ep", "ulysses"):
        if getattr(par, name) > 1:
            raise InputError(
                f"{name}={getattr(par, name)}: post-training jobs are modelled data parallel (DDP, ZeRO, "
                "FSDP as TRL runs them through accelerate); set the ranks with --gpus and --zero / --fsdp"
            )


def _rollout(
    spec: ModelSpec, setup: TrainingSetup, post: PostTraining, r: _Roles, extra: dict[str, object]
) -> PhasePeak:
    """The policy generating its generation batch (``batch x steps_per_generation`` completions per
    device): transformers ``generate`` on the policy, or the vLLM engine's share."""
    gen_batch = setup.micro_batch * post.steps_per_generation
    extra["generation_batch"] = gen_batch
    if post.rollout is Rollout.HF:
        gen = InferenceSetup(
            weights=_weights_format(setup),
            batch=gen_batch,
            context=setup.seq_len,
            prompt=setup.seq_len - post.completion,
            engine=Engine.HF,
        )
        est = estimate_inference(spec, gen)
        weights = est.extra["weight_bytes"]
        assert isinstance(weights, int)
        decode = next(p for p in est.phases if p.phase is Phase.DECODE)  # the cache at its longest
        extra["rollout_kv_bytes"] = sum(i.bytes for i in decode.items if i.category is Category.KV_CACHE)
        generate = _item(
            f"generate: KV cache and temporaries of {gen_batch} completions",
            Category.KV_CACHE,
            est.peak_allocated_bytes - weights,
            "rollout.generate",
            SRC_GENERATE,
        )
        return _phase(Phase.ROLLOUT, r.policy, r.reference, generate, *r.generate_gathered)
    return _phase(Phase.ROLLOUT, r.policy, r.reference, r.vllm)


def _online_phases(
    spec: ModelSpec, setup: TrainingSetup, post: PostTraining, train: Estimate, r: _Roles
) -> tuple[list[PhasePeak], dict[str, object]]:
    extra: dict[str, object] = {}
    rollout = _rollout(spec, setup, post, r, extra)
    gen_batch = setup.micro_batch * post.steps_per_generation
    kept = gen_batch * (
        setup.seq_len * KEPT_SEQ_INT64 * INT64 + post.completion * (INT64 + KEPT_COMPLETION_FP32 * FP32)
    )
    batch = _item(
        f"generation batch kept for the update ({gen_batch} completions: ids, masks, log-probs)",
        Category.ACTIVATIONS,
        kept,
        "policy.generation_batch",
    )
    # old-policy log-probs: with vLLM always (importance sampling), else when a generation batch spans
    # several steps; reference log-probs when there is a reference
    scores = (
        post.reference is not Reference.NONE
        or post.rollout is not Rollout.HF
        or post.steps_per_generation > 1
    )
    layer, head, residual = _no_grad_parts(spec, setup, setup.micro_batch, post.completion)
    forward = max(layer, head) if scores else 0
    scoring = _phase(
        Phase.SCORING,
        r.policy,
        r.reference,
        r.awake,
        batch,
        _item(
            "no-grad log-prob forward (reference / old policy) of one per-device batch",
            Category.TEMPORARIES,
            forward,
            "scoring.forward",
        ),
        *(r.gathered_for("reference", layer, head, residual) if forward else ()),
    )
    update = [_phase(p.phase, *p.items, r.reference, r.awake, batch) for p in train.phases]
    return [rollout, scoring, *update], extra


def _distill_phases(
    spec: ModelSpec, setup: TrainingSetup, post: PostTraining, train: Estimate, r: _Roles
) -> tuple[list[PhasePeak], dict[str, object]]:
    """Distillation: the student's rollout beside the teacher's weights, then its update, whose loss
    holds both models' hidden states (:func:`peakmem.formulas.logprob_head.divergence_head`); the
    teacher's no-grad forward runs after the student's, its saved activations alive (the scoring phase)."""
    assert post.teacher is not None
    extra: dict[str, object] = {}
    rollout = _rollout(spec, setup, post, r, extra)
    gen_batch = setup.micro_batch * post.steps_per_generation
    batch = _item(
        f"generation batch kept for the update ({gen_batch} completions: prompt and completion ids, masks)",
        Category.ACTIVATIONS,
        gen_batch * setup.seq_len * KEPT_SEQ_INT64 * INT64,
        "policy.generation_batch",
    )
    act = _act_bytes(setup)
    tokens = setup.micro_batch * setup.seq_len
    teacher_layer = layer_transient_bytes(post.teacher, tokens, act)
    teacher = _item(
        f"teacher forward (no grad) of {setup.micro_batch} sequences, after the student's",
        Category.TEMPORARIES,
        teacher_layer,
        "teacher.forward",
        SRC_DISTILL,
    )
    gathered = r.gathered_for("teacher", teacher_layer, 0, tokens * post.teacher.hidden_size * act)
    update: list[PhasePeak] = []
    scoring: list[PhasePeak] = []
    for p in train.phases:
        if p.phase is Phase.FORWARD:
            saved = [i for i in p.items if i.category is not Category.TEMPORARIES]
            scoring.append(_phase(Phase.SCORING, *saved, r.reference, r.awake, batch, teacher, *gathered))
        update.append(_phase(p.phase, *p.items, r.reference, r.awake, batch))
    return [rollout, *scoring, *update], extra


def _offline_phases(
    spec: ModelSpec, upd: TrainingSetup, post: PostTraining, train: Estimate, r: _Roles
) -> list[PhasePeak]:
    """DPO-style and KTO jobs: the update, and the no-grad passes around it, the largest as the scoring
    phase: a precomputed reference's pass before training (the policy's weights only); KTO's policy pass
    over the KL batch before the forward; the reference's pass after the policy's forward (its saved
    activations alive; KTO's reference runs the KL batch and the completions one after the other)."""
    layer, head, residual = _no_grad_parts(spec, upd, upd.micro_batch, post.completion)
    ref = max(layer, head)
    scoring: list[PhasePeak] = []
    if post.reference is Reference.PRECOMPUTED:
        pre = _item(
            "reference log-probs precomputed before training",
            Category.TEMPORARIES,
            ref,
            "reference.precompute",
        )
        pre_gathered = r.gathered_for("policy", layer, head, residual)
        scoring.append(_phase(Phase.SCORING, r.weights, pre, *pre_gathered))
    if post.unpaired_kl:
        kl = _item(
            "KL batch: the policy's no-grad forward before its update",
            Category.TEMPORARIES,
            ref,
            "scoring.kl",
        )
        kl_gathered = r.gathered_for("policy", layer, head, residual)
        scoring.append(_phase(Phase.SCORING, r.policy, r.reference, kl, *kl_gathered))
    update: list[PhasePeak] = []
    for p in train.phases:
        if p.phase is Phase.FORWARD and post.reference is not Reference.PRECOMPUTED:
            # the policy's saved activations, and the reference's working set for the policy's (same model,
            # its own FSDP root); where the policy's forward peaks at its first unshard (a large root, little
            # saved) that instant's activations stand in for the end of its forward
            saved = [i for i in p.items if i.category is not Category.TEMPORARIES]
            saved = [i for i in saved if i.key not in POLICY_GATHERED]
            what = "reference forward (no grad), after the policy's forward"
            after = _item(what, Category.TEMPORARIES, ref, "reference.forward")
            ref_gathered = r.gathered_for("reference", layer, head, residual)
            scoring.append(_phase(Phase.SCORING, *saved, r.reference, after, *ref_gathered))
        update.append(_phase(p.phase, *p.items, r.reference))
    return [max(scoring, key=lambda p: p.bytes), *update] if scoring else update


def _by_role(phase: PhasePeak) -> dict[str, int]:
    out: dict[str, int] = {}
    for i in phase.items:
        role = ROLES.get(i.key.split(".")[0], "policy")
        out[role] = out.get(role, 0) + i.bytes
    return out


def _shifted(
    band: Band | None, allocated: int, reserved: int, device_total: int, train: Estimate
) -> Band | None:
    """The update step's band moved by what the other roles add (their bytes are exact sums of parts the
    band does not cover: the reference copy, the vLLM share); its terms unchanged."""
    if band is None:
        return None

    def move(x: Range, by: int) -> Range:
        return Range(low=max(0, x.low + by), likely=x.likely + by, high=x.high + by)

    return Band(
        allocated=move(band.allocated, allocated - train.peak_allocated_bytes),
        reserved=move(band.reserved, reserved - train.peak_reserved_bytes),
        device_total=move(band.device_total, device_total - train.device_total_bytes),
        terms=band.terms,
    )


def estimate_post_training(
    spec: ModelSpec,
    setup: TrainingSetup,
    post: PostTraining,
    *,
    gpu_bytes: int | None = None,
    overheads: Overheads | None = None,
    costs: CostLookup | None = None,
    par: Parallelism | None = None,
) -> Estimate:
    """One GPU (``gpu_bytes`` of memory) of ``post`` training ``spec`` as ``setup`` describes the policy,
    at its largest phase; on several (``par``, data parallel), the most loaded rank."""
    if post.rollout is Rollout.VLLM_COLOCATE and gpu_bytes is None:
        raise InputError(
            "rollout='vllm-colocate': needs --gpu (vLLM takes rollout_memory of the whole device)"
        )
    upd = update_setup(setup, post)
    single = estimate_training(spec, upd, overheads=overheads, costs=costs)
    teacher_fsdp = None
    if par is None or par.is_single_gpu:
        train, shards, zero3_full, fsdp = single, 1, 0, NO_GATHER
    else:
        check_data_parallel(par)
        if post.objective is Objective.PPO:
            raise InputError(
                f"gpus={par.gpus}: ppo is modelled on one GPU (verl's FSDP sharding of the actor, "
                "critic and reference per rank is not modelled yet)"
            )
        policy = estimate_ranks(spec, upd, par, overheads=overheads, costs=costs).most_loaded
        train, fsdp = policy.estimate, policy.no_grad_forward
        shards = reference_shards(par)
        gathers_all = par.zero_stage == 3 and post.rollout is Rollout.HF  # ds3_gather_for_generation
        zero3_full = spec.params * _act_bytes(setup) if gathers_all else 0  # DeepSpeed's 16-bit params
        if post.teacher is not None and shards > 1:  # its own layers gathered in its no-grad forward
            frozen = replace(setup, loss=LossImpl.STANDARD, scored_tokens=None)
            teacher = estimate_ranks(post.teacher, frozen, par, overheads=overheads).most_loaded
            teacher_fsdp = teacher.no_grad_forward
    r = _Roles(
        train,
        single,
        post,
        gpu_bytes,
        shards=shards,
        zero3_full=zero3_full,
        fsdp=fsdp,
        teacher_fsdp=teacher_fsdp,
    )
    extra: dict[str, object] = {}
    if post.teacher is not None and post.teacher.vocab_size != spec.vocab_size:
        raise InputError(
            f"teacher={post.teacher.name!r}: its vocabulary ({post.teacher.vocab_size:,}) differs from "
            f"{spec.name}'s ({spec.vocab_size:,}); TRL's DistillationTrainer compares the full next-token "
            "distributions and needs one vocabulary"
        )
    if post.verl:
        from peakmem.ppo import ppo_phases

        phases, extra = ppo_phases(spec, setup, post, train, r, overheads=overheads, costs=costs)
    elif post.teacher is not None:
        phases, extra = _distill_phases(spec, setup, post, train, r)
    elif post.online:
        phases, extra = _online_phases(spec, setup, post, train, r)
    else:
        phases = _offline_phases(spec, upd, post, train, r)
    peak = max(phases, key=lambda p: p.bytes)
    # the caching allocator's slack and the device overheads of the update step carry over
    reserved = peak.bytes + train.peak_reserved_bytes - train.peak_allocated_bytes
    device_total = reserved + train.device_total_bytes - train.peak_reserved_bytes
    if train is not single:
        extra["reference_shards"] = shards
    extra.update(
        objective=post.objective.value,
        reference=post.reference.value,
        phases_by_role={p.phase.value: _by_role(p) for p in phases},
        update_peak_allocated_bytes=train.peak_allocated_bytes,
    )
    return replace(
        train,
        items=peak.items,
        phases=tuple(phases),
        peak_phase=peak.phase,
        peak_allocated_bytes=peak.bytes,
        peak_reserved_bytes=reserved,
        device_total_bytes=device_total,
        assumptions=(*_assumptions(post, extra), *train.assumptions),
        setup={**train.setup, "post_training": post.echo()},
        extra={**train.extra, **extra},
        band=_shifted(train.band, peak.bytes, reserved, device_total, train),
    )


def _assumptions(post: PostTraining, extra: dict[str, object]) -> tuple[str, ...]:
    out = [
        f"{post.objective.value}: the phases of TRL 1.16's trainer ({SRC_TRL}); the update's loss is TRL's "
        "fused log-prob head (no batch x seq x vocab logits)"
    ]
    if post.verl:
        from peakmem.ppo import SRC_FIT

        ppo = post.objective is Objective.PPO
        out = [
            f"{post.objective.value}: the phases of verl's trainer ({SRC_FIT}): rollout, scoring (old and "
            "reference log-probs"
            + (", the critic's values" if ppo else "")
            + ", a rule reward), "
            + ("critic update, " if ppo else "")
            + "actor update; every role resident on the GPU (no offload, verl's default); the actor's loss "
            "materializes the full logits, then the log-probs (verl logprobs_from_logits' torch path, "
            "padding kept; flash-attn's fused cross-entropy and remove-padding not modelled)",
        ]
        if ppo:
            out.append(
                f"critic: {extra['critic_params']:,} parameters (the policy's backbone with a one-output "
                "value head), fully trained with its own optimizer states"
            )
    if post.teacher is not None:
        kind = {0.0: "forward KL", 1.0: "reverse KL"}.get(post.beta, f"generalized JSD, beta {post.beta:g}")
        out = [
            f"distill: the phases of TRL 1.16's DistillationTrainer ({SRC_DISTILL}); the loss is TRL's "
            f"chunked divergence head ({kind}; no batch x seq x vocab logits)",
            f"teacher: {post.teacher.name}, frozen, loaded like the student (its weights in the student's "
            "dtype), a no-grad forward after the student's; on-policy: the student generates one completion "
            f"per prompt, {extra['generation_batch']} per device at once",
        ]
    if post.paired:
        out.append("chosen and rejected run concatenated: the update's micro-batch is 2 x --batch sequences")
    out.append(
        "reference: none (distillation has no KL penalty)"
        if post.teacher is not None
        else {
            Reference.SEPARATE: "reference: a frozen copy of the model in the policy's dtype",
            Reference.ADAPTER: "reference: the policy with its LoRA adapter disabled (peft use_adapter): "
            "no weights of its own",
            Reference.NONE: "reference: none (beta 0, or a reference-free objective)",
            Reference.PRECOMPUTED: "reference: log-probs precomputed once before training "
            "(precompute_ref_log_probs)",
        }[post.reference]
    )
    shards = extra.get("reference_shards")
    if shards is not None and post.reference is Reference.SEPARATE:
        out.append(
            f"reference sharded over {shards} ranks as the policy (TRL prepare_deepspeed keeps ZeRO-3, "
            "prepare_fsdp the policy's plugin)"
            if shards != 1
            else "reference: a whole copy on every rank "
            "(TRL prepare_deepspeed builds it with ZeRO disabled below stage 3)"
        )
    if post.online or post.verl:
        out.append(
            f"num_generations {post.num_generations} groups the completions; the per-device generation "
            f"batch is batch x steps_per_generation = {extra['generation_batch']}"
        )
    if post.rollout is Rollout.VLLM_SERVER:
        out.append("rollout: a vLLM server on GPUs of its own (trl vllm-serve); size them with peakmem infer")
    if post.rollout is Rollout.VLLM_COLOCATE:
        sleep = (
            "freed outside rollout (sleep mode, level 2)" if post.rollout_sleep else "resident in every phase"
        )
        out.append(
            f"rollout: vLLM colocated, {post.rollout_memory:g} of the GPU, {sleep}; what a sleeping "
            "engine keeps (CUDA graphs, its allocator pool) is not modelled"
        )
    return tuple(out)
