"""Post-training files (preference and RL objectives) are recognised, never read as SFT.

peakmem estimates one supervised training step of one model. A TRL ``GRPOConfig`` / ``DPOConfig`` /
``KTOConfig`` / ``PPOConfig`` / ``RLOOConfig`` file, axolotl's ``rl:`` and LLaMA-Factory's ``stage:``
describe jobs with more roles (a reference model, a reward model or critic, a rollout engine with its
KV pool) and more passes (log-probs over batch x completion x vocab). Until those are modelled, the
answer names the objective and every field that changes memory in ``not_modelled`` (an error under
``strict``), so the SFT-like step it prints is never mistaken for the job's peak.

Field names as the frameworks define them (read in their source):

* TRL ``trl/trainer/grpo_config.py``: ``use_vllm``, ``vllm_mode`` (``colocate`` shares the GPU),
  ``vllm_gpu_memory_utilization``, ``vllm_tensor_parallel_size``, ``vllm_enable_sleep_mode``,
  ``num_generations``, ``max_completion_length``, ``generation_batch_size``, ``steps_per_generation``,
  ``beta`` (> 0: a reference model), ``sync_ref_model``, ``loss_type`` (``grpo``, ``dr_grpo``, ``bnpo``,
  ``dapo``); ``rloo_config.py``: ``rloo_k`` (older versions); ``ppo_config.py``: ``num_ppo_epochs``,
  ``vf_coef``, ``kl_coef``, ``reward_model_path``, ``sft_model_path``; ``dpo_config.py``:
  ``precompute_ref_log_probs``, ``ref_model_init_kwargs``, ``force_use_ref_model``, ``rpo_alpha``;
  ``kto_config.py``: ``desirable_weight``, ``undesirable_weight``.
* axolotl ``utils/schemas/enums.py`` ``RLType``: ``rl: dpo | ipo | kto | orpo | simpo | grpo``.
* LLaMA-Factory ``hparams/finetuning_args.py``: ``stage: pt | sft | rm | ppo | dpo | kto``, ``pref_beta``,
  ``pref_loss``, ``ref_model``, ``reward_model``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from peakmem.fromfile.mapper import _Mapper

# Objectives that are one supervised step of one model: what peakmem estimates.
SUPERVISED = ("sft", "pt")

# Fields that mark a TRL file's objective, in the order they are tried (the first match names it).
_TRL_MARKERS: tuple[tuple[str, str], ...] = (
    ("num_ppo_epochs", "ppo"),
    ("vf_coef", "ppo"),
    ("rloo_k", "rloo"),
    ("num_generations", "grpo"),
    ("use_vllm", "grpo"),
    ("vllm_mode", "grpo"),
    ("max_completion_length", "grpo"),
    ("desirable_weight", "kto"),
    ("undesirable_weight", "kto"),
    ("precompute_ref_log_probs", "dpo"),
    ("ref_model_init_kwargs", "dpo"),
    ("force_use_ref_model", "dpo"),
    ("rpo_alpha", "dpo"),
    ("beta", "preference"),  # ORPO / SimPO / CPO configs have beta and none of the above
)

# Fields that change a post-training job's memory, and how.
POST_TRAINING_FIELDS: dict[str, str] = {
    "use_vllm": "a vLLM rollout engine (its weights and KV pool)",
    "vllm_mode": "where the rollout engine runs (colocate: on the training GPUs)",
    "vllm_gpu_memory_utilization": "the rollout engine's share of each GPU",
    "vllm_tensor_parallel_size": "the rollout engine's tensor parallelism",
    "vllm_enable_sleep_mode": "the rollout engine's memory released between rollouts",
    "num_generations": "completions per prompt (rollout batch and log-prob passes)",
    "max_completion_length": "completion tokens per sample (rollout KV and log-probs over the vocabulary)",
    "generation_batch_size": "prompts x completions generated at once",
    "steps_per_generation": "rollout batch reused over several steps",
    "beta": "a reference model's forward (beta > 0)",
    "pref_beta": "a reference model's forward",
    "sync_ref_model": "a reference model kept and updated",
    "ref_model": "a separate reference model",
    "ref_model_init_kwargs": "a separate reference model",
    "precompute_ref_log_probs": "reference log-probs computed before training",
    "reward_model": "a reward model",
    "reward_model_path": "a reward model",
    "sft_model_path": "a reference model loaded from the SFT checkpoint",
    "num_ppo_epochs": "PPO epochs over each rollout batch",
    "vf_coef": "a value model (critic) trained beside the policy",
    "rloo_k": "completions per prompt",
}


def objective(doc: Mapping[str, Any]) -> tuple[str, str] | None:
    """The post-training objective ``doc`` describes and the key that says so; None for SFT."""
    for key in ("rl", "stage"):  # axolotl, LLaMA-Factory
        value = doc.get(key)
        if isinstance(value, str) and value.strip() and value.strip().lower() not in SUPERVISED:
            return value.strip().lower(), key
    for key, name in _TRL_MARKERS:
        if doc.get(key) not in (None, False, "", [], 0):
            return name, key
    return None


def map_post_training(m: _Mapper, doc: Mapping[str, Any]) -> None:
    """Name a post-training objective and its memory fields as not modelled (strict: an error)."""
    found = objective(doc)
    if found is None:
        return
    name, key = found
    m.unknown(
        key,
        doc[key],
        f"a {name} post-training job: the estimate is one supervised training step of the policy only; "
        "reference, reward and value models, the rollout engine and the log-prob passes are not counted",
        SUPERVISED,
    )
    for field in sorted(POST_TRAINING_FIELDS):
        if field != key and doc.get(field) not in (None, False, "", [], 0):
            m.skip(field, doc[field], POST_TRAINING_FIELDS[field])
