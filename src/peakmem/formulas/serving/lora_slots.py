"""vLLM multi-LoRA serving: the LoRA slots it preallocates on the GPU.

With ``enable_lora`` vLLM wraps every linear layer of the decoder that the model supports for LoRA
(``LoRAModelManager._create_lora_modules``, vllm/lora/models.py, vLLM 0.11: every module that
``_match_target_modules`` finds among the model's supported LoRA modules, whatever an adapter
targets) and each wrapper allocates, once at load, zero-filled stacks for ``max_loras`` adapters of
``max_lora_rank`` in the LoRA dtype (``lora_dtype="auto"``: the model's dtype,
vllm/config/lora.py ``verify_with_model_config``). vllm/lora/layers/base_linear.py
``create_lora_weights`` (vLLM 0.11), per slice of a wrapped layer:

* ``lora_a_stacked``: ``[max_loras, 1, max_lora_rank, input_size]``;
* ``lora_b_stacked``: ``[max_loras, 1, output_size, max_lora_rank]``.

A merged layer (``qkv_proj``, ``gate_up_proj``: vllm/lora/layers/column_parallel_linear.py
``MergedColumnParallelLinearWithLoRA`` / ``MergedQKVParallelLinearWithLoRA``) has one A and one B
stack per slice (q, k, v; gate, up), so it holds what the separate q/k/v (gate/up) Linears would:
the slots are summed per transformers Linear. Under tensor parallelism a column-parallel layer keeps
its full input and its output per rank (``output_size_per_partition``), a row-parallel one
(``o_proj``, ``down_proj``: vllm/lora/layers/row_parallel_linear.py) its input per rank
(``input_size_per_partition``) and its full output (``fully_sharded_loras=False``, the default).

vLLM V1 counts these stacks in the memory profile: they exist after ``load_model``, so
``determine_available_memory`` (vllm/v1/worker/gpu_worker.py) sees them with the weights and the KV
pool shrinks by exactly their bytes (vllm-project/vllm issue #14450, fixed for V0 by PR #14469;
"V1 of LoRA should not have this issue").

Defaults and limits (vllm/config/lora.py ``LoRAConfig``, vLLM 0.11): ``max_loras=1``,
``max_lora_rank=16``, ``MaxLoRARanks = Literal[1, 8, 16, 32, 64, 128, 256, 320, 512]``
(:data:`peakmem.inference.VLLM_DEFAULT_MAX_LORA_RANK`, ``VLLM_MAX_LORA_RANKS``, checked there);
``max_cpu_loras`` (the CPU-side LRU cache of adapters, vllm/lora/worker_manager.py
``LRUCacheWorkerLoRAManager``) defaults to ``max_loras``.

Embedding / LM-head wrappers (:func:`lora_wrapper_bytes`). For a model class that declares
``embedding_modules`` (``{"embed_tokens": "input_embeddings", "lm_head": "output_embeddings"}``),
``get_supported_lora_modules`` (vllm/lora/utils.py) adds ``embed_tokens`` and ``lm_head`` to the supported
modules and ``_create_lora_modules`` wraps them too: ``embed_tokens`` in ``VocabParallelEmbeddingWithLoRA``
and, for ``lm_head``, the model's ``logits_processor`` in ``LogitsProcessorWithLoRA`` (the "(yard1): TODO
make this more robust" swap; vllm/lora/models.py up to 0.11, vllm/lora/model_manager.py after). Both keep
full-size stacks on every tensor-parallel rank (``org_vocab_size``, ``embedding_dim`` and the logits
processor's ``vocab_size`` are the unsharded sizes):

* up to vLLM 0.11 (vllm/lora/layers.py, later vllm/lora/layers/vocal_parallel_embedding.py and
  logits_processor.py, ``create_lora_weights``), with ``E = lora_extra_vocab_size`` (default 256,
  vllm/config ``LoRAConfig``):

  - embedding: ``lora_a_stacked [max_loras, org_vocab + E, rank]``, ``lora_b_stacked [max_loras, 1,
    hidden, rank]``, ``embeddings_tensors [max_loras, E, hidden]``;
  - logits: ``lora_a_stacked [max_loras, 1, rank, hidden]``, ``lora_b_stacked [max_loras, 1,
    ceil((vocab + E) / 256) * 256, rank]`` (``lora_vocab_padding_size``, 256 on CUDA; the logits
    processor's vocab is ``unpadded_vocab_size = vocab + E``, llama.py), ``embeddings_tensors
    [max_loras, E, hidden]``;
  - and the base layers grow for the added vocabulary (vllm/model_executor/models/llama.py
    ``LlamaModel``/``LlamaForCausalLM``; vllm/model_executor/layers/vocab_parallel_embedding.py
    ``VocabParallelEmbedding.__init__`` pads ``pad(pad(org, p) + added, p)`` rows, split over TP ranks):
    ``embed_tokens`` holds ``E x max_loras`` more rows and an untied ``lm_head`` (padding 256 instead of
    64) ``pad256(pad256(vocab) + E) - pad64(vocab)`` more rows (:func:`lora_extra_vocab_row_elements`);

* from vLLM 0.12 (PR #28545 "[LoRA][2/2]Remove LoRA extra vocab", merged 2025-11; ms-swift PR #7245 "fix
  lora in vllm >= v0.12"): ``E = 0`` and no padding: embedding ``lora_a [max_loras, org_vocab, rank]``,
  ``lora_b [max_loras, 1, hidden, rank]``; logits ``lora_a [max_loras, 1, rank, hidden]``, ``lora_b
  [max_loras, 1, vocab, rank]`` (vllm/lora/layers/vocal_parallel_embedding.py and logits_processor.py,
  read at the index's newest stored versions).

Under tensor parallelism ``LogitsProcessorWithLoRA`` also keeps ``sharded_to_full_mapping_gpu``, an int64
index of the LM head's padded vocabulary (``VocabParallelEmbedding.get_sharded_to_full_mapping``, None at
TP 1). A model whose ``lm_head`` IS its ``embed_tokens`` module (Qwen3 with ``tie_word_embeddings``:
``self.lm_head = self.model.embed_tokens``, vllm/model_executor/models/qwen3.py) is met twice by
``named_modules(remove_duplicate=False)``: ``from_layer`` builds a second ``VocabParallelEmbeddingWithLoRA``
for ``lm_head`` (the newest model_manager.py exempts ``lm_head`` from its alias rewiring, and
``LogitsProcessorWithLoRA._get_logits`` unwraps ``lm_head.base_layer``), so it holds two embedding
wrappers. Llama ties with ``ParallelLMHead.tie_weights``, which keeps a ``ParallelLMHead`` that no LoRA
class replaces (``VocabParallelEmbeddingWithLoRA.can_replace_layer``: ``type(layer) is
VocabParallelEmbedding``): one.

Which classes declare ``embedding_modules`` (:data:`VLLM_EMBEDDING_LORA_ARCHITECTURES`): Llama (and
Mistral, served by the Llama class or a subclass) in every release read; Qwen3 / Qwen3-MoE from vLLM PR
#29816 ("Support LoRA on Qwen3 Output Embedding", opened 2025-12-01, after the v0.12.0 branch; taken as
first in 0.13: the tag was not read); Qwen2 and Gemma declare ``{}`` (``SupportsLoRA``'s default,
vllm/model_executor/models/interfaces.py; PR #33234 for Qwen2 is open). Other architectures that declare
it (Granite, Jamba, Apertus, ...) were not read one by one and are counted without the wrappers: said in
the assumptions.

Read (vllm-project/vllm at the commits the code index stores; not every tag named above was checked
out, the repository being too large to mirror here): vllm/lora/layers/vocal_parallel_embedding.py @0726b06c
and logits_processor.py @01815c62 (no extra vocabulary), vllm/lora/model_manager.py @01533aa8
(``_create_lora_modules``), vllm/lora/utils.py @001e63a8 (``get_supported_lora_modules``, ``from_layer``,
``from_layer_logits_processor``), vllm/model_executor/models/llama.py @0035bdf2 and mistral.py @005df92d
(``embedding_modules``, the extra-vocabulary rows), qwen2.py @013a2792, qwen3.py @002456df (``{}``) and a
later qwen3.py (``SupportsEagle3``, declares them), gemma.py @02e37cdc, interfaces.py @002b4cf8,
vllm/model_executor/layers/vocab_parallel_embedding.py @00db0119; the extra-vocabulary shapes of
``create_lora_weights`` from the index's excerpts of an early vllm/lora/layers.py.

Not counted: LoRA on MoE experts (vllm/lora/layers/fused_moe.py), and the punica wrapper's index vectors
(vllm/lora/punica_wrapper/punica_base.py: a few int64 vectors of ``max_num_batched_tokens``, under
1 MiB): each is said in the estimate's assumptions.
"""

