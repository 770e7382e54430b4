"""The answers as data: Estimate / ModelSpec -> JSON (integer bytes) and the one-line headlines.

Standard library only, so that the core's one answer (:func:`peakmem.question.answer`) builds its JSON
without a face; :mod:`peakmem.render` draws the same results as terminal tables and Markdown. Text
shows decimal GB first (as the seed and GPU vendors quote memory) and binary GiB in parentheses.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from peakmem.breakdown import Category, Estimate, Verdict
from peakmem.formulas.weights import FLOAT_BYTES, WeightRow, bnb_kept_expert_params, weight_rows
from peakmem.inference import Engine
from peakmem.model import Attention, DerivedBlock, Layer, ModelSpec, Tower
from peakmem.units import fmt_both, fmt_bytes, fmt_count, fmt_gb
from peakmem.weight_formats import Scheme, WeightFormat

if TYPE_CHECKING:
    from peakmem.resolve import AnsweredBy

CATEGORY_LABELS = {
    Category.PARAMETERS: "parameters (weights)",
    Category.BUFFERS: "buffers",
    Category.GRADIENTS: "gradients",
    Category.MASTER_WEIGHTS: "master weights (fp32)",
    Category.OPTIMIZER_STATES: "optimizer states",
    Category.ACTIVATIONS: "activations",
    Category.TEMPORARIES: "temporaries",
    Category.KV_CACHE: "KV cache",
    Category.CUDA_GRAPHS: "CUDA graphs",
    Category.OVERHEAD: "overhead",
}


def fmt_per_param(x: float) -> str:
    """Bytes per parameter as the seed writes them: 2, 4, 0.5; tiny shares as "<0.001"."""
    return "<0.001" if 0 < x < 0.001 else f"{x:.4g}"


def states_per_param(est: Estimate) -> float:
    """Model-state bytes per parameter of the model: the seed's 16 for mixed-precision Adam, where
    every row covers every parameter; with adapters, rows cover different sets, so their bytes/param
    do not add up and this is the honest total."""
    return est.model_state_bytes / est.params if est.params else 0.0


# --- JSON ----------------------------------------------------------------------------------------
def spec_json(spec: ModelSpec, answered: AnsweredBy | None = None) -> dict[str, Any]:
    """``peakmem info --json``; ``answered``: which path answered (:func:`peakmem.resolve.answered_by`;
    by default read from the spec alone: formulas or derived)."""
    first = language_layer(spec)
    out = {
        "name": spec.name,
        "model_type": spec.model_type,
        "architecture": spec.architecture,
        "task": spec.task,
        "params": spec.params,
        "active_params": spec.active_params,
        "params_by_component": spec.params_by_component(),
        "buffers_numel": spec.buffer_numel,
        "num_layers": language_layers(spec),
        "hidden_size": spec.hidden_size,
        "vocab_size": spec.vocab_size,
        "num_heads": first.attention.num_heads,
        "num_kv_heads": first.attention.num_kv_heads,
        "head_dim": first.attention.head_dim,
        "intermediate_size": first.mlp.intermediate_size,
        "max_position_embeddings": spec.max_position_embeddings,
        "position": spec.position,
        "norm": spec.norm,
        "tie_word_embeddings": spec.tie_word_embeddings,
        "moe": {
            "num_experts": max(g.layer.mlp.num_experts for g in spec.groups),
            "experts_per_token": max(g.layer.mlp.experts_per_token for g in spec.groups),
        }
        if spec.is_moe
        else None,
        "notes": list(spec.notes),
        "answered_by": answered_by_json(answered or default_answered_by(spec)),
        "blocks": [
            {"count": g.count, "mixer": g.layer.derived.mixer, "ffn": g.layer.derived.ffn}
            for g in spec.groups
            if g.layer.derived is not None
        ]
        or None,
        "block_pattern": block_pattern(spec) if spec.derived_from else None,
        "towers": [tower_json(spec, t) for t in spec.towers],
    }
    if spec.towers:  # the fields above describe the language model; the towers are listed apart
        out["language_model"] = {
            "num_layers": language_layers(spec), "params": language_params(spec),
            "attention": attention_kind(first.attention),
        }  # fmt: skip
    return out


# --- the language model and the towers beside it (peakmem.model.Tower) ---------------------------
def language_layer(spec: ModelSpec) -> Layer:
    """The layer whose attention and MLP ``info`` describes: the first layer of a model without towers;
    with towers, the language model's first layer that caches keys and values (an attention block:
    a hybrid's linear-attention layers have no heads to show), else its first."""
    layers = [g.layer for g in spec.language_groups]
    if not spec.towers or not layers:
        return spec.first_layer
    return next((x for x in layers if x.derived is None or x.derived.kv_elements_per_token > 0), layers[0])


