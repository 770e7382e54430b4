"""Context parallelism's ring buffers (peakmem.formulas.model_parallel.cp_ring), hand-derived on the tiny
Llama of test_parallel: 8 heads of 8 (4 k/v heads), bf16 compute (c = 2 bytes), 256 tokens on each rank.

Per rank: the K+V chunk ``kv = 256 x 4 x (8 + 8) x 2 = 32,768`` B; query and output ``q = o = 256 x 8 x 8 x 2
= 32,768`` B; fp32 is twice the compute dtype (``f = 2``)."""

from __future__ import annotations

import pytest

from peakmem.errors import InputError
from peakmem.formulas import activations as act
from peakmem.formulas import model_parallel as mp
from peakmem.parallel import CpRotate, FsdpMode, Parallelism
from test_parallel import tiny

C = 2
T_LOCAL = 256
KV = T_LOCAL * 4 * (8 + 8) * C
Q = OUT = T_LOCAL * 8 * 8 * C
LSE = T_LOCAL * 8 * 4  # fp32 logsumexp


def _ring(par: Parallelism) -> mp.CpRing:
    return mp.cp_ring(tiny().groups[0].layer, T_LOCAL, C, par)


def test_chunk_by_hand() -> None:
    assert KV == Q == 32_768
    assert mp.ring_kv_chunk_bytes(tiny().groups[0].layer, T_LOCAL, C, Parallelism(gpus=4, cp=4)) == KV


def test_torch_allgather_grows_with_cp() -> None:
    """torch's all-gather rotate keeps every rank's K/V (cp x kv) for the whole ring. Forward: the larger
    of the first step (the K/V contiguous copies and the cat sent, 2 kv, and the merger's fp32 copy of the
    block output, 2 o) and a load-balanced merge step (fp32 merger out 2 o, the half block o / 2, its
    fp32 copy o, out - block_out o, one more fp32 2 o, two logsumexps of 256 x 8 x 4 = 8,192, less the
    kernel's own o and logsumexp: 5.5 o + lse); here the merge step. Backward: the contiguous copies
    (kv), two K/V cats (2 kv; one at cp 2, whose last and only rotation is the first),
    the fp32 dQ/dK/dV accumulators (2 x (q + kv)) and the fp32 dK/dV cat and all-to-all buffer
    (2 x 2 x kv). The output copy before o_proj is saved (o)."""
    for cp in (2, 4, 8):
        ring = _ring(Parallelism(gpus=cp, cp=cp, cp_rotate=CpRotate.ALLGATHER))
        assert ring.forward == max(cp * KV + 2 * KV + 2 * OUT, cp * KV + 5 * OUT + OUT // 2 + LSE)
        assert ring.forward == cp * KV + 5 * OUT + OUT // 2 + LSE
        assert ring.backward == cp * KV + (1 + min(2, cp - 1)) * KV + 2 * (Q + KV) + 2 * 2 * KV
        assert ring.saved == OUT
    at4 = _ring(Parallelism(gpus=4, cp=4, cp_rotate=CpRotate.ALLGATHER))
    assert (at4.forward, at4.backward) == (319_488, 491_520)


def test_torch_alltoall_holds_one_chunk() -> None:
    ring = _ring(Parallelism(gpus=8, cp=8, cp_rotate=CpRotate.ALLTOALL))
    assert (ring.forward, ring.saved) == (KV + 2 * KV, OUT)
    assert ring.backward == KV + 3 * KV + 2 * (Q + 3 * KV)
    assert (ring.forward, ring.backward) == (98_304, 393_216)


def test_megatron_p2p_ring_unchanged() -> None:
    """Megatron/TE: 2 K/V chunks in flight in forward; 2 more (fp32 dK/dV) in backward; nothing saved."""
    ring = _ring(Parallelism(gpus=8, cp=8, zero_stage=1))
    assert (ring.forward, ring.backward, ring.saved) == (2 * KV, 4 * KV, 0)


def test_tp_splits_heads() -> None:
    """TP 2: 2 k/v heads and 4 query heads per rank, so kv = q = o = 16,384 and the logsumexp 4,096; the
    forward's merge step (4 kv + 5.5 o + lse) is larger than its first step (6 kv + 2 o)."""
    ring = _ring(Parallelism(gpus=8, tp=2, cp=4, cp_rotate=CpRotate.ALLGATHER))
    kv = q = 16_384
    assert (
        (ring.forward, ring.backward, ring.saved)
        == (4 * kv + 5 * q + q // 2 + 4096, 7 * kv + 2 * (q + 3 * kv), q)
        == (159_744, 245_760, q)
    )


def test_auto_is_torch_under_fsdp2_else_p2p() -> None:
    assert Parallelism(gpus=8, cp=2, fsdp=FsdpMode.FULL_SHARD).cp_ring is CpRotate.ALLGATHER
    assert Parallelism(gpus=8, cp=2, fsdp=FsdpMode.FULL_SHARD, fsdp_version=1).cp_ring is CpRotate.P2P
    assert Parallelism(gpus=8, cp=2, zero_stage=3).cp_ring is CpRotate.P2P
    assert Parallelism(gpus=2, cp=2).cp_ring is CpRotate.P2P
    assert Parallelism(gpus=2, cp=2, cp_rotate="alltoall").cp_ring is CpRotate.ALLTOALL
    assert _ring(Parallelism(gpus=1)) == mp.CpRing(forward=0, backward=0)


def test_bad_rotate_is_refused() -> None:
    with pytest.raises(InputError, match="cp_rotate"):
        Parallelism(gpus=2, cp=2, cp_rotate="ring")


def test_layer_carries_the_ring() -> None:
    """tp_layer_activations adds the ring's transients and the saved output copy (key attn.cp_out_copy)."""
    la = act.LayerActivations(saved=(), core=0, layer_input=0, forward_transient=100, backward_transient=200)
    ring = mp.CpRing(forward=10, backward=20, saved=30)
    out = mp.tp_layer_activations(la, Parallelism(gpus=2, cp=2), ring)
    assert (out.forward_transient, out.backward_transient, out.saved_bytes) == (110, 220, 30)
    assert [i.key for i in out.saved] == ["attn.cp_out_copy"]
    p2p = mp.tp_layer_activations(la, Parallelism(gpus=2, cp=2), 7)  # an int: the p2p ring's chunk
    assert (p2p.forward_transient, p2p.backward_transient, p2p.saved_bytes) == (114, 228, 0)