from __future__ import annotations

from peakmem.formulas.model_parallel import ROW_PARALLEL_MODULES, TP_SPLIT_COMPONENTS
from peakmem.inference import CURRENT_ENGINE_VERSION, parse_engine_version
from peakmem.model import ModelSpec

# The KV budget counts the stacks from vLLM 0.8: V0 sized the pool before it built the LoRA manager until
# PR #14469 (0.8.0, vllm issue #14450); V1 (the default from 0.8) builds them inside load_model's profile.
VLLM_LORA_PROFILED_RELEASE = (0, 8)
# vLLM PR #28545 (merged 2025-11-12, first in 0.12: ms-swift PR #7245 "fix lora in vllm >= v0.12") removed
# lora_extra_vocab_size (default 256, vllm/config.py LoRAConfig up to 0.11) and lora_vocab_padding_size.
VLLM_LORA_NO_EXTRA_VOCAB_RELEASE = (0, 12)
VLLM_LORA_EXTRA_VOCAB_SIZE = 256  # LoRAConfig.lora_extra_vocab_size's default, vLLM up to 0.11
# LoRAConfig.lora_vocab_padding_size = current_platform.get_lora_vocab_padding_size(): 256 on CUDA (up to
# 0.11); LogitsProcessorWithLoRA pads its lora_b vocab to it, llama.py pads its lm_head to it with LoRA on.
VLLM_LORA_VOCAB_PADDING_SIZE = 256
# vllm/model_executor/layers/vocab_parallel_embedding.py DEFAULT_VOCAB_PADDING_SIZE
VLLM_DEFAULT_VOCAB_PADDING_SIZE = 64
INDEX_BYTES = 8  # torch.long: LogitsProcessorWithLoRA.sharded_to_full_mapping_gpu
# HF architecture -> the first vLLM release whose model class declares embedding_modules (embed_tokens,
# lm_head): LlamaForCausalLM (vllm/model_executor/models/llama.py) and MistralForCausalLM (mistral.py
# before the registry mapped it to the Llama class) from multi-LoRA's first release (PR #1804, in 0.3.0);
# Qwen3 dense / MoE from PR #29816 (after the 0.12.0 branch: 0.13 taken, the tag not read).
VLLM_EMBEDDING_LORA_ARCHITECTURES: dict[str, tuple[int, int]] = {
    "LlamaForCausalLM": (0, 3),
    "MistralForCausalLM": (0, 3),
    "Qwen3ForCausalLM": (0, 13),
    "Qwen3MoeForCausalLM": (0, 13),
}
# Architectures whose lm_head is the embed_tokens module itself when tied (qwen3.py / qwen3_moe.py
# ``self.lm_head = self.model.embed_tokens``): a second VocabParallelEmbeddingWithLoRA wraps it.
VLLM_LM_HEAD_IS_EMBEDDING_WHEN_TIED = frozenset({"Qwen3ForCausalLM", "Qwen3MoeForCausalLM"})
NEWEST_VLLM = parse_engine_version(CURRENT_ENGINE_VERSION["vllm"])


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def lora_slot_elements_per_adapter(spec: ModelSpec, *, rank: int, tp: int = 1) -> int:
    """Elements of one adapter slot on one tensor-parallel rank: ``rank x (input + output)`` of
    every decoder Linear vLLM wraps (attention and dense MLP projections), split as vLLM splits them."""
    total = 0
    for group in spec.groups:
        per_layer = 0
        for t in group.layer.tensors:
            if t.kind != "linear_weight" or t.component not in TP_SPLIT_COMPONENTS:
                continue
            out_features, in_features = t.shape[0], t.shape[-1]
            if t.module in ROW_PARALLEL_MODULES:
                in_features = _cdiv(in_features, tp)
            else:
                out_features = _cdiv(out_features, tp)
            per_layer += rank * (in_features + out_features) * t.copies
        total += per_layer * group.count
    return total