def language_layers(spec: ModelSpec) -> int:
    """The language model's layers (every layer outside the towers)."""
    return sum(g.count for g in spec.language_groups)


def language_params(spec: ModelSpec) -> int:
    """The parameters outside the towers: the language model, its embeddings and head, and any
    projector that sits outside a tower's module."""
    return spec.params - sum(spec.tower_params(t) for t in spec.towers)


def attention_kind(att: Attention) -> str:
    """MLA, MHA, MQA or GQA (with its k/v heads)."""
    if att.is_mla:
        return "MLA"
    if att.num_kv_heads == att.num_heads:
        return "MHA"
    return "MQA" if att.num_kv_heads == 1 else f"GQA ({att.num_kv_heads} kv heads)"


TOWER_SIZES = ("num_layers", "hidden_size", "num_heads", "intermediate_size", "patch_size",
               "temporal_patch_size", "spatial_merge_size", "image_size", "out_hidden_size")  # fmt: skip


def tower_json(spec: ModelSpec, tower: Tower) -> dict[str, Any]:
    """One tower in ``info --json``: its kind, module, sizes (None where its sub-config names none) and
    parameters (its tensors' sum: :meth:`peakmem.model.ModelSpec.tower_params`)."""
    sizes = {k: getattr(tower, k) or None for k in TOWER_SIZES}
    return {"kind": tower.kind, "module": tower.prefix, **sizes, "params": spec.tower_params(tower)}


def default_answered_by(spec: ModelSpec) -> AnsweredBy:
    """Which path built the spec, read from the spec alone: the formulas (peakmem.hf) or the derived
    path (transformers' own modules, measured block costs: peakmem.simulate.derive / shipped data)."""
    from peakmem.resolve import AnsweredBy

    return AnsweredBy(path="derived" if spec.derived_from else "formulas")


def answered_by_json(a: AnsweredBy) -> dict[str, Any]:
    """``path`` (formulas, derived or both); for ``both``, the comparison: parameter counts equal,
    each path's peak allocated bytes on ``setup`` and ``peak_diff`` ((derived - formulas) / formulas)."""
    out: dict[str, Any] = {"path": a.path}
    if a.path == "both":
        out.update(params_equal=a.params_equal, formulas_peak_allocated_bytes=a.formulas_peak_bytes,
                   derived_peak_allocated_bytes=a.derived_peak_bytes, peak_diff=a.peak_diff,
                   setup=a.setup)  # fmt: skip
    if a.note:
        out["note"] = a.note
    return out


def answered_by_line(a: AnsweredBy, spec: ModelSpec) -> str:
    """The ``answered by:`` line of ``peakmem info``."""
    if a.path == "derived":
        return f"answered by: derived path (transformers' modules; blocks measured): {block_pattern(spec)}"
    if a.path != "both" or a.peak_diff is None:
        return "answered by: formulas (peakmem.hf)"
    diff = abs(a.peak_diff)
    pct = f"{100 * diff:.1f}%" if diff >= 0.001 else "0.1%"
    verb = "agree within" if a.params_equal and diff <= AGREE else "differ by"
    counts = "the same parameter count" if a.params_equal else "different parameter counts"
    return (
        f"answered by: both (formulas and derived {verb} {pct}: {counts}; peak allocated "
        f"{fmt_bytes(a.formulas_peak_bytes or 0)} vs {fmt_bytes(a.derived_peak_bytes or 0)} on {a.setup})"
    )


AGREE = 0.02  # issue 14: the derived path agrees with the formulas within 2% on every catalog family


def _block_label(d: DerivedBlock) -> str:
    return d.mixer + ("" if d.ffn == "none" else f"+{d.ffn}")


