"""Speculative decoding: a draft model served next to the target (vLLM ``speculative_config``,
transformers assisted generation ``assistant_model``).

vLLM V1 (vllm-project/vllm main, 2025: vllm/v1/spec_decode/draft_model.py ``DraftModelProposer``,
vllm/v1/worker/gpu_model_runner.py ``load_model``):

* **Draft weights count inside gpu_memory_utilization.** ``GPUModelRunner.load_model`` loads the
  target, then ``self.drafter.load_model(self.model)``; both are resident before
  ``determine_available_memory`` (vllm/v1/worker/gpu_worker.py) profiles, so the KV pool shrinks by
  the draft's weight bytes. Older vLLM (V0 ``SpecDecodeWorker.determine_num_available_blocks``)
  "only considers the memory usage of the target model" (vllm-project/vllm issue #9995; PRs
  #13221 / #14067 added the proposer's weights to the profile): not modelled.
* **The draft's dtype is the target's** (vllm/config/speculative.py ``SpeculativeConfig``: the draft
  ``ModelConfig`` is built with ``dtype=self.target_model_config.dtype``), unless the draft's own
  checkpoint is quantized (its quantization_config). Its tensor-parallel size is the target's.
* **The draft's KV cache comes from the same pool.** ``DraftModelProposer.load_model`` builds the
  draft inside the target's ``vllm_config`` and takes as its ``attn_layer_names`` the Attention
  layers that ``get_layers_from_vllm_config(self.vllm_config, Attention)`` gains by loading it: they
  are in the same forward context, so ``GPUModelRunner.get_kv_cache_spec`` gives them KV cache pages
  next to the target's, with the same ``kv_cache_dtype`` (one CacheConfig). A block then costs the
  target's layers plus the draft's: per-token KV = target + draft, and the pool holds fewer tokens.
  Modelled as one KV-cache group (draft and target attention layers allocated in lockstep).
* **K lookahead slots per sequence.** The scheduler allocates
  ``allocate_slots(request, num_new_tokens, num_lookahead_tokens=self.num_lookahead_tokens)``
  (vllm/v1/core/sched/scheduler.py), ``num_lookahead_tokens = num_speculative_tokens``: a running
  sequence holds K slots beyond its tokens, so one of ``context`` tokens needs ``context + K``.

transformers assisted generation (generation/candidate_generator.py ``AssistedCandidateGenerator``):
the assistant is a second model on the GPU (weights in the dtype it was loaded in: here the
target's compute dtype unless its checkpoint is quantized) with its own DynamicCache of the
sequence, which it keeps across steps (``assistant_kwargs["past_key_values"]``); batch 1 only.

MTP (``--draft mtp``: DeepSeek-V3, GLM-4.5): the target's checkpoint holds ``num_nextn_predict_layers``
multi-token-prediction layers (vllm/model_executor/models/deepseek_mtp.py
``DeepSeekMultiTokenPredictorLayer``: ``enorm``, ``hnorm``, ``eh_proj`` = Linear(2h -> h),
``shared_head`` (a norm and a head), ``mtp_block`` = a decoder layer as the target's last). vLLM's
``EagleProposer.load_model`` (vllm/v1/spec_decode/eagle.py) shares the target's ``embed_tokens`` and
``lm_head`` with an MTP draft ("Detected MTP model. Sharing target model lm_head weights"), so the
draft adds the layers only, in the target's format; each layer's attention takes KV from the pool.
Not checked: quantized checkpoints that keep the MTP layer in bf16 (SGLang's qwen3_5_mtp.py
``_mtp_quant_config`` builds it unquantized for modelopt_mixed, serialized modelopt_fp4, and quark with
``mtp.*`` excluded): peakmem gives the MTP layer the target's format, so it under-counts those drafts.
``eh_proj`` is counted as a layer linear split under tensor parallelism (vLLM keeps it a replicated
``nn.Linear``: with tp > 1 it is under-counted by (1 - 1/tp) of its 2h^2 weights).

EAGLE / EAGLE-3 heads (``--draft-method eagle|eagle3``, or an EAGLE-3 checkpoint's architectures):
their layers as formulas/serving/eagle.py builds them; their KV from the same pool, K lookahead slots.
EAGLE-3's ``draft_id_to_target_id`` (int64, ``draft_vocab_size`` entries) is counted as a buffer.

n-gram (``--draft ngram``, vllm/v1/spec_decode/ngram_proposer.py ``NgramProposer``): matches the
prompt's tokens on the CPU (numpy); no weights, no KV cache on the GPU; the scheduler still holds the
K lookahead slots per sequence.

The proposer's persistent buffers (vllm/v1/spec_decode/eagle.py ``EagleProposer.__init__``, 2025
vllm-project/vllm main; ``max_num_tokens = max_num_batched_tokens``): ``input_ids`` int32 and
``positions`` int64 of ``max_num_batched_tokens``, ``hidden_states`` [max_num_batched_tokens, hidden]
in the model dtype; allocated when the runner is built, before the memory profile, so they count
with the weights. Counted for the proposers that hold them: eagle, eagle3, mtp.

SGLang's speculative decoding: formulas/serving/sglang_spec.py (the pools against mem_fraction_static).

Not checked: that the draft's vocabulary and tokenizer match the target's (vLLM requires a shared
vocabulary; peakmem takes the draft as given). Not modelled: the draft's own profile-run
activations (smaller than the target's for a smaller draft), a draft's recurrent state, the target's
auxiliary hidden states EAGLE-3 reads (three [tokens, h] activations),
the buffers of ``DraftModelProposer`` (``draft_model``; newer vLLM derives it from the same base).
"""

