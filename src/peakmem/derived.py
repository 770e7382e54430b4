"""Derived specs and measured block costs, as data: read, written and looked up without torch.

A *derived* spec is one :mod:`peakmem.simulate.derive` built from transformers' own modules for an
architecture :mod:`peakmem.hf` does not know. Its repeated blocks carry a
:class:`~peakmem.model.DerivedBlock` whose activation bytes are *measured* (fake-tensor runs of the
real model at a few small shapes) and fitted here as ``per_token * B*s + per_seq2 * B*s^2 + const``.

Costs depend on the setup's *family* (:func:`family_key`: precision, attention kernel, kernel
policy, method and adapter); sharding, checkpointing, accumulation and the optimizer are applied by
the formulas on top, so one family serves every layout. Where the costs come from, in order:

1. this process's memory;
2. the package's shipped data (``peakmem/catalog/derived/<name>.json``, written by
   ``benchmarks/derive_catalog.py``): catalog models answer without torch;
3. the on-disk cache, ``$PEAKMEM_DERIVED_CACHE`` or ``$XDG_CACHE_HOME/peakmem/derived/``
   (``~/.cache/peakmem/derived/``), one file per (config hash, family);
4. the *provider*, a function the oracle registers (:func:`set_provider`) that measures them; without
   torch there is none, and the error says which extra installs it.

Standard library only (the core imports it); the only I/O is the cache and the shipped files.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

from peakmem.errors import ConfigError

FORMAT = 3  # the JSON layout written below; bumped when it changes
# the cached spec's content within FORMAT: 2 = DerivedBlock carries the measured recurrent state
# (specs cached before it lack the state of SSM / linear-attention blocks: derived again); 3 = components
# labelled as hf.py labels them (simulate/derive.py _block_component: q/k norms are norms)
SPEC_VERSION = 3
# the cached costs' measurement within FORMAT: 2 = flash's backward scratch measured at S rows, unpadded
# (simulate/derive.py _forward_backward); costs cached before it are measured again
COSTS_VERSION = 2
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
        terms = _terms(batch, seq)
        value = sum((c * t for c, t in zip(self.coefficients, terms, strict=True)), Fraction(0))
        return max(0, round(value))

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
    """The exact :class:`Fit` through five ``(batch, seq, bytes)`` measurements (Gaussian
    elimination over fractions); a ValueError when the shapes do not separate the terms."""
    if len(points) < N_TERMS:
        raise ValueError(f"fit needs {N_TERMS} measurements, got {len(points)}")
    rows = [[Fraction(t) for t in _terms(b, s)] + [Fraction(y)] for b, s, y in points[:N_TERMS]]
    n = N_TERMS
    for col in range(n):
        pivot = next((r for r in range(col, n) if rows[r][col] != 0), None)
        if pivot is None:
            shapes = [(b, s) for b, s, _ in points[:n]]
            raise ValueError(f"fit: the shapes {shapes} do not separate the terms")
        rows[col], rows[pivot] = rows[pivot], rows[col]
        for r in range(n):
            if r != col and rows[r][col] != 0:
                factor = rows[r][col] / rows[col][col]
                rows[r] = [x - factor * y for x, y in zip(rows[r], rows[col], strict=True)]
    coef = [rows[i][n] / rows[i][i] for i in range(n)]
    return Fit(per_token=coef[0], per_seq2=coef[1], seq2=coef[2], seq=coef[3], const=coef[4])


@dataclass(frozen=True, kw_only=True)
class BlockCost:
    """One block kind's measured activation bytes in one setup family (per block, per step).

    ``saved``: what its forward leaves for backward; ``forward_transient``: beyond ``saved``, the most
    alive at once during its forward; ``backward_transient``: during its backward, the most alive above
    what was there when it started (the incoming gradient included), net of its saved bytes freed by
    then and *without* its weight gradients (the estimate adds those, as many as the method trains);
    ``freed``: of its saved bytes, those freed at that instant.
    """

    saved: Fit
    forward_transient: Fit
    backward_transient: Fit
    freed: Fit = Fit()

    def to_json(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name).to_json() for f in dataclasses.fields(self)}

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> BlockCost:
        return cls(
            **{f.name: Fit.from_json(value[f.name]) for f in dataclasses.fields(cls) if f.name in value}
        )


Costs = dict[str, BlockCost]  # DerivedBlock.key -> its cost


_ADAPTERS: dict[str, tuple[Any, Any]] = {}  # adapter key -> (LoraConfig, QuantConfig) it stands for


def family_key(
    *, precision: str, kernel: str, policy: str, method: str, adapter: str = "", objects: Any = None
) -> str:
    """What measured costs depend on: ``mixed-bf16|sdpa|cuda|full`` (``|<adapter>`` for LoRA/QLoRA:
    the adapter's settings; ``objects``, the (LoraConfig, QuantConfig) pair, is remembered for the
    provider, which builds the same adapters)."""
    parts = [precision, kernel, policy, method]
    if adapter:
        parts.append(adapter)
        if objects is not None:
            _ADAPTERS[adapter] = objects
    return "|".join(parts)


def adapter_objects(adapter: str) -> Any:
    """The (LoraConfig, QuantConfig) an adapter key was made from in this process (None if unknown)."""
    return _ADAPTERS.get(adapter)


# --- where costs come from ---------------------------------------------------------------------------
Provider = Callable[[Mapping[str, Any], str], Costs]
_PROVIDER: list[Provider] = []
_CONFIGS: dict[str, Mapping[str, Any]] = {}  # config hash -> the config (for the provider)
_MEMORY: dict[tuple[str, str], Costs] = {}
_SHIPPED_INDEX: dict[str, Path] | None = None


def set_provider(provider: Provider | None) -> None:
    """Register the function that measures costs (``peakmem.simulate.derive`` does, when imported)."""
    _PROVIDER.clear()
    if provider is not None:
        _PROVIDER.append(provider)


def config_hash(config: Mapping[str, Any]) -> str:
    """A stable 16-hex-digit hash of a config dict (keys sorted; bookkeeping keys ignored)."""
    drop = ("_name_or_path", "transformers_version")
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


def costs_for(chash: str, family: str) -> Costs:
    """The measured costs of a derived spec's blocks in ``family`` (memory, shipped data, disk cache,
    then the provider, which also writes the cache)."""
    hit = _MEMORY.get((chash, family))
    if hit is not None:
        return hit
    found = _shipped_costs(chash, family)
    if found is None:
        found = _read_cache(chash, family)
    if found is None:
        config = _CONFIGS.get(chash)
        if not _PROVIDER:
            _load_oracle()
        if not _PROVIDER or config is None:
            raise ConfigError(
                f"no measured block costs for this derived model (config {chash}) in setup family "
                f"{family!r}: measuring them needs torch and transformers ({TORCH_HINT})"
            )
        found = _PROVIDER[0](config, family)
        _write_cache(chash, family, found)
    _MEMORY[(chash, family)] = found
    return found


def costs_ready(chash: str, family: str) -> bool:
    """Whether :func:`costs_for` answers without measuring (memory, shipped data or the disk cache)."""
    return (
        (chash, family) in _MEMORY
        or _shipped_costs(chash, family) is not None
        or _read_cache(chash, family) is not None
    )


def _load_oracle() -> None:
    """Import :mod:`peakmem.simulate.derive` (it registers the provider) when torch and transformers
    are installed; by name, lazily: the core never imports an oracle at module level."""
    import importlib
    import importlib.util

    if importlib.util.find_spec("torch") is None or importlib.util.find_spec("transformers") is None:
        return
    set_provider(importlib.import_module("peakmem.simulate.derive").measure_costs)


def cached_spec(config: Mapping[str, Any], name: str | None = None) -> Any:
    """The derived spec of ``config`` from the disk cache (written by :func:`cache_spec`), or None:
    a second ``train`` of a new family then needs neither torch nor transformers."""
    chash = config_hash(config)
    try:
        data = json.loads((cache_dir() / f"{chash}--spec.json").read_text())
        if data.get("format") != FORMAT or data.get("spec_version") != SPEC_VERSION:
            return None
        spec = spec_from_json(data["spec"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    register_config(config)
    return dataclasses.replace(spec, name=name) if name else spec


def cache_spec(config: Mapping[str, Any], spec: Any) -> None:
    path = cache_dir() / f"{config_hash(config)}--spec.json"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        body = {"format": FORMAT, "spec_version": SPEC_VERSION, "spec": spec_to_json(spec)}
        tmp.write_text(json.dumps(body))
        tmp.replace(path)
    except OSError:
        pass


def _read_cache(chash: str, family: str) -> Costs | None:
    path = _cache_file(chash, family)
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("format") != FORMAT or data.get("family") != family:
        return None
    if data.get("costs_version") != COSTS_VERSION:
        return None
    try:
        return {k: BlockCost.from_json(v) for k, v in data["costs"].items()}
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return None


def _write_cache(chash: str, family: str, costs: Costs) -> None:
    path = _cache_file(chash, family)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        body = {"format": FORMAT, "costs_version": COSTS_VERSION, "config": chash, "family": family,
                "costs": {k: v.to_json() for k, v in costs.items()}}  # fmt: skip
        tmp.write_text(json.dumps(body, indent=1, sort_keys=True))
        tmp.replace(path)
    except OSError:
        pass  # a read-only cache only costs a re-measurement next time


# --- shipped data: spec + costs per catalog model ----------------------------------------------------
def _shipped_index() -> dict[str, Path]:
    global _SHIPPED_INDEX
    if _SHIPPED_INDEX is None:
        index: dict[str, Path] = {}
        if SHIPPED.is_dir():
            for path in sorted(SHIPPED.glob("*.json")):
                try:
                    data = json.loads(path.read_text())
                except (OSError, ValueError):
                    continue
                if isinstance(data, dict) and isinstance(data.get("config_hash"), str):
                    index[data["config_hash"]] = path
        _SHIPPED_INDEX = index
    return _SHIPPED_INDEX


def _shipped_costs(chash: str, family: str) -> Costs | None:
    path = _shipped_index().get(chash)
    if path is None:
        return None
    data = json.loads(path.read_text())
    fam = data.get("costs", {}).get(family)
    if fam is None:
        return None
    return {k: BlockCost.from_json(v) for k, v in fam.items()}


def shipped_spec(config: Mapping[str, Any], name: str | None = None) -> Any:
    """The shipped derived :class:`~peakmem.model.ModelSpec` for ``config``, or None."""
    path = _shipped_index().get(config_hash(config))
    if path is None:
        return None
    spec = spec_from_json(json.loads(path.read_text())["spec"])
    return dataclasses.replace(spec, name=name) if name else spec


def shipped_document(spec: Any, costs: Mapping[str, Costs]) -> dict[str, Any]:
    """The JSON document ``benchmarks/derive_catalog.py`` writes for one model."""
    return {
        "format": FORMAT,
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
