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
"""

from __future__ import annotations

from dataclasses import replace

from peakmem.breakdown import Band, Category, Estimate, MemoryItem, Phase, PhasePeak, Range
from peakmem.errors import InputError
from peakmem.estimate import estimate_training
from peakmem.formulas.logprob_head import no_grad_head_bytes
from peakmem.formulas.overhead import Overheads
from peakmem.formulas.serving.estimate import estimate_inference
from peakmem.formulas.serving.forward import layer_transient_bytes
from peakmem.inference import Engine, InferenceSetup
from peakmem.model import CostLookup, ModelSpec
from peakmem.post_training import PostTraining, Reference, Rollout
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
ROLES = {"reference": "reference", "rollout": "rollout engine"}  # item key prefix -> role (else: policy)


def _weights_format(setup: TrainingSetup) -> str:
    """The policy's weights as ``generate`` reads them: the parameters' own dtype (TRL generates outside
    autocast), nf4 for a QLoRA base."""
    if setup.method is Method.QLORA:
        return "nf4"
    if setup.precision in (Precision.MIXED_BF16, Precision.BF16):
        return "bf16"
    return "fp16" if setup.precision is Precision.MIXED_FP16 else "fp32"


def update_setup(setup: TrainingSetup, post: PostTraining) -> TrainingSetup:
    """The training step TRL runs: chosen + rejected concatenated for paired objectives, and the fused
    log-prob head over the completion (with the entropy for online objectives)."""
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
    act = FP32 if setup.precision is Precision.FP32 else 2
    tokens = sequences * setup.seq_len
    triton = setup.kernel_policy is KernelPolicy.CUDA
    head = no_grad_head_bytes(spec, tokens - sequences, sequences * completion, act, triton=triton)
    return max(layer_transient_bytes(spec, tokens, act), head + tokens * spec.hidden_size * act)


class _Roles:
    """The items every phase shares: the policy between steps, the reference's weights, the vLLM share."""

    def __init__(self, train: Estimate, post: PostTraining, gpu_bytes: int | None) -> None:
        between = sum(r.bytes for r in train.per_param if r.category is not Category.GRADIENTS)
        self.policy = _item(
            "policy: weights and optimizer states (gradients freed between steps)",
            Category.PARAMETERS,
            between,
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
            r.bytes for r in train.per_param if r.category is Category.PARAMETERS and r.params == train.params
        )
        self.reference = _item(
            "reference model weights (a frozen copy)",
            Category.PARAMETERS,
            copy if post.reference is Reference.SEPARATE else 0,
            "reference.weights",
        )
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


def _online_phases(
    spec: ModelSpec, setup: TrainingSetup, post: PostTraining, train: Estimate, r: _Roles
) -> tuple[list[PhasePeak], dict[str, object]]:
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
    extra: dict[str, object] = {"generation_batch": gen_batch}
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
        rollout = _phase(Phase.ROLLOUT, r.policy, r.reference, generate)
    else:
        rollout = _phase(Phase.ROLLOUT, r.policy, r.reference, r.vllm)
    # old-policy log-probs: with vLLM always (importance sampling), else when a generation batch spans
    # several steps; reference log-probs when there is a reference
    scores = (
        post.reference is not Reference.NONE
        or post.rollout is not Rollout.HF
        or post.steps_per_generation > 1
    )
    forward = no_grad_forward_bytes(spec, setup, setup.micro_batch, post.completion) if scores else 0
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
    )
    update = [_phase(p.phase, *p.items, r.reference, r.awake, batch) for p in train.phases]
    return [rollout, scoring, *update], extra


def _offline_phases(
    spec: ModelSpec, upd: TrainingSetup, post: PostTraining, train: Estimate, r: _Roles
) -> list[PhasePeak]:
    """DPO-style and KTO jobs: the update, and the no-grad passes around it, the largest as the scoring
    phase: a precomputed reference's pass before training (the policy's weights only); KTO's policy pass
    over the KL batch before the forward; the reference's pass after the policy's forward (its saved
    activations alive; KTO's reference runs the KL batch and the completions one after the other)."""
    ref = no_grad_forward_bytes(spec, upd, upd.micro_batch, post.completion)
    scoring: list[PhasePeak] = []
    if post.reference is Reference.PRECOMPUTED:
        pre = _item(
            "reference log-probs precomputed before training",
            Category.TEMPORARIES,
            ref,
            "reference.precompute",
        )
        scoring.append(_phase(Phase.SCORING, r.weights, pre))
    if post.unpaired_kl:
        kl = _item(
            "KL batch: the policy's no-grad forward before its update",
            Category.TEMPORARIES,
            ref,
            "scoring.kl",
        )
        scoring.append(_phase(Phase.SCORING, r.policy, r.reference, kl))
    update: list[PhasePeak] = []
    for p in train.phases:
        if p.phase is Phase.FORWARD and post.reference is not Reference.PRECOMPUTED:
            saved = [i for i in p.items if i.category is not Category.TEMPORARIES]
            what = "reference forward (no grad), after the policy's forward"
            after = _item(what, Category.TEMPORARIES, ref, "reference.forward")
            scoring.append(_phase(Phase.SCORING, *saved, r.reference, after))
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
) -> Estimate:
    """One GPU (``gpu_bytes`` of memory) of ``post`` training ``spec`` as ``setup`` describes the policy,
    at its largest phase."""
    if post.rollout is Rollout.VLLM_COLOCATE and gpu_bytes is None:
        raise InputError(
            "rollout='vllm-colocate': needs --gpu (vLLM takes rollout_memory of the whole device)"
        )
    upd = update_setup(setup, post)
    train = estimate_training(spec, upd, overheads=overheads, costs=costs)
    r = _Roles(train, post, gpu_bytes)
    extra: dict[str, object] = {}
    if post.online:
        phases, extra = _online_phases(spec, setup, post, train, r)
    else:
        phases = _offline_phases(spec, upd, post, train, r)
    peak = max(phases, key=lambda p: p.bytes)
    # the caching allocator's slack and the device overheads of the update step carry over
    reserved = peak.bytes + train.peak_reserved_bytes - train.peak_allocated_bytes
    device_total = reserved + train.device_total_bytes - train.peak_reserved_bytes
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
    if post.paired:
        out.append("chosen and rejected run concatenated: the update's micro-batch is 2 x --batch sequences")
    out.append(
        {
            Reference.SEPARATE: "reference: a frozen copy of the model in the policy's dtype",
            Reference.ADAPTER: "reference: the policy with its LoRA adapter disabled (peft use_adapter): "
            "no weights of its own",
            Reference.NONE: "reference: none (beta 0, or a reference-free objective)",
            Reference.PRECOMPUTED: "reference: log-probs precomputed once before training "
            "(precompute_ref_log_probs)",
        }[post.reference]
    )
    if post.online:
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
