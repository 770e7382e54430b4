"""Measured block costs: the fake steps of a family at a few shapes, and the fit over them.

:func:`measure_costs` runs the real model's training step under fake tensors at five small shapes
(:data:`SHAPES`; micro-batch 1 apart where it differs) with :mod:`peakmem.simulate.runner`'s machinery and
tracker, and fits, per block kind, what each block saves for backward and, instant by instant, its
forward and backward bytes (:func:`peakmem.block_costs.block_cost`: the peak is the largest instant at the
shape asked), with costs of their own beyond the short shapes where a longer sequence's bytes are not
given back (:data:`SEQ_CHECK`, :data:`LONG_SHAPES`).
"""

from __future__ import annotations

import dataclasses
import traceback
from collections.abc import Mapping
from typing import Any

from peakmem import block_costs, progress
from peakmem.bnb_versions import BNB_CURRENT
from peakmem.errors import InputError
from peakmem.formulas.profiles import code_config
from peakmem.model import FIRST_BLOCK, LAST_BLOCK
from peakmem.simulate.derive.build import build_meta
from peakmem.simulate.derive.forked import Task, measure_steps
from peakmem.simulate.derive.from_model import spec_from_model
from peakmem.simulate.derive.step import Steps
from peakmem.training import adapter_objects, family_code

# (batch, seq) of the five fake-tensor runs the costs are fitted over: three sequence lengths separate
# per-token, per-sequence-squared and constant bytes, two batches separate what scales with the batch from
# what the batch shares (a broadcast causal mask). Short, so a run is cheap; micro-batch 2 and 4, not 1:
# at micro-batch 1 a tensor broadcast over a size-1 batch can stay a view where a larger batch copies it
# (matmul's expand + reshape of a one-head k/v against every query head: Falcon's multi-query attention on
# SDPA's math kernel, ATen/native/LinearAlgebra.cpp ``_matmul_impl``), which no term of the fit can carry:
# fitted over batch-1 and batch-2 shapes together, tiny Falcon's costs came out 4-7% low at batch 2.
SHAPES = ((2, 32), (2, 64), (4, 64), (2, block_costs.SHORT_MAX_SEQ), (4, 32))
# micro-batch 1 is checked at BATCH1_CHECK; where the batch-linear costs do not give it back, the costs at
# micro-batch 1 are measured on their own at BATCH1_SHAPES (three lengths: s^2, s and a constant)
BATCH1_CHECK = (1, 64)
BATCH1_SHAPES = ((1, 32), BATCH1_CHECK, (1, block_costs.SHORT_MAX_SEQ))
# The fit is checked at SEQ_CHECK, four times the longest fitted sequence. A block whose kernel works in
# chunks pads the sequence to a multiple of its chunk (transformers' Mamba-2 torch path: mamba_chunk_size
# 256; the gated delta-net's torch_chunk_gated_delta_rule: chunk_size 64), so its bytes are a step
# function below a few chunks and the polynomial through SHAPES extrapolates wrongly: Granite 4.0-H's
# Mamba-2 block saved 0.68x, Qwen3-Next's gated delta-net block 2.7x its measured bytes at 2 x 512. Where
# the fit does not give SEQ_CHECK back, the block gets costs fitted over LONG_SHAPES (sixteen times as
# long: at least two whole chunks of 256, since a single chunk skips the passing of states between
# chunks: Granite 4.0-H's Mamba-2 block runs 194 events at 2 x 256 and 199 from 2 x 512 on, its saved
# bytes linear in the sequence from there), used beyond the short shapes (BlockCost.long), and checked at
# micro-batch 1 at LONG_BATCH1_CHECK.
SEQ_CHECK = (2, 4 * block_costs.SHORT_MAX_SEQ)
LONG = 16
LONG_SHAPES = tuple((b, LONG * s) for b, s in SHAPES)
LONG_BATCH1_CHECK = (1, LONG * BATCH1_CHECK[1])
LONG_BATCH1_SHAPES = tuple((b, LONG * s) for b, s in BATCH1_SHAPES)


Shape = tuple[int, int]  # (micro-batch, sequence)
Point = tuple[int, int, block_costs.Measured]


@dataclasses.dataclass(frozen=True)
class _Family:
    """A setup family (``precision|kernel|policy|method[|adapter]``) as the parts a step's setup takes."""

    precision: str
    kernel: str
    policy: str
    method: str
    lora: Any
    quant: Any
    code: str  # the model code measured ("": transformers'; peakmem.formulas.profiles.code_config)
    bitsandbytes: str = BNB_CURRENT  # the release the quantized base runs (its Linears' inputs kept or not)

    def setup(self, batch: int, seq: int) -> Any:
        from peakmem.training import AttentionKernel, KernelPolicy, Method, Precision, TrainingSetup

        return TrainingSetup(
            precision=Precision(self.precision), attention=AttentionKernel(self.kernel),
            kernel_policy=KernelPolicy(self.policy), micro_batch=batch, seq_len=seq,
            method=Method(self.method), lora=self.lora, quant=self.quant, bitsandbytes=self.bitsandbytes,
        )  # fmt: skip


