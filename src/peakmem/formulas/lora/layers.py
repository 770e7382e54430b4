"""How LoRA regroups a spec's layers: the layers that save or hold something the others do not get a group of
their own (the first layer, and the layers a layer-indexed ``target_parameters`` key names)."""

from __future__ import annotations

import itertools
from dataclasses import replace

from peakmem.adapters import LoraConfig
from peakmem.model import FIRST_BLOCK, LayerGroup, ModelSpec

from ..memo import Memo
from .targets import resolve_targets


def split_first_layer(spec: ModelSpec) -> ModelSpec:
    """The same spec with its first layer as a group of its own: under LoRA nothing before the first
    adapter requires grad, so the first layer saves less than the others (see :func:`.deltas.adapt_layer`)."""
    first = spec.groups[0]
    layer = first.layer
    if layer.derived is not None:  # a derived block: its costs measured on the first block itself
        layer = replace(layer, derived=replace(layer.derived, key=layer.derived.key + FIRST_BLOCK))
    if first.count == 1:
        return (
            spec
            if layer is first.layer
            else replace(spec, groups=(replace(first, layer=layer), *spec.groups[1:]))
        )
    groups = (LayerGroup(count=1, layer=layer), replace(first, count=first.count - 1), *spec.groups[1:])
    return replace(spec, groups=groups)


def split_target_layers(spec: ModelSpec, lora: LoraConfig, memo: Memo | None = None) -> ModelSpec:
    """The same spec with each layer that a layer-indexed ``target_parameters`` key names
    (``22.mlp.experts.gate_up_proj``) in a group of its own: only those layers hold the adapter, its
    gradients and its ParamWrapper costs (a derived block keeps its key: its measured costs are the same)."""
    chosen = {i for m in resolve_targets(spec, lora, memo) for i in m.layers}
    if not chosen:
        return spec
    groups: list[LayerGroup] = []
    start = 0
    for g in spec.groups:
        inside = {i for i in chosen if start <= i < start + g.count}
        cuts = sorted({start, start + g.count} | inside | {i + 1 for i in inside})
        groups += [replace(g, count=b - a) for a, b in itertools.pairwise(cuts)]
        start += g.count
    return spec if len(groups) == len(spec.groups) else replace(spec, groups=tuple(groups))
