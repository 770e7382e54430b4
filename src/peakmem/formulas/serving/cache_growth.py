"""What the caching allocator keeps reserved while transformers' cache grows in ``generate`` (engine hf).

Each decode step ``torch.cat``s every layer's K and V into new tensors one token longer (transformers 5.23
``cache_utils.py`` ``DynamicLayer.update``: the old tensor is dropped as the new one replaces it; before
v4.36 the attention returned the new pair in a new tuple and ``greedy_search`` / ``sample`` kept the
previous step's tuple in ``model_kwargs`` until the forward returned, so the old ones go at the step's
end). A request above 10 MiB gets a segment of its own, rounded up to 2 MiB (``get_allocation_size``), and
a freed block serves only requests no larger than itself (``get_free_block``): while a layer's K grows
inside its segment the freed blocks are reused, but each time it outgrows the 2 MiB rounding every layer's
K and V take new segments and the old ones stay cached, too small for anything the loop asks for later,
unless larger blocks freed elsewhere (the prefill's activations, repeat_kv copies, dequantized weights)
absorb the growth. The closed form (allocated plus a fragmentation fraction) cannot see this: with 8 x
64-dim heads and 16 sequences growing from 256 to 1,024 tokens, transformers' own generate replayed
through the allocator model reserves 274 MiB, the closed form 182 MiB.

So the whole generate is replayed here, request by request, through
:class:`~peakmem.formulas.caching_allocator.CachingAllocatorModel`: the prefill forward and the decode steps,
each layer as transformers 5.23's ``LlamaDecoderLayer`` allocates on the way (recorded on the CPU with
``peakmem.measure.tracker.LiveStorageTracker``: RMSNorm's fp32 chain, the q / k / v projections, RoPE's
``mul`` / ``neg`` / ``cat`` / ``add``, the cache update, attention's output, the output projection, the
residual, the MLP's ``act(gate) * up`` and ``down``), the model's embedding and RoPE cos / sin kept to the end
of the forward, its last norm over every position, and the logits with ``generate``'s fp32 copy and the
processed scores, both kept through the next forward (``min_new_tokens``' two logits processors: a clone and a
``where`` each; without it a greedy job has none; Llama-2-7B's layers at vocab 32,000 traced: 1,510 MiB, the
scores freed at once read 1,282). Releases before v4.36 keep the projected K and V of the prompt as the cache
(no copy), build a 4-D mask and run eager attention (matmul's copies of the prompt's query, key and value, the
scores, their fp32 copy and softmax, the cast back, the probabilities kept until the attention returns), as
transformers 4.35.0's own generate does on the CPU (benchmarks/legacy_generate_trace.py: exact on its four
jobs, every step replayed); repeat_kv copies where the release makes them
(:func:`peakmem.transformers_versions.sdpa_repeats_kv`); bitsandbytes' and the GPTQ / AWQ kernels' dequantized
weight around each quantized matmul (:func:`peakmem.formulas.quant_kernels.linear_temporary_bytes`); before
v4.45 the prompt's fp32 logits held by ``outputs`` until the first decode step returns. Only requests
above 1 MiB are replayed: smaller ones go to the small pool (``get_pool``), whose 2 MiB segments no large
request can use. Decode steps are replayed every ``stride`` tokens, chosen so that no K or V grows by more
than :data:`STEP_BYTES` between two of them (a quarter of the 2 MiB rounding, so every segment size the loop
reaches is still asked for: within 1.5 % of the replay of every step on tests/test_cache_growth.py's cases,
but 5.6 % low on the v4.35 tuple cache over 8 of Llama-2-7B's layers, whose two alternating sets of segments
the skipped steps reorder, and 1.9 % low on transformers 5.23 over two of them with ``min_new_tokens``
(1,482 MiB; every step and the trace 1,510), up to 14 % low where K and V below 10 MiB share the 20 MiB
segments with the fp32 scores 5.x keeps through each forward, which take whichever free block fits at each
step (the tests' mha and layernorm cases); 1 MiB read up to 3 % low, 2 MiB up to 45 %). Other architectures
are replayed through the same layer (their norms, MLPs and attention as the shapes say); MoE layers, MLA,
recurrent layers, quantized caches and assisted decoding are not replayed (the closed form stands). After
:data:`STEADY_AFTER` decode steps the constant-size requests smaller than the cache's K and V are left out.
Before v4.36, where the process first ran plain forwards over the same batch with each output held until the
next returned (``forward_loop``: optimum-benchmark's inference benchmark), those are replayed first
(:func:`replay_forward_loop`): the second output's segments, free once the loop ends, take some of the
growing K and V that would otherwise strand a segment at every 2 MiB (Llama-2-7B, 16 x 128 + 256 tokens,
every step: 47.1 GiB fresh, 32.3 GiB after the loop).
With the GPU's size known, the replay may reserve what the weights and the CUDA context leave; beyond it the
model frees its cached segments and retries, as ``DeviceCachingAllocator::malloc`` does, and the estimate's
reserved is the larger of the closed form and the resident tensors plus the replay, the band keeping the
closed form as its low end (:func:`growth_term`). Without a GPU the replay can outgrow any (32 sequences of
Qwen2.5-7B growing to 8,192 tokens strand hundreds of GB, which a real run's allocator frees whenever the GPU
fills): what the job needs stays the closed form, and a note says what a GPU with room would show.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from peakmem.breakdown import BandTerm
from peakmem.dtypes import BOOL, INT64
from peakmem.dtypes import FP32 as FP32_DTYPE
from peakmem.formulas.allocator import K_SMALL_SIZE, NO_ROUNDUP
from peakmem.formulas.caching_allocator import CachingAllocatorModel
from peakmem.formulas.kv_cache import kv_heads_per_rank
from peakmem.formulas.quant_kernels import linear_temporary_bytes
from peakmem.formulas.serving.context import CUDA_CONTEXT_BYTES, ServingContext, serving_state
from peakmem.inference import TRANSFORMERS_CACHE_CLASSES, TRANSFORMERS_LOGITS_TO_KEEP, CacheImplementation
from peakmem.model import Layer
from peakmem.transformers_versions import sdpa_repeats_kv

GROWTH_NOTE = (
    "transformers generate replayed request by request through the caching-allocator model "
    "(formulas/serving/cache_growth.py): the segments the growing cache and the prefill cut reserve {extra} "
    "above the closed form on this GPU"
)
GROWTH_NO_GPU_NOTE = (
    "transformers generate replayed request by request through the caching-allocator model "
    "(formulas/serving/cache_growth.py): on a GPU with room to spare, the segments the growing cache cuts "
    "keep up to {extra} more reserved than this (torch.cuda.max_memory_reserved, nvidia-smi); a fuller GPU's "
    "allocator frees them and retries instead, so what the job needs stays the closed form; --gpu gives "
    "that GPU's reading"
)
SRC_GROWTH_TERM = (
    "formulas/serving/cache_growth.py (transformers 5.23 cache_utils.py DynamicLayer.update: torch.cat, the "
    "old tensor dropped; v4.35 generation/utils.py greedy_search: the previous step's tuple kept to the "
    "step's end; c10/cuda/CUDACachingAllocator.cpp get_allocation_size / get_free_block): the replay follows "
    "transformers 5.23's and 4.35's Llama layer as recorded on the CPU (exact there); another release, "
    "architecture or CUDA kernel makes other requests, whose blocks may absorb the growth, so what the "
    "replay adds above the closed form may not be there"
)
STEP_BYTES = 512 * 1024  # the most one K or V grows between two replayed decode steps
# ... unless that makes more replayed steps than this (a long generation at a large batch): then evenly spaced
# (Qwen2.5-7B, 32 sequences from 512 to 8,192 tokens: 481 steps at 512 KiB read 0.07 % above 241 at 1 MiB)
MAX_DECODE_STEPS = 256
FP32 = FP32_DTYPE.nbytes(1)


@dataclass(frozen=True, kw_only=True)
class LayerShape:
    """One decoder layer on one rank, elements per token unless said otherwise."""

    hidden: int
    q: int  # query heads x head dim
    out: int  # query heads x value head dim (attention's output)
    k: int  # cached K: kv heads x head dim
    v: int  # cached V: kv heads x value head dim
    heads: int  # query heads (scores, repeat_kv copies)
    window: int | None  # sliding window (the cache keeps at most this many tokens)
    width: int  # MLP intermediate size
    gated: bool
    rms: bool  # RMSNorm (upcast to fp32), else LayerNorm
    rope: bool
    repeats: bool  # repeat_kv copies K and V to every query head
    temps_prefill: tuple[int, ...]  # dequantized weight bytes per matmul q, k, v, o, (gate), up, down
    temps_decode: tuple[int, ...]


@dataclass(frozen=True, kw_only=True)
class GenerateRun:
    batch: int
    prompt: int
    context: int  # prompt + new tokens
    act_bytes: int
    vocab: int
    head_dim: int  # RoPE cos / sin width
    layers: tuple[LayerShape, ...]  # every layer, in order
    legacy: bool  # before v4.36: the tuple cache, eager attention
    all_logits: bool  # before v4.45: the prefill computes every position's logits
    softmax_copy: bool = True  # eager softmax(dtype=fp32) copies the scores to fp32 first (not fp16 on CUDA)
    # generate(min_new_tokens=...) builds two logits processors (5.x: a clone and a where each, _scores);
    # peakmem infer's context is prompt plus the new tokens every sequence makes, which a real model only
    # makes for sure when min_new_tokens forces them (optimum-benchmark's min_new_tokens = max_new_tokens)
    min_new_tokens: bool = True
    divisions: int = NO_ROUNDUP  # PYTORCH_CUDA_ALLOC_CONF roundup_power2_divisions
    capacity: int | None = None  # what the replayed requests may reserve (the GPU's less the rest)
    # plain forwards over the same batch and prompt before the generate, each output held until the next
    # call returns (legacy only: there generate's prefill is that forward; :func:`replay_forward_loop`)
    forward_loop: bool = False


ALLOC, FREE, RENAME = 0, 1, 2
_Op = tuple[int, str, str | int, bool]  # (what, name, bytes or the new name, the name is the layer's)
LAYER_SCOPED = ("cache.", "old.")  # a layer program's names that belong to its layer's cache
GROWING = ("cache.", "rep.", "s.")  # requests whose size follows the cache's length (the rest stay put)
# plain forwards replayed before the generate where GenerateRun.forward_loop: the pool they leave is the same
# from the second on (two outputs alive at once, then freed; tests/test_cache_growth.py replays 2 to 8)
FORWARD_LOOP_CALLS = 2
# decode steps replayed whole before the constant-size requests smaller than the cache's K and V are left
# out: the first steps cut the segments those requests then reuse at every layer and step, and a block
# smaller than the cache's tensors cannot take one of them. Larger ones (a dequantized weight) can, and
# are freed again at every layer: they stay in (left out, the replay read Llama-2-7B fp4 at batch 16 39.5
# GB against 13.6). Tested against the replay of every request on tests/test_cache_growth.py's cases.
STEADY_AFTER = 2


class _Replay:
    """Requests by name, only the large pool's (see the module docstring)."""

    __slots__ = ("keys", "model", "next_key", "olds", "peak")

    def __init__(self, divisions: int, capacity: int | None) -> None:
        self.model = CachingAllocatorModel(divisions, capacity)
        self.keys: dict[str | tuple[int, str], int] = {}
        self.next_key = 0
        self.peak = 0
        self.olds: list[str | tuple[int, str]] = []  # v4.35: the previous step's cache, dropped at its end

    def alloc(self, name: str, nbytes: int) -> None:
        if nbytes <= K_SMALL_SIZE:
            return
        key = self.next_key
        self.next_key += 1
        self.model.malloc(key, nbytes)
        self.keys[name] = key
        self.peak = max(self.peak, self.model.reserved)

    def free(self, *names: str | tuple[int, str]) -> None:
        for name in names:
            key = self.keys.pop(name, None)
            if key is not None:
                self.model.free(key)

    def rename(self, old: str, new: str) -> None:
        key = self.keys.pop(old, None)
        if key is not None:
            self.keys[new] = key

    def run(self, program: list[_Op], layer: int) -> None:
        """Execute a layer's :class:`_Program`, its cache's names scoped to ``layer`` (the hot loop of the
        replay: its requests are all large, bound locals)."""
        keys, model = self.keys, self.model
        for op, name, arg, scoped in program:
            slot: str | tuple[int, str] = (layer, name) if scoped else name
            if op == ALLOC:
                key = self.next_key
                self.next_key = key + 1
                model.malloc(key, arg)  # type: ignore[arg-type]
                keys[slot] = key
                if model.reserved > self.peak:
                    self.peak = model.reserved
            elif op == FREE:
                k = keys.pop(slot, None)
                if k is not None:
                    model.free(k)
            else:
                k = keys.pop(slot, None)
                if k is not None:
                    new = (layer, arg) if isinstance(arg, str) and arg.startswith(LAYER_SCOPED) else arg
                    keys[new] = k  # type: ignore[index]
                    if isinstance(arg, str) and arg.startswith("old."):
                        self.olds.append(new)  # type: ignore[arg-type]


