"""``measure_post_training``: run TRL's own DPO and GRPO trainers on a tiny model on the CPU and
report the live tensor bytes of each phase (rollout, scoring, forward, backward, optimizer).

The trainers are TRL 1.16's ``DPOTrainer`` and ``GRPOTrainer`` (``transformers.generate`` for the
rollout), built from ``config`` with random weights, a word-level tokenizer over the model's
vocabulary, and synthetic prompts and completions of exactly the lengths asked (GRPO's completions
are forced to ``completion`` tokens with ``min_new_tokens``). The phases are set around the trainers'
own methods (``_generate_single_turn``, ``_generate_and_score_completions``, ``compute_loss``, the
reference forward, ``accelerator.backward``, the optimizer step) and read from
:class:`~peakmem.measure.tracker.LiveStorageTracker`, as ``peakmem measure`` reads a training step.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import tempfile
import warnings
from typing import Any

import torch

from peakmem.breakdown import Estimate, MemoryItem, Phase, PhasePeak
from peakmem.errors import InputError
from peakmem.measure.adapter import apply_adapter
from peakmem.measure.runner import build_model, unique_numel
from peakmem.measure.tracker import LiveStorageTracker, Snapshot
from peakmem.measure.trainer import model_dtype
from peakmem.post_training import Objective, PostTraining, Reference, Rollout
from peakmem.training import Checkpointing, OptimizerImpl, OptimizerName, Precision, TrainingSetup

_TRL: Any = None


def _trl() -> Any:
    """TRL's top-level names (imported lazily: the extra ``rl``; typed Any, as TRL exports them lazily)."""
    global _TRL
    if _TRL is None:
        _TRL = importlib.import_module("trl")
    return _TRL


FIRST_TOKEN = 4  # ids 0-3: bos, unk, eos, pad of the synthetic tokenizer
PROMPTS = 64
LARGEST = 12  # tensors listed per phase  # dataset rows (more than the steps consume)
_RUNNABLE = (Objective.DPO, Objective.KTO, Objective.GRPO, Objective.DISTILL)
# the trainer modules whose ``use_adapter`` (the adapter-disabled reference) the phases are set around
_ADAPTER_MODULES = {Objective.DPO: "trl.trainer.dpo_trainer", Objective.KTO: "trl.trainer.kto_trainer"}


SPECIAL = ("<bos>", "<unk>", "<eos>", "<pad>")


def _word(i: int) -> str:
    """Token ``i`` >= FIRST_TOKEN as a letters-only word (no special token is a substring of one)."""
    out = ""
    for _ in range(4):
        out += chr(ord("a") + i % 26)
        i //= 26
    return out


def _tokenizer(vocab: int) -> Any:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = {**{t: i for i, t in enumerate(SPECIAL)}, **{_word(i): i for i in range(FIRST_TOKEN, vocab)}}
    tk = Tokenizer(models.WordLevel(words, unk_token=SPECIAL[1]))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    bos, unk, eos, pad = SPECIAL
    return PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tk, bos_token=bos, unk_token=unk, eos_token=eos, pad_token=pad
    )


def _text(row: int, n: int, vocab: int, salt: int = 0) -> str:
    span = vocab - FIRST_TOKEN
    return " ".join(_word(FIRST_TOKEN + (row * 7 + j * 13 + salt) % span) for j in range(n))


def _check(setup: TrainingSetup, post: PostTraining) -> None:
    if post.objective not in _RUNNABLE:
        raise InputError(
            f"objective={post.objective.value!r}: measure runs TRL's dpo, kto, grpo and distill trainers"
        )
    if post.rollout is not Rollout.HF:
        raise InputError(f"rollout={post.rollout.value!r}: measure generates with transformers (rollout hf)")
    if setup.precision in (Precision.MIXED_BF16, Precision.MIXED_FP16, Precision.AMP_FP16):
        raise InputError(
            f"precision={setup.precision.value!r}: TRL's trainers run fp32, amp-bf16 or bf16 here"
        )
    if setup.optimizer is not OptimizerName.ADAMW or setup.optimizer_impl is OptimizerImpl.FOREACH:
        raise InputError("optimizer: measure runs TRL with adamw, fused or for-loop (HF adamw_torch[_fused])")
    if setup.checkpointing not in (Checkpointing.NONE, Checkpointing.FULL) or setup.checkpoint_every > 1:
        raise InputError(f"checkpointing={setup.checkpointing_spelled!r}: measure runs none or full here")


