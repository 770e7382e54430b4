"""Helpers for torch-tier tests: build transformers' own model on the meta device and count it.

Import only from tests marked ``@pytest.mark.torch`` (this module imports torch and transformers).
Building on the meta device allocates no memory, so even a 671 B model is built in seconds.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping
from typing import Any

import torch
import transformers
from transformers import CONFIG_MAPPING, AutoConfig, PretrainedConfig

from peakmem.model import ModelSpec

# Keys of a config.json that are not constructor arguments (or that the config class recomputes).
_DROP = ("model_type", "transformers_version", "_name_or_path", "architectures", "auto_map")


def hf_config(config: Mapping[str, Any]) -> PretrainedConfig:
    """The transformers config object for a config.json dict (gemma3: its text_config)."""
    cfg = dict(config)
    model_type = cfg["model_type"]
    if model_type == "gemma3":
        cfg = {**(cfg.get("text_config") or {}), "model_type": "gemma3_text"}
        model_type = "gemma3_text"
    kwargs = {k: v for k, v in cfg.items() if k not in _DROP}
    if model_type not in CONFIG_MAPPING and cfg.get("architectures"):  # remote-code types (kimi_k2)
        return getattr(transformers, cfg["architectures"][0]).config_class(**kwargs)
    return AutoConfig.for_model(model_type, **kwargs)


def build_meta(config: Mapping[str, Any], architecture: str) -> torch.nn.Module:
    """``transformers.<architecture>(config)`` with every tensor on the meta device (no memory)."""
    cls = getattr(transformers, architecture)
    cfg = hf_config(config)
    with torch.device("meta"):
        return cls(cfg)


def build_spec_model(config: Mapping[str, Any], spec: ModelSpec) -> torch.nn.Module:
    return build_meta(config, spec.architecture)


def count_params(model: torch.nn.Module) -> int:
    """``sum(p.numel() for p in model.parameters())``: tied weights once."""
    return sum(p.numel() for p in model.parameters())


def count_buffers(model: torch.nn.Module) -> int:
    return sum(b.numel() for b in model.buffers())


def param_shapes(model: torch.nn.Module) -> dict[str, tuple[int, ...]]:
    """Parameter name -> shape, for diagnosing a mismatch."""
    return {n: tuple(p.shape) for n, p in model.named_parameters()}


def layer_pattern_counts(model: torch.nn.Module) -> Counter[str]:
    """numel per parameter name with layer indices replaced by ``*`` (a compact diff aid)."""
    out: Counter[str] = Counter()
    for n, p in model.named_parameters():
        out[re.sub(r"\.\d+\.", ".*.", n)] += p.numel()
    return out


def spec_pattern_counts(spec: ModelSpec) -> Counter[str]:
    """The same view of a spec: outer tensors by name, layer tensors under ``*``."""
    out: Counter[str] = Counter()
    for t in spec.outer:
        out[t.name] += t.numel
    for g in spec.groups:
        for t in g.layer.tensors:
            out[f"*.{t.name}"] += t.numel * g.count
    return out


def mismatch(model: torch.nn.Module, spec: ModelSpec) -> str:
    """A readable description of how the spec's inventory differs from the model's parameters."""
    got = {re.sub(r"^.*\.\*\.", "*.", k): v for k, v in layer_pattern_counts(model).items()}
    want = spec_pattern_counts(spec)
    lines = [
        f"{k}: transformers {got.get(k, 0)} vs spec {want.get(k, 0)}"
        for k in sorted(set(got) | set(want))
        if got.get(k, 0) != want.get(k, 0)
    ]
    return "\n".join(lines)


def params_by_component_from_names(model: torch.nn.Module, spec: ModelSpec) -> dict[str, int]:
    """Per-component counts of the model, attributing each parameter through the spec's tensor names."""
    comp: dict[str, str] = {t.name: t.component for t in spec.outer}
    for g in spec.groups:
        for t in g.layer.tensors:
            comp[f"*.{t.name}"] = t.component
    out: dict[str, int] = {}
    for name, p in model.named_parameters():
        key = re.sub(r"^.*\.\d+\.", "*.", name)
        c = comp.get(key, comp.get(name, "unknown"))
        out[c] = out.get(c, 0) + p.numel()
    return out
