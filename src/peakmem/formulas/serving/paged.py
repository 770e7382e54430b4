"""vLLM and SGLang: a KV pool preallocated out of the GPU, in pages.

* ``vllm``: preallocates ``gpu_memory_utilization x GPU`` minus weights, the profiled activation
  peak (one chunk of ``max_num_batched_tokens``) and non-torch memory, as a paged KV pool
  (``vllm/v1/worker/gpu_worker.py`` ``determine_available_memory``); reports how many sequences
  of ``context`` tokens fit in it.
* ``sglang``: the same with ``mem_fraction_static`` (its default chosen by GPU size:
  ``peakmem.sglang_defaults``) and one-token pages; that fraction, of the memory the CUDA context leaves
  free (:func:`peakmem.formulas.serving.context.fraction_base`), holds weights and pool.
"""

from __future__ import annotations

from peakmem.breakdown import Category, MemoryItem
from peakmem.device import is_rocm
from peakmem.errors import require
from peakmem.formulas.band import cuda_graphs_term
from peakmem.formulas.serving import vllm_profile
from peakmem.formulas.serving.context import (
    CUDA_CONTEXT_BYTES,
    CUDA_CONTEXT_SOURCE,
    EngineMemory,
    ServingContext,
    cache_bytes,
    fraction_base,
    hybrid_block,
    mla_absorbed_bytes,
    state_items,
    state_per_sequence,
    weights_item,
)
from peakmem.formulas.serving.cuda_graphs import (
    Accounting,
    GraphMemory,
    graph_band,
    graph_memory,
    graph_note,
)
from peakmem.formulas.serving.forward import layer_transient_bytes
from peakmem.formulas.serving.lora_slots import (
    VLLM_LORA_PROFILED_RELEASE,
    has_embedding_lora,
    lora_slot_bytes,
    lora_wrapper_bytes,
)
from peakmem.formulas.serving.mxfp4_pad import vllm_mxfp4_pad_bytes
from peakmem.formulas.serving.parallel import dp_gathered_bytes
from peakmem.formulas.serving.prefix import PrefixShare, concurrent_with_share, shared_prefix
from peakmem.formulas.serving.sglang_spec import (
    draft_outside_budget,
    sglang_draft_figures,
    sglang_draft_notes,
)
from peakmem.formulas.serving.speculative import (
    draft_buffers_item,
    draft_cache_bytes,
    draft_notes,
    draft_weights_item,
    lookahead_tokens,
)
from peakmem.formulas.weights import WeightRow
from peakmem.inference import Engine
from peakmem.vllm_defaults import V0_MAX_NUM_SEQS, batch_note

# the rows peakmem's sampler warm-up takes for SGLang (vLLM V0's, as before; SGLang's own not read)
SGLANG_SAMPLER_ROWS = V0_MAX_NUM_SEQS
# The engines that preallocate a KV pool: a request fits when the pool holds it (serving_fit).
POOLED_ENGINES = (Engine.VLLM, Engine.SGLANG)


