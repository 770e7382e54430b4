"""The planner: the ONE search of what fits (DESIGN.md). Will it fit, and what is the cheapest change
that makes it fit? Verdicts, a search over the user's own setup, limits, and a multi-GPU plan.

One concept a module: :mod:`.search` (the memoised estimator, the changes, the finishers and the
"first value that fits" helpers), :mod:`.fit` (fit's families of changes, candidates, limits),
:mod:`.plan` (plan's layouts), :mod:`.serving` (``fit --infer``) and :mod:`.ways` (``train``'s answer
and its ways down); each module carries the JSON of its report.

``fit`` (``peakmem fit MODEL --gpu A,B,...``):

1. a verdict per GPU (the device total, what ``nvidia-smi`` shows, against the GPU's usable memory)
   and the smallest sufficient option;
2. for each GPU it does not fit: a search over changes to the user's setup. Each *family* of
   changes is a small generator (:data:`FAMILIES`) that offers a few options, least invasive first,
   or says why it is not available (the feature is not modelled) or not applicable. Up to
   :data:`MAX_CHANGES` families are combined; three *finishers* then close the gap with the least
   invasive value of one knob: a smaller micro-batch with more accumulation (the global batch is
   kept), sharding over the fewest GPUs of one node (ZeRO-3), and - last, flagged as changing the
   job - a shorter sequence. Candidates that fit are ranked fewest changes first, then by the
   estimated GPU time per token (:mod:`peakmem.formulas.step_time`); a candidate is dropped when a
   subset of its changes already fits. Every change alone is listed too, with its total, so "why
   not X" has an answer;
3. limits: the largest micro-batch and the longest sequence that fit, the fewest GPUs (ZeRO-3).

``plan`` (``peakmem plan MODEL --gpu NAME --max-gpus N``): scores every layout (GPU count, tensor,
pipeline and data parallel degrees, ZeRO stage / FSDP, checkpointing, micro-batch) with the
step-time model first (arithmetic only), then estimates memory in order of step time until the
top layouts that fit are found; layouts whose most frugal variant does not fit are skipped whole.

Every estimate goes through the public estimators (:func:`peakmem.estimate.estimate_training`,
:func:`peakmem.ranks.estimate_ranks`), memoised per (setup, parallelism) within one search: what is
suggested is exactly what those functions say when asked again.
"""

from __future__ import annotations

from peakmem.breakdown import Verdict
from peakmem.planner.fit import FitReport, GpuFit, Limits, fit, fit_json
from peakmem.planner.plan import Layout, PlanReport, plan, plan_cp_options, plan_ep_options, plan_json
from peakmem.planner.search import (
    MAX_CHANGES,
    SEQ_STEP,
    TOP_CANDIDATES,
    Candidate,
    Change,
    Family,
    where_it_acts,
)
from peakmem.planner.serving import (
    InferCandidate,
    InferFitReport,
    InferGpuFit,
    fit_inference,
    fit_inference_json,
)
from peakmem.planner.ways import TrainAnswer, Way, WaysDown, train_answer, ways_down

__all__ = [
    "MAX_CHANGES",
    "SEQ_STEP",
    "TOP_CANDIDATES",
    "Candidate",
    "Change",
    "Family",
    "FitReport",
    "GpuFit",
    "InferCandidate",
    "InferFitReport",
    "InferGpuFit",
    "Layout",
    "Limits",
    "PlanReport",
    "TrainAnswer",
    "Verdict",
    "Way",
    "WaysDown",
    "fit",
    "fit_inference",
    "fit_inference_json",
    "fit_json",
    "plan",
    "plan_cp_options",
    "plan_ep_options",
    "plan_json",
    "train_answer",
    "ways_down",
    "where_it_acts",
]  # fmt: skip
