"""Turn the command line's MODEL and GPU arguments into a ModelSpec and a Gpu.

MODEL, in the order tried (DESIGN.md, "The command line"):

1. a catalog name or alias (``gpt2-xl``, ``meta-llama/Llama-3.1-8B``): the catalog's config;
2. an existing path to a ``config.json``, or to a folder holding one;
3. a Hub id (``owner/name``): config.json fetched through huggingface_hub's cache
   (:mod:`peakmem.hub`, imported only then);
4. anything else: :class:`~peakmem.errors.UnknownNameError` with close catalog names.

GPU: a catalog name or alias (``4090``, ``h100``), or a plain size (``24GB``, ``24 GiB``,
``24g``) that becomes an anonymous :class:`~peakmem.catalog.Gpu` of exactly that many bytes.
"""

from __future__ import annotations

import copy
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from peakmem.catalog import GPUS, Gpu, find_gpu, find_model, get_gpu, unknown_gpu, unknown_model
from peakmem.errors import ConfigError, InputError, UnknownNameError
from peakmem.formulas.step_time import REFERENCE_GPU
from peakmem.hf import check_config, read_config_file
from peakmem.model import CostLookup, ModelSpec
from peakmem.units import ACCEPTED_SIZE_FORMS, looks_like_size, parse_size
from peakmem.validate import MAX_DEVICE_BYTES, too_large

CONFIG_FILE = "config.json"
# A Hub repository id: "owner/name", letters, digits, '-', '_', '.' (huggingface_hub's
# validate_repo_id allows the same characters, at most 96 of them).
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*/[A-Za-z0-9][A-Za-z0-9_.\-]*$")
HUB_ID_MAX_LEN = 96
MAX_MODEL_ARG_LEN = 4096  # PATH_MAX on Linux: no path or name is longer
MAX_GPU_ARG_LEN = 200  # a catalog name or a size ("80GiB"); far longer than any of them
_PATH_PREFIXES = ("/", "./", "../", "~", ".\\", "..\\")
ACCEPTED_GPU_FORMS = f"a GPU name (see `peakmem gpus`) or {ACCEPTED_SIZE_FORMS}"
ACCEPTED_MODEL_FORMS = (
    "a catalog name (see `peakmem models`), a path to a config.json or a folder holding one, "
    "or a Hugging Face Hub id such as owner/name"
)


# Which path builds the spec: "auto" (the formulas when they know the model_type, else the derived
# path), or one of the two forced ("derived" for a known family: how tests and `info --cross-check`
# compare the two; "formulas" for an unknown one: its ConfigError).
PATHS = ("auto", "formulas", "derived")


class Deriver(Protocol):
    """Builds a derived spec from transformers' own modules (:func:`peakmem.simulate.derive.derive_spec`;
    :func:`peakmem.simulate.deriver` hands it out where torch and transformers are installed)."""

    def __call__(self, config: Mapping[str, Any], *, name: str | None = None) -> ModelSpec: ...


def resolve_model(arg: str, *, path: str = "auto", derive: Deriver | None = None) -> ModelSpec:
    """The ModelSpec a MODEL argument names; errors say which forms are accepted. ``derive``: see
    :func:`spec_for_config`."""
    name, config = resolve_config(arg)
    return spec_for_config(config, name=name, path=path, derive=derive)


def spec_for_config(
    config: dict[str, Any], *, name: str | None = None, path: str = "auto", derive: Deriver | None = None
) -> ModelSpec:
    """The formulas' spec (:func:`peakmem.hf.spec_from_config`) when they know the ``model_type``;
    else a *derived* one: shipped with the package for catalog models (:mod:`peakmem.block_costs`), or
    built from transformers' own modules by ``derive``, which the face hands in where torch and
    transformers are installed (:func:`peakmem.simulate.deriver`; this module never imports an oracle).
    Derived specs say so in their notes. ``path`` (:data:`PATHS`) forces one of the two."""
    from peakmem.hf import SUPPORTED_MODEL_TYPES, spec_from_config

    if path not in PATHS:
        raise InputError(f"path={path!r}: one of {', '.join(PATHS)}")
    known = config.get("model_type") in SUPPORTED_MODEL_TYPES or not isinstance(config.get("model_type"), str)
    if path == "formulas" or (path == "auto" and known):
        return spec_from_config(config, name=name)
    from peakmem import block_costs

    shipped = derived_spec_if_ready(config, name=name)
    if shipped is not None:
        return shipped
    if derive is None:
        if path == "derived":
            raise ConfigError(
                f"model_type={config.get('model_type')!r}: no derived spec shipped or cached for this "
                "config; "
                f"`{block_costs.TORCH_HINT}` derives it from transformers' own model"
            )
        try:
            return spec_from_config(config, name=name)
        except ConfigError as err:
            raise ConfigError(
                f"{err.args[0]}; `{block_costs.TORCH_HINT}` answers it: peakmem then derives the spec from "
                "transformers' own model (exact parameter count) and measures its blocks"
            ) from None
    return derive(config, name=name)