class _Program:
    """One layer's requests recorded once and replayed for every layer of its shape: only those above
    the small pool, with a ``floor`` only those whose size follows the cache's length or that are at least
    the floor, and the frees and renames of what it did not drop."""

    __slots__ = ("dropped", "floor", "ops")

    def __init__(self, floor: int) -> None:
        self.ops: list[_Op] = []
        self.dropped: set[str] = set()
        self.floor = floor  # constant-size requests below it are left out (0: none is)

    def alloc(self, name: str, nbytes: int) -> None:
        if nbytes <= K_SMALL_SIZE or (nbytes < self.floor and not name.startswith(GROWING)):
            self.dropped.add(name)
        else:
            self.dropped.discard(name)
            self.ops.append((ALLOC, name, nbytes, name.startswith(LAYER_SCOPED)))

    def free(self, *names: str) -> None:
        self.ops.extend((FREE, n, 0, n.startswith(LAYER_SCOPED)) for n in names if n not in self.dropped)

    def rename(self, old: str, new: str) -> None:
        if old in self.dropped:
            self.dropped.add(new)
        else:
            self.ops.append((RENAME, old, new, old.startswith(LAYER_SCOPED)))


def _norm(r: _Program | _Replay, rows: int, s: LayerShape, el: int, out: str) -> None:
    """RMSNorm as transformers writes it: ``x.to(float32)``, ``pow(2)``, ``x * rsqrt(...)``, back to the
    input dtype, times the weight; LayerNorm: one kernel, its output."""
    n = rows * s.hidden
    if not s.rms:
        r.alloc(out, n * el)
        return
    r.alloc("n.up", n * FP32)
    r.alloc("n.pow", n * FP32)
    r.free("n.pow")
    r.alloc("n.mul", n * FP32)
    r.free("n.up")
    r.alloc("n.down", n * el)
    r.alloc(out, n * el)
    r.free("n.down", "n.mul")