def _args(setup: TrainingSetup, post: PostTraining, out: str) -> Any:
    common: dict[str, Any] = dict(
        output_dir=out,
        per_device_train_batch_size=setup.micro_batch,
        gradient_accumulation_steps=setup.grad_accum,
        max_steps=2,
        report_to=[],
        use_cpu=True,
        bf16=setup.precision is Precision.AMP_BF16,
        save_strategy="no",
        logging_strategy="no",
        gradient_checkpointing=setup.checkpointing is Checkpointing.FULL,
        gradient_checkpointing_kwargs={"use_reentrant": False},
        dataloader_num_workers=0,
        disable_tqdm=True,
        optim="adamw_torch_fused" if setup.optimizer_impl is OptimizerImpl.FUSED else "adamw_torch",
        beta=post.beta,
    )
    if post.objective in (Objective.DPO, Objective.KTO):
        config = _trl().DPOConfig if post.objective is Objective.DPO else _trl().KTOConfig
        return config(
            **common,
            max_length=setup.seq_len,
            precompute_ref_log_probs=post.reference is Reference.PRECOMPUTED,
        )
    if post.objective is Objective.DISTILL:  # one completion per prompt, on-policy (the student's)
        return _trl().DistillationConfig(
            **common,
            max_completion_length=post.completion,
            generation_kwargs={"min_new_tokens": post.completion},
        )
    return _trl().GRPOConfig(
        **common,
        num_generations=post.num_generations,
        max_completion_length=post.completion,
        steps_per_generation=post.steps_per_generation,
        generation_kwargs={"min_new_tokens": post.completion},
    )


def _dataset(setup: TrainingSetup, post: PostTraining, vocab: int) -> Any:
    from datasets import Dataset

    prompt = setup.seq_len - post.completion
    rows = range(PROMPTS)
    if post.objective is Objective.DPO:
        # DPO appends eos to each completion and tokenizes prompt + completion as one text (trl
        # dpo_trainer.py): completion - 1 words + eos, each completion starting with a space
        return Dataset.from_dict(
            {
                "prompt": [_text(i, prompt, vocab) for i in rows],
                "chosen": [" " + _text(i, post.completion - 1, vocab, 1) for i in rows],
                "rejected": [" " + _text(i, post.completion - 1, vocab, 2) for i in rows],
            }
        )
    if post.objective is Objective.KTO:  # unpaired completions, half of them desirable
        return Dataset.from_dict(
            {
                "prompt": [_text(i, prompt, vocab) for i in rows],
                "completion": [" " + _text(i, post.completion - 1, vocab, 1) for i in rows],
                "label": [i % 2 == 0 for i in rows],
            }
        )
    return Dataset.from_dict({"prompt": [_text(i, prompt, vocab) for i in rows]})


def _reward(completions: list[Any], **_: Any) -> list[float]:
    return [float(len(c)) for c in completions]


def _trainer(
    model: Any, setup: TrainingSetup, post: PostTraining, config: dict[str, Any], out: str, teacher: Any
) -> Any:
    vocab = int(config["vocab_size"])
    tok = _tokenizer(vocab)
    args = _args(setup, post, out)
    data = _dataset(setup, post, vocab)
    if post.objective is Objective.DISTILL:
        return _trl().DistillationTrainer(
            model=model, teacher_model=teacher, args=args, train_dataset=data, processing_class=tok
        )
    if post.objective in (Objective.DPO, Objective.KTO):
        ref = None
        if post.reference is Reference.SEPARATE:
            ref = build_model(config, setup).to(model_dtype(setup.precision))
        trainer = _trl().DPOTrainer if post.objective is Objective.DPO else _trl().KTOTrainer
        return trainer(model=model, ref_model=ref, args=args, train_dataset=data, processing_class=tok)
    if post.reference is Reference.SEPARATE:  # GRPOTrainer loads its reference from the policy's path
        path = os.path.join(out, "policy")
        model.save_pretrained(path)
        model.config._name_or_path = path
    return _trl().GRPOTrainer(
        model=model, reward_funcs=_reward, args=args, train_dataset=data, processing_class=tok
    )