def block_pattern(spec: ModelSpec) -> str:
    """A derived spec's blocks, compressed: runs of one kind (``24 x attention+dense``); a repeating
    period as ``12 x [3 x linear_attention+moe, attention+moe]``; else counts per kind, in order."""
    runs: list[tuple[str, int]] = []
    for g in spec.groups:
        if g.layer.derived is None:
            continue
        label = _block_label(g.layer.derived)
        if runs and runs[-1][0] == label:
            runs[-1] = (label, runs[-1][1] + g.count)
        else:
            runs.append((label, g.count))

    def show(rs: Sequence[tuple[str, int]]) -> str:
        return ", ".join(label if n == 1 else f"{n} x {label}" for label, n in rs)

    if len(runs) <= PATTERN_RUNS:
        return show(runs)
    for period in range(1, len(runs) // 2 + 1):
        if len(runs) % period == 0 and all(runs[i] == runs[i % period] for i in range(len(runs))):
            return f"{len(runs) // period} x [{show(runs[:period])}]"
    # not periodic as a whole: a periodic body with a different tail (or head) is still counted per kind
    totals: dict[str, int] = {}
    for label, n in runs:
        totals[label] = totals.get(label, 0) + n
    return show(list(totals.items())) + " (interleaved)"


PATTERN_RUNS = 3  # up to this many runs of one kind are listed as they are


def estimate_json(est: Estimate, verdicts: Sequence[Verdict] = (), ways: Any = None) -> dict[str, Any]:
    """``peakmem train|infer --json``; ``ways`` a :class:`peakmem.planner.WaysDown` (train only)."""
    out: dict[str, Any] = {
        "method": est.method,
        "job": est.job,
        "model": {"name": est.model_name, "params": est.params, "trainable_params": est.trainable_params},
        "setup": est.setup,
        "warnings": list(est.warnings),
        "bytes_per_param": [
            {
                "tensor": r.tensor,
                "dtype": r.dtype,
                "bytes": r.bytes_per_param,
                "total_bytes": r.bytes,
                "params": r.params,
                "category": r.category.value,
                "source": r.source,
            }
            for r in est.per_param
        ],
        "model_state_bytes": est.model_state_bytes,
        "breakdown": {c.value: b for c, b in est.by_category().items()},
        "items": [
            {"path": i.path, "category": i.category.value, "bytes": i.bytes, "source": i.source}
            for i in est.items
        ],
        "phases": {p.phase.value: p.bytes for p in est.phases},
        "peak_phase": est.peak_phase.value,
        "peak_allocated_bytes": est.peak_allocated_bytes,
        "peak_reserved_bytes": est.peak_reserved_bytes,
        "device_total_bytes": est.device_total_bytes,
        "needed_bytes": est.needed_bytes,
        "assumptions": list(est.assumptions),
    }
    out.update(est.extra)
    if est.band is not None:
        out["band"] = est.band.json()
    if verdicts:
        out["verdicts"] = [
            {
                "gpu": v.gpu,
                "capacity_bytes": v.capacity_bytes,
                "fits": v.fits,
                "verdict": v.state,
                "headroom_bytes": v.headroom_bytes,
            }
            for v in verdicts
        ]
        if len(verdicts) == 1:
            out["verdict"] = verdicts[0].state
    if ways is not None:
        out["ways_down"] = [
            {
                "change": w.label,
                "changes": [list(c.as_tuple()) for c in w.changes],
                "device_total_bytes": w.estimate.device_total_bytes,
                "needed_bytes": w.needed_bytes,
                "peak_allocated_bytes": w.estimate.peak_allocated_bytes,
                "saving_bytes": w.saving_bytes,
                "gpus": w.parallelism.gpus if w.parallelism is not None else 1,
            }
            for w in ways.ways
        ]
        out["ways_down_note"] = ways.note
        out["ways_not_measured"] = list(ways.not_measured)
    return out


def answer_json(est: Estimate, gpus: Sequence[Any] = (), ways: Any = None) -> dict[str, Any]:
    """The JSON answer to ``peakmem train|infer|measure|simulate --json`` and to ``/api/train`` and
    ``/api/infer`` (one function, so the CLI and the web say the same): the estimate, a verdict per
    GPU (``gpus``: catalog GPUs) and, for training, the ways down."""
    return estimate_json(est, verdicts_of(est, gpus), ways)


def verdicts_of(est: Estimate, gpus: Sequence[Any]) -> list[Verdict]:
    """The three-state verdict of ``est`` on each GPU: what it must hold (``Estimate.needed_bytes``: the
    likely device total less the cache the allocator frees before an OOM), and the band's high end less the
    same."""
    return [Verdict(gpu=g.name, capacity_bytes=g.usable_bytes, needed_bytes=est.needed_bytes,
                    high_bytes=est.needed_high_bytes) for g in gpus]  # fmt: skip


def band_text(est: Any) -> str:
    """' (likely range 33.6-39.9 GB)': the band of what the device must hold after the headline's number
    (the device-total band less ``Estimate.releasable_bytes``)."""
    band = getattr(est, "band", None)
    if band is None:
        return ""
    r, cache = band.device_total, est.releasable_bytes
    return f" (range {fmt_gb(r.low - cache, 1).removesuffix(' GB')}-{fmt_gb(r.high - cache, 1)})"


def cache_text(est: Any) -> str:
    """The sentence a headline adds where the caching allocator keeps cache it frees before an OOM
    (``Estimate.releasable_bytes``: batches of varying lengths, formulas/padded_lengths.py)."""
    cache = est.releasable_bytes
    if not cache:
        return ""
    return (
        f" On a card with room, the caching allocator keeps {fmt_both(cache)} more (segments shorter "
        f"batches cut; nvidia-smi ≈ {fmt_both(est.device_total_bytes)}), which it frees before an "
        "out-of-memory error."
    )


def fits_on(needed: int) -> str:
    """'it fits on an A100 40GB (40 GB) or larger' — the smallest catalog GPU with room."""
    from peakmem.catalog import GPUS

    roomy = sorted((g for g in GPUS if g.vendor == "nvidia" and g.usable_bytes >= needed),
                   key=lambda g: g.usable_bytes)  # fmt: skip
    if not roomy:
        return "it fits on no single GPU in the catalog"
    g = roomy[0]
    return f"the smallest NVIDIA GPU it fits on is {g.display_name} ({fmt_gb(g.usable_bytes, 1)})"


def bnb_expert_warning(rows: Sequence[WeightRow], fmt: WeightFormat) -> str | None:
    """The warning an answer opens with when bitsandbytes leaves fused MoE experts 16-bit (the
    expert rows of ``rows`` kept in ``fmt``'s float dtype: formulas/weights.py ``bnb_kept_expert_params``)."""
    kept = bnb_kept_expert_params(rows, fmt)
    if not kept:
        return None
    total = sum(r.params for r in rows)
    bits = "4-bit" if fmt.scheme is Scheme.BNB_4BIT else "8-bit"
    width = FLOAT_BYTES[fmt.float_dtype]
    return (
        f"experts stay 16-bit under bitsandbytes {bits} (transformers 5 keeps fused 3-D expert parameters, "
        f"not nn.Linear): {fmt_count(kept)} of {fmt_count(total)} parameters at {width} bytes "
        f"({fmt.float_dtype}), {fmt_both(kept * width)}"
    )


def weight_warnings(spec: ModelSpec, training: Any = None, inference: Any = None) -> tuple[str, ...]:
    """What the answer to ``training`` (QLoRA's base) or ``inference`` (its ``--weights``) says first."""
    from peakmem.adapters import quant_of
    from peakmem.formulas.qlora import base_rows

    if training is not None:
        from peakmem.step_setup import setup_that_runs

        quant = quant_of(setup_that_runs(spec, training))
        if quant is None:
            return ()
        fmt, rows = quant.weight_format, base_rows(spec, quant)
    elif inference is not None:
        fmt = inference.weight_format
        if fmt.scheme not in (Scheme.BNB_4BIT, Scheme.BNB_INT8):
            return ()
        rows = weight_rows(spec, fmt)
    else:
        return ()
    found = bnb_expert_warning(rows, fmt)
    return () if found is None else (found,)


def train_headline(name: str, setup: Any, est: Any, verb: str = "needs", par: Any = None) -> str:
    """The one-line answer of ``peakmem train`` (and ``/api/train``); ``par`` a sharded layout."""
    what = {"full": "full fine-tuning", "lora": "LoRA fine-tuning", "qlora": "QLoRA fine-tuning"}[
        setup.method.value
    ]
    post = est.setup.get("post_training") if isinstance(getattr(est, "setup", None), dict) else None
    where = fits_on(est.needed_bytes)
    if isinstance(post, dict):  # a post-training job (peakmem.jobs): its objective, roles and peak phase
        roles = f"teacher {post['teacher']}" if "teacher" in post else f"reference {post['reference']}"
        if "rollout" in post:
            roles += f", rollout {post['rollout']}"
        what = (f"{str(post['objective']).upper()} ({what.replace(' fine-tuning', '')} policy, {roles}; "
                f"peak in {est.peak_phase.value})")  # fmt: skip
        if post.get("rollout") == "vllm-colocate":  # its share is of the GPU asked about, not any GPU
            where = f"vLLM colocated takes {post['rollout_memory']:g} of the GPU asked about"
    line = (
        f"{name} {what} with {setup.precision.value} {setup.optimizer.value} "
        f"(batch {setup.micro_batch} x seq {setup.seq_len}, {setup.attention.value} attention, "
        f"checkpointing {setup.checkpointing_spelled}) {verb} ≈ {fmt_both(est.needed_bytes)}"
        f"{band_text(est)} on the device; {where}.{cache_text(est)}"
    )
    if par is not None:
        line += f" Layout: {par.describe()}; most loaded rank shown."
    return line


@dataclass(frozen=True, kw_only=True)
class InferAnswer:
    """The answer to ``peakmem infer`` and ``/api/infer`` (one function, so both say the same)."""

    estimate: Estimate  # what the request needs (SGLang: its CUDA graphs on the one GPU named, if one is)
    verdicts: tuple[Verdict, ...]  # per GPU: serving_fit's (a pooled engine fits when its pool holds it)
    headline: str
    json: dict[str, Any]


def infer_answer(spec: ModelSpec, setup: Any, gpus: Sequence[Any] = (), overheads: Any = None) -> InferAnswer:
    """Estimate ``setup`` without the GPU (SGLang's CUDA graphs and prefill chunk, the terms that depend on
    it, at the cuda_graph_max_bs and chunked_prefill_size it picks for the one GPU named; transformers'
    generate on the one GPU named, whose size bounds what its allocator keeps) and judge it on
    each of ``gpus`` with :func:`peakmem.formulas.serving.serving_fit` (``overheads``: expandable segments,
    fragmentation, a calibrated profile)."""
    from dataclasses import replace

    from peakmem.formulas.serving import estimate_inference, serving_fit
    from peakmem.vllm_defaults import batch_note as vllm_batch_note

    alone = replace(setup, gpu_bytes=None)
    if len(gpus) == 1 and setup.engine.value == "sglang":  # SGLang's own tier for that GPU
        tier = setup.sglang_defaults(gpus[0].memory_bytes)  # nvidia-smi's total (inference.py gpu_smi_bytes)
        alone = replace(alone, cuda_graph_max_bs=tier.cuda_graph_max_bs,
                        prefill_chunk=tier.chunked_prefill_size)  # fmt: skip
    batch_note = ""
    if len(gpus) == 1 and setup.engine.value == "vllm":  # vLLM's batch defaults for that GPU
        batch = setup.on_gpu(gpus[0].usable_bytes, gpus[0].display_name, gpus[0].memory_bytes).vllm_batch()
        alone = replace(alone, max_num_seqs=batch.max_num_seqs, prefill_chunk=batch.max_num_batched_tokens)
        batch_note = vllm_batch_note(batch, setup.vllm_entrypoint) if batch.defaulted else ""
    if len(gpus) == 1 and setup.engine.value == "hf":  # what transformers' allocator reserves on that GPU
        alone = replace(alone, gpu_bytes=gpus[0].usable_bytes)  # (formulas/serving/cache_growth.py)
    est = estimate_inference(spec, alone, overheads=overheads)
    if batch_note:
        est = replace(est, assumptions=(batch_note, *est.assumptions))
    est = replace(est, warnings=weight_warnings(spec, inference=setup))
    fits = [serving_fit(spec, setup.on_gpu(g.usable_bytes, g.display_name, g.memory_bytes), g.usable_bytes,
                        overheads=overheads) for g in gpus]  # fmt: skip
    verdicts = tuple(f.verdict(g.name) for f, g in zip(fits, gpus, strict=True))
    context = est.extra.get("context", setup.context)
    lora = est.extra.get("lora_slot_bytes")
    slots = ""
    if isinstance(lora, int) and lora:
        slots = f" and {setup.lora_slots} LoRA slots of rank {setup.lora_rank} ({fmt_both(lora)})"
    draft = est.extra.get("draft_weight_bytes")
    if setup.draft is not None and isinstance(draft, int):
        ahead = (f", {setup.num_speculative_tokens} speculative tokens"
                 if setup.num_speculative_tokens is not None else "")  # fmt: skip
        slots += f" and draft {setup.draft.name} ({fmt_both(draft)}{ahead})"
    headline = (
        f"{spec.name} inference with {setup.weights} weights{slots} on {setup.engine.value} "
        f"({setup.batch} x {context} tokens, KV cache {setup.kv_cache.value}) needs ≈ "
        f"{fmt_both(est.device_total_bytes)}{band_text(est)} per GPU"
    )
    lay = setup.layout
    if lay.parallel:  # pipeline / data / expert parallel: the most loaded rank (formulas/serving/parallel.py)
        headline += f" (the most loaded of {lay.gpus} GPUs: {lay.describe()})"
    pools = f" per rank, {lay.dp} in all," if lay.dp > 1 else ""
    for g, f in zip(gpus, fits, strict=True):
        if f.pool_bytes is not None and f.budget_bytes is not None:
            alone = f.max_concurrent_alone
            shared = (f" sharing a {setup.prefix_tokens}-token prefix ({alone} without sharing)"
                      if setup.prefix_tokens and alone is not None else "")  # fmt: skip
            graphs = f.estimate.extra.get("cuda_graph_bytes")  # formulas/serving/cuda_graphs.py
            on_top = (f" + CUDA graphs {fmt_both(graphs)} on top" if isinstance(graphs, int)
                      and f.estimate.extra.get("cuda_graph_accounting") == "on_top" else "")  # fmt: skip
            # SGLang's fraction is of what the CUDA context leaves (formulas/serving/context.py fraction_base)
            of = "what the CUDA context leaves" if setup.engine is Engine.SGLANG else "the GPU"
            headline += (
                f"; on {g.name} {setup.engine.value} takes {f.fraction:g} x {of} "
                f"({fmt_both(f.budget_bytes)}){on_top}, a KV pool of {fmt_both(f.pool_bytes)}{pools} "
                "that holds "
                f"{f.max_concurrent} sequences of {context} tokens{shared} ({setup.batch} asked): "
                f"{f.verdict(g.name).state}"
            )
    if not gpus:
        headline += f"; {_smallest_serving_gpu(spec, setup)}"
    out = estimate_json(est, list(verdicts))
    if fits:  # each GPU's row gains serving_fit's figures (the pool and the sequences it holds)
        out["verdicts"] = [{**row, **{k: v for k, v in f.json().items() if k not in row}}
                           for row, f in zip(out["verdicts"], fits, strict=True)]  # fmt: skip
    return InferAnswer(estimate=est, verdicts=verdicts, headline=headline + ".", json=out)


def _smallest_serving_gpu(spec: ModelSpec, setup: Any) -> str:
    """The smallest catalog NVIDIA GPU that serving_fit says holds the job (a pooled engine's pool too)."""
    from peakmem.catalog import GPUS
    from peakmem.formulas.serving import serving_fit

    for g in sorted((g for g in GPUS if g.vendor == "nvidia"), key=lambda g: g.usable_bytes):
        if serving_fit(
            spec, setup.on_gpu(g.usable_bytes, g.display_name, g.memory_bytes), g.usable_bytes
        ).fits:
            return f"the smallest NVIDIA GPU it fits on is {g.display_name} ({fmt_gb(g.usable_bytes, 1)})"
    return "it fits on no single GPU in the catalog"
