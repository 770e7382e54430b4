"""Post-training files (preference and RL objectives): mapped to ``--objective`` and its roles, never
read as SFT.

A TRL ``GRPOConfig`` / ``RLOOConfig`` / ``DPOConfig`` file (and ORPO / SimPO / CPO configs, which have a
``beta`` and none of DPO's reference fields), a ``DistillationConfig`` (``teacher_model_name_or_path``),
axolotl's ``rl:`` (its ``trl:`` block holds the GRPO fields) and LLaMA-Factory's ``stage: dpo``
(``pref_loss``) are mapped to the options of :mod:`peakmem.post_training` (:func:`map_post_training`).
Objectives peakmem does not model (PPO, GKD, reward modelling) are named in ``not_modelled`` with every
field that changes their memory (an error under ``strict``), so the answer is never mistaken for the
job's peak. TRL's post-training configs default ``gradient_checkpointing`` and ``bf16`` to True
(``grpo_config.py`` / ``dpo_config.py``: "Defaults to True instead of False"); a file that leaves them
out gets those defaults, named as such.

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

from peakmem.fromfile.mapper import _Mapper, as_float, as_int, truthy

# Objectives that are one supervised step of one model: what peakmem estimates.
SUPERVISED = ("sft", "pt")

# Fields that mark a TRL file's objective, in the order they are tried (the first match names it).
_TRL_MARKERS: tuple[tuple[str, str], ...] = (
    ("lmbda", "gkd"),  # trl.experimental.gkd GKDConfig: full-vocabulary logits of student and teacher
    ("teacher_model_name_or_path", "distill"),  # DistillationConfig (trl/trainer/distillation_config.py)
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
    "teacher_model_name_or_path": "a frozen teacher's weights and its forward",
    "lmbda": "GKD's on-policy fraction (student and teacher full-vocabulary logits)",
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


# open-r1 (huggingface/open-r1 @ 1416fa0c) recipes are GRPOConfig YAMLs read by its own scripts, which
# pin trl==0.18.0 (setup.py) and add GRPOScriptArguments.reward_funcs (src/open_r1/configs.py). TRL
# 0.18.0's GRPOConfig (trl/trainer/grpo_config.py @ v0.18.0) defaults differ from 1.16's where memory
# depends on them: vllm_mode "server" (1.16: "colocate") and beta 0.04 (1.16: 0.0, no reference).
OPEN_R1_MARKER = "reward_funcs"
OPEN_R1_TRL = "0.18.0"
OPEN_R1_DEFAULTS = {"vllm_mode": "server", "beta": 0.04}

# objectives peakmem models (peakmem.post_training) as their files spell them
MODELLED = ("dpo", "ipo", "orpo", "simpo", "kto", "grpo", "rloo", "preference", "distill")
# LLaMA-Factory stage dpo: pref_loss (hparams/finetuning_args.py): sigmoid, hinge, ipo, kto_pair, orpo, simpo
_PREF_LOSS = {"orpo": "orpo", "simpo": "simpo"}
# file fields -> peakmem options, with the conversion: (dest, kind)
_FIELDS: tuple[tuple[str, str, str], ...] = (
    ("beta", "beta", "float"),
    ("pref_beta", "beta", "float"),
    ("num_generations", "num_generations", "int"),
    ("rloo_k", "num_generations", "int"),
    ("max_completion_length", "completion", "int"),
    ("steps_per_generation", "steps_per_generation", "int"),
    ("vllm_gpu_memory_utilization", "rollout_memory", "float"),
)
# memory fields of the modelled objectives that peakmem does not model yet
_UNMODELLED_FIELDS = {
    "vllm_tensor_parallel_size": "the rollout engine's tensor parallelism (one GPU modelled)",
    "sync_ref_model": "a reference model kept and updated",
    "num_iterations": "the generation batch reused over several updates (old log-probs)",
    "generation_batch_size": "prompts x completions generated at once (use steps_per_generation)",
}


def _objective_name(found: str, doc: Mapping[str, Any]) -> str:
    """peakmem's objective for a file's: LLaMA-Factory's pref_loss picks ORPO / SimPO; IPO is DPO's
    memory; a TRL file with ``beta`` only (a DPO config without its reference fields, or an ORPO / SimPO /
    CPO one) is read as DPO, the one with a reference: never below the job's memory."""
    if found == "dpo" and isinstance(doc.get("pref_loss"), str):
        return _PREF_LOSS.get(doc["pref_loss"].lower(), "dpo")
    return {"ipo": "dpo", "preference": "dpo"}.get(found, found)