def _wrap(obj: Any, name: str, before: Any = None, after: Any = None) -> None:
    original = getattr(obj, name)

    def wrapped(*a: Any, **k: Any) -> Any:
        if before is not None:
            before()
        result = original(*a, **k)
        if after is not None:
            after()
        return result

    setattr(obj, name, wrapped)


class _Phases:
    """The phase the tracker records, set by the trainer's own calls."""

    def __init__(self, tracker: LiveStorageTracker) -> None:
        self.tracker, self.step = tracker, 0

    def set(self, phase: Phase) -> Any:
        return lambda: self.tracker.set_phase(phase, self.step)


def _instrument(trainer: Any, post: PostTraining, ph: _Phases, stack: contextlib.ExitStack) -> None:
    import transformers
    from transformers import TrainerCallback

    tracker = ph.tracker

    class Steps(TrainerCallback):
        def on_pre_optimizer_step(self, *_: Any, **__: Any) -> None:
            tracker.set_phase(Phase.OPTIMIZER, ph.step)

        def on_step_end(self, *_: Any, **__: Any) -> None:
            if trainer.optimizer is not None:
                tracker.tag_optimizer_states(trainer.optimizer)
            ph.step += 1
            tracker.set_phase(Phase.LOAD, ph.step)

    trainer.add_callback(Steps())
    for printer in (transformers.PrinterCallback, transformers.ProgressCallback):
        trainer.remove_callback(printer)  # the answer is the report, not the trainer's log lines
    _wrap(trainer.accelerator, "backward", before=ph.set(Phase.BACKWARD))
    if post.objective in (Objective.GRPO, Objective.DISTILL):
        _wrap(trainer, "_generate_single_turn", before=ph.set(Phase.ROLLOUT), after=ph.set(Phase.SCORING))
        _wrap(trainer, "_generate_and_score_completions", after=ph.set(Phase.FORWARD))
        if post.objective is Objective.DISTILL:  # the teacher's no-grad forward after the student's
            trainer.teacher_model.register_forward_pre_hook(lambda *_: ph.set(Phase.SCORING)())
            trainer.teacher_model.register_forward_hook(lambda *_: ph.set(Phase.FORWARD)())
        return
    _wrap(trainer, "compute_loss", before=ph.set(Phase.FORWARD))
    if post.objective is Objective.KTO:  # the policy's (and the reference's) pass over the KL batch
        _wrap(trainer, "_compute_kl_logps", before=ph.set(Phase.SCORING), after=ph.set(Phase.FORWARD))
    if trainer.ref_model is not None:
        trainer.ref_model.register_forward_pre_hook(lambda *_: ph.set(Phase.SCORING)())
        trainer.ref_model.register_forward_hook(lambda *_: ph.set(Phase.FORWARD)())
        return
    module: Any = importlib.import_module(_ADAPTER_MODULES[post.objective])
    original = module.use_adapter

    @contextlib.contextmanager
    def use_adapter(*a: Any, **k: Any) -> Any:
        ph.set(Phase.SCORING)()
        with original(*a, **k):
            yield
        ph.set(Phase.FORWARD)()

    module.use_adapter = use_adapter
    stack.callback(setattr, module, "use_adapter", original)  # the trainer module as it was


