"""SGLang speculative decoding (``--speculative-algorithm EAGLE|EAGLE3|NEXTN|STANDALONE|NGRAM``): where
the draft's weights and KV pool sit against ``--mem-fraction-static``.

Read in sgl-project/sglang ``python/sglang/srt/model_executor/model_runner.py`` ``init_memory_pool``
(2025 main, the form quoted in sglang PR #23862's description) and ``server_args.py``:

* **The target profiles alone.** ``profile_max_num_token`` runs on the target's ModelRunner after its
  weights are loaded and before the draft worker exists: ``rest = available - total x (1 -
  mem_fraction_static)``, ``max_total_num_tokens = rest // cell_size`` with the target's cell only.
* **Headroom for draft and verify tokens.** The target then sets
  ``draft_runner_cache_size = max_total_num_tokens + max_num_reqs x speculative_num_steps x
  speculative_eagle_topk + max_num_reqs x speculative_num_draft_tokens + 100`` and takes that many
  tokens itself ("Target worker and draft worker shares the same indices for the token_to_kv_pool");
  ``max_num_reqs`` is ``max_running_requests``, which server_args.py ``_handle_speculative_decoding``
  sets to 48 for EAGLE / EAGLE3 / NEXTN / STANDALONE unless given ("Max running requests is reset to
  48 for speculative decoding"): at most 48 requests run at once.
* **The draft is on top.** The draft worker (``is_draft_worker``) loads its weights and allocates a KV
  pool of ``draft_runner_cache_size`` tokens of its own cell, neither inside the budget: sglang PR
  #23862 (2026-04-27) "The draft model's weights and KV cache are not accounted for, causing OOM at
  launch"; the only cover was ``server_args``' flat reserve (+2 GiB for EAGLE / NEXTN, +6 GiB for
  STANDALONE: ``sglang_defaults.SGLANG_SPEC_RESERVED_MIB``) lowering the default mem_fraction_static.
* **Budgeted later.** #23862 and #28855 (2026-06-21, "count speculative draft weights against
  --mem-fraction-static") profile the KV pool after both models' weights, for both pools: the budget
  holds target + draft weights and target + draft KV. peakmem takes SGLang releases from
  :data:`SGLANG_DRAFT_BUDGETED_FROM` to carry them (an assumption: the release number was not read;
  ``--engine-version`` picks the other rule).

peakmem maps ``--num-speculative-tokens K`` to a chain: ``speculative_num_steps K``,
``speculative_eagle_topk 1``, ``speculative_num_draft_tokens K + 1``. The draft's CUDA graphs (its decode
and draft-extend runners, the target's verify graphs) and the runners' static buffers (``hidden_states`` of
``3 x target_hidden`` for EAGLE-3 in the draft-extend runner, ...) are the CUDA-graph term's:
formulas/serving/sglang_graphs.py. Not modelled: trees with topk > 1.

**The draft's load-time copies** (:func:`load_copies_bytes`): an EAGLE / EAGLE-3 / MTP draft is built
with its own embedding (and, but for EAGLE-3, head), which ``set_embed_and_head`` frees only after the
draft worker's ``TpModelWorker.__init__`` (weights and KV pool) has run (speculative/eagle_worker.py).
Before the budgeted release they come on top of everything past mem_fraction_static at launch; after it,
whether the profile sees them is not read (a note says so). Found after peakmem missed a held-out log
(benchmarks/spec_decode_logs.json: ``Qwen3_5ForCausalLMMTP``'s "Load weight end ... mem usage" 5.53 GiB
on a 248,320 x 5,120 vocabulary against 0.79 GiB counted), then read in SGLang's source; nothing fitted.
"""

from __future__ import annotations

from peakmem.formulas.serving.context import ServingContext, cache_bytes, fraction_base
from peakmem.formulas.serving.eagle import EAGLE3
from peakmem.formulas.serving.speculative import draft_cache_bytes
from peakmem.inference import Engine

# The release from which peakmem budgets the draft inside mem_fraction_static (see the docstring)
SGLANG_DRAFT_BUDGETED_FROM = (0, 6)
# server_args.py _handle_speculative_decoding: max_running_requests = 48 unless given
SGLANG_SPEC_MAX_RUNNING_REQUESTS = 48
SGLANG_DRAFT_CACHE_BUFFER = 100  # draft_runner_cache_size's "+ 100" ("buffer")
SGLANG_EAGLE_TOPK = 1  # peakmem's chain: speculative_eagle_topk
# The drafts whose embedding (and head) SGLang points at the target's after loading their own
# (eagle_worker.py: set_embed_and_head, or set_embed for EAGLE-3)
SGLANG_SHARED_METHODS = ("eagle", EAGLE3, "mtp")
# layers/vocab_parallel_embedding.py DEFAULT_VOCAB_PADDING_SIZE (as vLLM's)
SGLANG_VOCAB_PADDING = 64


def draft_outside_budget(c: ServingContext) -> bool:
    """SGLang before :data:`SGLANG_DRAFT_BUDGETED_FROM` with a draft model: its weights and KV pool
    are allocated beyond mem_fraction_static."""
    d, s = c.setup.draft, c.setup
    return (
        s.engine is Engine.SGLANG
        and d is not None
        and d.spec is not None
        and s.version < SGLANG_DRAFT_BUDGETED_FROM
    )


