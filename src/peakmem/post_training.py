"""What a post-training job is: the objective, its reference, its rollout engine and their sizes.

A preference or RL job (DESIGN.md, "Jobs of several models") trains one **policy** and holds other
roles beside it: a **reference** model for the KL or the preference log-ratio, and, for online RL, a
**rollout engine** that generates the completions. :class:`PostTraining` names them; the policy's own
setup stays a :class:`peakmem.training.TrainingSetup` (``batch`` is TRL's ``per_device_train_batch_size``:
preference pairs for DPO-style objectives, completions for GRPO/RLOO; ``seq`` is the whole sequence,
prompt plus completion, as TRL's ``max_length``).

Defaults are TRL 1.16's (read in its source, ``trl/trainer/*_config.py`` and ``*_trainer.py``):

* GRPO ``beta`` 0.0 (``grpo_config.py``: "If 0.0 (default), the reference model is not loaded";
  0.04 before TRL 0.19), DPO ``beta`` 0.1 (``dpo_config.py``);
* GRPO ``num_generations`` 8 (RLOO 2; RLOO ``beta`` 0.05), ``max_completion_length`` 512,
  ``vllm_gpu_memory_utilization`` 0.3, ``vllm_enable_sleep_mode`` False, ``steps_per_generation`` =
  ``gradient_accumulation_steps`` (``GRPOConfig.__post_init__``), ``use_vllm`` False (``model.generate``
  on the policy);
* the reference (``GRPOTrainer.__init__`` / ``DPOTrainer.__init__``): none when GRPO's beta is 0; the
  policy with its adapter disabled (``use_adapter(model, adapter_name=None)``) for a PEFT policy; none
  with ``precompute_ref_log_probs`` (DPO: the log-probs are computed once before training); otherwise a
  second copy built like the policy (``create_model_from_path(..., dtype=self.model.dtype)``).
* ORPO and SimPO are reference-free (Hong et al. 2024, arXiv 2403.07691; Meng et al. 2024,
  arXiv 2405.14734) and, like DPO, run chosen and rejected concatenated in one forward.
"""

from __future__ import annotations

from dataclasses import dataclass

from peakmem.choice import Choice
from peakmem.errors import InputError
from peakmem.validate import check_bool, check_int, coerce_choice

TRL_VERSION = "1.16.0"  # the TRL whose defaults and trainers these rules follow (pyproject extra ``rl``)


class Objective(Choice):
    SFT = "sft"
    DPO = "dpo"
    ORPO = "orpo"
    SIMPO = "simpo"
    GRPO = "grpo"
    RLOO = "rloo"
    KTO = "kto"
    PPO = "ppo"
    DISTILL = "distill"


# Objectives that run chosen and rejected completions concatenated in one forward (TRL's
# ``DPOTrainer._compute_loss``: ``batch is [chosen, rejected]``).
PAIRED = (Objective.DPO, Objective.ORPO, Objective.SIMPO)
# Objectives that generate their own completions (TRL ``GRPOTrainer`` / ``RLOOTrainer``).
ONLINE = (Objective.GRPO, Objective.RLOO)
REFERENCE_FREE = (Objective.ORPO, Objective.SIMPO)
# Objectives with a reference over unpaired completions and a KL estimate from mismatched pairs (TRL
# ``KTOTrainer._compute_loss``: a no-grad policy pass over the KL batch before the policy's forward, and the
# reference over the KL batch and the completions after it)
UNPAIRED = (Objective.KTO,)
# Objectives whose roles and phases are not modelled yet: asking for one is an InputError, never an
# SFT answer.
NOT_MODELLED = {
    Objective.PPO: "PPO's critic (a trained value model) and reward model beside the policy",
    Objective.DISTILL: "distillation's teacher forward and its B x L x vocab logits",
}