def _pad(n: int, to: int) -> int:
    return _cdiv(n, to) * to


def has_embedding_lora(spec: ModelSpec, version: tuple[int, int]) -> bool:
    """Whether vLLM ``version`` wraps this architecture's embed_tokens / lm_head for LoRA."""
    first = VLLM_EMBEDDING_LORA_ARCHITECTURES.get(spec.architecture)
    return first is not None and version >= first


def embedding_wrapper_elements(
    spec: ModelSpec, *, max_loras: int, rank: int, version: tuple[int, int]
) -> int:
    """Values of one ``VocabParallelEmbeddingWithLoRA`` (replicated on every TP rank): ``lora_a``
    ``[max_loras, vocab + E, rank]``, ``lora_b`` ``[max_loras, 1, hidden, rank]`` and, up to 0.11,
    ``embeddings_tensors`` ``[max_loras, E, hidden]`` (``E``: the extra vocabulary, 0 from 0.12)."""
    extra = VLLM_LORA_EXTRA_VOCAB_SIZE if version < VLLM_LORA_NO_EXTRA_VOCAB_RELEASE else 0
    hidden = spec.hidden_size
    return max_loras * ((spec.vocab_size + extra) * rank + hidden * rank + extra * hidden)


def logits_wrapper_elements(spec: ModelSpec, *, max_loras: int, rank: int, version: tuple[int, int]) -> int:
    """Values of ``LogitsProcessorWithLoRA`` (replicated): ``lora_a`` ``[max_loras, 1, rank, hidden]``,
    ``lora_b`` ``[max_loras, 1, V, rank]`` with ``V = ceil((vocab + E) / 256) * 256`` up to 0.11 (``vocab``
    from 0.12), and up to 0.11 ``embeddings_tensors`` ``[max_loras, E, hidden]``."""
    hidden = spec.hidden_size
    if version < VLLM_LORA_NO_EXTRA_VOCAB_RELEASE:
        extra = VLLM_LORA_EXTRA_VOCAB_SIZE
        vocab = _pad(spec.vocab_size + extra, VLLM_LORA_VOCAB_PADDING_SIZE)
    else:
        extra, vocab = 0, spec.vocab_size
    return max_loras * (rank * hidden + vocab * rank + extra * hidden)