def headroom_tokens(c: ServingContext) -> int:
    """The tokens ``draft_runner_cache_size`` adds to the profiled pool (0 without an SGLang draft)."""
    s = c.setup
    if s.engine is not Engine.SGLANG or s.draft is None or s.draft.spec is None:
        return 0
    k, reqs = s.num_speculative_tokens or 0, SGLANG_SPEC_MAX_RUNNING_REQUESTS
    return reqs * k * SGLANG_EAGLE_TOPK + reqs * (k + 1) + SGLANG_DRAFT_CACHE_BUFFER


def load_copies_bytes(c: ServingContext) -> int:
    """The draft's own embedding and head SGLang allocates at load and frees once the draft worker's
    ``TpModelWorker.__init__`` (its weights, then its KV pool) has run: ``set_embed_and_head`` /
    ``set_embed`` then point the draft at the target's (speculative/eagle_worker.py; the MTP models,
    e.g. models/qwen3_5_mtp.py and deepseek_nextn.py, build ``embed_tokens`` and ``lm_head`` of the full
    vocabulary; llama_eagle3.py its ``embed_tokens``, keeping its own ``draft_vocab_size`` head). Both
    are vocabulary-parallel (``VocabParallelEmbedding`` / ``ParallelLMHead``: the vocabulary padded to
    :data:`SGLANG_VOCAB_PADDING`, split over tp) in the model dtype. 0 without an SGLang EAGLE / EAGLE-3 /
    MTP draft (a separate draft model keeps its own)."""
    s, d = c.setup, c.setup.draft
    if s.engine is not Engine.SGLANG or d is None or d.spec is None or d.method not in SGLANG_SHARED_METHODS:
        return 0
    vocab = -(-d.spec.vocab_size // SGLANG_VOCAB_PADDING) * SGLANG_VOCAB_PADDING
    copies = 1 if d.method == EAGLE3 else 2  # EAGLE-3: the embedding only
    return copies * -(-vocab // s.tp) * d.spec.hidden_size * c.act_bytes


def sglang_draft_figures(c: ServingContext, pool_bytes: int, draft_weight_bytes: int) -> dict[str, int]:
    """What an SGLang draft adds around a KV pool of ``pool_bytes`` (the target's alone before
    :data:`SGLANG_DRAFT_BUDGETED_FROM`, target + draft after): the pool's tokens, the headroom tokens,
    and the bytes allocated beyond mem_fraction_static (headroom KV of both models; before, also the
    draft's weights and whole KV pool). Empty without an SGLang draft model."""
    s, d = c.setup, c.setup.draft
    if s.engine is not Engine.SGLANG or d is None or d.spec is None:
        return {}
    target_cell, draft_cell = cache_bytes(c, 1, 1), draft_cache_bytes(c, 1, 1)
    outside = draft_outside_budget(c)
    cell = target_cell if outside else target_cell + draft_cell
    tokens = pool_bytes // max(1, cell)
    extra = headroom_tokens(c)
    beyond = extra * (target_cell + draft_cell)
    copies = load_copies_bytes(c)
    if outside:  # at launch: the draft's weights, the load-time copies beside them, its whole pool
        beyond += draft_weight_bytes + copies + tokens * draft_cell
    return {
        "sglang_pool_tokens": tokens,
        "sglang_draft_headroom_tokens": extra,
        "sglang_draft_cache_tokens": tokens + extra,
        "sglang_beyond_budget_bytes": beyond,
    }


def sglang_draft_notes(c: ServingContext, figures: dict[str, int], budget: int) -> tuple[str, ...]:
    """What the answer says of an SGLang draft's pools (nothing without one)."""
    if not figures:
        return ()
    s, beyond = c.setup, figures["sglang_beyond_budget_bytes"]
    gpu = s.gpu_bytes or 0
    notes = [
        f"SGLang speculative decoding (a chain of {s.num_speculative_tokens}): both KV pools hold "
        f"{figures['sglang_draft_cache_tokens']} tokens, {figures['sglang_draft_headroom_tokens']} of them "
        f"draft/verify headroom for max_running_requests {SGLANG_SPEC_MAX_RUNNING_REQUESTS} (at most "
        f"{SGLANG_SPEC_MAX_RUNNING_REQUESTS} requests run unless --max-running-requests); {beyond} B "
        "beyond mem_fraction_static"
    ]
    if draft_outside_budget(c):
        notes.append("SGLang before the draft was budgeted (sglang PR #23862, #28855): the draft's weights "
                     "and whole KV pool are allocated past mem_fraction_static")  # fmt: skip
    copies = load_copies_bytes(c)
    if copies:
        where = (
            "past mem_fraction_static with the rest"
            if draft_outside_budget(c)
            else ("inside the budget where the profile sees them (not modelled)")
        )
        notes.append(f"the draft's own embedding/head ({copies} B) exist from its load until "
                     f"set_embed_and_head, after its KV pool is allocated: {where}")  # fmt: skip
    room = fraction_base(Engine.SGLANG, gpu)  # the budget is a fraction of it
    if budget + beyond > room:
        over = budget + beyond - room
        notes.append(f"does not launch: mem_fraction_static's budget and the draft's {beyond} B exceed what "
                     f"the CUDA context leaves of the GPU by {over} B (sglang PR #23862: \"causing OOM at "
                     "launch\")")  # fmt: skip
    return tuple(notes)