from __future__ import annotations

from dataclasses import replace

from peakmem.breakdown import Category, MemoryItem
from peakmem.formulas.kv_cache import kv_bytes_per_token, kv_cache_bytes
from peakmem.formulas.serving.context import REPLICATING_ENGINES, ServingContext, sharded_weight_bytes
from peakmem.formulas.serving.eagle import EAGLE3
from peakmem.formulas.weights import weight_rows
from peakmem.inference import Engine
from peakmem.model import LayerGroup, ModelSpec, linear, norm
from peakmem.weight_formats import WeightFormat, parse_weight_format

SOURCE = "formulas/serving/speculative.py"


def mtp_draft_spec(target: ModelSpec, layers: int) -> ModelSpec:
    """The target's ``layers`` MTP layers as a draft spec: the last decoder layer plus ``eh_proj``,
    ``enorm``, ``hnorm`` and ``shared_head.norm``; embeddings and head shared with the target."""
    h, last = target.hidden_size, target.groups[-1].layer
    extra = (*linear("eh_proj", 2 * h, h, False, "other"), *norm("enorm", h, False),
             *norm("hnorm", h, False), *norm("shared_head.norm", h, False))  # fmt: skip
    layer = replace(last, tensors=(*last.tensors, *extra))
    return replace(
        target, name=f"{target.name} MTP", groups=(LayerGroup(count=layers, layer=layer),), outer=()
    )


def draft_format(c: ServingContext) -> WeightFormat | None:
    """The draft's weight format: its checkpoint's, else the target's compute dtype (vLLM's rule);
    None without a draft model (none, or n-gram)."""
    d = c.setup.draft
    if d is None or d.spec is None:
        return None
    return parse_weight_format(d.weights or c.compute_dtype)


def draft_weight_bytes(c: ServingContext) -> int:
    """The draft's weights on one tensor-parallel rank (0 without a draft)."""
    d, fmt = c.setup.draft, draft_format(c)
    if d is None or d.spec is None or fmt is None:
        return 0
    return sharded_weight_bytes(
        weight_rows(d.spec, fmt), c.setup.tp, mla_replicated=c.setup.engine in REPLICATING_ENGINES
    )


# EagleProposer's persistent buffers per token (vllm/v1/spec_decode/eagle.py ``__init__``:
# ``self.input_ids = torch.zeros(max_num_batched_tokens, dtype=torch.int32)``, ``self.positions``
# int64, ``self.hidden_states`` [max_num_batched_tokens, hidden_size] in the model dtype)
PROPOSER_INPUT_ID_BYTES = 4
PROPOSER_POSITION_BYTES = 8
PROPOSER_METHODS = ("eagle", "eagle3", "mtp")
# llama_eagle3.py: draft_id_to_target_id = nn.Parameter(torch.zeros(draft_vocab_size, dtype=torch.long))
D2T_BYTES = 8


