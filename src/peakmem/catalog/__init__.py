"""The catalog: models and GPUs as data, each entry with its source; exact lookup with suggestions.

:class:`Gpu` is defined in :mod:`peakmem.device` (formulas describe GPUs without the catalog) and
re-exported here.

``MODELS`` and ``GPUS`` are tuples built on first use (module ``__getattr__``), so that
``import peakmem.catalog`` stays cheap. Lookup is exact and case-insensitive on an entry's name and
its declared aliases; a miss raises :class:`~peakmem.errors.UnknownNameError` with close names.
There are no fuzzy hits: ``a100`` finds an A100 only because an entry declares that alias.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from peakmem.device import Gpu, Vendor
from peakmem.errors import UnknownNameError, require, suggest


@dataclass(frozen=True, kw_only=True)
class CatalogModel:
    """A model known by name: its Hub ``config.json`` (architecture keys) and where it came from."""

    name: str  # short canonical name, lowercase: "gpt2-xl", "llama-3.1-8b"
    family: str  # "gpt2", "llama", "qwen3", ...
    hub_id: str  # the repository on the Hugging Face Hub the config comes from
    config: Mapping[str, Any] = field(hash=False, compare=False, repr=False)
    source: str  # URL of the config.json
    aliases: tuple[str, ...] = ()
    reported_params: int | None = None  # total count from the model card or paper, when stated
    note: str = ""  # uncertain values, deviations from the Hub file
    variant_of: str | None = None  # a head/task variant of another entry; does not answer to hub_id

    def __post_init__(self) -> None:
        require(self.name == self.name.lower() and bool(self.name), "name", self.name, "must be lowercase")
        require("model_type" in self.config, "config", self.name, "must name its model_type")

    @property
    def names(self) -> tuple[str, ...]:
        """Every name the entry answers to: its name, Hub id (unless a variant) and aliases."""
        if self.variant_of is not None:
            return (self.name, *self.aliases)
        return (self.name, self.hub_id, *self.aliases)


if TYPE_CHECKING:
    MODELS: tuple[CatalogModel, ...]
    GPUS: tuple[Gpu, ...]


def __getattr__(name: str) -> object:
    """Build ``MODELS`` / ``GPUS`` on first access."""
    if name == "MODELS":
        return _models()
    if name == "GPUS":
        return _gpus()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@functools.cache
def _models() -> tuple[CatalogModel, ...]:
    from peakmem.catalog.models import MODEL_ENTRIES

    # A read-only view: lookups hand out the shared dict, callers copy it (dict(entry.config)).
    return tuple(
        CatalogModel(**{**entry, "config": MappingProxyType(entry["config"])})
        for entry in (*MODEL_ENTRIES, *_config_entries())
    )


# Entries kept as whole config.json files (catalog/configs/<name>.json: this year's flagships, many of
# model types the formulas do not know, answered through the derived path); keys beyond CatalogModel's
# (``reported_params_text``: the card's rounding, for tests) are dropped.
_CONFIG_KEYS = ("name", "family", "hub_id", "config", "source", "aliases", "reported_params", "note")


def _config_entries() -> list[dict[str, Any]]:
    import json
    from importlib.resources import files

    out = []
    for path in sorted(files("peakmem.catalog").joinpath("configs").iterdir(), key=lambda p: p.name):
        if path.name.endswith(".json"):
            doc = json.loads(path.read_text(encoding="utf-8"))
            out.append({k: tuple(v) if k == "aliases" else v for k, v in doc.items() if k in _CONFIG_KEYS})
    return out


@functools.cache
def _gpus() -> tuple[Gpu, ...]:
    from peakmem.catalog.gpus import GPU_ENTRIES

    return tuple(Gpu(**entry) for entry in GPU_ENTRIES)


def _index(entries: tuple[Any, ...], kind: str) -> dict[str, Any]:
    index: dict[str, Any] = {}
    for entry in entries:
        for alias in entry.names:
            key = alias.lower()
            other = index.get(key)
            if other is not None and other is not entry:
                raise ValueError(f"{kind} name {alias!r} is declared by {other.name!r} and {entry.name!r}")
            index[key] = entry
    return index


@functools.cache
def _model_index() -> dict[str, CatalogModel]:
    return _index(_models(), "model")


@functools.cache
def _gpu_index() -> dict[str, Gpu]:
    return _index(_gpus(), "gpu")


def model_names() -> list[str]:
    """Canonical model names, in catalog order."""
    return [m.name for m in _models()]


def gpu_names() -> list[str]:
    return [g.name for g in _gpus()]


def find_model(name: str) -> CatalogModel | None:
    """The entry whose name, Hub id or alias equals ``name`` (case-insensitive), else None."""
    return _model_index().get(name.strip().lower())


def find_gpu(name: str) -> Gpu | None:
    return _gpu_index().get(name.strip().lower())


def get_model(name: str) -> CatalogModel:
    """Exact lookup; raises UnknownNameError (exit 3) with close names on a miss."""
    entry = find_model(name)
    if entry is None:
        raise unknown_model(name)
    return entry


def get_gpu(name: str) -> Gpu:
    """Exact lookup; raises UnknownNameError (exit 3) with close names on a miss."""
    entry = find_gpu(name)
    if entry is None:
        raise unknown_gpu(name)
    return entry


def unknown_model(name: str) -> UnknownNameError:
    """The error for a model name that is not in the catalog, with close catalog names."""
    return _unknown("model", name, _models())


def unknown_gpu(name: str) -> UnknownNameError:
    return _unknown("gpu", name, _gpus())


# How many close names an unknown-name error offers.
_MAX_SUGGESTIONS = 3


def _unknown(kind: str, name: str, entries: tuple[Any, ...]) -> UnknownNameError:
    """Match ``name`` against every name and short alias, then offer the canonical names hit.

    Aliases widen the net (``4900`` is close to the alias ``4090``) while the message names each
    entry once, by its canonical name. Hub ids are matched on their repository part.
    """
    owner: dict[str, str] = {}
    for entry in entries:
        for alias in entry.names:
            owner.setdefault(alias.rsplit("/", 1)[-1].lower(), entry.name)
    key = name.strip().rsplit("/", 1)[-1]
    hits: list[str] = []
    for hit in suggest(key, owner, limit=4 * _MAX_SUGGESTIONS):
        canonical = owner[hit.lower()]
        if canonical not in hits:
            hits.append(canonical)
    canonical_names = [e.name for e in entries]
    return UnknownNameError(kind, name, canonical_names, suggestions=hits[:_MAX_SUGGESTIONS])


__all__ = [
    "GPUS", "MODELS", "CatalogModel", "Gpu", "Vendor", "find_gpu", "find_model", "get_gpu", "get_model",
    "gpu_names", "model_names", "unknown_gpu", "unknown_model",
]  # fmt: skip
