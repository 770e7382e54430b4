"""``measure_ppo``: one PPO iteration with a critic (or GRPO / RLOO without one), in verl's phase order, on
tiny models on the CPU.

verl (Ray, vLLM/SGLang, FSDP) does not run here, so this is a step harness of our own, in plain torch
and transformers, that runs the same math in the same order as verl's trainer (read at volcengine/verl
b178a3cd, not imported and not copied): ``verl/trainer/ppo/ray_trainer.py`` ``RayPPOTrainer.fit``:

1. **rollout**: the policy generates ``batch x steps_per_generation`` completions of exactly
   ``completion`` tokens (transformers ``generate`` on the policy, as verl's ``hf`` rollout does;
   ``min_new_tokens`` forces the length);
2. **scoring**: the reward (a rule, on the last token: no reward model), the old log-probs by the actor
   (``fsdp_workers.py`` ``compute_log_prob``: with the entropy unless the actor is LoRA), the reference
   log-probs (the separate copy, or the actor with its adapter disabled), the values by the critic, and
   the GAE advantages and returns (Schulman et al. 2016, arXiv 1506.02438; gamma = lambda = 1, verl's
   ``algorithm`` defaults), each forward under ``torch.no_grad()`` one micro-batch at a time;
3. **critic update** (``workers/critic/dp_critic.py`` ``update_critic``): the critic (the backbone with a
   one-label token-classification head, ``AutoModelForTokenClassification`` with ``num_labels = 1`` and
   ``classifier_dropout = 0``, as ``fsdp_workers.py`` builds it) predicts the values of the completion
   positions; the clipped value loss ``0.5 * max((v - R)^2, (clip(v, v_old +- c) - R)^2)`` (PPO,
   Schulman et al. 2017, arXiv 1707.06347; ``core_algos.compute_value_loss``, ``cliprange_value`` 0.5),
   backward, ``clip_grad_norm_`` and the AdamW step, then ``zero_grad``;
4. **actor update** (``workers/actor/dp_actor.py`` ``update_policy`` / ``_forward_micro_batch``, padding
   kept: ``use_remove_padding`` off): the model's full logits ``[B, L, V]``, divided by the temperature
   in place, sliced to the completion positions, the log-probs as ``logprobs_from_logits``' torch path
   computes them (``torch_functional.logprobs_from_logits_v2``: the labels' logits gathered less a
   per-row ``logsumexp``; one ``log_softmax`` per row for 16-bit logits), the entropy
   (``entropy_from_logits``: ``logsumexp(z) - sum(softmax(z) * z)``) only when asked, the clipped
   surrogate loss (``compute_policy_loss_vanilla``, clip 0.2) and, with a reference, the ``low_var_kl``
   penalty (Schulman's k3 estimator); backward, ``clip_grad_norm_``, the step, ``zero_grad``.

The tracker (:class:`~peakmem.measure.tracker.LiveStorageTracker`) records the live tensor bytes of each
phase; the second iteration (optimizer states created by the first) is reported, as ``peakmem measure``
reports a steady step.
"""

from __future__ import annotations

import contextlib
import warnings
from typing import Any

import torch

from peakmem.breakdown import Estimate, MemoryItem, Phase, PhasePeak
from peakmem.errors import InputError
from peakmem.measure.adapter import apply_adapter
from peakmem.measure.runner import ATTN_IMPL, build_model, config_and_class, unique_numel
from peakmem.measure.tracker import LiveStorageTracker, Snapshot
from peakmem.measure.trainer import make_trainer, model_dtype
from peakmem.post_training import Objective, PostTraining, Reference, Rollout
from peakmem.ppo import critic_setup
from peakmem.training import Checkpointing, Method, OptimizerImpl, OptimizerName, Precision, TrainingSetup