def paged_memory(c: ServingContext, rows: tuple[WeightRow, ...]) -> EngineMemory:
    """vLLM / SGLang: a preallocated paged pool; without a GPU size, the cache the batch needs."""
    s = c.setup
    b = s.layout.rank_batch(s.batch)  # one data-parallel rank's share (peakmem.serving_layout)
    # vLLM raises the attention block of a hybrid model until a page holds one layer's recurrent state
    # (formulas/recurrent_state.py vllm_hybrid_block)
    hybrid = hybrid_block(c)
    block = hybrid.block if hybrid is not None else s.effective_block_size
    weights = weights_item(c, rows)
    beside = engine_weight_rows(c)  # MLA copies, MXFP4 padding
    # the prefill chunk and the sampler warm-up's rows: vLLM's max_num_batched_tokens and max_num_seqs by
    # release, GPU and entry point (peakmem.vllm_defaults); SGLang's chunked_prefill_size by GPU tier
    # (peakmem.sglang_defaults) and 256 rows (its own warm-up not read); the given --prefill-chunk /
    # --max-num-seqs kept
    batch = None if s.engine is Engine.SGLANG else s.vllm_batch(c.context)
    if batch is None:
        chunk, max_num_seqs = s.sglang_defaults(s.gpu_bytes).chunked_prefill_size, SGLANG_SAMPLER_ROWS
    else:
        chunk, max_num_seqs = batch.max_num_batched_tokens, batch.max_num_seqs
    vocab = -(-c.spec.vocab_size // s.tp)
    act = layer_transient_bytes(c.spec, chunk, c.act_bytes, s.tp, fused=True)
    # vLLM from 0.9: its profile as the 0.19 logs give it (formulas/serving/vllm_profile.py) - the sampler
    # warm-up over the whole vocabulary on every rank, and what the device gains outside torch in the profile
    logged = s.engine is Engine.VLLM and vllm_profile.measured(s.version)
    non_torch = vllm_profile.non_torch(s.tp) if logged else None
    if logged:
        sampler = vllm_profile.sampler_bytes(max_num_seqs, c.spec.vocab_size, c.act_bytes, s.version,
                                             flashinfer=not is_rocm(s.gpu_architecture))  # fmt: skip
    else:  # profile_run's sampler warm-up as read: fp32 logits and probabilities for max_num_seqs sequences
        sampler = max_num_seqs * vocab * 4 * 2
    # CUDA graphs (formulas/serving/cuda_graphs.py): captured per size into one shared pool
    graphs = graph_memory(c.spec, s, act_bytes=c.act_bytes, max_tokens=chunk,
                          spec_tokens=s.num_speculative_tokens or 0, max_num_seqs=max_num_seqs)  # fmt: skip
    graph_bytes = graphs.bytes if graphs is not None else 0
    graph_low, graph_high = graph_band(graphs)
    # vLLM 0.14 on: the modular MoE kernels' workspace, grown by the profile's forward, is still held in the
    # sampler warm-up (formulas/serving/vllm_profile.py MODULAR_MOE_RELEASE)
    workspace = 0
    if logged and vllm_profile.holds_moe_workspace(s.version, s.weight_format, s.gpu_architecture):
        slices = 1 if s.layout.ep > 1 else s.layout.expert_ways
        workspace = vllm_profile.moe_workspace_bytes(c.spec, chunk, slices, c.act_bytes, s.version)
    # SGLang DP attention: the tokens of every DP rank gathered before the MLP (formulas/serving/parallel.py)
    activations = max(act, sampler + workspace) + dp_gathered_bytes(
        c.spec.hidden_size, chunk, s.layout, c.act_bytes
    )
    # vLLM's hybrid KV-cache manager keeps each sequence's SSM / linear-attention state in the same
    # pool (vllm/v1/kv_cache_interface.py MambaSpec), one padded page per stateful layer: a sequence needs
    # its KV and its state. SGLang keeps the states in a MambaPool of their own (sglang_mamba_slots).
    state_per_seq = state_per_sequence(c)
    # speculative decoding (formulas/serving/speculative.py): the draft's layers take KV from the same
    # pool, and each sequence holds K lookahead slots
    tokens = c.context + lookahead_tokens(c)
    per_seq_draft = draft_cache_bytes(c, tokens, 1, block)
    per_seq = cache_bytes(c, tokens, 1, block) + per_seq_draft + state_per_seq
    # automatic prefix caching: the shared prefix's full blocks are held once (formulas/serving/prefix.py)
    share = _prefix_share(c, block)
    shared_draft = draft_cache_bytes(c, share.shared_tokens, 1, block) if share.shared_tokens else 0
    shared = (cache_bytes(c, share.shared_tokens, 1, block) if share.shared_tokens else 0) + shared_draft
    needed = shared + (per_seq - shared) * b
    draft_needed = shared_draft + (per_seq_draft - shared_draft) * b
    lora = _lora_item(c)
    draft_w = draft_weights_item(c)
    draft_buf = draft_buffers_item(c, chunk)
    notes: list[str] = list(draft_notes(c))
    extra: dict[str, object] = {
        "kv_bytes_per_sequence": per_seq,
        "kv_needed_bytes": needed,
        "prefill_chunk_tokens": chunk,
    }
    if batch is not None:
        extra["max_num_seqs"] = max_num_seqs
        if batch.defaulted:
            notes.append(batch_note(batch, s.vllm_entrypoint))
    if non_torch is not None:
        extra.update(vllm_non_torch_bytes=non_torch.likely, vllm_non_torch_low_bytes=non_torch.low,
                     vllm_non_torch_high_bytes=non_torch.high)  # fmt: skip
        notes.append(vllm_profile.profile_note(sampler, max_num_seqs, non_torch, s.tp))
    if workspace:
        extra["vllm_moe_workspace_bytes"] = workspace
        notes.append(vllm_profile.workspace_note(workspace, chunk))
    if draft_w is not None:
        extra["draft_kv_needed_bytes"] = draft_needed
    if hybrid is not None:
        extra.update(vllm_hybrid_block_size=hybrid.block, vllm_mamba_page_bytes=hybrid.mamba_page,
                     vllm_mamba_page_padding_pct=round(hybrid.padding_pct, 2))  # fmt: skip
    if s.prefix_tokens:
        extra.update(prefix_tokens=s.prefix_tokens, prefix_shared_tokens=share.shared_tokens,
                     prefix_shared_kv_bytes=shared)  # fmt: skip
        notes.append(
            f"prefix caching: the {s.prefix_tokens}-token shared prefix's {share.shared_tokens // block} "
            f"full {block}-token blocks ({shared} B) are stored once; each request holds its own "
            f"{per_seq - shared} B (the rest of its {c.context} tokens, the prefix's partial block included)"
        )
    if lora is not None:
        extra["lora_slot_bytes"] = lora.bytes
        wrappers = lora_wrapper_bytes(c.spec, max_loras=s.lora_slots, rank=s.lora_rank,
                                      dtype_bytes=c.act_bytes, tp=s.tp, version=s.version)  # fmt: skip
        extra["lora_wrapper_bytes"] = wrappers
        counted = (
            f"and the embedding / LM-head wrappers ({wrappers} B: {c.spec.architecture} declares "
            "embedding_modules in this release)"
            if has_embedding_lora(c.spec, s.version)
            else f"no embedding / LM-head wrappers ({c.spec.architecture} declares no embedding_modules in "
            "this release, or its declaration was not read)"
        )
        notes.append(
            f"LoRA slots: vLLM's A/B stacks of every decoder Linear {counted}; not counted: LoRA on MoE "
            "experts, punica index buffers (< 1 MiB); the adapters' CPU cache (max_cpu_loras, default "
            "max_loras) is host RAM"
        )
    if s.gpu_bytes is not None:
        # What the engine preallocates on that GPU; the request's own bytes (below) do not depend on it.
        budget = int(fraction_base(s.engine, s.gpu_bytes) * s.memory_fraction(s.gpu_bytes))
        # vLLM V1 loads the draft before profiling: its weights count with the target's (speculative.py)
        resident = weights.bytes + sum(i.bytes for i in (*beside, draft_w, draft_buf) if i is not None)
        outside = draft_outside_budget(c)
        if s.engine is Engine.SGLANG:
            # SGLang: mem_fraction_static x GPU holds weights + KV pool only; activations and CUDA
            # graphs use the rest (python/sglang/srt/model_executor/model_runner.py profile_max_num_token).
            # A draft's weights and pool count there only from SGLANG_DRAFT_BUDGETED_FROM (sglang_spec.py).
            pool = budget - (weights.bytes if outside else resident)
        else:
            # vLLM: requested memory minus non-KV memory (weights, profiled activation peak, non-torch);
            # from 0.20 also the CUDA graphs' estimate (vllm/v1/worker/gpu_worker.py; serving/cuda_graphs.py)
            # (from 0.19 the non-torch increase of the profile; the context is its baseline, outside it)
            pool = budget - resident - activations - (non_torch.likely if non_torch else CUDA_CONTEXT_BYTES)
            if graphs is not None and graphs.accounting is Accounting.KV_BUDGET:
                pool -= graph_bytes
        pool = max(pool, 0)
        if lora is not None and s.version >= VLLM_LORA_PROFILED_RELEASE:
            # vLLM V1 profiles after load_model: the LoRA stacks count with the weights (lora_slots.py)
            shrink = min(pool, lora.bytes)
            pool -= shrink
            extra["kv_pool_lora_shrink_bytes"] = shrink
            notes.append(
                f"LoRA slots take {lora.bytes} B out of the KV pool (vLLM profiles them with the weights)"
            )
        elif lora is not None:
            notes.append(
                f"LoRA slots ({lora.bytes} B) come on top of gpu_memory_utilization x GPU: vLLM before "
                "0.8 sized the KV pool before it built the LoRA manager (vllm issue #14450)"
            )
        # SGLang before the draft was budgeted: the pool holds the target's KV only (the draft's own
        # pool of as many tokens is allocated beyond the budget: sglang_spec.py)
        pool_draft = per_seq_draft if outside else 0
        block_bytes = cache_bytes(c, block, 1, block) + (
            0 if outside else draft_cache_bytes(c, block, 1, block)
        )
        in_pool, shared_in = per_seq - pool_draft, shared - (shared_draft if outside else 0)
        kv_pool = pool
        slots = None
        if s.engine is Engine.SGLANG and state_per_seq:
            # SGLang: the rest splits into a MambaPool of whole states and the token KV pool
            slots, state_pool = sglang_mamba_slots(pool, state_per_seq)
            kv_pool, in_pool = pool - state_pool, in_pool - state_per_seq
            extra.update(mamba_cache_slots=slots, mamba_pool_bytes=state_pool)
            notes.append(sglang_mamba_note(slots, state_per_seq))
        concurrent = (
            concurrent_with_share(kv_pool, per_sequence=in_pool, shared_bytes=shared_in) if in_pool else 0
        )
        if slots is not None:
            concurrent = min(concurrent, slots) if in_pool else slots
        figures = sglang_draft_figures(c, pool, draft_w.bytes if draft_w is not None else 0)
        extra.update(figures)
        notes.extend(sglang_draft_notes(c, figures, budget))
        if s.prefix_tokens:
            extra["max_concurrent_without_prefix_sharing"] = kv_pool // in_pool if in_pool else 0
        extra.update(
            kv_pool_bytes=pool,  # SGLang: its token pool and its MambaPool (mamba_pool_bytes) together
            kv_pool_blocks=kv_pool // max(1, block_bytes),
            max_concurrent_sequences=concurrent,
            memory_budget_bytes=budget,
            memory_fraction=s.memory_fraction(s.gpu_bytes),
        )
        if kv_pool < in_pool or slots == 0:
            notes.append(
                f"does not start: the KV pool ({pool} B) cannot hold one {c.context}-token sequence "
                f"({in_pool} B); lower context (max_model_len) or raise gpu_memory_utilization"
            )
        elif concurrent > max_num_seqs and s.engine is Engine.VLLM:
            notes.append(
                f"the KV pool holds {concurrent} sequences; vLLM runs at most max_num_seqs="
                f"{max_num_seqs} at once unless raised"
            )
        elif concurrent < b:
            notes.append(f"only {concurrent} sequences of {c.context} tokens fit; the rest wait in the queue")
    notes.append(
        f"{s.engine.value} preallocates a KV pool of gpu_memory_utilization x GPU less the rest; the KV "
        "cache shown is what the batch needs (it fits when the pool holds it: serving_fit)"
    )
    ahead = f" + {tokens - c.context} lookahead" if tokens > c.context else ""
    kv_item = MemoryItem(
        path=f"kv cache ({c.context}{ahead} tokens x {b}, {block}-token blocks)",
        category=Category.KV_CACHE,
        bytes=needed - draft_needed - state_per_seq * b,
        source="formulas/kv_cache.py" + (" + formulas/serving/prefix.py" if shared else ""),
    )
    draft_resident = [i for i in (draft_w, draft_buf) if i is not None]
    draft_rows = [] if draft_w is None else [*draft_resident, MemoryItem(
        path=f"draft kv cache ({c.context}{ahead} tokens x {b}, same pool)", category=Category.KV_CACHE,
        bytes=draft_needed, source="formulas/serving/speculative.py")]  # fmt: skip
    states = state_items(c, b)
    act_item = MemoryItem(
        path=f"activations ({chunk}-token prefill chunk)",
        category=Category.ACTIVATIONS,
        bytes=activations,
        source="formulas/serving/forward.py layer_transient_bytes"
        + (" + formulas/serving/vllm_profile.py" if logged else ""),
    )
    decode_tmp = MemoryItem(
        path="decode temporaries",
        category=Category.TEMPORARIES,
        bytes=layer_transient_bytes(c.spec, b, c.act_bytes, s.tp, fused=True)
        + b * vocab * 8
        + dp_gathered_bytes(c.spec.hidden_size, b, s.layout, c.act_bytes),
        source="formulas/serving/paged.py",
    )
    overhead = [
        MemoryItem(
            path="CUDA context + non-torch",
            category=Category.OVERHEAD,
            bytes=CUDA_CONTEXT_BYTES + (non_torch.likely if non_torch else 0),
            source=CUDA_CONTEXT_SOURCE + (" + formulas/serving/vllm_profile.py" if non_torch else ""),
        )
    ]
    lora_rows = [lora] if lora is not None else []
    held = [*beside, *lora_rows, *draft_resident]
    extra["steady_state_bytes"] = weights.bytes + sum(i.bytes for i in held) + needed
    graph_rows = _graph_rows(graphs, extra, notes)
    return EngineMemory(
        prefill=[weights, *beside, *lora_rows, *draft_rows, kv_item, *states, act_item, *graph_rows],
        decode=[weights, *beside, *lora_rows, *draft_rows, kv_item, *states, decode_tmp, *graph_rows],
        overhead=overhead,
        extra=extra,
        notes=tuple(notes),
        band_terms=(
            *((cuda_graphs_term(low_bytes=graph_low, high_bytes=graph_high),) if graphs is not None else ()),
            *((vllm_profile.non_torch_term(non_torch),) if non_torch is not None else ()),
        ),
    )


def engine_weight_rows(c: ServingContext) -> list[MemoryItem]:
    """What the engine holds beside the checkpoint's weights, a row each where there is any: vLLM's
    16-bit copy of a quantized MLA kv_b_proj, and its padding of MXFP4 experts to the MoE kernel's tiles."""
    rows = (
        ("MLA W_UK / W_UV (compute-dtype copy of kv_b_proj)", mla_absorbed_bytes(c),
         "formulas/serving/context.py mla_absorbed_bytes"),
        ("MXFP4 experts' padding to the MoE kernel's tiles", vllm_mxfp4_pad_bytes(c),
         "formulas/serving/mxfp4_pad.py"),
    )  # fmt: skip
    return [MemoryItem(path=path, category=Category.PARAMETERS, bytes=n, source=source)
            for path, n, source in rows if n]  # fmt: skip


def _graph_rows(graphs: GraphMemory | None, extra: dict[str, object], notes: list[str]) -> list[MemoryItem]:
    """The CUDA graphs' row (none with enforce_eager), their figures in ``extra`` and their note."""
    if graphs is None:
        notes.append("no CUDA graphs (enforce_eager / --disable-cuda-graph / cudagraph_mode none)")
        return []
    extra.update(cuda_graph_bytes=graphs.bytes, cuda_graphs=graphs.graphs,
                 cuda_graph_accounting=graphs.accounting.value)  # fmt: skip
    if graphs.runner:  # vLLM V1 engine: the model runner (formulas/serving/cuda_graphs.py vllm_model_runner)
        extra["vllm_model_runner"] = graphs.runner
    if graphs.nccl_captured:  # --disable-custom-all-reduce at TP > 1: NCCL all-reduces in the graphs
        extra.update(cuda_graph_allreduces=graphs.captured_allreduces,
                     cuda_graph_nccl_bytes=graphs.nccl_bytes)  # fmt: skip
    notes.append(graph_note(graphs))
    return [MemoryItem(
        path=f"CUDA graphs ({graphs.graphs} graphs, largest {graphs.largest})", category=Category.CUDA_GRAPHS,
        bytes=graphs.bytes, source="formulas/serving/cuda_graphs.py",
    )]  # fmt: skip


def _prefix_share(c: ServingContext, block: int) -> PrefixShare:
    """The shared prefix of ``c``'s requests; it must leave each request a token of its own."""
    prefix = c.setup.prefix_tokens
    if prefix:
        require(prefix < c.context, "prefix_tokens", prefix,
                f"must be below context={c.context} (each request has tokens of its own)")  # fmt: skip
        require(all(g.layer.attention.sliding_window is None for g in c.spec.groups), "prefix_tokens",
                prefix, "prefix sharing with sliding-window layers is not modelled")  # fmt: skip
    return shared_prefix(prefix, block)


def _lora_item(c: ServingContext) -> MemoryItem | None:
    """vLLM's preallocated LoRA slots (formulas/serving/lora_slots.py), in the model's dtype: the decoder
    Linears' stacks and, where the release wraps them, the embedding / LM-head wrappers."""
    s = c.setup
    if not s.lora_slots:
        return None
    nbytes = lora_slot_bytes(
        c.spec, max_loras=s.lora_slots, rank=s.lora_rank, dtype_bytes=c.act_bytes, tp=s.tp, version=s.version
    )
    return MemoryItem(
        path=f"LoRA slots ({s.lora_slots} x rank {s.lora_rank})",
        category=Category.PARAMETERS,
        bytes=nbytes,
        source="formulas/serving/lora_slots.py",
    )


# SGLang --mamba-full-memory-ratio default 0.9: the MambaPool takes ratio / (1 + ratio) of the memory left
# after the weights (python/sglang/srt/model_executor/model_runner.py ``_handle_max_mamba_cache``, SGLang
# main of 2026, read without its commit: ``mamba_budget = total_rest_memory * ratio / (1 + ratio)``;
# max_mamba_cache_size = budget // mamba_cache_per_req); the KV pool gets the rest
SGLANG_MAMBA_FULL_MEMORY_RATIO = 0.9


def sglang_mamba_slots(rest: int, state_per_request: int) -> tuple[int, int]:
    """SGLang's MambaPool for ``rest`` bytes after the weights: (its slots, its bytes), one slot per
    running request (no ``--max-mamba-cache-size``, no speculative decoding: its intermediate states,
    ``speculative_num_draft_tokens`` states per request, are not modelled)."""
    ratio = SGLANG_MAMBA_FULL_MEMORY_RATIO
    slots = int(rest * ratio / (1 + ratio)) // state_per_request
    return slots, slots * state_per_request


def sglang_mamba_note(slots: int, state_per_request: int) -> str:
    return (
        f"SGLang MambaPool: {slots} recurrent-state slots of {state_per_request} B "
        f"(mamba_full_memory_ratio {SGLANG_MAMBA_FULL_MEMORY_RATIO}: ratio / (1 + ratio) of the memory after "
        "the weights); the KV pool gets the rest, and the running requests are capped by both"
    )
