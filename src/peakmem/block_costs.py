"""Derived specs and measured block costs, as data: read, written and looked up without torch.

A *derived* spec is one :mod:`peakmem.simulate.derive` built from transformers' own modules for an
architecture :mod:`peakmem.hf` does not know. Its repeated blocks carry a
:class:`~peakmem.model.DerivedBlock` whose activation bytes are *measured* (fake-tensor runs of the
real model at a few small shapes) and fitted here as ``per_token * B*s + per_seq2 * B*s^2 + const``,
instant by instant (:class:`BlockCost`: a peak is the largest of a block's candidate instants).

Costs depend on the setup's *family* (:func:`peakmem.training.family_key`: precision, attention kernel, kernel
policy, method and adapter); sharding, checkpointing, accumulation and the optimizer are applied by
the formulas on top, so one family serves every layout. Where the costs come from, in order:

1. this process's memory;
2. the package's shipped data (``peakmem/catalog/derived/<name>.json``, written by
   ``benchmarks/derive_catalog.py``): catalog models answer without torch;
3. the on-disk cache, ``$PEAKMEM_DERIVED_CACHE`` or ``$XDG_CACHE_HOME/peakmem/derived/``
   (``~/.cache/peakmem/derived/``), one file per (config hash, family);
4. the *provider*, a function the oracle registers (:func:`set_provider`) that measures them, asked
   only by :func:`provided_lookup`, the lookup the face hands an estimator when torch is installed
   (:func:`peakmem.simulate.measuring_lookup`); estimators read :func:`stored_lookup` otherwise, whose
   error says which extra installs torch. The store never imports an oracle.

Standard library only (the core imports it); the only I/O is the cache and the shipped files.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
import os
import types
import typing
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

from peakmem import progress
from peakmem.errors import ConfigError
from peakmem.model import FIRST_BLOCK, LAST_BLOCK, ModelSpec

FORMAT = 3  # the JSON layout written below; bumped when it changes
# the cached spec's content within FORMAT: 2 = DerivedBlock carries the measured recurrent state
# (specs cached before it lack the state of SSM / linear-attention blocks: derived again); 3 = components
# labelled as peakmem.hf labels them (simulate/derive/from_model.py block components: q/k norms are norms);
# 4 = the towers beside the language model (ModelSpec.towers: a vision-language model's vision encoder);
# 5 = DerivedBlock.conv_kernel (the conv state's window) and ModelSpec.mamba_ssm_dtype (the serving engines'
# state shapes: formulas/recurrent_state.py engine_state)
SPEC_VERSION = 5
# the cached costs' measurement within FORMAT: 2 = flash's backward scratch measured at S rows, unpadded
# (simulate/derive/step.py forward/backward); 3 = every candidate peak instant fitted on its own, over
# micro-batch 2 and 4, with its weight gradients written by then, and micro-batch 1's costs of their own
# where they differ (BlockCost; simulate/derive/costs.py SHAPES). Costs cached before it are measured again.
# Within 3, costs of their own beyond SHORT_MAX_SEQ tokens where the short fit does not give back a longer
# sequence (BlockCost.long; simulate/derive/costs.py SEQ_CHECK) came later: costs measured before them lack
# them (the shipped files of the models with chunked kernels - Mamba-2, gated delta-nets - were measured
# again; a disk cache of such a model from before is not, and extrapolates from the short shapes)
COSTS_VERSION = 3
# the disk-cached costs of the families a later fix of the fake step changed, which are measured again when
# cached before it, without bumping COSTS_VERSION (the shipped files, none of these families, stay good): a
# part of the family key -> the revision its costs must carry (:func:`family_revision`). 1 = LoRA adapters
# with adapter_dtype "base" in their base layer's dtype, where they were fp32 (simulate/fakeify.py
# adapters_to_base_dtype); 2 = QLoRA as bitsandbytes, peft and TRL run it (dd2f788: the 4-bit stand-in outside
# autocast with peft's clone, the float weights prepared by module name; 3e6ba9a: its stored bytes and
# dequantize_4bit's rebuilt absmax by the QuantConfig; simulate/fakeify.py): QLoRA costs cached before it
# held an autocast copy of every quantized weight
FAMILY_REVISIONS = {"adapter_dtype='base'": 1, "|qlora|": 2}
# the longest sequence of the short shapes a block is fitted over (simulate/derive/costs.py SHAPES): its
# ``long`` costs, where it has them, answer beyond it
SHORT_MAX_SEQ = 128
CACHE_ENV = "PEAKMEM_DERIVED_CACHE"
SHIPPED = Path(__file__).parent / "catalog" / "derived"
TORCH_HINT = "pip install 'peakmem[torch]'"


# --- fitted costs ------------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class Fit:
    """Bytes as ``per_token*B*s + per_seq2*B*s^2 + seq2*s^2 + seq*s + const`` (exact fractions of
    measured ints). ``seq2``/``seq``: tensors shared by the batch (a causal mask broadcast over it)."""

    per_token: Fraction = Fraction(0)
    per_seq2: Fraction = Fraction(0)
    seq2: Fraction = Fraction(0)
    seq: Fraction = Fraction(0)
    const: Fraction = Fraction(0)

    def at(self, batch: int, seq: int) -> int:
        return max(0, self.at_signed(batch, seq))

    def at_signed(self, batch: int, seq: int) -> int:
        """The polynomial's value, not clamped at 0 (a net byte count can be negative), rounded half to
        even as ``round(Fraction)`` rounds it; in integers over the coefficients' common denominator."""
        numerators, den = self._over_common_denominator
        total = sum(n * t for n, t in zip(numerators, _terms(batch, seq), strict=True))
        whole, rest = divmod(total, den)
        return whole + (2 * rest > den or (2 * rest == den and whole % 2 == 1))

    @functools.cached_property
    def _over_common_denominator(self) -> tuple[tuple[int, ...], int]:
        """The coefficients' numerators over their least common denominator, and that denominator: a
        block's fit picks its candidate peaks by evaluating each at 136 shapes (:func:`_prune`);
        :func:`block_cost` of Qwen3-Next-80B's blocks took 4.2 s per measured family in fractions, 1.2 s
        so."""
        den = math.lcm(*(c.denominator for c in self.coefficients))
        return tuple(c.numerator * (den // c.denominator) for c in self.coefficients), den

    @property
    def coefficients(self) -> tuple[Fraction, ...]:
        return (self.per_token, self.per_seq2, self.seq2, self.seq, self.const)

    def to_json(self) -> list[str]:
        return [str(c) for c in self.coefficients]

    @classmethod
    def from_json(cls, value: Any) -> Fit:
        a, b, c, d, e = (Fraction(str(v)) for v in value)
        return cls(per_token=a, per_seq2=b, seq2=c, seq=d, const=e)


def _terms(batch: int, seq: int) -> tuple[int, ...]:
    return (batch * seq, batch * seq * seq, seq * seq, seq, 1)


N_TERMS = 5


def fit(points: list[tuple[int, int, int]]) -> Fit:
    """The exact :class:`Fit` through five ``(batch, seq, bytes)`` measurements; a ValueError when the
    shapes do not separate the terms. A family's blocks fit hundreds of series over the same five
    shapes, so the shapes' inverse is computed once (:func:`_inverse`) and each fit is its product with
    the bytes, in integers over one denominator."""
    if len(points) < N_TERMS:
        raise ValueError(f"fit needs {N_TERMS} measurements, got {len(points)}")
    numerators, den = _inverse(tuple((b, s) for b, s, _ in points[:N_TERMS]))
    ys = [y for _, _, y in points[:N_TERMS]]
    a, b, c, d, e = (Fraction(sum(n * y for n, y in zip(row, ys, strict=True)), den) for row in numerators)
    return Fit(per_token=a, per_seq2=b, seq2=c, seq=d, const=e)


@functools.lru_cache(maxsize=64)
def _inverse(shapes: tuple[tuple[int, int], ...]) -> tuple[tuple[tuple[int, ...], ...], int]:
    """The inverse of the shapes' term matrix (Gauss-Jordan elimination over fractions), as integer
    numerators over their least common denominator; a ValueError when the shapes do not separate the
    terms."""
    n = N_TERMS
    rows = [[Fraction(t) for t in _terms(b, s)] + [Fraction(int(i == j)) for j in range(n)]
            for i, (b, s) in enumerate(shapes)]  # fmt: skip
    for col in range(n):
        pivot = next((r for r in range(col, n) if rows[r][col] != 0), None)
        if pivot is None:
            raise ValueError(f"fit: the shapes {list(shapes)} do not separate the terms")
        rows[col], rows[pivot] = rows[pivot], rows[col]
        for r in range(n):
            if r != col and rows[r][col] != 0:
                factor = rows[r][col] / rows[col][col]
                rows[r] = [x - factor * y for x, y in zip(rows[r], rows[col], strict=True)]
    inv = [[x / rows[i][i] for x in rows[i][n:]] for i in range(n)]
    den = math.lcm(*(x.denominator for row in inv for x in row))
    return tuple(tuple(x.numerator * (den // x.denominator) for x in row) for row in inv), den


def fit_single(points: list[tuple[int, int, int]]) -> Fit:
    """The :class:`Fit` at micro-batch 1 through three ``(1, seq, bytes)`` measurements: at one sequence
    the per-token and per-sequence terms coincide, so three lengths give ``s^2``, ``s`` and a constant
    (carried in ``seq2``, ``seq`` and ``const``); a ValueError when they do not separate them."""
    if len(points) < 3 or any(b != 1 for b, _, _ in points):
        raise ValueError(f"fit_single needs three micro-batch-1 measurements, got {points}")
    (_, s1, y1), (_, s2, y2), (_, s3, y3) = points[:3]
    if len({s1, s2, s3}) < 3:
        raise ValueError(f"fit_single: the lengths {[s1, s2, s3]} do not separate the terms")
    # Lagrange's interpolation in s: exact over fractions
    a = b = c = Fraction(0)
    for si, yi, others in ((s1, y1, (s2, s3)), (s2, y2, (s1, s3)), (s3, y3, (s1, s2))):
        den = Fraction((si - others[0]) * (si - others[1]))
        a += yi / den
        b -= yi * (others[0] + others[1]) / den
        c += yi * others[0] * others[1] / den
    return Fit(seq2=a, seq=b, const=c)


@dataclass(frozen=True, kw_only=True)
class Measured:
    """One block's bytes in one fake-tensor step (:func:`peakmem.simulate.derive.analyse.analyse`), event by
    event: ``forward[i]``, beyond its saved bytes, what its forward holds after its i-th event;
    ``backward[i]``, after the i-th event of its backward, (bytes alive above what was there when it
    started - the incoming gradient included, its weight gradients not - net of its saved bytes freed
    by then; those freed; its weight-gradient bytes written by then); ``grads``: all it writes;
    ``output``: of ``saved``, its output, kept by what follows it (the next block's first Linear or norm)
    and still alive when its own backward starts: under checkpointing, the next block's kept input."""

    saved: int
    forward: tuple[int, ...]
    backward: tuple[tuple[int, int, int], ...]
    grads: int = 0
    output: int = 0

    @property
    def peaks(self) -> tuple[int, int, int, int]:
        """(saved, forward transient, backward transient with the gradients written by then, freed
        then): the block's own peaks at this shape, what a :class:`BlockCost` must give back."""
        fwd = max(0, max(self.forward, default=0))
        bwd, freed = 0, 0
        for x, f, g in self.backward:
            if x + g > bwd:
                bwd, freed = x + g, f
        return self.saved, fwd, bwd, freed


@dataclass(frozen=True, kw_only=True)
class Instant:
    """One instant of a block's backward that can be its peak: ``transient``, the bytes alive then above
    what was there when its backward started, net of its saved bytes ``freed`` by then and without its
    weight gradients; ``grads``, the share of its weight gradients written by then (the estimate scales
    what the setup's method trains by it)."""

    transient: Fit
    freed: Fit = Fit()
    grads: Fraction = Fraction(1)

    def to_json(self) -> dict[str, Any]:
        return {
            "transient": self.transient.to_json(),
            "freed": self.freed.to_json(),
            "grads": str(self.grads),
        }

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> Instant:
        return cls(transient=Fit.from_json(value["transient"]), freed=Fit.from_json(value["freed"]),
                   grads=Fraction(str(value["grads"])))  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class CostAt:
    """A :class:`BlockCost` at one shape: what the estimate reads (``backward_transient`` includes the
    ``grads_in_flight``, its weight gradients written by its backward's peak)."""

    saved: int
    forward_transient: int
    backward_transient: int
    freed: int
    grads_in_flight: int
    output_kept: int | None = None  # of ``saved``, the block's output (None: not measured, costs v2)


@dataclass(frozen=True, kw_only=True)
class BlockCost:
    """One block kind's measured activation bytes in one setup family (per block, per step).

    ``saved``: what its forward leaves for backward. A block's transient peak is the largest of a few
    instants, each of whose bytes is a polynomial in the shape, and which one is largest changes with
    the shape (attention's s^2 scores overtake per-token temporaries as sequences grow; an MoE block
    peaks at its experts' output gradients, before any weight gradient exists, at short ones): one fit
    through the peaks of five small shapes mixes instants and extrapolates wrongly. So every instant
    that can be a peak is fitted on its own (event by event: the same code runs the same events at every
    shape) and the cost at a shape is their maximum. ``forward``: beyond ``saved``, what its forward
    holds at each candidate instant; ``backward``: its backward's candidate instants (:class:`Instant`).
    ``output``: of ``saved``, the block's output that what follows keeps and that is still alive when the
    block's own backward starts (under checkpointing the next block's kept input, which its recomputation
    does not rebuild; None in costs measured before it).
    ``batch1``: the costs at micro-batch 1 where they are not the batch-linear ones (a tensor broadcast
    over heads is a view at batch 1 and a copy above: matmul's ``expand`` + ``reshape``,
    ATen/native/LinearAlgebra.cpp ``_matmul_impl``), measured at micro-batch 1 on their own.
    ``long``: the costs beyond :data:`SHORT_MAX_SEQ` tokens where the short fit does not give back a
    longer sequence's bytes (a kernel working in chunks pads the sequence to whole chunks: Mamba-2's 256
    tokens, a gated delta-net's 64), fitted over longer sequences of whole chunks.
    """

    saved: Fit
    forward: tuple[Fit, ...] = ()
    backward: tuple[Instant, ...] = ()
    output: Fit | None = None
    batch1: BlockCost | None = None
    long: BlockCost | None = None

    def at(self, batch: int, seq: int, grad_bytes: int = 0) -> CostAt:
        """The costs at ``batch`` x ``seq``, ``grad_bytes`` being the block's weight gradients the setup
        writes: the backward peak is the instant with the most bytes, gradients written by then included."""
        if seq > SHORT_MAX_SEQ and self.long is not None:
            return self.long.at(batch, seq, grad_bytes)
        if batch == 1 and self.batch1 is not None:
            return self.batch1.at(batch, seq, grad_bytes)
        fwd = max((f.at(batch, seq) for f in self.forward), default=0)
        bwd = freed = grads = 0
        for inst in self.backward:
            g = round(grad_bytes * inst.grads)
            x = inst.transient.at(batch, seq) + g
            if x > bwd:
                bwd, freed, grads = x, inst.freed.at(batch, seq), g
        output = None if self.output is None else self.output.at(batch, seq)
        return CostAt(saved=self.saved.at(batch, seq), forward_transient=fwd, backward_transient=bwd,
                      freed=freed, grads_in_flight=grads, output_kept=output)  # fmt: skip

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "saved": self.saved.to_json(),
            "forward": [f.to_json() for f in self.forward],
            "backward": [i.to_json() for i in self.backward],
        }
        if self.output is not None:
            out["output"] = self.output.to_json()
        if self.batch1 is not None:
            out["batch1"] = self.batch1.to_json()
        if self.long is not None:
            out["long"] = self.long.to_json()
        return out

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> BlockCost:
        batch1, long = value.get("batch1"), value.get("long")
        return cls(
            saved=Fit.from_json(value["saved"]),
            forward=tuple(Fit.from_json(f) for f in value["forward"]),
            backward=tuple(Instant.from_json(i) for i in value["backward"]),
            output=Fit.from_json(value["output"]) if "output" in value else None,
            batch1=cls.from_json(batch1) if batch1 is not None else None,
            long=cls.from_json(long) if long is not None else None,
        )


# Shapes a block's candidate instants are compared at, to drop those that are never the largest: every
# micro-batch and sequence length a training setup plausibly runs (powers of two; the polynomials are
# smooth, so an instant that is largest only between grid points is within rounding of one that is
# largest at them), with no and with all weight gradients written.
PRUNE_BATCHES = (1, 2, 4, 8, 16, 32, 64, 128)
PRUNE_SEQS = tuple(2**k for k in range(4, 21))  # 16 .. 1,048,576 tokens


def block_cost(points: list[tuple[int, int, Measured]], *, single: bool = False) -> BlockCost:
    """A :class:`BlockCost` from one block's measurements at five shapes (:data:`N_TERMS`; with
    ``single``, three micro-batch-1 shapes): every event that can be a peak (the last before a
    decrease) is fitted across the shapes on its own; the candidates never largest on the
    :data:`PRUNE_BATCHES` x :data:`PRUNE_SEQS` grid are dropped. Shapes whose events do not line up
    (a kernel chosen by shape) are fitted through their peaks instead (one instant each)."""
    fitter = fit_single if single else fit
    pts = [(b, s, m) for b, s, m in points]
    saved = fitter([(b, s, m.saved) for b, s, m in pts])
    batches = (1,) if single else PRUNE_BATCHES
    grid = [(b, s) for b in batches for s in PRUNE_SEQS]
    total = pts[0][2].grads
    aligned_fwd = len({len(m.forward) for _, _, m in pts}) == 1
    aligned_bwd = len({len(m.backward) for _, _, m in pts}) == 1 and all(m.grads == total for _, _, m in pts)
    if aligned_fwd:
        idx = _candidates([list(m.forward) for _, _, m in pts])
        fwd_fits = [fitter([(b, s, m.forward[i]) for b, s, m in pts]) for i in idx]
        forward = _prune(fwd_fits, lambda f, b, s, w: f.at(b, s), grid, (0,))
    else:
        forward = [fitter([(b, s, m.peaks[1]) for b, s, m in pts])]
    if aligned_bwd:
        idx = _candidates([[x for x, _, _ in m.backward] for _, _, m in pts])
        instants = [
            Instant(transient=fitter([(b, s, m.backward[i][0]) for b, s, m in pts]),
                    freed=fitter([(b, s, m.backward[i][1]) for b, s, m in pts]),
                    grads=Fraction(pts[0][2].backward[i][2], total) if total else Fraction(0))
            for i in idx
        ]  # fmt: skip
        backward = _prune(
            instants, lambda c, b, s, w: c.transient.at(b, s) + round(w * c.grads), grid, (0, total)
        )
    else:  # through the peaks (all the block's weight gradients added to them: the formulas' convention)
        at_peak = [(b, s, max(m.backward, default=(0, 0, 0))) for b, s, m in pts]
        backward = [Instant(transient=fitter([(b, s, x) for b, s, (x, _, _) in at_peak]),
                            freed=fitter([(b, s, f) for b, s, (_, f, _) in at_peak]))]  # fmt: skip
    output = fitter([(b, s, m.output) for b, s, m in pts])
    return BlockCost(saved=saved, forward=tuple(forward), backward=tuple(backward), output=output)


def batch_linear_at(points: list[tuple[int, int, Measured]], batch: int, seq: int, other: Measured) -> bool:
    """Whether the costs fitted over ``points`` give back ``other``, measured at ``batch`` x ``seq``,
    event by event at every instant that can be a peak (so not only at the peak this shape happens to
    have): the same events, and each candidate's fit equal to its bytes there."""
    everything = [*points, (batch, seq, other)]
    if (
        len({len(m.forward) for _, _, m in everything}) != 1
        or len({len(m.backward) for _, _, m in everything}) != 1
    ):
        return False
    for name in ("saved", "output"):
        if fit([(b, s, getattr(m, name)) for b, s, m in points]).at(batch, seq) != getattr(other, name):
            return False
    for i in _candidates([list(m.forward) for _, _, m in everything]):
        if fit([(b, s, m.forward[i]) for b, s, m in points]).at_signed(batch, seq) != other.forward[i]:
            return False
    for i in _candidates([[x for x, _, _ in m.backward] for _, _, m in everything]):
        for j in range(3):
            if (
                fit([(b, s, m.backward[i][j]) for b, s, m in points]).at_signed(batch, seq)
                != other.backward[i][j]
            ):
                return False
    return True


def _candidates(series: list[list[int]]) -> list[int]:
    """Indices that can hold a peak in any of the aligned ``series``: the last event before a decrease,
    and the last one."""
    n = len(series[0])
    if n == 0:
        return []
    out = {n - 1}
    for vals in series:
        out |= {i for i in range(n - 1) if vals[i + 1] < vals[i]}
    return sorted(out)


def _prune(cands: list[Any], value: Callable[[Any, int, int, int], int], grid: list[tuple[int, int]],
           weights: tuple[int, ...]) -> list[Any]:  # fmt: skip
    """The candidates that are the largest (the first, on ties) at some grid shape for some gradient
    bytes in ``weights`` (``value(candidate, batch, seq, grad_bytes)``), in their order."""
    if len(cands) <= 1:
        return cands
    keep: set[int] = set()
    for b, s in grid:
        for w in weights:
            values = [value(c, b, s, w) for c in cands]
            keep.add(values.index(max(values)))
    return [c for i, c in enumerate(cands) if i in keep]


Costs = dict[str, BlockCost]  # DerivedBlock.key -> its cost


def block_kind(key: str) -> str:
    """A block key without its edge suffix (:data:`FIRST_BLOCK`, :data:`LAST_BLOCK`): its kind's key."""
    return key.removesuffix(LAST_BLOCK).removesuffix(FIRST_BLOCK)


def block_key_costs(costs: Costs, key: str) -> BlockCost | None:
    """The cost of a block key, an edge block's (:data:`FIRST_BLOCK`, :data:`LAST_BLOCK`) falling back
    to its kind's when it was not measured apart (it did not differ, or shipped data predates it)."""
    while True:
        cost = costs.get(key)
        if cost is not None:
            return cost
        for suffix in (FIRST_BLOCK, LAST_BLOCK):
            if key.endswith(suffix):
                key = key.removesuffix(suffix)
                break
        else:
            return None


# --- where costs come from ---------------------------------------------------------------------------
Provider = Callable[[Mapping[str, Any], str], Costs]
_PROVIDER: list[Provider] = []
_CONFIGS: dict[str, Mapping[str, Any]] = {}  # config hash -> the config (for the provider)
_MEMORY: dict[tuple[str, str], Costs] = {}
_SHIPPED_INDEX: dict[str, dict[str, Any]] | None = None  # config hash -> its parsed shipped file


def set_provider(provider: Provider | None) -> None:
    """Register the function that measures costs (``peakmem.simulate.derive`` does, when imported: the
    store never imports an oracle; :func:`provided_lookup` calls it)."""
    _PROVIDER.clear()
    if provider is not None:
        _PROVIDER.append(provider)


def config_hash(config: Mapping[str, Any]) -> str:
    """A stable 16-hex-digit hash of a config dict (keys sorted; bookkeeping keys ignored)."""
    # quantization_config: how the checkpoint stores its weights, not the modules transformers builds
    drop = ("_name_or_path", "transformers_version", "quantization_config")
    body = json.dumps({k: v for k, v in config.items() if k not in drop}, sort_keys=True, default=str)
    return hashlib.sha256(body.encode()).hexdigest()[:16]


def register_config(config: Mapping[str, Any]) -> str:
    """Remember ``config`` so that its costs can be measured later; returns its hash."""
    key = config_hash(config)
    _CONFIGS[key] = config
    return key


def cache_dir() -> Path:
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "peakmem" / "derived"


def _cache_file(chash: str, family: str) -> Path:
    """One file per (config, family); the family (with a LoRA config, long) hashed into the name."""
    return cache_dir() / f"{chash}--{hashlib.sha256(family.encode()).hexdigest()[:16]}.json"


def stored_costs(chash: str, family: str) -> Costs | None:
    """The stored costs of a derived spec's blocks in ``family`` (memory, shipped data, disk cache), or
    None: nothing here measures."""
    hit = _MEMORY.get((chash, family))
    if hit is not None:
        return hit
    found = _shipped_costs(chash, family)
    if found is None:
        found = _read_cache(chash, family)
    if found is not None:
        _MEMORY[(chash, family)] = found
    return found


def _not_stored(chash: str, family: str) -> ConfigError:
    return ConfigError(
        f"no measured block costs for this derived model (config {chash}) in setup family "
        f"{family!r}: measuring them needs torch and transformers ({TORCH_HINT})"
    )


def costs_for(chash: str, family: str) -> Costs:
    """The stored costs (:func:`stored_costs`), else those the registered provider measures (it also
    writes the cache); a ConfigError naming the extra that installs torch where there is no provider."""
    found = stored_costs(chash, family)
    if found is None:
        config = _CONFIGS.get(chash)
        if not _PROVIDER or config is None:
            raise _not_stored(chash, family)
        found = _PROVIDER[0](config, family)
        _write_cache(chash, family, found)
        _MEMORY[(chash, family)] = found
    return found


def costs_ready(chash: str, family: str) -> bool:
    """Whether :func:`stored_costs` answers (memory, shipped data or the disk cache): nothing to measure."""
    return stored_costs(chash, family) is not None


def stored_lookup(spec: ModelSpec, family: str, key: str) -> BlockCost | None:
    """A :data:`~peakmem.model.CostLookup` over the stored costs only (what an estimator reads unless its
    caller hands it a measuring one): a ConfigError where ``family`` is not stored for ``spec``."""
    costs = stored_costs(spec.derived_from, family)
    if costs is None:
        raise _not_stored(spec.derived_from, family)
    return block_key_costs(costs, key)


def provided_lookup(spec: ModelSpec, family: str, key: str) -> BlockCost | None:
    """A :data:`~peakmem.model.CostLookup` that measures what is not stored through the registered
    provider (:func:`peakmem.simulate.measuring_lookup` registers the oracle and hands this out)."""
    return block_key_costs(costs_for(spec.derived_from, family), key)


# --- the disk cache: data from disk, checked before it is believed ---------------------------------
# A cache file is untrusted like any file (peakmem.userfiles): read bounded, parsed depth-safe, and
# believed only when its digest (sha256 over its canonical JSON with the code's version) matches, its
# layout and costs versions are this code's, it names the config hash and family it is filed under, and
# its values pass the same limits as a config.json (a spec) or a bounded number (a cost). Anything else
# is ignored with a note in the answer (peakmem.progress) and measured again where torch is there.
MAX_CACHE_BYTES = (
    4 * 1000 * 1000
)  # a family's costs are ~10 KB, a spec ~100 KB; the largest shipped file 260 kB
MAX_COST_DIGITS = 60  # digits of one fitted coefficient's numerator or denominator (real ones: < 20)


def _digest(body: Mapping[str, Any]) -> str:
    from peakmem import __version__

    text = json.dumps({"peakmem": __version__, **body}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def _ignored(path: Path, why: str) -> None:
    progress.note(f"ignored the cached file {path.name} ({why}); its costs are measured again")


def _read_checked(path: Path, **expected: Any) -> dict[str, Any] | None:
    """The cache file's body when every check passes (``expected``: fields it must hold, as written),
    else None (a missing file silently; any other failure with a note)."""
    from peakmem.errors import InputError
    from peakmem.userfiles import parse_json, read_user_text

    if not os.path.lexists(path):
        return None
    try:
        data = parse_json(read_user_text(path, what="a cache file", max_bytes=MAX_CACHE_BYTES))
    except (InputError, OSError, ValueError) as err:
        _ignored(path, str(err).removeprefix(f"{path}: ")[:160])
        return None
    if not isinstance(data, dict) or not isinstance(data.get("digest"), str):
        _ignored(path, "not a cache file of this layout")
        return None
    digest = data.pop("digest")
    if digest != _digest(data):
        _ignored(path, "its contents do not match its digest: edited, truncated or of another version")
        return None
    for key, want in expected.items():
        if data.get(key) != want:
            _ignored(path, f"{key} {data.get(key)!r}, expected {want!r}")
            return None
    return data


def _write_checked(path: Path, body: dict[str, Any]) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps({**body, "digest": _digest(body)}, indent=1, sort_keys=True))
        tmp.replace(path)
    except OSError:
        pass  # a read-only cache only costs a re-measurement next time


def _costs_from_json(doc: Any) -> Costs:
    """Costs as a cache file holds them, each coefficient a bounded fraction (a ValueError otherwise)."""
    if not isinstance(doc, dict) or not all(isinstance(k, str) for k in doc):
        raise ValueError("costs: not an object of block keys")
    costs = {k: BlockCost.from_json(v) for k, v in doc.items()}
    for key, cost in costs.items():
        for fit_ in _fits(cost):
            for c in fit_.coefficients:
                if max(len(str(abs(c.numerator))), len(str(c.denominator))) > MAX_COST_DIGITS:
                    raise ValueError(f"costs of {key}: a coefficient of more than {MAX_COST_DIGITS} digits")
    return costs


def _fits(cost: Any) -> Iterator[Fit]:
    """Every Fit inside a BlockCost (its instants, its micro-batch-1 and long costs)."""
    for f in dataclasses.fields(cost):
        value = getattr(cost, f.name)
        for v in value if isinstance(value, tuple) else (value,):
            if isinstance(v, Fit):
                yield v
            elif dataclasses.is_dataclass(v) and not isinstance(v, type):
                yield from _fits(v)


def cached_spec(config: Mapping[str, Any], name: str | None = None) -> Any:
    """The derived spec of ``config`` from the disk cache (written by :func:`cache_spec`), or None:
    a second ``train`` of a new family then needs neither torch nor transformers. The spec passes the
    limits a config.json does (layers, widths, heads, vocabulary), else it is ignored."""
    chash = config_hash(config)
    path = cache_dir() / f"{chash}--spec.json"
    data = _read_checked(path, format=FORMAT, spec_version=SPEC_VERSION, config=chash)
    if data is None:
        return None
    try:
        spec = spec_from_json(data["spec"])
        _check_spec(spec, chash)
    except (KeyError, TypeError, ValueError, AttributeError, RecursionError) as err:
        _ignored(path, f"not a valid spec: {str(err)[:120]}")
        return None
    register_config(config)
    return dataclasses.replace(spec, name=name) if name else spec


def _check_spec(spec: Any, chash: str) -> None:
    """A spec read from disk within the limits a config.json is held to (peakmem.validate)."""
    from peakmem.model import ModelSpec
    from peakmem.validate import MAX_HEADS, MAX_LAYERS, MAX_VOCAB, MAX_WIDTH

    if not isinstance(spec, ModelSpec) or spec.derived_from != chash:
        raise ValueError(f"it was derived from config {getattr(spec, 'derived_from', None)!r}, not {chash}")
    limits = ((spec.num_layers, MAX_LAYERS, "layers"), (spec.hidden_size, MAX_WIDTH, "hidden size"),
              (spec.vocab_size, MAX_VOCAB, "vocabulary"))  # fmt: skip
    for value, limit, what in limits:
        if not isinstance(value, int) or not 0 <= value <= limit:
            raise ValueError(f"{what} {value!r} outside 0..{limit:,}")
    for g in spec.groups:
        heads = g.layer.attention.num_heads
        if not (isinstance(g.count, int) and 0 < g.count <= MAX_LAYERS and 0 <= heads <= MAX_HEADS):
            raise ValueError(f"a layer group of {g.count!r} layers, {heads!r} heads")


def cache_spec(config: Mapping[str, Any], spec: Any) -> None:
    chash = config_hash(config)
    body = {"format": FORMAT, "spec_version": SPEC_VERSION, "config": chash, "spec": spec_to_json(spec)}
    _write_checked(cache_dir() / f"{chash}--spec.json", body)


def family_revision(family: str) -> int | None:
    """The revision the cached costs of ``family`` carry (:data:`FAMILY_REVISIONS`; None: no revision)."""
    return max((rev for part, rev in FAMILY_REVISIONS.items() if part in family), default=None)


def _read_cache(chash: str, family: str) -> Costs | None:
    path = _cache_file(chash, family)
    data = _read_checked(path, format=FORMAT, costs_version=COSTS_VERSION, config=chash, family=family,
                         revision=family_revision(family))  # fmt: skip
    if data is None:
        return None
    try:
        return _costs_from_json(data.get("costs"))
    except (KeyError, TypeError, ValueError, ZeroDivisionError, AttributeError) as err:
        _ignored(path, f"not valid costs: {str(err)[:120]}")
        return None


def _write_cache(chash: str, family: str, costs: Costs) -> None:
    body = {"format": FORMAT, "costs_version": COSTS_VERSION, "config": chash, "family": family,
            "costs": {k: v.to_json() for k, v in costs.items()}}  # fmt: skip
    revision = family_revision(family)
    if revision is not None:
        body["revision"] = revision
    _write_checked(_cache_file(chash, family), body)


# --- shipped data: spec + costs per catalog model ----------------------------------------------------
def _shipped_index() -> dict[str, dict[str, Any]]:
    """The shipped files, parsed once per process, by config hash."""
    global _SHIPPED_INDEX
    if _SHIPPED_INDEX is None:
        index: dict[str, dict[str, Any]] = {}
        if SHIPPED.is_dir():
            for path in sorted(SHIPPED.glob("*.json")):
                try:
                    data = json.loads(path.read_text())
                except (OSError, ValueError):
                    continue
                if isinstance(data, dict) and isinstance(data.get("config_hash"), str):
                    index[data["config_hash"]] = data
        _SHIPPED_INDEX = index
    return _SHIPPED_INDEX


def _shipped_costs(chash: str, family: str) -> Costs | None:
    data = _shipped_index().get(chash)
    if data is None:
        return None
    fam = data.get("costs", {}).get(family)
    if fam is None or data.get("costs_version") != COSTS_VERSION:  # measured in another layout: stale
        return None
    return {k: BlockCost.from_json(v) for k, v in fam.items()}


def shipped_spec(config: Mapping[str, Any], name: str | None = None) -> Any:
    """The shipped derived :class:`~peakmem.model.ModelSpec` for ``config``, or None."""
    data = _shipped_index().get(config_hash(config))
    if data is None:
        return None
    spec = spec_from_json(data["spec"])
    return dataclasses.replace(spec, name=name) if name else spec


def shipped_document(spec: Any, costs: Mapping[str, Costs]) -> dict[str, Any]:
    """The JSON document ``benchmarks/derive_catalog.py`` writes for one model."""
    return {
        "format": FORMAT,
        "costs_version": COSTS_VERSION,
        "config_hash": spec.derived_from,
        "spec": spec_to_json(spec),
        "costs": {fam: {k: v.to_json() for k, v in c.items()} for fam, c in sorted(costs.items())},
    }


# --- ModelSpec <-> JSON (generic over the frozen dataclasses of peakmem.model) -----------------------
def spec_to_json(spec: Any) -> dict[str, Any]:
    out: dict[str, Any] = _to_json(spec)
    return out


def _to_json(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _to_json(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (tuple, list)):
        return [_to_json(v) for v in value]
    return value


def spec_from_json(data: Mapping[str, Any]) -> Any:
    from peakmem.model import ModelSpec

    return _from_json(ModelSpec, data)


def _from_json(tp: Any, value: Any) -> Any:
    import peakmem.model as model_mod

    if dataclasses.is_dataclass(tp):
        hints = typing.get_type_hints(tp, vars(model_mod))
        kwargs = {
            f.name: _from_json(hints[f.name], value[f.name])
            for f in dataclasses.fields(tp)
            if f.init and f.name in value
        }
        return tp(**kwargs)  # type: ignore[operator]
    origin = typing.get_origin(tp)
    if origin is tuple:
        args = typing.get_args(tp)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_from_json(args[0], v) for v in value)
        return tuple(_from_json(a, v) for a, v in zip(args, value, strict=True))
    if origin in (typing.Union, types.UnionType):
        if value is None:
            return None
        for arg in typing.get_args(tp):
            if arg is not type(None):
                return _from_json(arg, value)
    return value