def derived_spec_if_ready(config: dict[str, Any], *, name: str | None = None) -> ModelSpec | None:
    """The derived spec of ``config`` if it answers without measuring (shipped with the package or in
    the disk cache), else None; no torch needed."""
    from peakmem import block_costs

    spec = block_costs.shipped_spec(config, name) or block_costs.cached_spec(config, name)
    if spec is not None:
        block_costs.register_config(config)
    return spec  # type: ignore[no-any-return]


# --- which path answered (peakmem info) ---------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class AnsweredBy:
    """Which path built a spec: ``formulas`` (:mod:`peakmem.hf`), ``derived`` (transformers' modules,
    measured blocks) or ``both``: the formulas know the family and a derived answer was at hand (shipped,
    cached, or derived now by ``info --cross-check``), so the two are compared on ``setup`` (the
    defaults of ``peakmem train``)."""

    path: str
    params_equal: bool | None = None
    formulas_peak_bytes: int | None = None
    derived_peak_bytes: int | None = None
    setup: str = ""
    note: str = ""

    @property
    def peak_diff(self) -> float | None:
        """(derived - formulas) / formulas of the peak allocated bytes; None unless ``both``."""
        if self.formulas_peak_bytes is None or self.derived_peak_bytes is None:
            return None
        return (self.derived_peak_bytes - self.formulas_peak_bytes) / self.formulas_peak_bytes


NO_DERIVED_NOTE = (
    "no derived answer shipped or cached for this config; `peakmem info --cross-check` derives one "
    "(needs torch) and compares the two"
)


def answered_by(
    config: dict[str, Any], spec: ModelSpec, *, name: str | None = None, cross_check: bool = False,
    derive: Deriver | None = None, costs: CostLookup | None = None,
) -> AnsweredBy:  # fmt: skip
    """Which path answered ``spec`` (built from ``config``) and, for a family the formulas know, how the
    derived path agrees: only from shipped or cached derived data (no torch, no wait) unless
    ``cross_check``, which derives the spec (``derive``) and measures its blocks (``costs``): the face
    hands both in where torch and transformers are installed (:mod:`peakmem.simulate`)."""
    from peakmem import block_costs
    from peakmem.estimate import estimate_training
    from peakmem.formulas.activations import derived_family
    from peakmem.training import DEFAULT_SEQ_LEN, TrainingSetup

    if spec.derived_from:
        return AnsweredBy(path="derived")
    other = derived_spec_if_ready(config, name=name)
    if other is None and cross_check:
        if derive is None:
            raise InputError(
                f"--cross-check: deriving the spec needs torch and transformers ({block_costs.TORCH_HINT})"
            )
        other = derive(config, name=name)
    if other is None:
        return AnsweredBy(path="formulas", note=NO_DERIVED_NOTE)
    seq = min(spec.max_position_embeddings, DEFAULT_SEQ_LEN)
    setup = TrainingSetup(seq_len=seq)
    if not cross_check and not block_costs.costs_ready(other.derived_from, derived_family(setup)):
        return AnsweredBy(path="formulas", note=NO_DERIVED_NOTE)
    return AnsweredBy(
        path="both",
        params_equal=other.params == spec.params,
        formulas_peak_bytes=estimate_training(spec, setup).peak_allocated_bytes,
        derived_peak_bytes=estimate_training(other, setup, costs=costs).peak_allocated_bytes,
        setup=f"peakmem train defaults (full, {setup.precision.value}, {setup.optimizer.value}, "
        f"batch {setup.micro_batch} x seq {seq})",
    )