# verl b178a3cd trainer/config ppo_trainer.yaml (its _generated_ppo_trainer.yaml) defaults
CLIP_RATIO = 0.2  # actor.clip_ratio
CLIPRANGE_VALUE = 0.5  # critic.cliprange_value
GRAD_CLIP = 1.0  # actor.grad_clip, critic.grad_clip
TEMPERATURE = 1.0  # rollout.temperature
GAMMA = LAM = 1.0  # algorithm.gamma, algorithm.lam
ENTROPY_COEFF = 0.01  # any nonzero actor.entropy_coeff turns the entropy on (its value changes no bytes)
FIRST_TOKEN = 4  # prompts use ids from here (below: bos, unk, eos, pad as the TRL harness's tokenizer)
EOS, PAD = 2, 3
ITERATIONS = 2
ORDER = (Phase.ROLLOUT, Phase.SCORING, Phase.CRITIC_UPDATE, Phase.FORWARD, Phase.BACKWARD, Phase.OPTIMIZER)


def _check(setup: TrainingSetup, post: PostTraining) -> None:
    if not post.verl:
        raise InputError(
            f"objective={post.objective.value!r}: measure_ppo runs verl's loop (ppo, or grpo / rloo with "
            "trainer 'verl')"
        )
    if post.rollout is not Rollout.HF:
        raise InputError(f"rollout={post.rollout.value!r}: measure generates with transformers (rollout hf)")
    if setup.precision not in (Precision.FP32, Precision.AMP_BF16):
        raise InputError(
            f"precision={setup.precision.value!r}: the PPO harness runs fp32 or amp-bf16 on the CPU"
        )
    if setup.optimizer is not OptimizerName.ADAMW or setup.optimizer_impl is OptimizerImpl.FOREACH:
        raise InputError("optimizer: the PPO harness runs adamw, fused or for-loop")
    if setup.checkpointing not in (Checkpointing.NONE, Checkpointing.FULL) or setup.checkpoint_every > 1:
        raise InputError(f"checkpointing={setup.checkpointing_spelled!r}: measure runs none or full here")
    if setup.method is Method.QLORA:
        raise InputError("method='qlora': not measurable here (bitsandbytes 4-bit training needs CUDA)")


def build_critic(config: dict[str, Any], setup: TrainingSetup) -> torch.nn.Module:
    """The value model verl's ``fsdp_workers.py`` ``_build_critic_model_optimizer`` loads: the config's
    backbone under ``AutoModelForTokenClassification`` with one label and no classifier dropout."""
    import transformers

    cfg, _ = config_and_class(config, drop=("model_type", "transformers_version"))
    cfg.num_labels = 1
    cfg.classifier_dropout = 0.0
    cfg.use_cache = False
    torch.manual_seed(1)
    builder: Any = transformers.AutoModelForTokenClassification
    model: torch.nn.Module = builder.from_config(
        cfg, dtype=torch.float32, attn_implementation=ATTN_IMPL[setup.attention]
    )
    return model