class Reference(Choice):
    AUTO = "auto"  # what TRL 1.16 does for the objective, method and beta (see resolve_reference)
    SEPARATE = "separate"  # a second frozen copy of the model
    ADAPTER = "adapter"  # the policy with its LoRA adapter disabled (peft)
    NONE = "none"  # no reference (GRPO beta 0, ORPO, SimPO)
    PRECOMPUTED = "precomputed"  # DPO precompute_ref_log_probs: log-probs computed once before training


class Rollout(Choice):
    HF = "hf"  # transformers generate on the policy itself (TRL use_vllm=False)
    VLLM_COLOCATE = "vllm-colocate"  # vLLM on the training GPUs (TRL vllm_mode="colocate")
    VLLM_SERVER = "vllm-server"  # vLLM on GPUs of its own (TRL vllm_mode="server", trl vllm-serve)


# trl/trainer/*_config.py
DEFAULT_BETA = {Objective.GRPO: 0.0, Objective.RLOO: 0.05, Objective.DPO: 0.1, Objective.KTO: 0.1}
DEFAULT_NUM_GENERATIONS = {Objective.GRPO: 8, Objective.RLOO: 2}  # GRPOConfig / RLOOConfig.num_generations
DEFAULT_COMPLETION = 512  # GRPOConfig.max_completion_length
DEFAULT_ROLLOUT_MEMORY = 0.3  # GRPOConfig.vllm_gpu_memory_utilization
MAX_BETA = 1000.0  # a KL / preference coefficient; published recipes use 0.001-10
MAX_GENERATIONS = 1024  # completions per prompt; no recipe uses more than a few dozen