def _family(family: str) -> _Family:
    family, code = family_code(family)
    parts = family.split("|", 4)
    precision, kernel, policy = parts[:3]
    method = parts[3] if len(parts) > 3 else "full"
    lora = quant = None
    bnb = BNB_CURRENT
    if method != "full":
        objects = adapter_objects(parts[4] if len(parts) > 4 else "")
        if objects is None:
            raise InputError(f"setup family {family!r}: the adapter is not known in this process")
        lora, quant, bnb = objects
    return _Family(precision=precision, kernel=kernel, policy=policy, method=method, lora=lora, quant=quant,
                   code=code, bitsandbytes=bnb)  # fmt: skip


def _measure(
    config: Mapping[str, Any],
    fam: _Family,
    shapes: tuple[Shape, ...],
    *,
    optional: bool = False,
    only: Mapping[Shape, frozenset[str]] | None = None,
    what: str = "fake-tensor steps of its blocks",
) -> dict[Shape, Steps]:
    """Each shape's bytes per block key, the steps side by side
    (:func:`~peakmem.simulate.derive.forked.measure_steps`), the model cut to blocks of the kinds ``only``
    names for a shape; with ``optional``, a shape the model cannot run (tiny BERT's 256 learned positions
    at 512 tokens) is left out, and the costs it would have checked stay as they are."""
    tasks: list[Task] = [(fam.setup(batch, seq), (only or {}).get((batch, seq))) for batch, seq in shapes]
    if not tasks:
        return {}
    progress.stage(f"{config.get('model_type')}: {what} ({fam.method}, {fam.precision})", len(tasks))
    found: dict[Shape, Steps] = {}
    for shape, step in zip(shapes, measure_steps(dict(config), tasks), strict=True):
        if isinstance(step, Exception) and optional:
            continue
        if isinstance(step, InputError):
            raise step
        if isinstance(step, Exception):
            raise _step_error(step, config, fam.method, fam.precision) from step
        found[shape] = step
    return found


def _points(at: dict[Shape, Steps], key: str, shapes: tuple[Shape, ...]) -> list[Point] | None:
    """``key``'s measurements at ``shapes``, in their order; None unless all of them were measured."""
    pts = [(b, s, at[(b, s)][key]) for b, s in shapes if key in at.get((b, s), {})]
    return pts if len(pts) == len(shapes) else None


def _differs(pts: list[Point] | None, at: dict[Shape, Steps], key: str, shape: Shape) -> bool:
    """Whether the costs fitted over ``pts`` miss the bytes measured at ``shape`` (False where that
    shape, or the key in it, was not measured)."""
    there = at.get(shape, {}).get(key)
    return pts is not None and there is not None and not block_costs.batch_linear_at(pts, *shape, there)