def _matmul(r: _Program | _Replay, out: str, nbytes: int, temp: int) -> None:
    r.alloc("mm.temp", temp)
    r.alloc(out, nbytes)
    r.free("mm.temp")


def _rope(r: _Program, rows: int, width: int, el: int, out: str) -> None:
    """``x * cos + rotate_half(x) * sin``, rotate_half = ``cat(-x2, x1)``."""
    n = rows * width * el
    r.alloc("r.m1", n)
    r.alloc("r.neg", n // 2)
    r.alloc("r.cat", n)
    r.free("r.neg")
    r.alloc("r.m2", n)
    r.free("r.cat")
    r.alloc(out, n)
    r.free("r.m1", "r.m2")


def _eager(
    r: _Program, s: LayerShape, b: int, tokens: int, kept: int, el: int, *, prefill: bool, softmax_copy: bool
) -> None:
    """v4.35 ``LlamaAttention.forward``'s eager attention (modeling_llama.py l. 390-415), as traced on the CPU
    (benchmarks/legacy_generate_trace.py): over the prompt ``torch.matmul`` copies the rotated query (and,
    without repeat_kv, the key and later the value: laid out (batch, tokens, heads, dim), they cannot be
    viewed as one batch of matrices) before each ``bmm``; ``/ sqrt(d)`` and ``+ mask`` each a new tensor;
    ``softmax(dtype=float32)`` copies the masked scores to fp32 and softmaxes into another (fp16 on CUDA:
    one kernel, no copy; aten/native/SoftMax.cpp ``softmax``), cast back while the masked scores still live
    (``attn_weights`` rebound after the cast); ``transpose(1, 2).contiguous()``. Leaves ``attn``, ``s.p``."""
    rows, scores = b * tokens, b * s.heads * tokens * kept
    kv_copies = prefill and not s.repeats  # repeat_kv's own copies are laid out for bmm
    if prefill:
        r.alloc("s.q", rows * s.q * el)
    if kv_copies:
        r.alloc("s.kt", b * kept * s.k * el)
    r.alloc("s.mm", scores * el)
    if kv_copies:
        r.free("s.kt")
    if prefill:
        r.free("s.q")
    r.alloc("s.div", scores * el)
    r.free("s.mm")
    r.alloc("s.mask", scores * el)
    r.free("s.div")
    if softmax_copy:
        r.alloc("s.in32", scores * FP32)
    r.alloc("s.fp32", scores * FP32)
    if softmax_copy:
        r.free("s.in32")
    r.alloc("s.p", scores * el)
    r.free("s.fp32", "s.mask")
    if kv_copies:
        r.alloc("s.v", b * kept * s.v * el)
    r.alloc("attn.bmm", rows * s.out * el)
    if kv_copies:
        r.free("s.v")
    r.alloc("attn", rows * s.out * el)
    r.free("attn.bmm")


def _mask(r: _Replay, b: int, tokens: int, cached: int, el: int) -> None:
    """v4.35 ``LlamaModel.forward``'s 4-D mask (modeling_llama.py l. 886; modeling_attn_mask_utils.py
    ``_make_causal_mask`` l. 131-135, ``_expand_mask`` l. 157-161, ``to_4d`` l. 112-115), kept as ``mask``
    to the forward's end: over the prompt the causal (tokens, tokens) mask, ``torch.full`` in fp32 then cast;
    the 2-D mask expanded and cast, ``1.0 -`` it, its bool, ``masked_fill``; the sum of the two."""
    m = b * tokens * cached
    if tokens > 1:
        r.alloc("mask.c32", tokens * tokens * FP32)
        r.alloc("mask.c", tokens * cached * el)
        r.free("mask.c32")
    r.alloc("mask.exp", m * el)
    r.alloc("mask.inv", m * el)
    r.alloc("mask.bool", m)
    r.alloc("mask.fill", m * el)
    r.free("mask.bool", "mask.exp", "mask.inv")
    if tokens > 1:
        r.alloc("mask", m * el)
        r.free("mask.fill", "mask.c")
    else:
        r.rename("mask.fill", "mask")


@lru_cache(maxsize=64)
def _layer(
    s: LayerShape,
    first: bool,
    tokens: int,
    cached: int,
    *,
    prefill: bool,
    batch: int,
    el: int,
    legacy: bool,
    growing_only: bool,
    softmax_copy: bool = True,
) -> list[_Op]:
    """The program of one layer of shape ``s`` in a forward over ``tokens`` new tokens for each of
    ``batch`` sequences, its cache ``cached`` tokens long after the update; it reads ``x`` (``embed`` for
    the ``first`` layer, kept to the forward's end) and leaves ``x``."""
    b = batch
    kept = cached if s.window is None else min(cached, s.window)
    r = _Program(b * kept * min(s.k, s.v) * el if growing_only else 0)
    rows = b * tokens
    temps = s.temps_prefill if prefill else s.temps_decode
    t_q, t_k, t_v, t_o, *t_mlp = temps
    _norm(r, rows, s, el, "ln1")
    _matmul(r, "q", rows * s.q * el, t_q)
    _matmul(r, "k", rows * s.k * el, t_k)
    _matmul(r, "v", rows * s.v * el, t_v)
    if s.rope:  # the projections go once both are rotated
        if legacy:  # v4.35 apply_rotary_pos_emb (modeling_llama.py l. 222-223): cos / sin[position_ids]
            for part in ("rope.cos", "rope.sin"):
                r.alloc(part, rows * (s.q // s.heads) * el)
        _rope(r, rows, s.q, el, "qr")
        _rope(r, rows, s.k, el, "kr")
        if legacy:
            r.free("rope.cos", "rope.sin")
        r.free("q", "k")
    else:
        r.rename("q", "qr")
        r.rename("k", "kr")
    for part, width in (("kr", s.k), ("v", s.v)):
        cache = f"cache.{part}"
        if legacy and prefill:
            r.rename(part, cache)  # the projected (and RoPE'd) tensor is the cache: no copy
            continue
        r.rename(cache, "cache.old")
        r.alloc(cache, b * kept * width * el)  # torch.cat: the new tensor made while the old one lives
        if legacy:
            r.rename("cache.old", f"old.{part}")  # dropped when the step's forward returns
        else:
            r.free("cache.old")
    r.free("kr", "v")
    if s.repeats:
        r.alloc("rep.k", b * s.heads * kept * (s.q // s.heads) * el)
        r.alloc("rep.v", b * s.heads * kept * (s.out // s.heads) * el)
    if legacy:
        _eager(r, s, b, tokens, kept, el, prefill=prefill, softmax_copy=softmax_copy)
    else:
        r.alloc("attn", rows * s.out * el)
        r.alloc("attn.lse", b * s.heads * tokens * FP32)  # SDPA's logsumexp (fp32 a query head and token)
        r.free("attn.lse")
        r.free("rep.k", "rep.v")
    _matmul(r, "o", rows * s.hidden * el, t_o)
    if legacy:  # v4.35 l. 426-429: the probabilities and repeat_kv's copies go as the attention returns
        r.free("attn", "s.p", "qr", "rep.k", "rep.v", "ln1")
    else:
        r.free("attn", "qr", "ln1")
    r.alloc("h1", rows * s.hidden * el)
    r.free("o")
    _norm(r, rows, s, el, "ln2")
    n = rows * s.width * el
    if s.gated:
        t_gate, t_up, t_down = t_mlp
        _matmul(r, "gate", n, t_gate)
        r.alloc("act", n)
        r.free("gate")
        _matmul(r, "up", n, t_up)
        r.alloc("mul", n)
        r.free("act", "up")
    else:
        t_up, t_down = t_mlp
        _matmul(r, "up", n, t_up)
        r.alloc("mul", n)
        r.free("up")
    _matmul(r, "down", rows * s.hidden * el, t_down)
    r.free("mul", "ln2")
    r.alloc("h2", rows * s.hidden * el)
    r.free("down", "h1")
    if not first:
        r.free("x")  # the previous layer's output (the first layer's input, the embedding's, stays)
    r.rename("h2", "x")
    return r.ops


def _forward(
    r: _Replay, run: GenerateRun, tokens: int, cached: int, *, prefill: bool, growing_only: bool = False
) -> None:
    """One forward of ``tokens`` new tokens a sequence (the prompt, or one decode step) and what
    ``generate`` does with its logits."""
    b, el = run.batch, run.act_bytes
    rows = b * tokens
    r.alloc("embed", rows * run.layers[0].hidden * el)  # layer 0's input, kept to the forward's end
    if run.legacy:
        _mask(r, b, tokens, cached, el)
    if run.layers[0].rope and not run.legacy:
        # 5.x rotary_emb: fp32 freqs (half the head), emb = cat(freqs, freqs), cos / sin times the scaling,
        # cast to the dtype; the cast ones kept to the forward's end
        cos_sin = rows * run.head_dim
        r.alloc("freqs", cos_sin // 2 * FP32)
        r.alloc("emb", cos_sin * FP32)
        for part in ("cos", "sin"):
            r.alloc(f"{part}.32", cos_sin * FP32)
            r.alloc(f"{part}.scaled", cos_sin * FP32)
            r.free(f"{part}.32")
        r.alloc("cos", cos_sin * el)
        r.alloc("sin", cos_sin * el)
        r.free("freqs", "emb", "cos.scaled", "sin.scaled")
    for i, shape in enumerate(run.layers):
        r.run(_layer(shape, i == 0, tokens, cached, prefill=prefill, batch=b, el=el, legacy=run.legacy,
                     growing_only=growing_only, softmax_copy=run.softmax_copy), i)  # fmt: skip
    _norm(r, rows, run.layers[-1], el, "final")
    r.free("x", "embed", "cos", "sin", "mask")
    kept = tokens if prefill and run.all_logits else 1
    if run.legacy:
        _legacy_logits(r, b * kept * run.vocab, el)
        return
    r.alloc("logits", b * kept * run.vocab * el)
    r.free("final")
    if run.all_logits:  # logits.float() inside the model: outputs keep the fp32 copy
        r.alloc("outputs.logits", b * kept * run.vocab * FP32)
        r.free("logits")
    else:
        r.rename("logits", "outputs.logits")
    _scores(r, b, run.vocab, run.min_new_tokens)
    r.free("outputs.logits")  # 5.x _sample: ``del outputs`` at the end of each step


def _scores(r: _Replay, b: int, vocab: int, min_new_tokens: bool) -> None:
    """transformers 5.23 ``_sample`` (generation/utils.py l. 3247-3250): ``next_token_logits`` is the last
    position's fp32 copy, the previous step's dropped as the name is rebound; ``logits_processor`` returns
    ``next_token_scores``, the previous step's dropped only once the processors return. Both stay alive
    through the next forward (the names are rebound after it; ``del outputs``, l. 3292, frees only the
    logits). With ``min_new_tokens`` generate (l. 2061: ``min_length`` = prompt + ``min_new_tokens``) builds
    ``MinLengthLogitsProcessor`` and ``MinNewTokensLengthLogitsProcessor`` (l. 1515-1539); each makes
    ``arange(vocab)`` (int64), its ``isin`` mask, ``scores.clone()`` and, below the minimum (every step
    when the minimum is the maximum), ``torch.where`` over the scores, the clone dropped as
    ``scores_processed`` is rebound, the arange and mask as it returns (logits_process.py l. 156-161,
    l. 229-235); ``LogitsProcessorList`` drops each processor's input as ``scores`` is rebound (l. 96), but
    the first's, ``next_token_logits``. Without them a greedy job builds no processor
    (``_get_logits_processor``, l. 1410-1657: every other one needs an option; the warpers only sample): the
    scores are the logits."""
    n = b * vocab * FP32
    r.alloc("next.logits", n)  # outputs.logits[:, -1].to(copy=True, dtype=torch.float32)
    r.free("next_token_logits")
    r.rename("next.logits", "next_token_logits")
    if not min_new_tokens:
        return
    scores = "next_token_logits"
    # MinLength: arange, isin, clone; MinNewTokensLength: the clone first
    for i, clone_first in enumerate((False, True)):
        if clone_first:
            r.alloc("proc.clone", n)
        r.alloc("proc.arange", INT64.nbytes(vocab))
        r.alloc("proc.mask", BOOL.nbytes(vocab))
        if not clone_first:
            r.alloc("proc.clone", n)
        r.alloc(f"proc.{i}", n)  # torch.where(eos_token_mask, -inf, scores)
        r.free("proc.clone", "proc.arange", "proc.mask")
        if scores != "next_token_logits":
            r.free(scores)
        scores = f"proc.{i}"
    r.free("next_token_scores")
    r.rename(scores, "next_token_scores")


def _legacy_logits(r: _Replay, n: int, el: int) -> None:
    """v4.35: ``lm_head``, ``logits.float()`` (modeling_llama.py l. 1052-1053), the last norm's output gone
    with the model's; greedy_search keeps the previous step's outputs (its fp32 logits) until ``outputs`` is
    rebound to the new ones (generation/utils.py l. 2521), reads the last position as a view and processes
    it in place (l. 2531-2534: no fp32 copy); the previous step's cache goes at the step's end."""
    r.alloc("logits", n * el)
    r.alloc("logits.fp32", n * FP32)
    r.free("logits", "final", "outputs.logits")
    r.rename("logits.fp32", "outputs.logits")
    r.free(*r.olds)
    r.olds.clear()


def decode_lengths(run: GenerateRun) -> tuple[int, ...]:
    """The cache lengths of the replayed decode steps: every ``stride`` tokens and the last (the
    decode forwards hold prompt + 1 .. context - 1 tokens)."""
    first, last = run.prompt + 1, run.context - 1
    if last < first:
        return ()
    grow = max(max(s.k, s.v) for s in run.layers) * run.batch * run.act_bytes  # bytes a token adds
    stride = max(1, STEP_BYTES // max(1, grow), -(-(last - first) // MAX_DECODE_STEPS))
    return (*range(first, last, stride), last)


def replay_forward_loop(r: _Replay, run: GenerateRun, calls: int = FORWARD_LOOP_CALLS) -> None:
    """``calls`` plain forwards over the prompt, as optimum-benchmark's inference benchmark runs them
    before any generate (benchmarks/inference/benchmark.py@014c97e and @f75d9f9 ``run_forward_tracking``,
    then ``run_generate_tracking`` on the same model and process): ``_ = backend.forward(...)`` rebinds
    ``_`` only once the call returns, so each output (before v4.36 the tuple cache, the prompt's projected
    K and V, and every position's fp32 logits: modeling_llama.py l. 1052-1053) is alive through the next
    call, and the last goes when ``run_forward_tracking`` returns. Before v4.36 such a call is generate's own
    prefill forward (``greedy_search`` calls ``self(**model_inputs)``), replayed as that."""
    held: list[str] = []
    for call in range(calls):
        _forward(r, run, run.prompt, run.prompt, prefill=True)
        output = [k for k in r.keys if k not in held]
        for k in output:  # the output, named apart from the next call's
            r.keys[f"call{call}:{k}"] = r.keys.pop(k)
        r.free(*held)
        held = [f"call{call}:{k}" for k in output]
    r.free(*held)


@lru_cache(maxsize=256)
def replayed_reserved(run: GenerateRun, steady_after: int = STEADY_AFTER) -> int:
    """Peak ``max_memory_reserved`` of the large pool over the prefill and the decode steps (bytes), after
    the forward loop where ``run.forward_loop``; after ``steady_after`` decode steps only the requests
    that grow with the cache are replayed."""
    r = _Replay(run.divisions, run.capacity)
    if run.forward_loop:
        replay_forward_loop(r, run)
    _forward(r, run, run.prompt, run.prompt, prefill=True)
    for step, cached in enumerate(decode_lengths(run)):
        _forward(r, run, 1, cached, prefill=False, growing_only=step >= steady_after)
    return r.peak


def growth_run(c: ServingContext, divisions: int = NO_ROUNDUP, resident: int = 0) -> GenerateRun | None:
    """``c``'s generate as :func:`replayed_reserved` replays it; None where it is not replayed (module
    docstring: a static or quantized cache, MoE, MLA or recurrent layers, a draft, chunked prefill).
    On a GPU of known size the replay may reserve what ``resident`` bytes (weights, buffers) and the CUDA
    context leave: beyond it the allocator frees its cached segments and retries, as the model does."""
    s, spec = c.setup, c.spec
    if (
        s.cache_implementation is not CacheImplementation.DYNAMIC
        or c.kv_bits != 8 * c.act_bytes
        or s.draft is not None
        or s.prefill_chunk
        or serving_state(c).total
        or any(g.layer.mlp.is_moe or g.layer.attention.is_mla for g in spec.groups)
    ):
        return None
    legacy = s.version < TRANSFORMERS_CACHE_CLASSES
    release = f"{s.version[0]}.{s.version[1]}.0"
    layers = tuple(
        shape
        for g in spec.groups
        for shape in (_layer_shape(c, g.layer, legacy=legacy, release=release),) * g.count
    )
    return GenerateRun(
        batch=s.batch, prompt=c.prompt, context=c.context, act_bytes=c.act_bytes,
        vocab=-(-spec.vocab_size // s.tp), head_dim=spec.groups[0].layer.attention.head_dim, layers=layers,
        legacy=legacy, all_logits=s.version < TRANSFORMERS_LOGITS_TO_KEEP or s.keep_all_logits,
        softmax_copy=c.compute_dtype != "fp16",
        divisions=divisions, capacity=s.gpu_bytes - CUDA_CONTEXT_BYTES - resident if s.gpu_bytes else None,
        forward_loop=s.forward_loop and legacy,
    )  # fmt: skip


def _layer_shape(c: ServingContext, layer: Layer, *, legacy: bool, release: str) -> LayerShape:
    s, tp, att, mlp = c.setup, c.setup.tp, layer.attention, layer.mlp
    heads = -(-att.num_heads // tp)
    kv = kv_heads_per_rank(att.num_kv_heads, tp)
    h, width = c.spec.hidden_size, -(-mlp.intermediate_size // tp)
    q, out, k, v = heads * att.head_dim, heads * att.v_head_dim, kv * att.head_dim, kv * att.v_head_dim
    mlp_in = ((h, width), (h, width)) if mlp.gated else ((h, width),)  # (gate,) up
    linears = ((h, q), (h, k), (h, v), (out, h), *mlp_in, (width, h))

    def temps(rows: int, prefill: bool) -> tuple[int, ...]:
        return tuple(linear_temporary_bytes(i, o, s, rows, c.act_bytes, prefill=prefill) for i, o in linears)

    return LayerShape(
        hidden=h, q=q, out=out, k=k, v=v, heads=heads, window=att.sliding_window, width=width,
        gated=mlp.gated, rms=c.spec.norm == "rmsnorm", rope=c.spec.position == "rope",
        repeats=kv < heads and (legacy or sdpa_repeats_kv(release, masked=False)),
        temps_prefill=temps(s.batch * c.prompt, True), temps_decode=temps(s.batch, False),
    )  # fmt: skip


def growth_term(extra: int) -> BandTerm:
    """The band's allowance for the replay: reserved may be as low as the closed form, ``extra`` below."""
    return BandTerm(name="allocator_cache_growth", level="reserved", low_bytes=-extra, high_bytes=0,
                    source=SRC_GROWTH_TERM)  # fmt: skip
