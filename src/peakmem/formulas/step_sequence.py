"""The analytic estimate's own training steps as a sequence of allocations and frees, replayed through
the caching-allocator model (:mod:`.caching_allocator`) to give ``max_memory_reserved``.

Reserved memory depends on the order and the sizes of the requests, not only on their sum: blocks
that forward's activations cut from 20 MiB segments cannot hold the optimizer step's larger
temporaries, and optimizer states created lazily in step 1 land in blocks that step 2's logits then
miss. A closed form over totals cannot see either, so the estimate describes its step tensor by
tensor (:class:`StepTensors`: the sizes the timeline already has, per tensor) and this module walks
two steps of it - step 1 creates the optimizer states inside ``optimizer.step()`` (torch/optim/adam.py
``_init_group``), step 2 is the steady state - through :class:`.caching_allocator.CachingAllocatorModel`.
Segments are never released (``empty_cache`` is not called), so the reserved peak is what is reserved
after step 2. The order within a step follows the timeline of :mod:`.timeline`:

* load: weights (module order), buffers, then the fp32 master copies (the optimizer wrapper's);
* forward: the embedding's saved tensors, each layer's momentary extra (freed) and saved tensors, the
  head's momentary extra (a soft-capped head's logits before tanh, freed) and saved tensors, then the
  logits and their fp32 copy, the loss's saved output made from them, and the two freed. A layer's
  interior allocates more than it saves (an RMSNorm's fp32 ``pow``, a residual sum, a cast whose
  source dies: simulate's recorded traces hold about three times as many 4-16 MiB requests as the saved
  tensors); the sequence has only what the estimate lists, each tensor at its own size
  (``MemoryItem.sizes``): cut into equal parts, Qwen3-0.6B's norm, q/k-norm and q/k/v items left
  230 MiB of 1-4 MiB holes that simulate's trace does not have (reserved -3.4 % against simulate's,
  -0.6 % at their sizes). A layer's momentary tensors (``LayerTensors.forward_extra``, and in backward
  its recomputed tensors and gradient temporaries) are at their sizes too where the formulas list them
  (activations ``LayerActivations.forward_sizes`` etc.): cut into equal parts a few MiB below a saved
  tensor, no freed block held it (Llama-3.1-8B cut to 4 layers, 2 x 8192, full checkpointing: -12.1 %
  against simulate's reserved, +1.2 % at their sizes);
* backward: the loss's gradients, each replacing the one before; the head's gradients (a tied
  embedding's held to the end); per layer from the top its temporaries, its weight gradients (kept
  as ``.grad``), then its temporaries and saved tensors freed; the embedding's gradients at the end;
* optimizer: under mixed precision each 16-bit gradient replaced by its fp32 copy on the master
  weight, one tensor at a time; in step 1 every state created (per parameter, its states in turn);
  the step's temporaries (foreach: one per parameter, all alive together) then freed;
* ``zero_grad(set_to_none=True)`` frees the gradients. With resident gradients (accumulation, or
  ``set_to_none=False``) the first backward creates them and later ones add into them through a
  temporary per tensor.

Multi-GPU: one FSDP rank (``StepTensors.sharded``; step_parts.py ``sharded_parts`` says, with torch
2.13's files, which requests land on the default stream), written for its default stream only: a cached
block serves only the stream that allocated it (c10/cuda/CUDACachingAllocator.cpp ``get_free_block``),
so FSDP's side-stream buffers (all-gather outputs, reduce-scatter outputs: formulas/fsdp2.py
``StreamPools``) are pools of their own, added beside this replay. The order then differs where FSDP
acts: each layer unit's unsharded parameters around its forward and its backward (none under FSDP1,
whose unsharded flat parameter is the unshard stream's); in backward its gradients, its post-backward
(reshard, the previous unit's reduce-scatter input reclaimed, its own allocated, the gradients freed
after the copy-in: torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py ``post_backward``,
_fsdp_collectives.py ``foreach_reduce``; FSDP1: the views' gradients concatenated into the unit's flat
gradient, which its post-backward stream reduces); the root unit (embeddings, final norm, head)
unsharded around the model's forward and from the logits' gradient to the end of backward, its
gradients whole until then. No gradient outlives backward on the default stream, so the optimizer
reads none and zero_grad frees none of its blocks. Under TP's ``loss_parallel`` the loss follows
torch/distributed/tensor/parallel/loss.py (torch 2.13): ``_log_softmax`` (the upcast copy, ``x - max``,
``exp`` freed after its sum, the saved ``shifted - logsumexp``) and ``_nll_loss_and_log_softmax_backward``
(``zeros_like(x)``, ``exp(x)``, their sum, the product with the output gradient), with torchtitan's
``pred.float()`` and ``del pred`` before backward (torchtitan@9dec370 train.py).

Pure Python, standard library only; O(events x log(free blocks)).
"""