def resolve_config(arg: str) -> tuple[str, dict[str, Any]]:
    """The name and the ``config.json`` dict a MODEL argument names (a copy: callers may change it).

    The dict is within :func:`peakmem.hf.check_config`'s bounds (nesting, sizes, key types),
    so no caller (spec building, simulate, measure) starts work on a model no cluster holds.
    """
    name, config = _find_config(arg)
    check_config(config)
    return name, config


def _find_config(arg: str) -> tuple[str, dict[str, Any]]:
    if not isinstance(arg, str):
        raise InputError(f"MODEL={arg!r}: must be a string; give {ACCEPTED_MODEL_FORMS}")
    text = arg.strip()
    if not text:
        raise InputError(f"MODEL={arg!r}: empty; give {ACCEPTED_MODEL_FORMS}")
    if len(text) > MAX_MODEL_ARG_LEN:
        raise InputError(
            f"MODEL={_short(text)}: {len(text):,} characters is too long (at most {MAX_MODEL_ARG_LEN:,}); "
            f"give {ACCEPTED_MODEL_FORMS}"
        )
    entry = find_model(text)
    if entry is not None:
        return entry.name, copy.deepcopy(dict(entry.config))
    path = _existing_config_path(text)
    if path is not None:
        return _name_from_path(path), read_config_file(path)
    if _looks_like_path(text):
        raise ConfigError(f"MODEL={_short(text)}: no such file or folder; give {ACCEPTED_MODEL_FORMS}")
    if is_hub_id(text):
        return text, _config_from_hub(text)
    raise unknown_model(text)


def is_hub_id(text: str) -> bool:
    """``owner/name`` with the characters the Hub allows."""
    return len(text) <= HUB_ID_MAX_LEN and bool(_HUB_ID.match(text)) and ".." not in text


def _existing_config_path(text: str) -> Path | None:
    """The config.json ``text`` points at, if it is an existing file or a folder holding one."""
    p = Path(os.path.expanduser(text))
    try:
        exists, is_dir = p.exists(), p.is_dir()
        holds_config = is_dir and (p / CONFIG_FILE).exists()
    except (OSError, ValueError):  # a name too long for the file system, a NUL byte: no such file
        return None
    if exists and not is_dir:  # a FIFO or a device too: the reader refuses it by name, unread
        return p
    if is_dir:
        if holds_config:
            return p / CONFIG_FILE
        raise ConfigError(f"MODEL={text!r}: the folder holds no {CONFIG_FILE}")
    return None


def _short(text: str, limit: int = 80) -> str:
    """``repr(text)``, cut to ``limit`` characters so that an error stays one readable line."""
    shown = repr(text)
    return shown if len(shown) <= limit else shown[: limit - 4] + "...'"


def _looks_like_path(text: str) -> bool:
    return text.startswith(_PATH_PREFIXES) or text.endswith(".json") or "\\" in text or text.count("/") > 1


def _name_from_path(path: Path) -> str:
    """``.../Llama-3.1-8B/config.json`` -> ``Llama-3.1-8B``; a loose file keeps its own name."""
    if path.name == CONFIG_FILE and path.parent.name:
        return path.parent.name
    return path.stem


def _config_from_hub(repo_id: str) -> dict[str, Any]:
    from peakmem import hub

    try:
        return hub.fetch_config(repo_id)
    except hub.HubNotFoundError:
        error = unknown_model(repo_id)
        error.args = (
            f"{error.args[0]}; no Hub repository of that id either (if it is private, {hub.TOKEN_HINT})",
        )
        raise error from None


