"""Parallel serving: what each rank of a vLLM / SGLang deployment holds, the most loaded one, and the
concurrent sequences the whole deployment serves (the layout itself: :mod:`peakmem.serving_layout`).

* Pipeline parallel: vLLM's split of the decoder layers (vllm/distributed/utils.py ``get_pp_indices``,
  vLLM 0.11): ``layers // pp`` each, the remainder one more each on the stages before the last, from
  the second-to-last backwards; the first stage also holds the token embedding, the last the final norm
  and the LM head (``PPMissingLayer`` elsewhere); a tied head is a copy of the embedding there. Each stage
  holds the KV cache of its own layers only, sized from its own free memory
  (vllm/v1/worker/gpu_worker.py ``determine_available_memory`` runs on every worker); the engine then
  gives every worker the smallest block count among them (vllm/v1/core/kv_cache_utils.py
  ``get_kv_cache_configs``: ``min_num_blocks``), so the stage whose pool holds the fewest sequences
  decides. SGLang is modelled with the same split.
* Data parallel (both engines) and SGLang's DP attention: each of the ``dp`` ranks keeps its own KV pool
  for its own requests, so the deployment holds ``dp`` x what one rank's pool holds.
* SGLang DP attention gathers every DP rank's tokens before the MoE / dense layers
  (python/sglang/srt/layers/dp_attention.py ``_DpGatheredBufferWrapper``: a global buffer of
  ``global_dp_buffer_len x hidden_size`` and a local one of ``local_dp_buffer_len x hidden_size``, in the
  model's dtype; with max padding the global length is ``dp x`` the longest rank's tokens).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from peakmem.breakdown import Estimate
from peakmem.formulas.serving.context import WEIGHTS_ITEM_PREFIX
from peakmem.model import LayerGroup, ModelSpec
from peakmem.serving_layout import ServingLayout

FIRST_STAGE_COMPONENTS = ("embeddings", "positions")  # what vLLM builds on the first PP rank only


def pp_layer_counts(num_layers: int, pp: int) -> tuple[int, ...]:
    """Decoder layers per pipeline stage, as vLLM's ``get_pp_indices`` splits them."""
    parts = [num_layers // pp] * pp
    for i in range(2, num_layers % pp + 2):
        parts[-i] += 1
    return tuple(parts)


def _slice_groups(groups: tuple[LayerGroup, ...], start: int, end: int) -> tuple[LayerGroup, ...]:
    """The layer groups covering layers ``[start, end)``."""
    out: list[LayerGroup] = []
    first = 0
    for g in groups:
        lo, hi = max(start, first), min(end, first + g.count)
        if hi > lo:
            out.append(dataclasses.replace(g, count=hi - lo))
        first += g.count
    return tuple(out)


def stage_spec(spec: ModelSpec, pp: int, stage: int) -> ModelSpec:
    """The part of ``spec`` that pipeline stage ``stage`` of ``pp`` holds: its layers, the embedding on
    the first stage, the final norm and head on the last (a tied head as a copy of the embedding)."""
    if pp == 1:
        return spec
    counts = pp_layer_counts(spec.num_layers, pp)
    start = sum(counts[:stage])
    first, last = stage == 0, stage == pp - 1
    outer = []
    for t in spec.outer:
        head_side = t.component not in FIRST_STAGE_COMPONENTS
        if (first and not head_side) or (last and head_side):
            outer.append(t)
        elif last and spec.tie_word_embeddings and t.component == "embeddings":
            outer.append(dataclasses.replace(t, component="head"))  # the tied head's own copy
    return dataclasses.replace(
        spec, groups=_slice_groups(spec.groups, start, start + counts[stage]), outer=tuple(outer),
        tie_word_embeddings=spec.tie_word_embeddings and first and last,
    )  # fmt: skip


def dp_gathered_bytes(hidden_size: int, tokens_per_rank: int, layout: ServingLayout, act_bytes: int) -> int:
    """SGLang DP attention's gathered buffers: the global one (``dp`` x the rank's tokens, max padding)
    and the local one (the rank's tokens), ``hidden_size`` wide; 0 without DP attention."""
    if not layout.dp_attention or layout.dp == 1:
        return 0
    return (layout.dp + 1) * tokens_per_rank * hidden_size * act_bytes


def _int(est: Estimate, key: str) -> int | None:
    """An integer of ``est.extra``; None where it has none."""
    value = est.extra.get(key)
    return value if isinstance(value, int) else None


def _weights_on_rank(est: Estimate) -> int:
    """The bytes of the model's own weights on the rank (formulas/serving/context.py weights_item)."""
    return sum(i.bytes for i in est.items if i.path.startswith(WEIGHTS_ITEM_PREFIX))


def deployment_estimate(
    spec: ModelSpec, layout: ServingLayout, rank_estimate: Callable[[ModelSpec], Estimate]
) -> Estimate:
    """The most loaded rank's estimate (the stage with the largest device total), with what each stage
    holds and the sequences the whole deployment serves (``max_concurrent_sequences``)."""
    counts = pp_layer_counts(spec.num_layers, layout.pp)
    seen: dict[ModelSpec, Estimate] = {}
    stages: list[Estimate] = []
    for s in range(layout.pp):
        part = stage_spec(spec, layout.pp, s)
        if part not in seen:
            seen[part] = rank_estimate(part)
        stages.append(seen[part])
    loaded = max(
        range(layout.pp), key=lambda s: (stages[s].device_total_bytes, stages[s].peak_allocated_bytes)
    )
    est = stages[loaded]
    extra: dict[str, object] = {
        **est.extra, "gpus": layout.gpus, "layout": layout.describe(), "per_rank": True,
        "pp_layer_counts": list(counts), "most_loaded_stage": loaded,
        "stage_weight_bytes": [_weights_on_rank(e) for e in stages],
        "stage_device_total_bytes": [e.device_total_bytes for e in stages],
    }  # fmt: skip
    concurrent = [_int(e, "max_concurrent_sequences") for e in stages]
    if all(c is not None for c in concurrent):
        rank = min(c for c in concurrent if c is not None)
        extra.update(rank_max_concurrent_sequences=rank, max_concurrent_sequences=rank * layout.dp)
    note = (
        f"{layout.gpus} GPUs ({layout.describe()}); per GPU: the most loaded rank"
        + (f" (pipeline stage {loaded} of {layout.pp}: {counts[loaded]} of {spec.num_layers} layers)"
           if layout.pp > 1 else "")
        + (f"; each of the {layout.dp} data-parallel ranks holds its own KV pool and its share of the batch"
           if layout.dp > 1 else "")
    )  # fmt: skip
    return dataclasses.replace(
        est, model_name=spec.name, params=spec.params, extra=extra, assumptions=(*est.assumptions, note)
    )