def _checkpointing(model: Any, setup: TrainingSetup, tracker: LiveStorageTracker) -> None:
    if setup.checkpointing is Checkpointing.FULL:
        kwargs = {
            "use_reentrant": False,
            "context_fn": lambda: (contextlib.nullcontext(), tracker.recompute()),
        }
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def token_logprobs(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Per-token log-probs of ``labels`` under ``logits`` ``[B, R, V]``, row by row (the memory-saving
    loop verl's ``logprobs_from_logits_v2`` describes): fp32 gathers the labels' logits and subtracts each
    row's ``logsumexp``; 16-bit logits take one ``log_softmax`` per row."""
    if logits.dtype in (torch.float32, torch.float64):
        picked = torch.gather(logits, -1, labels.unsqueeze(-1)).squeeze(-1)
        return picked - torch.stack([torch.logsumexp(row, dim=-1) for row in logits])
    rows = [
        torch.log_softmax(r, -1).gather(-1, y.unsqueeze(-1)).squeeze(-1)
        for r, y in zip(logits, labels, strict=True)
    ]
    return torch.stack(rows)


def token_entropy(logits: torch.Tensor) -> torch.Tensor:
    """The entropy of each position's distribution: ``logsumexp(z) - sum(softmax(z) * z)``."""
    p = torch.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - (p * logits).sum(-1)


def actor_logprobs(
    model: Any, ids: torch.Tensor, mask: torch.Tensor, completion: int, *, entropy: bool
) -> Any:
    """verl's actor forward, padding kept: full logits, divided by the temperature in place, sliced to
    the completion's positions, then the log-probs (and the entropy)."""
    logits = model(input_ids=ids, attention_mask=mask, use_cache=False).logits
    logits.div_(TEMPERATURE)
    logits = logits[:, -completion - 1 : -1, :]
    logp = token_logprobs(logits, ids[:, -completion:])
    return logp, (token_entropy(logits) if entropy else None)


def critic_values(critic: Any, ids: torch.Tensor, mask: torch.Tensor, completion: int) -> torch.Tensor:
    out: torch.Tensor = critic(input_ids=ids, attention_mask=mask, use_cache=False).logits  # [B, L, 1]
    return out[:, -completion - 1 : -1].squeeze(-1)


def gae(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalized advantage estimation over the completion (arXiv 1506.02438), whitened advantages."""
    last = torch.zeros_like(rewards[:, 0])
    out = []
    for t in reversed(range(rewards.shape[1])):
        nxt = values[:, t + 1] if t + 1 < rewards.shape[1] else torch.zeros_like(last)
        delta = rewards[:, t] + GAMMA * nxt - values[:, t]
        last = delta + GAMMA * LAM * last
        out.append(last)
    adv = torch.stack(out[::-1], dim=1)
    returns = adv + values
    adv = (adv - adv[mask.bool()].mean()) / (adv[mask.bool()].std() + 1e-8)
    return adv * mask, returns


def policy_loss(logp: torch.Tensor, old: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The clipped surrogate objective (arXiv 1707.06347 eq. 7), token mean."""
    ratio = torch.exp(logp - old)
    loss = torch.maximum(-adv * ratio, -adv * torch.clamp(ratio, 1 - CLIP_RATIO, 1 + CLIP_RATIO))
    return (loss * mask).sum() / mask.sum()


def low_var_kl(logp: torch.Tensor, ref: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The k3 estimator ``exp(ref - logp) - (ref - logp) - 1``, clamped as verl's ``kl_penalty``."""
    kl = ref - logp
    k3 = torch.clamp(torch.exp(kl) - kl - 1, min=-10, max=10)
    return (k3 * mask).sum() / mask.sum()


def value_loss(v: torch.Tensor, old: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    clipped = torch.max(torch.min(v, old + CLIPRANGE_VALUE), old - CLIPRANGE_VALUE)
    loss = torch.max((v - returns) ** 2, (clipped - returns) ** 2)
    return 0.5 * (loss * mask).sum() / mask.sum()


def measure_ppo(
    config: dict[str, Any], setup: TrainingSetup, post: PostTraining, *, model_name: str = "model"
) -> Estimate:
    """Two PPO iterations (rollout, scoring, critic update, actor update) on random tiny models: the live
    bytes at the peak of each phase of the second, by tensor. The critic shares the policy's config."""
    _check(setup, post)
    warnings.filterwarnings("ignore")
    torch.manual_seed(0)
    policy = apply_adapter(build_model(config, setup).to(model_dtype(setup.precision)), setup)
    critic = build_critic(config, setup) if post.objective is Objective.PPO else None
    ref = None
    if post.reference is Reference.SEPARATE:
        ref = build_model(config, setup).eval()
        ref.requires_grad_(False)
    tracker = LiveStorageTracker(device_type="cpu")
    for m in (policy, critic, ref):
        if m is not None:
            tracker.register_module(m)
            if m is not ref:
                _checkpointing(m, setup, tracker)
    b, seq = setup.micro_batch, setup.seq_len
    gen_batch = b * post.steps_per_generation
    gen = torch.Generator().manual_seed(0)
    vocab = int(config["vocab_size"])
    with tracker:
        tracker.set_phase(Phase.LOAD, 0)
        actor_tr = make_trainer(policy, setup, torch.device("cpu"), tracker)
        critic_tr = None
        if critic is not None:
            critic_tr = make_trainer(critic, critic_setup(setup), torch.device("cpu"), tracker)
            tracker.watch_gradients(critic.named_parameters())
        tracker.watch_gradients(policy.named_parameters())
        for it in range(ITERATIONS):
            _iteration(
                policy, critic, ref, actor_tr, critic_tr, tracker, it, setup, post, gen, vocab, gen_batch
            )
        tracker.set_phase(Phase.LOAD, ITERATIONS)
    found: dict[Phase, Snapshot] = {}
    for snap in tracker.ledger.peaks():
        steady = snap.step == ITERATIONS - 1 and snap.phase in ORDER
        if steady and snap.bytes > getattr(found.get(snap.phase), "bytes", -1):
            found[snap.phase] = snap
    phases = tuple(
        PhasePeak(phase=p, bytes=found[p].bytes, items=_items(found[p])) for p in ORDER if p in found
    )
    peak = max(phases, key=lambda p: p.bytes)
    largest = [
        {"tensor": r.label, "dtype": r.dtype, "shape": list(r.shape), "bytes": r.nbytes}
        for r in found[peak.phase].largest(12)
    ]
    return Estimate(
        method="measured", job="train", model_name=model_name, params=unique_numel(policy.parameters()),
        trainable_params=sum(p.numel() for p in policy.parameters() if p.requires_grad), per_param=(),
        items=peak.items, phases=phases, peak_phase=peak.phase, peak_allocated_bytes=peak.bytes,
        peak_reserved_bytes=peak.bytes, device_total_bytes=peak.bytes,
        assumptions=("PPO step harness in verl's phase order (peakmem.measure.ppo), 2 iterations on the CPU; "
                     "bytes: live tensor storage at each phase's peak; reserved = allocated on the CPU",),
        setup={"post_training": post.echo(), "micro_batch": b, "seq_len": seq},
        extra={"largest_tensors": largest},
    )  # fmt: skip


def _iteration(
    policy: Any, critic: Any, ref: Any, actor_tr: Any, critic_tr: Any, tracker: LiveStorageTracker, it: int,
    setup: TrainingSetup, post: PostTraining, gen: torch.Generator, vocab: int, gen_batch: int,
) -> None:  # fmt: skip
    b, seq, comp = setup.micro_batch, setup.seq_len, post.completion
    prompt = seq - comp
    tracker.set_phase(Phase.ROLLOUT, it)
    prompts = torch.randint(FIRST_TOKEN, vocab, (gen_batch, prompt), generator=gen)
    policy.eval()
    with torch.no_grad():
        ids = policy.generate(
            input_ids=prompts,
            attention_mask=torch.ones_like(prompts),
            max_new_tokens=comp,
            min_new_tokens=comp,
            do_sample=True,
            pad_token_id=PAD,
            eos_token_id=EOS,
            use_cache=True,
        )
    del prompts
    tracker.set_phase(Phase.SCORING, it)
    attn = torch.ones_like(ids)
    mask = torch.ones(gen_batch, comp)
    rewards = torch.zeros(gen_batch, comp)
    rewards[:, -1] = (ids[:, -comp:] % 7).float().mean(-1)  # a rule-based score on the last token
    chunks = [slice(i, i + b) for i in range(0, gen_batch, b)]
    full = setup.method is Method.FULL

    def logprobs(model: Any, s: slice, entropy: bool) -> torch.Tensor:
        # verl's _forward_micro_batch enters torch.autocast(param_dtype) per micro-batch (its weight casts
        # cached until it exits), for scoring as for the updates
        with actor_tr.autocast():
            out: torch.Tensor = actor_logprobs(model, ids[s], attn[s], comp, entropy=entropy)[0]
        return out

    def scored_values(s: slice) -> torch.Tensor:
        critic.eval()
        with critic_tr.autocast():
            return critic_values(critic, ids[s], attn[s], comp)

    with torch.no_grad():
        old = torch.cat([logprobs(policy, s, full) for s in chunks])
        ref_logp = None
        if post.reference is Reference.SEPARATE:
            ref_logp = torch.cat([logprobs(ref, s, False) for s in chunks])
        elif post.reference is Reference.ADAPTER:
            with policy.disable_adapter():
                ref_logp = torch.cat([logprobs(policy, s, False) for s in chunks])
        if critic is None:  # GRPO / RLOO: advantages from the group's scores, returns the same tensor
            adv = group_advantages(rewards, mask, post.num_generations)
        else:
            values = torch.cat([scored_values(s) for s in chunks]).float()
            adv, returns = gae(rewards, values, mask)
    if critic is not None:
        _critic_update(critic, critic_tr, tracker, it, setup, ids, attn, comp, chunks, values, returns, mask)
    policy.train()
    for k, s in enumerate(chunks):
        tracker.set_phase(Phase.FORWARD, it)
        with actor_tr.autocast():
            logp, ent = actor_logprobs(policy, ids[s], attn[s], comp, entropy=post.entropy)
            loss = policy_loss(logp, old[s], adv[s], mask[s])
            if ent is not None:
                loss = loss - ENTROPY_COEFF * (ent * mask[s]).sum() / mask[s].sum()
            if ref_logp is not None and post.beta > 0:
                loss = loss + post.beta * low_var_kl(logp, ref_logp[s], mask[s])
        tracker.set_phase(Phase.BACKWARD, it)
        actor_tr.backward(loss / len(chunks))
        del loss, logp, ent
        if (k + 1) % setup.grad_accum == 0 or k + 1 == len(chunks):
            tracker.set_phase(Phase.OPTIMIZER, it)
            torch.nn.utils.clip_grad_norm_(actor_tr.params, GRAD_CLIP)
            actor_tr.step()
            actor_tr.zero_grad()
            tracker.tag_optimizer_states(actor_tr.optimizer)
    tracker.set_phase(Phase.LOAD, it + 1)


def _critic_update(
    critic: Any, critic_tr: Any, tracker: LiveStorageTracker, it: int, setup: TrainingSetup,
    ids: torch.Tensor, attn: torch.Tensor, comp: int, chunks: list[slice], values: torch.Tensor,
    returns: torch.Tensor, mask: torch.Tensor,
) -> None:  # fmt: skip
    tracker.set_phase(Phase.CRITIC_UPDATE, it)
    critic.train()
    for k, s in enumerate(chunks):
        with critic_tr.autocast():
            loss = value_loss(critic_values(critic, ids[s], attn[s], comp), values[s], returns[s], mask[s])
        critic_tr.backward(loss / len(chunks))
        del loss
        if (k + 1) % setup.grad_accum == 0 or k + 1 == len(chunks):
            torch.nn.utils.clip_grad_norm_(critic_tr.params, GRAD_CLIP)
            critic_tr.step()
            critic_tr.zero_grad()
            tracker.tag_optimizer_states(critic_tr.optimizer)


def group_advantages(rewards: torch.Tensor, mask: torch.Tensor, group: int) -> torch.Tensor:
    """verl ``core_algos.py`` ``compute_grpo_outcome_advantage``: each response's score normalised within
    its group of ``group`` responses, broadcast over the response (advantages and returns one tensor)."""
    scores = rewards.sum(-1).view(-1, group)
    normed = (scores - scores.mean(-1, keepdim=True)) / (scores.std(-1, keepdim=True) + 1e-6)
    return normed.view(-1, 1) * mask


def _items(snap: Snapshot) -> tuple[MemoryItem, ...]:
    return tuple(MemoryItem(path=label, category=cat, bytes=b) for cat, label, b in snap.by_label())