from __future__ import annotations

from dataclasses import dataclass

from .allocator import K_SMALL_BUFFER, K_SMALL_SIZE, NO_ROUNDUP, round_request
from .caching_allocator import Block, CachingAllocatorModel


@dataclass(kw_only=True, slots=True)
class LayerTensors:
    """One group of ``count`` identical layers, per layer (built per estimate: slotted, not frozen)."""

    count: int
    saved: tuple[int, ...]  # activations saved in forward, in order (freed in its backward)
    forward_extra: tuple[int, ...] = ()  # momentary tensors in its forward, freed before its saved ones
    backward_extra: tuple[int, ...] = ()  # gradient temporaries (and recomputed tensors) of its backward
    grads: tuple[int, ...] = ()  # its weight gradients (one per parameter tensor)
    # FSDP (``StepTensors.sharded``): the unit's unsharded parameters that the default stream holds from
    # its unshard to its reshard, in forward and again in backward (FSDP2's per-parameter all-gather
    # outputs; none under FSDP1, whose unsharded flat parameter lives on the unshard stream)
    unshard: tuple[int, ...] = ()
    reduce_input: int = 0  # FSDP2: its reduce-scatter input (kept until the next unit's post-backward)
    flat_grad: int = 0  # FSDP1: the flat gradient that concatenates its gradients (split's backward)


@dataclass(kw_only=True, slots=True)
class StepTensors:
    """A training step, tensor by tensor (sizes in bytes; built per estimate)."""

    weights: tuple[int, ...]  # parameters and buffers, in load order
    masters: tuple[int, ...] = ()  # fp32 master copies (mixed precision), per trainable tensor
    states: tuple[int, ...] = ()  # optimizer states, per parameter and state, in creation order
    embed_saved: tuple[int, ...] = ()
    layers: tuple[LayerTensors, ...] = ()  # groups in forward order
    head_saved: tuple[int, ...] = ()
    # alive together in the head's forward before its saved tensors, then freed: a soft-capped head's
    # logits and logits / cap (modeling_gemma2.py: each freed once the next exists; tanh saves its output)
    head_extra: tuple[int, ...] = ()
    loss_extra: tuple[int, ...] = ()  # alive at the loss in forward (logits, their fp32 copy); then freed
    loss_saved: tuple[int, ...] = ()  # saved by the loss, made from ``loss_extra`` (log_softmax output)
    forward_held: tuple[int, ...] = ()  # alive from the start of forward until the loss (autocast cache)
    # the loss's gradients at the start of backward, a chain: each node's output replaces its input
    # (nll_loss -> log_softmax -> the fp32 upcast's backward), the last one read by the head's backward
    loss_grads: tuple[int, ...] = ()
    head_grads: tuple[int, ...] = ()  # weight gradients written at the start of backward (head, final norm)
    end_grads: tuple[int, ...] = ()  # weight gradients written at the end (embeddings)
    # a tied embedding: the LM head's gradient, held from the head's backward to the embedding's, where
    # the embedding's own contribution arrives and their sum becomes .grad (input_buffer.cpp accumulate)
    tied_hold: int = 0
    master_grads: tuple[int, ...] = ()  # fp32 copies that replace ``grads`` at the step (mixed precision)
    step_temporaries: tuple[int, ...] = ()  # the optimizer step's temporaries, all alive together
    micro_batches: int = 1
    grads_resident: bool = False  # gradients outlive zero_grad (set_to_none=False or accumulation)
    # FSDP (one rank, its default stream only; see "Multi-GPU" in the module doc): the gradients leave
    # the default stream at each unit's post-backward (reduce-scattered into side-stream shards); the
    # root unit (embeddings, final norm, head) with its unsharded parameters, reduce-scatter input
    # (FSDP2) or flat gradient (FSDP1); layer units' parameters stay unsharded forward to backward
    sharded: bool = False
    root_unshard: tuple[int, ...] = ()
    root_reduce: int = 0
    root_flat_grad: int = 0
    keep_units: bool = False  # FSDP2 reshard_after_forward=False (shard-grad-op)
    # PyTorch TP's loss_parallel (torch/distributed/tensor/parallel/loss.py): (the rank's 16-bit logits,
    # one fp32 T x V/tp shard), the SP all-gather buffer of the head input, and the head's input
    # gradient as a whole T x H partial sum and its reduce-scattered shard
    loss_parallel: tuple[int, ...] = ()
    head_gather: tuple[int, ...] = ()
    roundup_divisions: int = NO_ROUNDUP  # PYTORCH_CUDA_ALLOC_CONF roundup_power2_divisions (allocator.py)
    head_input_grad: tuple[int, ...] = ()


