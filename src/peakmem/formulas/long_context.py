"""Long-context training: Ulysses sequence parallelism, tiled MLP and token-budget micro-batches.

* **Ulysses / ALST** (Jacobs et al. 2023, arXiv 2309.14509 §3; ALST, arXiv 2506.13996 §3.2; DeepSpeed
  v0.19.6 ``deepspeed/runtime/sequence_parallel/ulysses_sp.py`` ``UlyssesSPAttentionHF``): each of the
  ``N`` ranks of a sequence-parallel group holds ``seq / N`` tokens outside attention (the
  ``UlyssesSPDataLoaderAdapter`` refuses a ``seqlen`` not divisible by ``sp_size``). Attention
  all-to-alls q, k and v to the full sequence with ``heads / N`` heads per rank
  (``_combine_local_sequences``) and the output back (``_partition_global_sequence``). The heads must
  divide by ``N``; the k/v heads must divide by ``N`` or ``N`` by them: with fewer k/v heads than ranks
  each rank gets one k/v head, replicated ``N / kv`` times by ``repeat_interleave`` before the
  all-to-all (``kv_replication_factor``). Eager attention is refused there
  (``register_with_transformers``: "eager ... isn't currently supported"). ZeRO shards over the
  sequence-data-parallel group (deepspeed/runtime/engine.py ``seq_data_parallel_group``), so the
  Ulysses ranks shard model states like data-parallel ones. With Megatron TP the heads are split by
  ``tp`` first, Ulysses splits what each TP rank holds; with ring CP (``--cp``) the sequence is split
  ``cp x N`` ways, Ulysses inside each ring chunk (USP, Fang & Zhao 2024, arXiv 2405.07719 §3), so the
  ring's K/V chunk is the gathered one. Per rank this module models: the attention's saved tensors at
  the full (ring-chunk) sequence with ``heads / N`` heads (the k/v replication included), and the
  all-to-all buffers: while the kernel's inputs are built, the caller's local q, k, v (held by
  ``LlamaAttention.forward``) and the all-to-all outputs being copied into the kernel's layout are
  alive (``rearrange(...).contiguous()``); backward runs the same all-to-alls on the gradients
  (``_DimZeroAllToAll.backward``). The loss sees the rank's own ``seq / N`` tokens (ALST's
  ``TiledFusedLogitsLoss`` tiles it further: ``--loss chunked``).
* **Tiled MLP** (ALST §3.3; DeepSpeed ``ulysses_sp.py`` ``TiledMLP``): the MLP runs over ``shards``
  chunks of the sequence under ``torch.no_grad`` and saves only its input; backward recomputes each
  shard with grad and runs its backward, writing into one ``zeros_like(x)`` input gradient. So no MLP
  interior is saved, and in backward one shard's interior and its gradient temporaries are alive with
  the full input gradient. Default shards: DeepSpeed's ``tiled_mlp_forward`` example,
  ``ceil(seqlen / hidden_size)`` over the rank's tokens (:data:`DEEPSPEED_SHARD_RULE`); axolotl targets
  32,768 tokens a shard (``src/axolotl/monkeypatch/tiled_mlp/patch.py``, :data:`AXOLOTL_SHARD_TOKENS`).
  Mixture-of-experts layers are left untiled here (DeepSpeed's ``TiledMLP`` wraps a dense MLP).
* **Token-budget micro-batches** (verl ``use_dynamic_bsz``; ``verl/utils/seqlen_balancing.py``
  ``rearrange_micro_batches``: samples packed so a micro-batch's summed ``attention_mask`` is at most
  ``max_token_len``, which must be at least the longest sample; ``verl/workers/actor/dp_actor.py``:
  ``max_token_len = ppo_max_token_len_per_gpu * ulysses_sequence_parallel_size``): the micro-batch is
  one packed row of ``N x ulysses x cp`` tokens, each rank holding ``N``. Attention over packed samples
  (flash varlen) is linear in tokens, so the packing does not change its bytes; a quadratic kernel is
  estimated as one sample of the whole row, the largest sum of squares the budget allows.
"""

from __future__ import annotations

from dataclasses import replace

