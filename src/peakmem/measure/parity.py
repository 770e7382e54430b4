"""The parity grid: the analytic estimate against ``measure_training(..., device="cpu")``.

Tolerances (issue 3, item 7): the peak within :data:`PEAK_TOLERANCE` of the measured peak; each
category within :data:`CATEGORY_TOLERANCE` of its measured bytes, where a category below
:data:`SMALL_CATEGORY` of the peak is compared absolutely (within that fraction of the peak).
Categories are compared at the measured peak's phase (the analytic estimate's ``PhasePeak`` of
the same phase), so a near-tie between two phases does not turn into a category mismatch; the
phases are reported side by side. The analytic side runs with ``KernelPolicy.CPU``: the CPU's
kernels decide the bytes being measured.

Used by ``tests/test_parity.py`` (a sample) and ``benchmarks/parity.py`` (the full grid).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace
from typing import Any

from peakmem.breakdown import Category, Estimate, Phase
from peakmem.training import AttentionKernel, Checkpointing, KernelPolicy, Precision, TrainingSetup

PEAK_TOLERANCE = 0.05
CATEGORY_TOLERANCE = 0.10
SMALL_CATEGORY = 0.01  # of the peak

# Tiny configs of three families. Small enough that one measured case takes well under a second
# on CPU, wide enough (hidden 128, vocab 512) that activations, states and logits all matter.
FAMILIES: dict[str, dict[str, Any]] = {
    "gpt2": {  # learned positions, LayerNorm with biases, GELU MLP, tied head, dropout 0.1
        "model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "vocab_size": 512,
        "n_positions": 256, "n_embd": 128, "n_layer": 2, "n_head": 4, "bos_token_id": 0, "eos_token_id": 0,
    },
    "llama": {  # RoPE, RMSNorm, SwiGLU, GQA, untied head, no biases, no dropout
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 512, "hidden_size": 128,
        "intermediate_size": 344, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "max_position_embeddings": 256, "bos_token_id": 0, "eos_token_id": 0,
    },
    "qwen2": {  # q/k/v biases, GQA, tied head
        "model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "vocab_size": 512, "hidden_size": 128,
        "intermediate_size": 320, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 1,
        "max_position_embeddings": 256, "tie_word_embeddings": True, "bos_token_id": 0, "eos_token_id": 0,
    },
}  # fmt: skip
PRECISIONS = (Precision.FP32, Precision.AMP_BF16, Precision.MIXED_BF16, Precision.BF16)
ATTENTIONS = (AttentionKernel.EAGER, AttentionKernel.SDPA)
CHECKPOINTING = (Checkpointing.NONE, Checkpointing.FULL)
SHAPES = ((1, 128), (4, 64))  # (micro_batch, seq_len)


@dataclass(frozen=True, kw_only=True)
class Case:
    family: str
    setup: TrainingSetup

    @property
    def name(self) -> str:
        s = self.setup
        return (
            f"{self.family}/{s.precision.value}/{s.attention.value}/ckpt-{s.checkpointing_spelled}"
            f"/b{s.micro_batch}xs{s.seq_len}"
        )

    @property
    def config(self) -> dict[str, Any]:
        return FAMILIES[self.family]


def full_grid(*, selective: bool = False) -> list[Case]:
    """The issue's grid; ``selective=True`` adds selective checkpointing as a third value."""
    cases = []
    checkpointing = (*CHECKPOINTING, Checkpointing.SELECTIVE) if selective else CHECKPOINTING
    for fam, prec, att, ck, (b, s) in itertools.product(
        FAMILIES, PRECISIONS, ATTENTIONS, checkpointing, SHAPES
    ):
        cases.append(_case(fam, prec, att, ck, b, s))
    return cases


def _case(fam: str, prec: Precision, att: AttentionKernel, ck: Checkpointing, batch: int, seq: int) -> Case:
    """One grid point, run with the CPU kernel policy (what `measure --device cpu` executes)."""
    setup = TrainingSetup(
        precision=prec, attention=att, checkpointing=ck, micro_batch=batch, seq_len=seq,
        kernel_policy=KernelPolicy.CPU,
    )  # fmt: skip
    return Case(family=fam, setup=setup)


def sampled_grid() -> list[Case]:
    """A deterministic quarter of the grid that still covers every value of every axis with every
    family and every precision: for each (family, precision), two of the eight
    (attention, checkpointing, shape) combinations, rotating so that all eight appear."""
    combos = list(itertools.product(ATTENTIONS, CHECKPOINTING, SHAPES))
    cases = []
    for i, (fam, prec) in enumerate(itertools.product(FAMILIES, PRECISIONS)):
        for j in (i % len(combos), (i + 3) % len(combos)):
            att, ck, (b, s) = combos[j]
            cases.append(_case(fam, prec, att, ck, b, s))
    return cases


@dataclass(frozen=True, kw_only=True)
class CategoryCheck:
    category: Category
    measured: int
    analytic: int
    ok: bool
    relative: bool  # False: compared absolutely (a small category)

    @property
    def error(self) -> float:
        """Relative error, or the absolute difference as a fraction of the peak for small ones."""
        return (self.analytic - self.measured) / self.measured if self.relative and self.measured else 0.0


