"""PPO with a critic, and GRPO / RLOO without one, as verl runs them: the roles and phases of one iteration.

verl (volcengine/verl, read at b178a3cd) ``trainer/ppo/ray_trainer.py`` ``RayPPOTrainer.fit`` runs, per
iteration and with every role colocated on the same GPUs (``create_colocated_worker_cls``):

1. **rollout**: the actor generates the responses (here transformers ``generate`` on the policy, or the
   vLLM engine's share: :func:`peakmem.jobs._rollout`, shared with GRPO);
2. **scoring**: the reward (a rule by default: ``reward_model.enable`` false), the old log-probs by the
   actor (``fsdp_workers.py`` ``compute_log_prob``, with the entropy unless the actor is LoRA:
   ``calculate_entropy = not is_lora``), the reference log-probs (only with ``actor.use_kl_loss`` or
   ``algorithm.use_kl_in_reward``; both false by default, so beta 0 loads no reference; a LoRA actor's
   reference is the actor with its adapter disabled), the critic's values, all under ``torch.no_grad()``;
3. **critic update** (``workers/critic/dp_critic.py`` ``update_critic``): the value model, the backbone
   under ``AutoModelForTokenClassification`` with ``num_labels = 1`` (:func:`critic_spec`), trained with the
   clipped value loss and its own AdamW states;
4. **actor update** (``workers/actor/dp_actor.py`` ``update_policy``): the full logits, then the log-probs
   (:func:`peakmem.formulas.logprob_head.logits_logprob_head`; the entropy only with ``entropy_coeff`` != 0
   or ``calculate_entropy``, both off by default).

Each role keeps its weights and optimizer states resident through the iteration (``param_offload`` and
``optimizer_offload`` false by default); gradients are freed by ``zero_grad`` after each update. The
critic's and the actor's training timelines are :func:`peakmem.estimate.estimate_training` of their own
setups (composed, not copied).

GRPO and RLOO under verl (``algorithm.adv_estimator=grpo|rloo``: ``RayPPOTrainer`` builds no critic,
``use_critic`` false) run the same loop without the values pass and the critic update: the same
actor's logits-then-log-prob loss and no-grad scoring passes, where TRL's trainers run the fused log-prob
head (``--trainer verl``; :mod:`peakmem.fromfile.verl` sets it). On several GPUs (data parallel, the
actor and reference sharded as ``estimate_ranks`` shards them) a sharded scoring pass gathers the layers
one by one; PPO's critic is not sharded there yet (a one-line error).
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from peakmem.breakdown import Category, Estimate, MemoryItem, Phase, PhasePeak
from peakmem.estimate import estimate_training
from peakmem.formulas.logprob_head import logits_no_grad_bytes
from peakmem.formulas.overhead import Overheads
from peakmem.formulas.serving.forward import layer_transient_bytes
from peakmem.model import CostLookup, ModelSpec, linear
from peakmem.post_training import Objective, PostTraining, Reference
from peakmem.training import GradSync, LossImpl, Method, ReduceDtype, TrainingSetup

if TYPE_CHECKING:
    from peakmem.jobs import _Roles

VERL = "verl b178a3cd"
SRC_FIT = f"{VERL} trainer/ppo/ray_trainer.py RayPPOTrainer.fit"
SRC_CRITIC = f"{VERL} workers/fsdp_workers.py _build_critic_model_optimizer, workers/critic/dp_critic.py"
SRC_SCORE = f"{VERL} workers/fsdp_workers.py compute_log_prob / compute_ref_log_prob / compute_values"
INT64, FP32 = 8, 4
# per response, kept from scoring to the updates (the DataProto batch): input_ids and attention_mask over
# the sequence (int64, as in jobs.KEPT_SEQ_INT64), and over the response fp32 vectors: the response mask,
# token-level scores, old log-probs, values, advantages and returns (and the reference log-probs)
KEPT_SEQ_INT64 = 2
KEPT_RESPONSE_FP32 = 6
# GRPO / RLOO: the response mask, token-level scores, old log-probs and the advantages, which verl's
# compute_grpo_outcome_advantage also returns as the returns (core_algos.py: ``return scores, scores``)
KEPT_RESPONSE_FP32_NO_CRITIC = 4


def critic_spec(spec: ModelSpec) -> ModelSpec:
    """The value model verl builds from the policy's checkpoint: the same backbone, the LM head replaced by
    ``score`` (``Linear(H, 1)`` with a bias, transformers ``GenericForTokenClassification``), untied."""
    head = {"head"}
    outer = tuple(t for t in spec.outer if t.component not in head)
    return replace(
        spec,
        name=f"{spec.name} critic",
        task="token-value",
        outer=(*outer, *linear("score", spec.head_in_features, 1, True, "classifier")),
        tie_word_embeddings=False,
        num_labels=1,
    )


def critic_setup(setup: TrainingSetup) -> TrainingSetup:
    """The critic's training step: fully trained (its own optimizer states), the policy's precision,
    optimizer, micro-batch and checkpointing, the standard head (no log-probs)."""
    return replace(
        setup, method=Method.FULL, lora=None, quant=None, loss=LossImpl.STANDARD, scored_tokens=None
    )


def actor_setup(setup: TrainingSetup, post: PostTraining) -> TrainingSetup:
    """The actor's update: verl's logits-then-log-prob loss over the response (and the entropy from the
    same logits when ``entropy_coeff`` != 0 or ``calculate_entropy``). Its micro-batches each run
    ``loss.backward()`` with the gradients synced (verl b178a3c verl/workers/actor/dp_actor.py
    ``update_policy``: no no_sync), so ``grad_sync`` auto is each-micro-batch; its FSDP reduces in fp32
    (verl/workers/fsdp_workers.py ``MixedPrecision(param_dtype=bf16, reduce_dtype=fp32)``), so
    ``fsdp_reduce_dtype`` auto is fp32."""
    loss = LossImpl.LOGITS_LOGPROB_ENTROPY if post.entropy else LossImpl.LOGITS_LOGPROB
    sync = GradSync.EACH if setup.grad_sync is GradSync.AUTO else setup.grad_sync
    auto = setup.fsdp_reduce_dtype is ReduceDtype.AUTO
    reduce = ReduceDtype.FP32 if auto else setup.fsdp_reduce_dtype
    return replace(setup, loss=loss, scored_tokens=post.completion, grad_sync=sync, fsdp_reduce_dtype=reduce)


def _item(path: str, category: Category, nbytes: int, key: str, source: str = SRC_FIT) -> MemoryItem:
    return MemoryItem(path=path, category=category, bytes=nbytes, source=source, key=key)


def _phase(phase: Phase, *parts: MemoryItem) -> PhasePeak:
    items = tuple(i for i in parts if i.bytes)
    return PhasePeak(phase=phase, bytes=sum(i.bytes for i in items), items=items)


def scoring_bytes(
    spec: ModelSpec, setup: TrainingSetup, post: PostTraining, *, actor_cache: int = 0, critic_cache: int = 0
) -> dict[str, int]:
    """The no-grad passes of the scoring phase, one micro-batch each: the actor's old log-probs (with the
    entropy for a fully trained actor), the reference's, the critic's values (a layer's temporaries; its
    ``[B, L, 1]`` output is negligible). Each pass runs in an autocast region of its own
    (``_forward_micro_batch``), which caches the 16-bit casts of the weights that require grad until it
    exits: ``actor_cache`` / ``critic_cache`` (none for the frozen reference)."""
    from peakmem.jobs import _act_bytes

    b, seq, act = setup.micro_batch, setup.seq_len, _act_bytes(setup)
    tokens = b * seq
    layer = layer_transient_bytes(spec, tokens, act)
    out = {
        "old log-probs (actor)": actor_cache
        + max(
            layer,
            logits_no_grad_bytes(spec, b, seq, post.completion, act, entropy=setup.method is Method.FULL),
        ),
    }
    if post.objective is Objective.PPO:
        out["values (critic)"] = critic_cache + layer_transient_bytes(
            critic_spec(post.critic or spec), tokens, act
        )
    if post.reference is not Reference.NONE:
        no_entropy = logits_no_grad_bytes(spec, b, seq, post.completion, act, entropy=False)
        out["reference log-probs"] = max(layer, no_entropy)
    return out


# the training forward's 16-bit weight casts (peakmem.estimate): the layers' and the head's, saved by their
# Linears, and the autocast cache's; a no-grad pass in autocast holds the same casts in the cache
WEIGHT_CAST_KEYS = ("autocast.weight_casts", "head.weight_cast", "autocast.weight_cache")


def _weight_cache(est: Estimate) -> int:
    """The 16-bit casts of the weights that require grad, as a training forward in autocast holds them
    (none outside autocast): what a no-grad pass in its own autocast region caches."""
    forward = next((p for p in est.phases if p.phase is Phase.FORWARD), None)
    return sum(i.bytes for i in (forward.items if forward else ()) if i.key in WEIGHT_CAST_KEYS)


def ppo_phases(
    spec: ModelSpec,
    setup: TrainingSetup,
    post: PostTraining,
    train: Estimate,
    roles: _Roles,
    *,
    overheads: Overheads | None = None,
    costs: CostLookup | None = None,
) -> tuple[list[PhasePeak], dict[str, object]]:
    """The iteration's phases on one GPU: rollout, scoring, critic update, then the actor's forward,
    backward and step (``train``: the actor's update estimate). ``roles``: :class:`peakmem.jobs._Roles`."""
    from peakmem.jobs import _resident, _rollout

    critic = None
    if post.objective is Objective.PPO:  # GRPO / RLOO: no critic (verl's use_critic follows the estimator)
        backbone = critic_spec(post.critic or spec)
        critic = estimate_training(backbone, critic_setup(setup), overheads=overheads, costs=costs)
    resident = _item(
        "critic: weights and optimizer states (gradients freed between updates)",
        Category.PARAMETERS,
        _resident(critic) if critic else 0,
        "critic.resident",
        SRC_CRITIC,
    )
    extra: dict[str, object] = {}
    rollout = _rollout(spec, setup, post, roles, extra)
    gen_batch = setup.micro_batch * post.steps_per_generation
    # without a critic: no values, and GRPO's returns are its advantages (one tensor)
    vectors = (KEPT_RESPONSE_FP32 if critic else KEPT_RESPONSE_FP32_NO_CRITIC) + (
        1 if post.reference is not Reference.NONE else 0
    )
    kept = gen_batch * (setup.seq_len * KEPT_SEQ_INT64 * INT64 + post.completion * vectors * FP32)
    batch = _item(
        f"batch kept for the updates ({gen_batch} responses: ids, masks, log-probs, values, advantages)",
        Category.ACTIVATIONS,
        kept,
        "policy.generation_batch",
    )
    # autocast caches the casts of weights that require grad: a LoRA actor's adapters (16-bit, 2 bytes
    # each), not its frozen base, whose casts its training forward saves for the input's gradient
    casts = _weight_cache(train)
    actor_cache = casts if setup.method is Method.FULL or not casts else 2 * train.trainable_params
    critic_cache = _weight_cache(critic) if critic else 0
    passes = scoring_bytes(spec, setup, post, actor_cache=actor_cache, critic_cache=critic_cache)
    largest = max(passes, key=lambda k: passes[k])
    extra["scoring_passes"] = passes
    shared = (roles.reference, roles.awake)
    scoring = _phase(
        Phase.SCORING,
        roles.policy,
        resident,
        *shared,
        batch,
        _item(
            f"no-grad forward: {largest}, one micro-batch",
            Category.TEMPORARIES,
            passes[largest],
            "scoring.forward",
            SRC_SCORE,
        ),
        # a sharded actor / reference gathers its layers one by one; the pass's temporaries are its
        # logits' (the head's instant), beside which FSDP2's unshards count by their largest instant
        *roles.gathered_for("policy", 0, passes[largest], 0),
    )
    update = [_phase(p.phase, *p.items, resident, *shared, batch) for p in train.phases]
    rollout = _phase(rollout.phase, *rollout.items, resident)
    if critic is None:
        return [rollout, scoring, *update], extra
    critic_peak = max(critic.phases, key=lambda p: p.bytes)
    critic_items = tuple(
        replace(i, path=f"critic: {i.path}", key=f"critic.{i.key}") for i in critic_peak.items
    )
    critic_update = _phase(Phase.CRITIC_UPDATE, *critic_items, roles.policy, *shared, batch)
    extra["critic_update_phase"] = critic_peak.phase.value
    extra["critic_params"] = critic.params
    return [rollout, scoring, critic_update, *update], extra