@dataclass(frozen=True, kw_only=True, slots=True)
class Replayed:
    reserved: int  # max_memory_reserved over the two steps
    allocated: int  # max_memory_allocated over the two steps (blocks, rounded)
    segments: int  # cudaMalloc calls of the large pool


# a live tensor of a replay: its block (large pool), or its rounded bytes (small pool: counted, not placed)
Held = Block | int


class _Run:
    """The allocator model, each tensor held by its block.

    Requests of the small pool (up to kSmallSize, 1 MiB: biases, norm weights, statistics) are counted,
    not placed: they share 2 MiB segments of their own that no large request uses, so their segments
    are their live peak rounded up to kSmallBuffer (their holes are at most a few blocks of 2 MiB).
    Half of GPT-2's tensors are biases: this halves the replay's work there.

    :meth:`free` empties the list it frees, so a list freed twice is freed once (the loss's saved output
    is freed where its backward runs and again at the end of the loss's backward)."""

    __slots__ = ("divisions", "model", "peak_allocated", "small_live", "small_peak")

    def __init__(self, divisions: int = NO_ROUNDUP) -> None:
        self.divisions = divisions
        self.model = CachingAllocatorModel(divisions)
        self.peak_allocated = 0
        self.small_live = 0
        self.small_peak = 0

    def alloc(self, sizes: tuple[int, ...]) -> list[Held]:
        held: list[Held] = []
        take = self.model.take
        for nbytes in sizes:
            if nbytes <= 0:  # allocate(0) returns nullptr: no block
                continue
            size = round_request(nbytes, self.divisions)
            if size <= K_SMALL_SIZE:
                self.small_live += size
                if self.small_live > self.small_peak:
                    self.small_peak = self.small_live
                held.append(size)
            else:
                held.append(take(size))
        live = self.model.allocated + self.small_live
        if live > self.peak_allocated:
            self.peak_allocated = live
        return held

    def free(self, held: list[Held]) -> None:
        give = self.model.give
        for h in held:
            if isinstance(h, int):
                self.small_live -= h
            else:
                give(h)
        held.clear()

    @property
    def reserved(self) -> int:
        return self.model.reserved + -(-self.small_peak // K_SMALL_BUFFER) * K_SMALL_BUFFER


# the allocator model with the small pool counted, for other request sequences (formulas/nf4_load.py)
AllocatorRun = _Run

# Setups that differ in what does not change a step's requests (the attention kernel of a model whose
# blocks are measured, a Liger or compile flag with no effect on it) replay the same sequence: their
# result is remembered, keyed by the requests themselves. ``train``'s ranked changes of Qwen3-Next-80B
# replayed 7 sequences, 5 of them distinct, at 0.28 s each (benchmarks/first_train.py, cached runs).
_MEMO: dict[tuple[object, ...], Replayed] = {}
_MEMO_MAX = 64


def _requests(step: StepTensors, steps: int) -> tuple[object, ...]:
    layers = tuple(tuple(getattr(g, f) for f in LayerTensors.__dataclass_fields__) for g in step.layers)
    return (steps, layers, *(getattr(step, f) for f in StepTensors.__dataclass_fields__ if f != "layers"))


def replay_steps(step: StepTensors, steps: int = 2) -> Replayed:
    """Reserved and allocated peaks of ``steps`` training steps of ``step`` (see the module doc)."""
    key = _requests(step, steps)
    hit = _MEMO.get(key)
    if hit is None:
        if len(_MEMO) >= _MEMO_MAX:
            _MEMO.clear()
        hit = _MEMO[key] = _replay(step, steps)
    return hit


def _replay(step: StepTensors, steps: int) -> Replayed:
    return _replay_batches((step,) * (steps * min(step.micro_batches, 2)))


def replay_lengths(batches: tuple[StepTensors, ...]) -> Replayed:
    """Reserved and allocated peaks of the micro-batches ``batches`` (the same model and setup at
    different sequence lengths: formulas/padded_lengths.py) replayed in turn through ONE allocator
    state, an optimizer step after every ``min(micro_batches, 2)`` of them and after the last."""
    key = ("lengths", *(_requests(b, 1) for b in batches))
    hit = _MEMO.get(key)
    if hit is None:
        if len(_MEMO) >= _MEMO_MAX:
            _MEMO.clear()
        hit = _MEMO[key] = _replay_batches(batches)
    return hit


def _replay_batches(batches: tuple[StepTensors, ...]) -> Replayed:
    """Each of ``batches`` one micro-batch; its weights, states and optimizer are the first's (the
    lengths change only the activations, logits and their temporaries)."""
    step = batches[0]
    run = _Run(step.roundup_divisions)
    run.alloc(step.weights)
    run.alloc(step.masters)
    grads: list[Held] = []  # the live .grad tensors, in the order backward wrote them
    per_step = min(step.micro_batches, 2)
    for i, batch in enumerate(batches):
        # the first micro-batch creates the gradients, every later one runs with them alive and adds
        # into them: the second stands for the rest (same requests, same free blocks)
        saved = _forward(run, batch)
        grads += _backward(run, batch, saved, accumulate=bool(grads))
        if (i + 1) % per_step and i + 1 < len(batches):
            continue
        grads = _optimizer(run, step, grads, first=i < per_step)
        if not step.grads_resident:  # zero_grad(set_to_none=True)
            run.free(grads)
            grads = []
    return Replayed(reserved=run.reserved, allocated=run.peak_allocated, segments=run.model.segments)


def _forward(run: _Run, step: StepTensors) -> list[list[Held]]:
    """The forward pass; returns the saved tensors' keys per layer (embedding first, head last)."""
    held = run.alloc(step.forward_held)
    root = run.alloc(step.root_unshard)
    saved = [run.alloc(step.embed_saved)]
    units: list[list[Held]] = []  # shard-grad-op: the units kept unsharded until their backward
    for g in step.layers:
        for _ in range(g.count):
            params = run.alloc(g.unshard)
            run.free(run.alloc(g.forward_extra))
            saved.append(run.alloc(g.saved))
            if step.keep_units:
                units.append(params)
            else:
                run.free(params)  # reshard after forward
    run.free(run.alloc(step.head_extra))
    gather = run.alloc(step.head_gather)
    saved.append(run.alloc(step.head_saved))
    run.free(gather)
    if step.loss_parallel:
        logits16, fp32 = step.loss_parallel
        logits = run.alloc((logits16,))
        run.free(root)  # the root's post-forward: the model returns the logits, the loss runs outside it
        copy = run.alloc((fp32,))  # pred.float(); _log_softmax's x.to(float32) is then a no-op
        shifted = run.alloc((fp32,))  # x - x_max
        run.free(run.alloc((fp32,)))  # exp(shifted), freed after its sum
        saved.append(run.alloc(step.loss_saved))  # shifted - logsumexp: log_softmax's saved output
        run.free(shifted)
        run.free(copy)
        run.free(logits)  # torchtitan: del pred before backward
    else:
        extra = run.alloc(step.loss_extra)
        run.free(root)
        saved.append(run.alloc(step.loss_saved))
        run.free(extra)
    run.free(held)
    saved.append([k for p in units for k in p])
    return saved


def _loss_backward(run: _Run, step: StepTensors, loss_saved: list[Held]) -> list[Held]:
    """The loss's backward; returns the gradient the head's backward reads."""
    loss: list[Held] = []
    if step.loss_parallel:  # _nll_loss_and_log_softmax_backward: (zeros_like(x) + exp(x)) * grad_output
        logits16, fp32 = step.loss_parallel
        zeros = run.alloc((fp32,))
        exp = run.alloc((fp32,))
        total = run.alloc((fp32,))
        run.free(exp)
        loss = run.alloc((fp32,))
        run.free(total)
        run.free(zeros)
        run.free(loss_saved)  # log_softmax's backward is grad_output.to(float32): its saved output goes
        new = run.alloc((logits16,))  # the .float() upcast's backward: the logits' 16-bit gradient
        run.free(loss)
        return new
    for i, nbytes in enumerate(step.loss_grads):
        new = run.alloc((nbytes,))
        run.free(loss)
        loss = new
        if i == 1:  # log_softmax's backward ran: its saved output goes
            run.free(loss_saved)
    run.free(loss_saved)
    return loss


def _backward(run: _Run, step: StepTensors, saved: list[list[Held]], *, accumulate: bool) -> list[Held]:
    """The backward pass; returns the gradients it created (none when they accumulate into .grad, or
    leave the default stream at FSDP's post-backward)."""
    units = saved.pop()  # shard-grad-op: every layer unit's unsharded parameters, in forward order
    loss_saved, head_saved = saved.pop(), saved.pop()
    loss = _loss_backward(run, step, loss_saved)
    root = run.alloc(step.root_unshard)  # the root's pre-backward, on the logits' gradient
    created = _grads(run, step.head_grads, accumulate)
    held = run.alloc((step.tied_hold,))
    whole = run.alloc(step.head_input_grad[:1])  # TP: the head's input gradient, a partial sum
    run.free(loss)
    run.free(run.alloc(step.head_input_grad[1:]))  # its reduce-scatter (SP) or all-reduce output
    run.free(whole)
    run.free(head_saved)
    reduce: list[Held] = []  # FSDP2: the last unit's reduce-scatter input
    for g in reversed(step.layers):
        for _ in range(g.count):
            if step.keep_units:  # reshard_after_forward=False: unsharded since forward
                params, units = units[len(units) - len(g.unshard) :], units[: len(units) - len(g.unshard)]
            else:
                params = run.alloc(g.unshard)
            tmp = run.alloc(g.backward_extra)
            grads = _grads(run, g.grads, accumulate)
            run.free(tmp)
            run.free(saved.pop())
            if not step.sharded:
                created += grads
                continue
            grads = _flat(run, g.flat_grad, grads)
            run.free(params)  # post_backward: reshard, reclaim the previous input, reduce
            run.free(reduce)
            reduce = run.alloc((g.reduce_input,))
            run.free(grads)
    contribution = run.alloc((step.tied_hold,))
    created += _grads(run, step.end_grads, accumulate)
    run.free(contribution)
    run.free(held)
    run.free(saved.pop())
    if not step.sharded:
        return created
    created = _flat(run, step.root_flat_grad, created)
    run.free(root)
    run.free(reduce)
    run.free(run.alloc((step.root_reduce,)))  # the final callback drops the last input
    run.free(created)
    return []


def _flat(run: _Run, nbytes: int, grads: list[Held]) -> list[Held]:
    """FSDP1: a unit's gradients concatenated into its flat gradient (the views' split backward)."""
    if not nbytes:
        return grads
    flat = run.alloc((nbytes,))
    run.free(grads)
    return flat


def _grads(run: _Run, sizes: tuple[int, ...], accumulate: bool) -> list[Held]:
    keys = run.alloc(sizes)
    if accumulate:  # written as a temporary, added into the existing .grad, freed
        run.free(keys)
        return []
    return keys


def _optimizer(run: _Run, step: StepTensors, grads: list[Held], *, first: bool) -> list[Held]:
    """The optimizer step; returns the gradients alive after it (zero_grad's to free)."""
    if step.master_grads and (first or not step.grads_resident):
        # master.grad = p.grad.float(); p.grad = None, tensor by tensor in parameter order (backward
        # wrote them top-down). Resident gradients keep both, the fp32 ones created once.
        fp32: list[Held] = []
        for k, nbytes in zip(reversed(grads), reversed(step.master_grads), strict=False):
            fp32 += run.alloc((nbytes,))
            if not step.grads_resident:
                run.free([k])
        grads = fp32 if not step.grads_resident else grads + fp32
    if first:
        run.alloc(step.states)
    run.free(run.alloc(step.step_temporaries))
    return grads