def draft_buffer_bytes(c: ServingContext, max_tokens: int) -> int:
    """vLLM's proposer buffers for ``max_tokens`` (max_num_batched_tokens) tokens, and EAGLE-3's
    ``d2t`` map; 0 for other drafts and engines."""
    d = c.setup.draft
    if d is None or d.spec is None or c.setup.engine is not Engine.VLLM or d.method not in PROPOSER_METHODS:
        return 0
    per_token = PROPOSER_INPUT_ID_BYTES + PROPOSER_POSITION_BYTES + d.spec.hidden_size * c.act_bytes
    d2t = (d.draft_vocab_size or d.spec.vocab_size) * D2T_BYTES if d.method == EAGLE3 else 0
    return max_tokens * per_token + d2t


def draft_buffers_item(c: ServingContext, max_tokens: int) -> MemoryItem | None:
    """The proposer's buffers as a breakdown row, or None when there are none."""
    n = draft_buffer_bytes(c, max_tokens)
    if not n:
        return None
    return MemoryItem(path=f"draft proposer buffers ({max_tokens} tokens)", category=Category.BUFFERS,
                      bytes=n, source=SOURCE)  # fmt: skip


def draft_weights_item(c: ServingContext) -> MemoryItem | None:
    """The draft's weights as a breakdown row, or None without a draft."""
    d, fmt = c.setup.draft, draft_format(c)
    if d is None or fmt is None:
        return None
    return MemoryItem(
        path=f"draft weights ({d.name}, {fmt.name})",
        category=Category.PARAMETERS,
        bytes=draft_weight_bytes(c),
        source=SOURCE,
    )


def draft_cache_bytes(c: ServingContext, tokens: int, batch: int, block: int = 1) -> int:
    """The draft's KV cache of ``batch`` sequences of ``tokens`` tokens on one rank, in the target's
    KV dtype and ``block``-token pages (0 without a draft)."""
    d = c.setup.draft
    if d is None or d.spec is None:
        return 0
    return kv_cache_bytes(d.spec, tokens=tokens, batch=batch, bits=c.kv_bits, latent=c.latent,
                          tp=c.setup.tp, block_size=block)  # fmt: skip


def lookahead_tokens(c: ServingContext) -> int:
    """vLLM's scheduler: the K slots each running sequence holds beyond its tokens (0 without a draft)."""
    s = c.setup
    if s.draft is None or s.engine is not Engine.VLLM:
        return 0
    return s.num_speculative_tokens or 0


def draft_extra(c: ServingContext) -> dict[str, object]:
    """The draft's figures for the estimate's JSON (empty without a draft)."""
    d, s = c.setup.draft, c.setup
    if d is None:
        return {}
    fmt = draft_format(c)
    kv = 0 if d.spec is None else kv_bytes_per_token(d.spec, bits=c.kv_bits, latent=c.latent, tp=s.tp)
    return {
        "draft": d.name,
        "draft_method": d.method,
        "draft_weights": fmt.name if fmt is not None else "",
        "draft_weight_bytes": draft_weight_bytes(c),
        "draft_kv_bytes_per_token": kv,
        "num_speculative_tokens": c.setup.num_speculative_tokens,
    }


def draft_notes(c: ServingContext) -> tuple[str, ...]:
    """What the answer says of the draft (nothing without one)."""
    d, s = c.setup.draft, c.setup
    if d is None:
        return ()
    if d.method == "ngram":
        return (f"n-gram speculation: no draft weights or KV cache (CPU lookup); each sequence holds "
                f"{s.num_speculative_tokens} lookahead slots",)  # fmt: skip
    notes = [f"draft {d.name}: its vocabulary and tokenizer are not checked against {c.spec.name}'s"]
    if d.method in ("eagle", "eagle3"):
        head = (" and its lm_head too" if d.method == "eagle"
                else f"; its own lm_head of {d.draft_vocab_size} rows and the d2t map")  # fmt: skip
        notes.append(f"{d.method} head: embed_tokens shared with the target{head}; fc counted "
                     "tensor-parallel (vLLM replicates it)")  # fmt: skip
    if s.engine is Engine.VLLM:
        notes.append(
            f"speculative decoding (vLLM V1): the draft's weights are profiled with the target's and its "
            f"KV cache comes from the same pool (per-token KV = target + draft); each sequence holds "
            f"{s.num_speculative_tokens} lookahead slots; the draft's tensor parallelism is the target's; "
            "vLLM V0 counted only the target's weights (vllm issue #9995)"
        )
    else:
        notes.append("assisted generation: the assistant's weights and its own DynamicCache of the sequence")
    return tuple(notes)