def measure_post_training(
    config: dict[str, Any],
    setup: TrainingSetup,
    post: PostTraining,
    *,
    model_name: str = "model",
    teacher_config: dict[str, Any] | None = None,
) -> Estimate:
    """Two optimizer steps of TRL's trainer for ``post``: the live bytes at the peak of each phase of the
    steady step (the second; the precompute pass for a precomputed reference), by tensor. Distillation
    builds its teacher from ``teacher_config`` (random weights, the student's dtype). verl's loop (PPO, no
    TRL trainer in 1.16; GRPO / RLOO with ``--trainer verl``) runs our step harness in verl's phase order,
    :func:`peakmem.measure.ppo.measure_ppo`."""
    if post.verl:
        from peakmem.measure.ppo import measure_ppo

        if post.critic is not None:
            raise InputError(
                f"critic={post.critic.name!r}: measure builds the critic from the policy's config (a chosen "
                "critic is estimated, not measured)"
            )
        return measure_ppo(config, setup, post, model_name=model_name)
    _check(setup, post)
    if post.objective is Objective.DISTILL and teacher_config is None:
        raise InputError("teacher=None: measure --objective distill needs --teacher CONFIG")
    warnings.filterwarnings("ignore")
    importlib.import_module("datasets").disable_progress_bars()
    importlib.import_module("transformers").utils.logging.disable_progress_bar()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    torch.manual_seed(0)
    model = build_model(config, setup).to(model_dtype(setup.precision))
    model = apply_adapter(model, setup)
    tracker = LiveStorageTracker(device_type="cpu")
    ph = _Phases(tracker)
    tracker.register_module(model)
    with tempfile.TemporaryDirectory() as out, tracker, contextlib.ExitStack() as stack:
        # DPO precomputes its reference log-probs inside DPOTrainer.__init__: tracked as the scoring phase
        tracker.set_phase(Phase.SCORING if post.reference is Reference.PRECOMPUTED else Phase.LOAD, 0)
        teacher = None
        if teacher_config is not None and post.objective is Objective.DISTILL:
            frozen = TrainingSetup(precision=setup.precision, seq_len=setup.seq_len)
            teacher = build_model(teacher_config, frozen).to(model_dtype(setup.precision)).eval()
            tracker.register_module(teacher)
        trainer = _trainer(model, setup, post, config, out, teacher)
        if getattr(trainer, "ref_model", None) is not None:
            tracker.register_module(trainer.ref_model)
        tracker.watch_gradients(trainer.model.named_parameters())
        _instrument(trainer, post, ph, stack)
        tracker.set_phase(Phase.LOAD, 0)
        trainer.train()
        tracker.set_phase(Phase.LOAD, ph.step + 1)
    found: dict[Phase, Snapshot] = {}
    for snap in tracker.ledger.peaks():
        steady = snap.step == 1 or (snap.phase is Phase.SCORING and post.reference is Reference.PRECOMPUTED)
        if (
            steady
            and snap.phase is not Phase.LOAD
            and snap.bytes > getattr(found.get(snap.phase), "bytes", -1)
        ):
            found[snap.phase] = snap
    order = [
        p
        for p in (Phase.SCORING, Phase.ROLLOUT, Phase.FORWARD, Phase.BACKWARD, Phase.OPTIMIZER)
        if p in found
    ]
    phases = tuple(PhasePeak(phase=p, bytes=found[p].bytes, items=_items(found[p])) for p in order)
    peak = max(phases, key=lambda p: p.bytes)
    trainable = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
    params = unique_numel(trainer.model.parameters())
    largest = [
        {"tensor": r.label, "dtype": r.dtype, "shape": list(r.shape), "bytes": r.nbytes}
        for r in found[peak.phase].largest(LARGEST)
    ]
    return Estimate(
        method="measured", job="train", model_name=model_name, params=params,
        trainable_params=trainable, per_param=(), items=peak.items, phases=phases, peak_phase=peak.phase,
        peak_allocated_bytes=peak.bytes, peak_reserved_bytes=peak.bytes, device_total_bytes=peak.bytes,
        assumptions=(f"TRL {post.objective.value} trainer, 2 steps on the CPU; bytes: live tensor storage at "
                     "each phase's peak (peakmem.measure.tracker); reserved = allocated on the CPU",),
        setup={"post_training": post.echo(), "micro_batch": setup.micro_batch, "seq_len": setup.seq_len},
        extra={"largest_tensors": largest},
    )  # fmt: skip


def _items(snap: Snapshot) -> tuple[MemoryItem, ...]:
    return tuple(MemoryItem(path=label, category=cat, bytes=b) for cat, label, b in snap.by_label())