def map_post_training(m: _Mapper, doc: Mapping[str, Any]) -> None:
    """The objective and its roles from a post-training file; what peakmem does not model named."""
    found = objective(doc)
    if found is None:
        return
    name, key = found
    if name not in MODELLED:
        why = (f"a {name} post-training job: not modelled (peakmem models sft, dpo, orpo, simpo, kto, grpo, "
               "rloo, distill); the estimate is one supervised step of the policy")  # fmt: skip
        m.unknown(key, doc[key], why, SUPERVISED)
        for field in sorted(POST_TRAINING_FIELDS):
            if field != key and doc.get(field) not in (None, False, "", [], 0):
                m.skip(field, doc[field], POST_TRAINING_FIELDS[field])
        return
    block = doc.get("trl")
    trl: Mapping[str, Any] = block if isinstance(block, Mapping) else {}  # axolotl's GRPO block
    fields = {**doc, **trl}
    if name == "grpo" and OPEN_R1_MARKER in doc and key not in ("rl", "stage"):
        _open_r1_defaults(m, fields)
    note = "beta alone: read as DPO (with a reference); an ORPO / SimPO file: --objective orpo|simpo"
    m.set("objective", _objective_name(name, doc), key, note if name == "preference" else "")
    for field, dest, kind in _FIELDS:
        if fields.get(field) is not None:
            value = as_float(m, field, fields[field]) if kind == "float" else as_int(m, field, fields[field])
            if value is not None:
                m.set(dest, value, m.defaults_from.get(field, field))
    if isinstance(fields.get("teacher_model_name_or_path"), str):
        m.set("teacher", fields["teacher_model_name_or_path"], "teacher_model_name_or_path")
    _map_rollout(m, fields)
    _map_reference(m, fields)
    _map_sequence(m, fields, name)
    _trl_defaults(m, doc, key)
    for field in sorted(_UNMODELLED_FIELDS):
        if fields.get(field) not in (None, False, "", [], 0, 1):
            m.skip(field, fields[field], _UNMODELLED_FIELDS[field])


def _open_r1_defaults(m: _Mapper, fields: dict[str, Any]) -> None:
    """An open-r1 recipe: the GRPOConfig defaults of the TRL it pins fill what the file leaves out."""
    for field, value in OPEN_R1_DEFAULTS.items():
        if field not in fields and (field != "vllm_mode" or truthy(fields.get("use_vllm"))):
            fields[field] = value
            m.notes.append(
                f"{m.src(OPEN_R1_MARKER)}: an open-r1 recipe (its scripts pin trl=={OPEN_R1_TRL}): "
                f"{field} = {value}, that TRL's default"
            )
            m.defaults_from[field] = f"(open-r1's trl=={OPEN_R1_TRL} default: {field}={value})"


def _map_rollout(m: _Mapper, f: Mapping[str, Any]) -> None:
    if not truthy(f.get("use_vllm")):
        return
    mode = str(f.get("vllm_mode") or "colocate").lower()  # GRPOConfig.vllm_mode default "colocate" (1.16)
    rollout = "vllm-colocate" if mode == "colocate" else "vllm-server"
    if "vllm_mode" in m.defaults_from:
        m.set("rollout", rollout, m.defaults_from["vllm_mode"])
    elif "vllm_mode" in f:
        m.set("rollout", rollout, "vllm_mode")
    else:
        m.set("rollout", rollout, "use_vllm", "TRL 1.16's default vllm_mode: colocate")
    if truthy(f.get("vllm_enable_sleep_mode")):
        m.set("rollout_sleep", True, "vllm_enable_sleep_mode")


def _map_reference(m: _Mapper, f: Mapping[str, Any]) -> None:
    if truthy(f.get("precompute_ref_log_probs")):
        m.set("reference", "precomputed", "precompute_ref_log_probs")
    elif f.get("ref_model") or f.get("ref_model_init_kwargs") or truthy(f.get("force_use_ref_model")):
        key = next(k for k in ("ref_model", "ref_model_init_kwargs", "force_use_ref_model") if f.get(k))
        m.set("reference", "separate", key, "a reference model of its own")


def _map_sequence(m: _Mapper, f: Mapping[str, Any], name: str) -> None:
    """Older TRL (< 1.0) files give the prompt's length: the sequence is prompt + completion."""
    prompt, completion = f.get("max_prompt_length"), f.get("max_completion_length")
    if prompt is not None and completion is not None:
        p, c = as_int(m, "max_prompt_length", prompt), as_int(m, "max_completion_length", completion)
        if p is not None and c is not None:
            m.set("seq", p + c, "max_prompt_length", "max_prompt_length + max_completion_length")
    elif name in ("grpo", "rloo") and completion is not None and "max_length" not in f:
        c = as_int(m, "max_completion_length", completion)
        if c is not None:
            m.set("seq", 2 * c, "max_completion_length", "no prompt length in the file: a prompt as long as "
                  "the completion assumed", keep=True)  # fmt: skip


def _trl_defaults(m: _Mapper, doc: Mapping[str, Any], key: str) -> None:
    """TRL's post-training configs turn on gradient checkpointing and bf16 by default (TRL files only:
    axolotl and LLaMA-Factory keep their own defaults)."""
    if key in ("rl", "stage"):
        return
    if "gradient_checkpointing" not in doc:
        m.set("checkpointing", "full", "(TRL default: gradient_checkpointing=True)", keep=True)
    if not any(k in doc for k in ("bf16", "fp16", "fp32")):
        m.set("precision", "amp-bf16", "(TRL default: bf16=True)", keep=True)