from peakmem.errors import InputError
from peakmem.model import Layer, ModelSpec
from peakmem.parallel import Parallelism
from peakmem.training import AttentionKernel, TrainingSetup

from .activations import LayerActivations, Shapes, attention_terms
from .activations.mlp import mlp_terms, routed_width_bytes

DEEPSPEED_SHARD_RULE = "ceil(seqlen / hidden_size)"  # ulysses_sp.py TiledMLP tiled_mlp_forward
AXOLOTL_SHARD_TOKENS = 32_768  # axolotl monkeypatch/tiled_mlp/patch.py target_tokens_per_shard
SRC_ULYSSES = "DeepSpeed ulysses_sp.py UlyssesSPAttentionHF: all-to-all to the full sequence, heads/N"
SRC_TILED = "DeepSpeed ulysses_sp.py TiledMLP: MLP under no_grad per shard, recomputed in backward"


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


# --- Ulysses ---------------------------------------------------------------------------------------
def check_ulysses(spec: ModelSpec, setup: TrainingSetup, par: Parallelism) -> None:
    """DeepSpeed's checks of a Ulysses layout (``UlyssesSPAttentionHF.__init__``,
    ``register_with_transformers``, ``UlyssesSPDataLoaderAdapter.refill``), each one line."""
    n = par.ulysses
    if n == 1:
        return
    if setup.attention is AttentionKernel.EAGER:
        raise InputError(
            f"attention='eager' with ulysses={n}: DeepSpeed Ulysses refuses eager attention "
            "(ulysses_sp.py register_with_transformers); use --attention sdpa or flash"
        )
    for g in spec.groups:
        att = g.layer.attention
        heads, kv = att.num_heads // par.tp, att.num_kv_heads // par.tp
        per = "/tp" if par.tp > 1 else ""
        if heads % n:
            raise InputError(
                f"ulysses={n} does not divide num_attention_heads{per}={heads} ({spec.name}): "
                "each rank attends with heads/ulysses heads"
            )
        if kv % n and n % kv:
            raise InputError(
                f"ulysses={n} and num_key_value_heads{per}={kv} ({spec.name}): one must divide the other "
                "(DeepSpeed replicates k/v heads only when ulysses is a multiple of them)"
            )
    chunk = setup.seq_len // par.cp
    if chunk % n:
        raise InputError(f"ulysses={n} does not divide seq/cp = {chunk}: each rank takes an equal chunk")


