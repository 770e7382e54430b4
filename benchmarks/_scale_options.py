"""The options of benchmarks/published_scale.py for the twentieth search's jobs and later: preference / RL
post-training (peakmem.post_training) and SGLang serving. Decided 2026-12-07 before any of those searches'
points was estimated (the rules: split_rule_20 / _21 in published_scale.json; the fields: briefs
h-published24 / h-published25); OBJECTIVE_ALIASES before the twenty-first search's points were merged."""

from __future__ import annotations

from typing import Any


class NotExpressible(Exception):
    """The point's job has no peakmem question (the message says why)."""


# peakmem --objective: TRL 1.16's trainers and verl's PPO (peakmem.post_training)
OBJECTIVES = ("sft", "dpo", "orpo", "simpo", "kto", "grpo", "rloo", "ppo", "distill")
# objectives that are another's trainer in TRL: SimPO is TRL's CPOTrainer with loss_type="simpo" (the same
# reference-free forward of chosen and rejected, cpo_config.py); GKD's GKDTrainer trains a student on its own
# generations (a share lmbda of the batches) against a frozen teacher, as the DistillationTrainer peakmem
# models does on every batch (an approximation the point states)
OBJECTIVE_ALIASES = {"cpo": "simpo", "gkd": "distill"}
# frameworks whose preference / RL trainers are TRL's (subclasses or patches of its trainer classes:
# LLaMA-Factory's CustomDPOTrainer, ms-swift's rlhf trainers, Unsloth's patched TRL trainers)
ON_TRL = ("trl", "unsloth", "ms-swift", "llamafactory")
# peakmem --trainer for GRPO / RLOO: TRL's loop or verl's (post_training.py); PPO is verl's
RL_TRAINERS = {**{t: "trl" for t in ON_TRL}, "verl": "verl"}
# peakmem --rollout (TRL use_vllm colocate / server, or generate on the policy); "none": no generation
ROLLOUTS = ("hf", "vllm-colocate", "vllm-server")
# job fields passed through to peakmem.train under the same name where the point gives them
PASSED = (
    "rollout_memory", "rollout_sleep", "num_generations", "completion", "beta", "reference",
    "steps_per_generation", "entropy", "critic", "teacher",
)  # fmt: skip


def post_training_options(job: dict[str, Any]) -> dict[str, Any]:
    """peakmem.train options for ``job.objective`` and its fields ({} for a plain training job)."""
    objective = job.get("objective")
    if objective is None:
        return {}
    objective = OBJECTIVE_ALIASES.get(objective, objective)
    if objective not in OBJECTIVES:
        raise NotExpressible(f"objective {objective!r} has no peakmem trainer")
    trainer = job.get("trainer") or "trl"
    opts: dict[str, Any] = {"objective": objective}
    if objective in ("grpo", "rloo"):
        if trainer not in RL_TRAINERS:
            raise NotExpressible(f"{trainer}'s {objective} loop is not modelled (peakmem: trl or verl)")
        opts["trainer"] = RL_TRAINERS[trainer]
    elif objective == "ppo":
        if trainer != "verl":
            raise NotExpressible(f"{trainer}'s PPO loop is not modelled (peakmem's ppo is verl's)")
    elif trainer not in ON_TRL:
        raise NotExpressible(f"{trainer}'s {objective} trainer is not modelled (peakmem's are TRL's)")
    rollout = job.get("rollout")
    if rollout not in (None, "none"):
        if rollout not in ROLLOUTS:
            raise NotExpressible(f"rollout {rollout!r} is not modelled (peakmem: {', '.join(ROLLOUTS)})")
        opts["rollout"] = rollout
    for name in PASSED:
        if job.get(name) is not None:
            opts[name] = job[name]
    return opts


def post_training_seq(job: dict[str, Any]) -> int | None:
    """The sequence peakmem is asked for: ``job.seq``, else the prompt and completion tokens together."""
    if job.get("seq") is not None:
        return int(job["seq"])
    if job.get("objective") and job.get("prompt_len") and job.get("completion"):
        return int(job["prompt_len"]) + int(job["completion"])
    return None


def sglang_options(job: dict[str, Any], *, gpu: str, weights: str, kv: str) -> dict[str, Any]:
    """peakmem.infer options for an SGLang server as its log prints ``ServerArgs`` (the values after
    ``__post_init__``: mem_fraction_static, chunked_prefill_size, cuda_graph_max_bs as they ran)."""
    context = job.get("context_length") or job.get("context_len_logged")
    if context is None:
        raise NotExpressible("the context length is not known")
    opts: dict[str, Any] = {
        "engine": "sglang", "engine_version": job["engine_version"], "weights": weights, "gpu": gpu,
        "gpu_memory_utilization": job["mem_fraction_static"], "context": context,
        "tp": job.get("tp") or 1, "pp": job.get("pp") or 1, "dp": job.get("dp") or 1,
        "enforce_eager": bool(job.get("disable_cuda_graph")),
    }  # fmt: skip
    if (job.get("ep") or 1) > 1:
        opts["ep"] = job["ep"]
    if job.get("enable_dp_attention"):
        opts["dp_attention"] = True
    if job.get("chunked_prefill_size"):
        opts["prefill_chunk"] = job["chunked_prefill_size"]
    if job.get("cuda_graph_max_bs"):
        opts["cuda_graph_max_bs"] = job["cuda_graph_max_bs"]
    if kv != "auto":
        opts["kv_cache"] = kv
    if job.get("draft"):
        opts.update(draft=job["draft"], draft_method=job.get("draft_method"),
                    num_speculative_tokens=job.get("num_speculative_tokens"))  # fmt: skip
    return opts