@dataclass(frozen=True, kw_only=True)
class PostTraining:
    """The roles beside the policy. ``reference`` is resolved (never AUTO) by :func:`post_training`;
    ``steps_per_generation``: generation batches are ``batch x steps_per_generation`` completions
    per device; ``completion``: completion tokens within ``seq``."""

    objective: Objective
    reference: Reference
    rollout: Rollout = Rollout.HF
    beta: float = 0.0
    num_generations: int = 8
    completion: int = DEFAULT_COMPLETION
    steps_per_generation: int = 1
    rollout_memory: float = DEFAULT_ROLLOUT_MEMORY
    rollout_sleep: bool = False

    def __post_init__(self) -> None:
        coerce_choice(self, "objective", Objective)
        coerce_choice(self, "reference", Reference)
        coerce_choice(self, "rollout", Rollout)
        check_int(
            "num_generations",
            self.num_generations,
            minimum=2 if self.online else 1,
            maximum=MAX_GENERATIONS,
            what="completions per prompt",
        )
        check_int("completion", self.completion)
        check_int("steps_per_generation", self.steps_per_generation)
        check_bool("rollout_sleep", self.rollout_sleep)
        for name in ("beta", "rollout_memory"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= MAX_BETA:
                raise InputError(f"{name}={value!r}: must be a number between 0 and {MAX_BETA:g}")
        if not 0 < self.rollout_memory < 1:
            raise InputError(
                f"rollout_memory={self.rollout_memory!r}: a fraction of the GPU, between 0 and 1"
            )
        if self.reference is Reference.AUTO:
            raise InputError("reference='auto': resolve it with post_training()")
        if not self.online and self.rollout is not Rollout.HF:
            raise InputError(
                f"rollout={self.rollout.value!r}: {self.objective.value} generates nothing "
                "(a rollout engine is for grpo and rloo)"
            )
        if self.reference is Reference.PRECOMPUTED and self.objective not in (*PAIRED, *UNPAIRED):
            raise InputError(
                f"reference='precomputed': TRL precomputes reference log-probs for DPO and KTO only, "
                f"not {self.objective.value}"
            )

    @property
    def online(self) -> bool:
        return self.objective in ONLINE

    @property
    def paired(self) -> bool:
        return self.objective in PAIRED

    @property
    def unpaired_kl(self) -> bool:
        return self.objective in UNPAIRED

    def echo(self) -> dict[str, object]:
        out: dict[str, object] = {
            "objective": self.objective.value,
            "reference": self.reference.value,
            "beta": self.beta,
        }
        if self.online:
            out.update(
                rollout=self.rollout.value,
                num_generations=self.num_generations,
                completion=self.completion,
                steps_per_generation=self.steps_per_generation,
            )
            if self.rollout is Rollout.VLLM_COLOCATE:
                out.update(rollout_memory=self.rollout_memory, rollout_sleep=self.rollout_sleep)
        else:
            out["completion"] = self.completion
        return out


def resolve_reference(objective: Objective, asked: Reference, *, beta: float, adapter: bool) -> Reference:
    """The reference TRL 1.16 builds for ``objective`` (``asked`` AUTO), or ``asked`` where it is possible."""
    if objective in REFERENCE_FREE:
        if asked not in (Reference.AUTO, Reference.NONE):
            raise InputError(f"reference={asked.value!r}: {objective.value} is reference-free")
        return Reference.NONE
    if asked is Reference.AUTO:
        if objective in ONLINE and beta == 0:
            return Reference.NONE
        return Reference.ADAPTER if adapter else Reference.SEPARATE
    if asked is Reference.ADAPTER and not adapter:
        raise InputError("reference='adapter': the adapter-disabled reference needs --method lora or qlora")
    if asked is Reference.NONE and objective in (*PAIRED, *UNPAIRED):
        raise InputError(f"reference='none': {objective.value} needs reference log-probs (or 'precomputed')")
    return asked


def post_training(
    objective: str,
    *,
    reference: str = "auto",
    rollout: str = "hf",
    beta: float | None = None,
    num_generations: int | None = None,
    completion: int | None = None,
    steps_per_generation: int = 1,
    rollout_memory: float = DEFAULT_ROLLOUT_MEMORY,
    rollout_sleep: bool = False,
    adapter: bool = False,
    seq: int,
    batch: int = 1,
    gpus: int = 1,
) -> PostTraining | None:
    """The post-training roles the options ask for; None for ``sft`` (one supervised step of one model).
    ``batch`` x ``gpus`` x ``steps_per_generation``: TRL's generation batch, a multiple of num_generations."""
    obj = Objective.parse(objective, "objective")
    if obj is Objective.SFT:
        return None
    if obj in NOT_MODELLED:
        raise InputError(
            f"objective={obj.value!r}: not modelled yet ({NOT_MODELLED[obj]}); peakmem estimates "
            "sft, dpo, orpo, simpo, kto, grpo and rloo"
        )
    b = DEFAULT_BETA.get(obj, 0.0) if beta is None else beta
    gens = DEFAULT_NUM_GENERATIONS.get(obj, 1) if num_generations is None else num_generations
    comp = completion if completion is not None else min(DEFAULT_COMPLETION, seq // 2)
    if comp >= seq:
        raise InputError(f"completion={comp}: must be shorter than seq={seq} (seq is prompt + completion)")
    generated = batch * gpus * steps_per_generation  # GRPOConfig.generation_batch_size
    if obj in ONLINE and generated % gens:
        raise InputError(
            f"num_generations={gens}: the generation batch "
            f"(batch x gpus x steps_per_generation = {generated}) "
            "must be divisible by it (TRL GRPOConfig.__post_init__): raise --batch or --grad-accum, or lower "
            "--num-generations"
        )
    ref = resolve_reference(obj, Reference.parse(reference, "reference"), beta=b, adapter=adapter)
    return PostTraining(
        objective=obj,
        reference=ref,
        rollout=Rollout.parse(rollout, "rollout"),
        beta=b,
        num_generations=gens,
        completion=comp,
        steps_per_generation=steps_per_generation,
        rollout_memory=rollout_memory,
        rollout_sleep=rollout_sleep,
    )