def lm_head_padded_vocab(spec: ModelSpec, version: tuple[int, int]) -> int:
    """Rows of vLLM's LM head with LoRA on (``num_embeddings_padded``): ``pad256(pad256(vocab) + E)`` up to
    0.11 (llama.py's ``ParallelLMHead(vocab + E, org_num_embeddings=vocab, padding_size=256)``), else
    ``pad64(vocab)``."""
    if version < VLLM_LORA_NO_EXTRA_VOCAB_RELEASE:
        org = _pad(spec.vocab_size, VLLM_LORA_VOCAB_PADDING_SIZE)
        return _pad(org + VLLM_LORA_EXTRA_VOCAB_SIZE, VLLM_LORA_VOCAB_PADDING_SIZE)
    return _pad(spec.vocab_size, VLLM_DEFAULT_VOCAB_PADDING_SIZE)


def lora_extra_vocab_row_elements(
    spec: ModelSpec, *, max_loras: int, version: tuple[int, int], tp: int = 1
) -> int:
    """Values the base embedding and LM head gain on one TP rank for LoRA's added vocabulary (up to 0.11):
    ``E x max_loras`` rows of ``embed_tokens`` and, untied, ``pad256(pad256(vocab) + E) - pad64(vocab)``
    rows of ``lm_head``, each ``hidden`` wide and split over the ranks."""
    if version >= VLLM_LORA_NO_EXTRA_VOCAB_RELEASE:
        return 0
    rows = _cdiv(VLLM_LORA_EXTRA_VOCAB_SIZE * max_loras, tp)
    if not spec.tie_word_embeddings:
        plain = _pad(spec.vocab_size, VLLM_DEFAULT_VOCAB_PADDING_SIZE)
        rows += _cdiv(lm_head_padded_vocab(spec, version) - plain, tp)
    return rows * spec.hidden_size


def lora_wrapper_bytes(
    spec: ModelSpec, *, max_loras: int, rank: int, dtype_bytes: int, tp: int = 1, version: tuple[int, int]
) -> int:
    """Bytes on one rank of vLLM's embedding / LM-head LoRA wrappers (0 for an architecture whose vLLM
    class declares no ``embedding_modules`` in ``version``): the wrappers' stacks (two embedding wrappers
    when the tied LM head is the embedding module), the added-vocabulary rows up to 0.11, and the int64
    ``sharded_to_full_mapping_gpu`` under TP."""
    if not has_embedding_lora(spec, version):
        return 0
    embeddings = 1
    if spec.tie_word_embeddings and spec.architecture in VLLM_LM_HEAD_IS_EMBEDDING_WHEN_TIED:
        embeddings = 2
    values = embeddings * embedding_wrapper_elements(spec, max_loras=max_loras, rank=rank, version=version)
    values += logits_wrapper_elements(spec, max_loras=max_loras, rank=rank, version=version)
    values += lora_extra_vocab_row_elements(spec, max_loras=max_loras, version=version, tp=tp)
    mapping = lm_head_padded_vocab(spec, version) * INDEX_BYTES if tp > 1 else 0
    return values * dtype_bytes + mapping


def lora_slot_bytes(
    spec: ModelSpec,
    *,
    max_loras: int,
    rank: int,
    dtype_bytes: int,
    tp: int = 1,
    version: tuple[int, int] = NEWEST_VLLM,
) -> int:
    """Bytes of vLLM's preallocated LoRA stacks on one rank: ``max_loras`` slots of ``rank`` of every
    decoder Linear, plus the embedding / LM-head wrappers where ``version`` has them."""
    linears = max_loras * lora_slot_elements_per_adapter(spec, rank=rank, tp=tp) * dtype_bytes
    wrappers = lora_wrapper_bytes(
        spec, max_loras=max_loras, rank=rank, dtype_bytes=dtype_bytes, tp=tp, version=version
    )
    return linears + wrappers