@dataclass(frozen=True, kw_only=True)
class Comparison:
    case: Case
    measured: Estimate
    analytic: Estimate
    phase: Phase  # the measured peak's phase, where categories are compared
    categories: tuple[CategoryCheck, ...] = field(default=())

    @property
    def peak_error(self) -> float:
        return (self.analytic.peak_allocated_bytes - self.measured.peak_allocated_bytes) / (
            self.measured.peak_allocated_bytes
        )

    @property
    def peak_ok(self) -> bool:
        return abs(self.peak_error) <= PEAK_TOLERANCE

    @property
    def ok(self) -> bool:
        return self.peak_ok and all(c.ok for c in self.categories)

    def failures(self) -> list[str]:
        out = []
        if not self.peak_ok:
            out.append(
                f"peak: analytic {self.analytic.peak_allocated_bytes} ({self.analytic.peak_phase.value}) vs "
                f"measured {self.measured.peak_allocated_bytes} ({self.measured.peak_phase.value}), "
                f"{self.peak_error:+.1%}"
            )
        for c in self.categories:
            if not c.ok:
                where = f"{c.category.value} at {self.phase.value}"
                out.append(f"{where}: analytic {c.analytic} vs measured {c.measured}")
        return out


def phase_categories(est: Estimate, phase: Phase) -> dict[Category, int]:
    for p in est.phases:
        if p.phase == phase:
            out: dict[Category, int] = {}
            for item in p.items:
                out[item.category] = out.get(item.category, 0) + item.bytes
            return out
    return est.by_category() if est.peak_phase == phase else {}


def compare(case: Case, measured: Estimate, analytic: Estimate) -> Comparison:
    phase = measured.peak_phase
    peak = measured.peak_allocated_bytes
    meas = phase_categories(measured, phase)
    ana = phase_categories(analytic, phase)
    checks = []
    for cat in Category:
        m, a = meas.get(cat, 0), ana.get(cat, 0)
        if not m and not a:
            continue
        small = m < SMALL_CATEGORY * peak
        ok = abs(a - m) <= SMALL_CATEGORY * peak if small else abs(a - m) <= CATEGORY_TOLERANCE * m
        checks.append(CategoryCheck(category=cat, measured=m, analytic=a, ok=ok, relative=not small))
    return Comparison(case=case, measured=measured, analytic=analytic, phase=phase, categories=tuple(checks))


def analytic_available() -> str | None:
    """None when the analytic estimator and the config adapter can be imported, else why not."""
    try:
        from peakmem.estimate import estimate_training  # noqa: F401
        from peakmem.hf import spec_from_config  # noqa: F401
    except ImportError as err:
        return f"the analytic estimator is not available yet ({err})"
    return None


def run_case(case: Case, *, steps: int = 2) -> Comparison:
    from peakmem.estimate import estimate_training
    from peakmem.hf import spec_from_config
    from peakmem.measure.runner import measure_training

    measured = measure_training(case.config, case.setup, device="cpu", steps=steps)
    spec = spec_from_config(case.config, name=case.family)
    analytic = estimate_training(spec, replace(case.setup, kernel_policy=KernelPolicy.CPU))
    return compare(case, measured, analytic)


def table(rows: list[Comparison]) -> str:
    """A plain-text table: case, measured and analytic peaks, error, per-category errors."""
    cats = [c for c in Category if any(ch.category == c for r in rows for ch in r.categories)]
    short = {
        c: c.value.replace("optimizer_states", "opt")
        .replace("master_weights", "master")
        .replace("parameters", "params")
        .replace("temporaries", "temps")
        .replace("activations", "acts")
        .replace("gradients", "grads")
        for c in cats
    }
    head = f"{'case':44} {'measured':>10} {'analytic':>10} {'err':>7} {'phase m/a':>19}  " + " ".join(
        f"{short[c]:>8}" for c in cats
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        by = {ch.category: ch for ch in r.categories}
        cells = []
        for c in cats:
            ch = by.get(c)
            if ch is None:
                cells.append(f"{'':>8}")
            elif ch.relative:
                cells.append(f"{ch.error:+7.1%}{'' if ch.ok else '!'}".rjust(8))
            else:
                of_peak = (ch.analytic - ch.measured) / r.measured.peak_allocated_bytes
                cells.append(f"{'~' if ch.ok else '!'}{of_peak:+.1%}".rjust(8))
        phases = f"{r.measured.peak_phase.value[:4]}/{r.analytic.peak_phase.value[:4]}"
        lines.append(
            f"{r.case.name:44} {r.measured.peak_allocated_bytes:>10} {r.analytic.peak_allocated_bytes:>10} "
            f"{r.peak_error:>+7.1%}{'' if r.peak_ok else '!'} {phases:>18}  " + " ".join(cells)
        )
    n_ok = sum(r.ok for r in rows)
    lines.append(
        f"{n_ok}/{len(rows)} cases within tolerance (peak ±{PEAK_TOLERANCE:.0%}, categories "
        f"±{CATEGORY_TOLERANCE:.0%}, categories under {SMALL_CATEGORY:.0%} of the peak: "
        f"±{SMALL_CATEGORY:.0%} of the peak); '!' marks a miss, '~' an absolute comparison"
    )
    return "\n".join(lines)
