"""Batches padded to their longest sample: the lengths the reserved replay walks (``--padded-lengths``).

Loops without packing pad each batch to its longest sample (transformers ``DataCollatorWithPadding`` /
``DataCollatorForSeq2Seq`` with ``padding=True``; torchtune@ff594c231 ``utils/collate.py`` ``padded_collate``,
"Pad a batch of sequences to the longest sequence length in the batch", the collate_fn of
``recipes/lora_finetune_single_device.py``; TRL's SFTTrainer without packing), so every tensor whose size
follows the sequence changes size from step to step. PyTorch's caching allocator returns no segment to the
driver unless ``empty_cache()`` is called (c10/cuda/CUDACachingAllocator.cpp ``release_cached_blocks`` runs
only when ``cudaMalloc`` fails), so ``max_memory_reserved`` grows above a fixed-length step's: a longer batch
finds the cached blocks split at the shorter ones' sizes and cuts new segments.

The estimate replays its step at the lengths :func:`lengths` gives through ONE allocator model
(formulas/step_sequence.py ``replay_lengths``), each one micro-batch, and adds what that reserves above its
fixed-length two-step replay; the allocated peak stays the fixed step's (the longest batch).

Which lengths, in which order - measured with benchmarks/torchtune_lora_trace.py (torchtune@ff594c231's own
7B LoRA step, q/v r=8, batch 2, on the meta device through the same allocator model; 512 tokens fixed:
14.51 GB reserved after 3 micro-batches):

* what grows reserved is a batch longer than those before it: 512 x k/8 in ascending order (k = 1..8)
  reaches 15.75 GB in 8 micro-batches; the same eight lengths starting with the longest (8, 3, 6, 1, 7, 4,
  2, 5; 8, 1, 7, 2, ...; 8, 4, 6, 2, ...; descending) stay at 14.56 GB, also when repeated: the longest
  batch's blocks are split for every shorter one and merge back;
* random lengths (each sample drawn, the batch padded to its longest, capped at 512) reach 15.88 GB after
  100 micro-batches and no more after 200 (lognormal, median 164 tokens, sigma 0.55), 15.65 GB after 100
  (uniform 16-512): the longest batch arrives after shorter ones, whose running maximum rises step by step;
* the ramp's step count decides its growth: 4 rising lengths reach 15.04 GB, 8 15.75 GB (the same 8 twice:
  15.76 GB), 16 17.07 GB. :data:`RAMP_STEPS` = 8 is the one whose figure lies between the two random
  orders' (a choice on this trace, a CPU replay: no published figure was read for it). With all
  projections at r=64 the 8-step ramp reads 16.41 GB against 15.17 GB fixed.

So the replay walks :data:`RAMP_STEPS` lengths rising to ``seq`` (the record lengths a random order meets
on its way to its longest batch), then ``seq`` again (a steady step of the longest batch). It models a
typical order, not a bound: a loop's own order and length distribution decide its reserved (the figures
above span 14.56-17.07 GB for one job).

The growth is cache, not a need: when ``cudaMalloc`` fails, the allocator frees cached segments and retries
before it raises (c10/cuda/CUDACachingAllocator.cpp ``malloc``: ``release_available_cached_blocks``, a no-op
without ``max_split_size_mb``, then ``release_cached_blocks``, every cached segment no block of which is in
use, then ``alloc_block`` again; the same order in the 2.x sources read). The segments shorter batches cut
hold nothing by then (taken so: a gradient or optimizer state placed in one of them would keep it, which the
replay does not follow), so a card smaller than the replay's reserved still runs the job: what it must hold is
the fixed-length step's (:data:`RELEASE`; ``Estimate.needed_bytes``, which every verdict reads). The growth is
what ``max_memory_reserved`` shows on a card with room.

A loop that runs its longest sample first (:attr:`Profile.longest_first`: Lit-GPT 2023's ``get_batch(...,
longest_seq_ix if iter_num == 0 else None)``) is replayed as the trace's longest-first orders: ``seq``, then
the ramp. Its longest batch meets nothing an earlier micro-batch left alive (:func:`first_is_longest`; what
a later long batch would meet after another is the estimate's ``loop_order`` band term).
"""

from __future__ import annotations

from peakmem.training import PaddedLengths, TrainingSetup

from .profiles import PROFILES

SRC = (
    "batches padded to their longest sample (transformers DataCollatorWithPadding, torchtune@ff594c231 "
    "utils/collate.py padded_collate): the caching allocator keeps the segments each length cuts "
    "(no empty_cache); formulas/padded_lengths.py"
)
# the ramp's steps: seq x k / RAMP_STEPS for k = 1 .. RAMP_STEPS (torchtune's 7B LoRA step, see the module
# doc: 8 rising lengths reach 15.75 GB, between random orders' 15.65 and 15.88 GB; 4: 15.04, 16: 17.07)
RAMP_STEPS = 8


def first_is_longest(setup: TrainingSetup) -> bool:
    """Whether the longest batch (``--seq``) is the loop's first micro-batch: varying lengths under a loop
    that runs its longest sample first (:attr:`Profile.longest_first`)."""
    return setup.padded_lengths is PaddedLengths.VARYING and PROFILES[setup.framework].longest_first


def lengths(seq: int, *, longest_first: bool = False) -> tuple[int, ...]:
    """The sequence lengths of the replayed micro-batches, in order: ``seq x k / RAMP_STEPS`` rising
    (each at least 1 token, repeats dropped), then ``seq`` once more; ``seq`` first as well where the loop
    runs its longest sample first."""
    ramp: list[int] = []
    for k in range(1, RAMP_STEPS + 1):
        n = max(1, seq * k // RAMP_STEPS)
        if not ramp or n != ramp[-1]:
            ramp.append(n)
    return (seq, *ramp, seq) if longest_first else (*ramp, seq)


RELEASE = (
    "the caching allocator frees cached segments and retries before an out-of-memory error "
    "(c10/cuda/CUDACachingAllocator.cpp malloc: release_available_cached_blocks, release_cached_blocks)"
)
NOT_REPLAYED = (
    "padded lengths varying: not replayed for this setup (the replay describes one GPU, or one FSDP rank, "
    "with a torch optimizer and the default allocator); reserved is the fixed-length step's"
)


LONGEST_FIRST_NOTE = (
    "padded lengths varying with the longest sample first (Lit-GPT 2023 get_batch at iter 0): nothing an "
    "earlier micro-batch left is alive at the --seq batch (a later long batch after another long one: the "
    "band's loop_order term)"
)


def note(growth: int, shown: str, longest_first: bool = False) -> str:
    """The assumption line of a varying-length estimate (``shown``: the growth in the face's units)."""
    at = (
        f"--seq, then {RAMP_STEPS} lengths rising to --seq"
        if longest_first
        else f"{RAMP_STEPS} lengths rising to --seq"
    )
    return (
        f"padded lengths varying: the step replayed at {at}, then --seq again, through one allocator state; "
        f"reserved {shown} above the fixed-length replay ({SRC}); a card needs only the fixed step's: "
        f"{RELEASE}"
        if growth
        else f"padded lengths varying: the replay at {at} reserves nothing above the fixed-length step "
        f"({SRC})"
    )