def local_kv_heads(kv_heads: int, par: Parallelism) -> int:
    """k/v heads one rank attends with: ``kv / (tp N)``, at least one (``kv_replication_factor``)."""
    return max(1, kv_heads // (par.tp * par.ulysses))


def attention_layer(layer: Layer, par: Parallelism) -> Layer:
    """``layer`` as the attention kernel sees it on one Ulysses group (before the TP split): heads / N,
    k/v heads ``tp x`` :func:`local_kv_heads` (so that the TP split leaves each rank its own)."""
    if par.ulysses == 1:
        return layer
    att = layer.attention
    kv = par.tp * local_kv_heads(att.num_kv_heads, par)
    return replace(layer, attention=replace(att, num_heads=att.num_heads // par.ulysses, num_kv_heads=kv))


def attention_shapes(sh: Shapes, par: Parallelism) -> Shapes:
    """The shapes the attention kernel sees: the whole ring chunk (``N x`` the rank's tokens). No memo:
    the estimator's memo keys layers by identity, and the layer here is a temporary."""
    if par.ulysses == 1:
        return sh
    return replace(sh, seq=sh.seq * par.ulysses, memo=None)


def all_to_all_bytes(layer: Layer, sh: Shapes, par: Parallelism) -> int:
    """One rank's all-to-all buffers around attention: the local q, k, v (the caller's) and the
    gathered ones being copied into the kernel's layout; the gradients take the same path back."""
    if par.ulysses == 1:
        return 0
    att = layer.attention
    width = att.head_dim
    local = sh.tokens * (att.num_heads * width + att.num_kv_heads * (width + att.v_head_dim)) * sh.c
    heads = att.num_heads // (par.tp * par.ulysses)
    kv = local_kv_heads(att.num_kv_heads, par)
    gathered = sh.tokens * par.ulysses * (heads * width + kv * (width + att.v_head_dim)) * sh.c
    return cdiv(local, par.tp) + gathered


def ulysses_attention(la: LayerActivations, spec: ModelSpec, layer: Layer, sh: Shapes,
                      par: Parallelism) -> LayerActivations:  # fmt: skip
    """``la`` (one layer at the rank's ``seq / N`` tokens, before the TP split) with its attention
    tensors as Ulysses saves them: each item of :func:`attention_terms` moved by the difference between
    the full sequence with heads / N and the local shard with all heads (equal for q, the output and
    the logsumexp; larger for k, v when they are replicated). Adapters' changes to the items stay."""
    if par.ulysses == 1:
        return la
    local = attention_terms(spec, layer, sh)[0]
    full = attention_terms(spec, attention_layer(layer, par), attention_shapes(sh, par))[0]
    delta: dict[str, int] = {}
    for sign, items in ((-1, local), (1, full)):
        for i in items:
            delta[i.key] = delta.get(i.key, 0) + sign * i.bytes
    saved = [replace(i, bytes=max(0, i.bytes + delta.pop(i.key, 0))) for i in la.saved]
    saved += [i for i in full if delta.get(i.key, 0) > 0]
    return replace(la, saved=tuple([i for i in saved if i.bytes]))


# --- tiled MLP -------------------------------------------------------------------------------------
def tiled_shards(spec: ModelSpec, tokens: int, shards: int) -> int:
    """``shards`` when given (> 0), else DeepSpeed's :data:`DEEPSPEED_SHARD_RULE` over ``tokens``."""
    return shards if shards > 0 else max(1, cdiv(tokens, spec.hidden_size))


def tiled_mlp(
    la: LayerActivations, spec: ModelSpec, layer: Layer, sh: Shapes, shards: int
) -> LayerActivations:
    """``la`` with its dense MLP tiled into ``shards`` (> 0) chunks: the MLP interior no longer saved; in
    its backward one shard's interior and gradient temporaries next to the whole input gradient; in
    forward one shard's interior next to the output being concatenated. A MoE layer is left as is."""
    if layer.mlp.is_moe or layer.derived is not None:
        return la
    items, mlp_bwd = mlp_terms(spec, layer, sh)
    keys = {i.key for i in items}
    interior = sum([i.bytes for i in items])
    saved = tuple([i for i in la.saved if i.key not in keys])
    full = sh.tokens * spec.hidden_size * sh.c  # the input gradient zeros_like(x); the output's cat
    shard = cdiv(interior + mlp_bwd, shards)
    stages = la.backward_stages
    transient = la.backward_transient
    if len(stages) == 2 and max(stages)[0] == la.backward_transient:  # not a post-norm / MoE stage
        (m_net, m_freed, m_grads), (a_net, a_freed, a_grads) = stages
        out_in = min(m_freed, routed_width_bytes(spec, layer, sh))  # the down projection's input
        mlp_stage = (m_net - mlp_bwd + shard + full, m_freed - out_in, m_grads)
        att_stage = (a_net + interior, a_freed - min(a_freed, interior), a_grads)
        stages = (mlp_stage, att_stage)
        transient = max(stages)[0]
    forward = max(la.forward_transient, cdiv(interior, shards) + full)
    return replace(la, saved=saved, forward_transient=forward, backward_transient=transient,
                   backward_stages=stages, interior=max(la.core, cdiv(interior, shards)) + full)  # fmt: skip


# --- token budget ----------------------------------------------------------------------------------
def token_budget_seq(max_tokens_per_gpu: int, longest: int | None, par_degree: int) -> int:
    """The packed micro-batch's tokens (over its ``ulysses x cp`` group): verl's ``max_token_len``; an
    InputError when the longest sample ``longest`` does not fit in it (verl's assert)."""
    row = max_tokens_per_gpu * par_degree
    if longest is not None and longest > row:
        raise InputError(
            f"max_tokens_per_gpu={max_tokens_per_gpu}: the packed micro-batch ({row:,} tokens over "
            f"ulysses x cp = {par_degree}) is shorter than seq={longest:,} (verl seqlen_balancing.py asserts "
            "max_token_len >= the longest sample)"
        )
    return row