# --- GPUs --------------------------------------------------------------------------------------------
def resolve_gpu(arg: str) -> Gpu:
    """A catalog GPU, or an anonymous one of a given size (``24GB``)."""
    if not isinstance(arg, str):
        raise InputError(f"--gpu={arg!r}: must be a string; give {ACCEPTED_GPU_FORMS}")
    text = arg.strip()
    if not text:
        raise InputError(f"--gpu={arg!r}: empty; give {ACCEPTED_GPU_FORMS}")
    if len(text) > MAX_GPU_ARG_LEN:
        raise InputError(f"--gpu={_short(text)}: {len(text):,} characters is too long for a GPU name or size")
    entry = find_gpu(text)
    if entry is not None:
        return entry
    if looks_like_size(text):
        return gpu_of_size(text)
    if text.startswith("-") and looks_like_size(text[1:]):
        raise InputError(f"--gpu={text!r}: the size must be positive")
    if re.fullmatch(r"[0-9]+(\.[0-9]+)?", text):
        raise InputError(f"--gpu={text!r}: a size needs a unit; give {ACCEPTED_GPU_FORMS}")
    error: UnknownNameError = unknown_gpu(text)
    error.args = (f"{error.args[0]}; or give a memory size: {ACCEPTED_SIZE_FORMS}",)
    raise error


def resolve_gpus(arg: str) -> tuple[Gpu, ...]:
    """A comma-separated list of GPUs (``peakmem fit --gpu 4090,a100``)."""
    parts = [p for p in (s.strip() for s in arg.split(",")) if p]
    if not parts:
        raise InputError(f"--gpu={arg!r}: empty; give {ACCEPTED_GPU_FORMS}")
    return tuple(resolve_gpu(p) for p in parts)


SOLD_AS_LOW, SOLD_AS_HIGH = 0.93, 1.01  # T4 and L40S report 0.9375 x their nominal GiB: the lowest seen


def sold_as(text: str) -> list[Gpu]:
    """Catalog cards sold under the size ``text`` names ("24GB": the RTX 4090, A10, ...): vendors quote
    nominal binary gigabytes that the driver reports a little under (RTX 4090 24,564 MiB; A10 and L4
    23,028 MiB, ECC reserved; T4 15,360 MiB), so a card counts within [SOLD_AS_LOW, SOLD_AS_HIGH] x
    that many GiB."""
    m = re.fullmatch(r"\s*(\d+)\s*(gb|gib|g)?\s*", text.lower())
    if not m:
        return []
    n = int(m.group(1))
    return [
        g for g in GPUS if not g.unified_memory and SOLD_AS_LOW <= g.memory_bytes / 2**30 / n <= SOLD_AS_HIGH
    ]


def gpu_of_size(text: str) -> Gpu:
    """An anonymous GPU with exactly ``parse_size(text)`` bytes, named after the size."""
    try:
        n_bytes = parse_size(text)
    except OverflowError:  # more digits than a float holds
        raise too_large("--gpu", text, MAX_DEVICE_BYTES, "bytes; no GPU holds more") from None
    if n_bytes <= 0:
        raise InputError(f"--gpu={text!r}: the size must be positive")
    if n_bytes > MAX_DEVICE_BYTES:
        raise too_large("--gpu", text, MAX_DEVICE_BYTES, "bytes; no GPU holds more")
    name = re.sub(r"\s+", "", text).lower()
    sold = sold_as(text)
    note = f"{n_bytes:,} B, the size as written (GB = 10^9 B, GiB = 2^30 B)"
    if sold:
        note += (
            "; cards sold as this size leave PyTorch other sizes: "
            + ", ".join(f"{g.name} ({g.usable_bytes:,} B)" for g in sold)
            + " (name one to use its exact size)"
        )
    return Gpu(
        name=name,
        display_name=f"{text.strip()} device",
        vendor="unknown",
        architecture="unknown",
        memory_bytes=n_bytes,
        memory_source=f"given as {text.strip()!r}",
        note=note,
        rates_from=get_gpu(REFERENCE_GPU),  # no rates of its own: step time borrows the reference GPU's
    )


def info_answer(
    model: str, *, cross_check: bool = False, derive: Deriver | None = None, costs: CostLookup | None = None
) -> tuple[ModelSpec, Any]:
    """``peakmem info``'s spec and which path answered it (:func:`answered_by`): one function for the
    command and the Python API (``peakmem.info``); ``derive`` and ``costs`` as the face hands them in."""
    name, config = resolve_config(model)
    spec = spec_for_config(config, name=name, derive=derive)
    return spec, answered_by(config, spec, name=name, cross_check=cross_check, derive=derive, costs=costs)
