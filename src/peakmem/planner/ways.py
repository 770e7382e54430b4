"""``peakmem train``'s answer and its ways down, asked of the one search.

The ways down are the single changes ``fit`` searches (its families, :data:`peakmem.planner.fit.FAMILIES`)
and its finishers (a smaller micro-batch with more accumulation, sharding over the GPUs of one node),
each estimated by the search's memoised estimator. A way is listed only when it needs strictly less
than the job as asked; the usual changes that save nothing are named in one line, with the phase
where the peak sits to say why.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from peakmem.breakdown import Estimate, Phase
from peakmem.errors import InputError
from peakmem.formulas.overhead import Overheads
from peakmem.model import CostLookup, ModelSpec
from peakmem.parallel import Parallelism
from peakmem.planner.fit import FAMILIES, _Ctx
from peakmem.planner.search import (
    MAX_NODE_GPUS,
    Change,
    _apply,
    _Config,
    _Estimator,
    _Search,
    smaller_micro_batch,
)
from peakmem.training import TrainingSetup

# Why a change that shrinks activations saves nothing, by the phase where the peak sits.
_PEAK_WHY = {
    Phase.OPTIMIZER: "the peak is in the optimizer step, after the backward pass has freed the activations",
    Phase.LOAD: "the peak is at model load, before any activation exists",
    Phase.FORWARD: "the peak is in the forward pass, and these do not shrink what it holds there",
    Phase.BACKWARD: "the peak is in the backward pass, and these do not shrink what it holds there",
}


@dataclass(frozen=True, kw_only=True)
class Way:
    """The job with one change, estimated (the most loaded rank's when sharded)."""

    label: str
    changes: tuple[Change, ...]
    setup: TrainingSetup
    parallelism: Any  # peakmem.parallel.Parallelism | None
    estimate: Estimate
    needed_bytes: int  # device total (of the most loaded rank)
    saving_bytes: int  # against the job as asked: always > 0


@dataclass(frozen=True, kw_only=True)
class WaysDown:
    ways: tuple[Way, ...]  # each saves memory; smallest need first
    no_help: str  # one line: the usual changes that save nothing here, and why ("" when none)
    # the ways of a derived model left out because its block costs in their setup family are not
    # measured yet (measuring one family takes a minute or more on a laptop's CPU: ``train`` would
    # otherwise measure every family it lists before answering)
    not_measured: tuple[str, ...] = ()

    def pairs(self) -> list[tuple[str, Estimate]]:
        """(label, estimate) per way, as the tables and pictures draw them."""
        return [(w.label, w.estimate) for w in self.ways]

    @property
    def note(self) -> str:
        """The line under the ways: what saves nothing here, and what was not measured yet."""
        parts = [self.no_help] if self.no_help else []
        if self.not_measured:
            what = ", ".join(self.not_measured)
            parts.append(f"{what}: {NOT_MEASURED_WHY}")
        return "; ".join(parts)


@dataclass(frozen=True, kw_only=True)
class TrainAnswer:
    """What ``peakmem train`` (and ``/api/train``) answers: the estimate, the per-rank report when
    sharded, and the ways down."""

    estimate: Estimate
    ranks: Any  # peakmem.ranks.RankReport | None
    ways: WaysDown


def ways_down(
    spec: ModelSpec, setup: TrainingSetup, par: Any = None, *, overheads: Overheads | None = None,
    capacity_bytes: int | None = None, estimator: _Estimator | None = None, costs: CostLookup | None = None,
) -> WaysDown:  # fmt: skip
    """The changes that bring ``setup`` (on ``par``) down. With ``capacity_bytes`` the finishers pick
    the least invasive value that fits it (as ``fit`` does); without, micro-batch 1 and one node."""
    est = estimator if estimator is not None else _Estimator(spec, overheads, lazy=True, costs=costs)
    base = est(setup, par)
    if base is None:
        raise est.failure(setup, par, spec)
    ctx = _Ctx(spec=spec, setup=setup, gpus=(), estimator=est, par=par)
    base_cfg = _Config(setup=setup, par=par, changes=(), labels=())
    configs: list[_Config] = []
    for family in FAMILIES:
        for opt in family(ctx)[1]:
            cfg = _apply(base_cfg, opt)
            if cfg is not None:
                configs.append(cfg)
    configs += _finished(spec, setup, par, est, base_cfg, capacity_bytes)
    ways: list[Way] = []
    idle: dict[str, list[str]] = {}  # usual field -> its values that save nothing
    unmeasured: list[str] = []
    for cfg in configs:
        if est.unmeasured(cfg.setup):
            unmeasured.append(" + ".join(cfg.labels))
            continue
        res = est(cfg.setup, cfg.par)
        if res is None:
            continue
        label = " + ".join(cfg.labels)
        if res.needed < base.needed:
            ways.append(Way(label=label, changes=cfg.changes, setup=cfg.setup, parallelism=cfg.par,
                            estimate=res.estimate, needed_bytes=res.needed,
                            saving_bytes=base.needed - res.needed))  # fmt: skip
        else:
            for c in cfg.changes:
                if c.field in _USUAL and c.new not in idle.setdefault(c.field, []):
                    idle[c.field].append(c.new)
    ways.sort(key=lambda w: (w.needed_bytes, w.label))
    return WaysDown(ways=tuple(ways), no_help=_no_help(idle, base.estimate.peak_phase),
                    not_measured=tuple(unmeasured))  # fmt: skip


NOT_MEASURED_WHY = (
    "not estimated: this model's block costs in that setup are not measured yet (asking for the setup "
    "itself, e.g. `peakmem train MODEL --method lora`, measures and caches them; `peakmem fit` measures "
    "every change it tries)"
)


def _finished(
    spec: ModelSpec, setup: TrainingSetup, par: Any, est: _Estimator, base: _Config, capacity: int | None
) -> list[_Config]:
    """The finishers' changes: fit's own finishers when a capacity is given, else their extremes."""
    out: list[_Config] = []
    search = _Search(spec, setup, (), est, par)
    fit_mb = search.finish_micro_batch(base, capacity) if capacity is not None else None
    fit_shard = search.finish_shard(base, capacity) if capacity is not None else None
    if fit_mb is not None:
        out.append(fit_mb)
    elif setup.micro_batch > 1:
        out.append(smaller_micro_batch(_Config(setup=setup, par=par, changes=(), labels=()), 1))
    if fit_shard is not None:
        out.append(fit_shard)
    elif par is None or par.gpus == 1:
        cur = par if par is not None else Parallelism()
        try:
            sharded = replace(cur, gpus=MAX_NODE_GPUS, dp=0, zero_stage=3)
        except InputError:
            return out
        out.append(_Config(
            setup=setup, par=sharded,
            changes=(Change(field="gpus", old="1", new=str(MAX_NODE_GPUS)),
                     Change(field="zero_stage", old=str(cur.zero_stage), new="3")),
            labels=(f"shard over {MAX_NODE_GPUS} GPUs (ZeRO-3, per GPU)",),
        ))  # fmt: skip
    return out


# Changes people reach for first, as the one-line note names them.
_USUAL: dict[str, Callable[[list[str]], str]] = {
    "checkpointing": lambda vs: f"activation checkpointing ({' or '.join(vs)})",
    "micro_batch": lambda vs: "a smaller micro-batch",
    "attention": lambda vs: f"{' or '.join(vs)} attention",
}


def _no_help(idle: dict[str, list[str]], phase: Phase) -> str:
    names = [_USUAL[f](vs) for f, vs in idle.items() if vs]
    if not names:
        return ""
    what = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
    verb = "saves" if len(names) == 1 else "save"
    why = _PEAK_WHY.get(phase, f"the peak is in the {phase.value} phase")
    return f"{what} {verb} nothing here: {why}"


def train_answer(
    spec: ModelSpec, setup: TrainingSetup, par: Any = None, *, overheads: Overheads | None = None,
    capacity_bytes: int | None = None, costs: CostLookup | None = None,
) -> TrainAnswer:  # fmt: skip
    """``peakmem train``'s answer: the estimate (the most loaded rank's when sharded, with the per-rank
    report) and the ways down, from one memoised search. ``costs``: a derived spec's block-cost lookup
    (:class:`peakmem.estimate.TrainingEstimator`; the face hands in a measuring one where torch runs)."""
    est = _Estimator(spec, overheads, lazy=True, costs=costs)  # measures the job's own setup family only
    res = est(setup, par)
    if res is None:
        raise est.failure(setup, par, spec)
    estimate = res.report.as_estimate() if res.report is not None else res.estimate
    ways = ways_down(spec, setup, par, overheads=overheads, capacity_bytes=capacity_bytes, estimator=est)
    return TrainAnswer(estimate=estimate, ranks=res.report, ways=ways)


__all__ = ["TrainAnswer", "Way", "WaysDown", "train_answer", "ways_down"]