def measure_costs(config: Mapping[str, Any], family: str) -> block_costs.Costs:
    """Measured :class:`~peakmem.block_costs.BlockCost` of every block kind of ``config`` in ``family``
    (``precision|kernel|policy|method``), fitted over :data:`SHAPES` (:func:`peakmem.block_costs.block_cost`),
    with costs of their own at micro-batch 1 where it differs (:data:`BATCH1_SHAPES`) and beyond the short
    shapes where a longer sequence's bytes are not given back (:data:`SEQ_CHECK`, :data:`LONG_SHAPES`)."""
    fam = _family(family)
    measured = code_config(config, fam.code)
    if measured != config:  # the framework's config, its blocks filed under the user's config's keys
        return _filed_under(measure_costs(measured, family_code(family)[0]), measured, config)
    at = _measure(config, fam, SHAPES, what="fake-tensor steps of its blocks at the fit shapes")
    short = {key: pts for key in at[SHAPES[0]] if (pts := _points(at, key, SHAPES)) is not None}
    out: block_costs.Costs = {key: block_costs.block_cost(pts) for key, pts in short.items()}
    # the two checks in one round of steps (the fit at a longer sequence, and at micro-batch 1)
    kinds_seen = len({block_costs.block_kind(k) for k in out})
    at |= _measure(config, fam, (SEQ_CHECK, BATCH1_CHECK), optional=True,
                   what=f"checking the fit of its {kinds_seen} block kind(s) at other shapes")  # fmt: skip
    long = [key for key in out if _differs(short[key], at, key, SEQ_CHECK)]
    # micro-batch 1 under the short shapes only for blocks without long costs: for the others (a chunked
    # kernel, a step function of the sequence below a few chunks) it would take three more steps for
    # sequences of at most SHORT_MAX_SEQ tokens at micro-batch 1, where the batch-linear costs answer
    batch1 = [key for key in out if key not in long and _differs(short[key], at, key, BATCH1_CHECK)]
    # the shapes those need, in one more round: a long block's micro-batch-1 shapes with its long ones
    # (its micro-batch 1 is checked at LONG_BATCH1_CHECK, one of them: a round of its own for the check
    # would cost more time than the two steps it may save). The long shapes run two blocks of each long
    # kind (the measured second one followed by another) and one of every other kind
    # (:func:`peakmem.simulate.derive.build.truncate`; one, since a model may need each: Qwen3.5's
    # training forward builds a cache that wants an attention layer): Qwen3.5-27B's step at 2 x 1024
    # takes 4.2 s instead of 6.3 s (three of each kind), and the six shipped models with long costs
    # regenerate to the same bytes
    long_shapes = (*LONG_SHAPES, *LONG_BATCH1_SHAPES) if long else ()
    kinds = frozenset(block_costs.block_kind(k) for k in long)
    more = (*long_shapes, *(BATCH1_SHAPES if batch1 else ()))
    at |= _measure(
        config,
        fam,
        tuple(shape for shape in more if shape not in at),
        optional=True,
        only=dict.fromkeys(long_shapes, kinds),
        what="longer shapes for the blocks the check missed",
    )
    for key in batch1:
        if (pts := _points(at, key, BATCH1_SHAPES)) is not None:
            out[key] = dataclasses.replace(out[key], batch1=block_costs.block_cost(pts, single=True))
    for key in long:
        if (long_cost := _long_cost(at, key)) is not None:
            out[key] = dataclasses.replace(out[key], long=long_cost)
    # an edge block measured like the others of its kind is not kept apart (block_costs.block_key_costs)
    for key in [k for k in out if k.endswith((FIRST_BLOCK, LAST_BLOCK))]:
        if out[key] == block_costs.block_key_costs(out, block_costs.block_kind(key)):
            del out[key]
    return out


def _filed_under(costs: block_costs.Costs, measured: Mapping[str, Any], config: Mapping[str, Any]
                 ) -> block_costs.Costs:  # fmt: skip
    """``costs`` of ``measured``'s blocks keyed as ``config``'s blocks in the same places (the keys hash
    the config and each block's modules: peakmem.simulate.derive.from_model)."""
    pairs = zip(spec_from_model(build_meta(config), config).groups,
                spec_from_model(build_meta(measured), measured).groups, strict=True)  # fmt: skip
    renamed = {t.layer.derived.key: o.layer.derived.key for o, t in pairs
               if o.layer.derived is not None and t.layer.derived is not None}  # fmt: skip
    out: block_costs.Costs = {}
    for key, cost in costs.items():
        old = next((k for k in renamed if key.startswith(k)), None)
        out[key if old is None else renamed[old] + key[len(old) :]] = cost
    return out


def _long_cost(at: dict[Shape, Steps], key: str) -> block_costs.BlockCost | None:
    """``key``'s costs fitted over :data:`LONG_SHAPES`, with costs of their own at micro-batch 1 where
    :data:`LONG_BATCH1_CHECK` differs; None unless every long shape was measured."""
    if (pts := _points(at, key, tuple(sorted(LONG_SHAPES)))) is None:
        return None
    cost = block_costs.block_cost(pts)
    if _differs(pts, at, key, LONG_BATCH1_CHECK) and (b1 := _points(at, key, LONG_BATCH1_SHAPES)):
        cost = dataclasses.replace(cost, batch1=block_costs.block_cost(b1, single=True))
    return cost


def _step_error(err: Exception, config: Mapping[str, Any], method: str, precision: str) -> InputError:
    """The user's error for a fake step that failed in transformers' or peft's code."""
    trace = "".join(traceback.format_exception(err))
    if not (isinstance(err, RuntimeError) and "grouped_mm" in trace):
        # transformers / peft code that does not run under this method (peft's LoRA Linear on Llama 4's
        # router, which returns a tuple): a named error, not a traceback
        return InputError(
            f"model_type={config.get('model_type')!r}: a fake-tensor training step of its blocks "
            f"failed under {method} ({precision}): {type(err).__name__}: {str(err)[:300]}"
        )
    # transformers' grouped_mm experts (integrations/moe.py) cast the input to the experts' dtype, and
    # torch 2.13's _grouped_mm (meta registration, as the CUDA kernel) takes bf16 only
    return InputError(
        f"precision={precision!r}: model_type={config.get('model_type')!r} runs its experts through "
        "torch._grouped_mm, which takes bf16 weights only; with fp32 expert weights transformers cannot "
        "run it. Use --precision bf16 or mixed-bf16"
    )
