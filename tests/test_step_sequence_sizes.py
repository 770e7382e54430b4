"""A layer's transients replayed at their tensors' sizes (step_parts.sized, LayerActivations *_sizes).

Hand-derived on tiny shapes: the tensors each transient sum is made of, and an allocator sequence where
requests at their real sizes cut fewer segments than the same sum in equal parts.
"""

from __future__ import annotations

from typing import Any

from peakmem.formulas import activations as act
from peakmem.formulas.step_sequence import LayerTensors, StepTensors, replay_steps
from peakmem.hf import spec_from_config
from peakmem.step_parts import sized, split
from peakmem.training import AttentionKernel, Checkpointing, KernelPolicy, Precision, TrainingSetup
from peakmem.units import MiB

B, S = 2, 32
T = B * S  # 64 tokens
H, F, HEADS, KV, D = 64, 128, 4, 2, 16
LLAMA: dict[str, Any] = {
    "model_type": "llama", "num_hidden_layers": 2, "hidden_size": H, "num_attention_heads": HEADS,
    "num_key_value_heads": KV, "intermediate_size": F, "vocab_size": 1000, "max_position_embeddings": 128,
    "tie_word_embeddings": False,
}  # fmt: skip


def _layer(**kw: Any) -> tuple[act.LayerActivations, act.Shapes]:
    spec = spec_from_config(dict(LLAMA))
    setup = TrainingSetup(micro_batch=B, seq_len=S, precision=Precision.BF16, **kw)
    sh = act.shapes(spec, setup)
    return act.layer_activations(spec, spec.first_layer, sh), sh


def test_sized_uses_the_tensors_only_where_they_add_up() -> None:
    assert sized((3, 5), 8, 4) == (3, 5)
    assert sized((3, 0, 5), 8, 4) == (3, 5)  # allocate(0) is no request
    assert sized((3, 5), 9, 4) == split(9, 4) == (3, 3, 3)  # a sum the sizes do not make: cut
    assert sized((), 8, 4) == (4, 4)


def test_interior_and_gated_mlp_backward_at_their_sizes() -> None:
    """SDPA on CPU (no flash scratch), bf16: c = r = 2 bytes. The interior is the Linears' input
    (T x H) then gate, act(gate), up, product (T x F each); the MLP half's backward temporaries are the
    incoming T x H gradient, the down projection's input gradient and the product's two T x F gradients;
    the attention half's: the incoming gradient, o_proj's input gradient, dq, dk, dv."""
    la, _ = _layer(attention=AttentionKernel.SDPA, kernel_policy=KernelPolicy.CPU)
    tf, th = T * F * 2, T * H * 2
    assert la.interior_sizes == (th, tf, tf, tf, tf)
    assert sum(la.interior_sizes) == la.interior == 4 * 16_384 + 8_192
    mlp = (th, tf, tf, tf)
    att = (th, T * HEADS * D * 2, T * HEADS * D * 2, T * KV * D * 2, T * KV * D * 2)
    assert la.backward_sizes in (mlp, att)
    assert sum(la.backward_sizes) == la.backward_transient + la.backward_freed - la.backward_grads
    assert sum(mlp) == 57_344 and sum(att) == 32_768
    assert la.backward_sizes == mlp  # the larger stage


def test_op_sac_and_full_recompute_at_their_sizes() -> None:
    """Op-level SAC keeps the layer input and q, v, gate and down outputs (odd matmuls); its forward
    holds the interior, its recomputation rebuilds the eager saved tensors less those. Full
    checkpointing rebuilds all of them (an RMSNorm's fp32 input copy is not the bf16 layer input)."""
    la, sh = _layer(attention=AttentionKernel.SDPA, kernel_policy=KernelPolicy.CPU)
    spec = spec_from_config(dict(LLAMA))
    kept = act.op_saved(spec, spec.first_layer, sh, la)
    op = act.op_checkpointed(la, kept)
    assert op.forward_sizes == la.interior_sizes and sum(op.forward_sizes) == op.forward_transient
    assert sum(op.recompute_sizes) == op.recompute
    q, v, gate, down = T * HEADS * D * 2, T * KV * D * 2, T * F * 2, T * H * 2
    assert [i.bytes for i in kept] == [T * H * 2, q, v, gate, down]
    assert len(op.recompute_sizes) == len(act.tensor_sizes(la.saved)) - 4  # one of each kept output's size
    full = act.checkpointed(la, Checkpointing.FULL)
    assert full.recompute_sizes == act.tensor_sizes(la.saved) and la.input_saved == 0
    assert sum(full.forward_sizes) == full.forward_transient == la.interior


def test_real_sizes_cut_fewer_segments_than_equal_parts() -> None:
    """Two layers, each saving one 224 MiB tensor after a forward whose momentary tensors are a 64 MiB
    input and three 224 MiB ones (736 MiB). At their sizes: layer 1 cuts 64 + 3 x 224 MiB segments and
    saves into one of its freed 224 MiB blocks; layer 2 finds the 64 and two 224 MiB blocks free and
    cuts one more 224 MiB segment: 64 + 4 x 224 = 960 MiB. In equal parts (4 x 184 MiB) no freed
    block holds a 224 MiB saved tensor: 4 x 184 + 2 x 224 = 1184 MiB. Step 2 reuses every block."""

    def reserved(extra: tuple[int, ...]) -> int:
        layer = LayerTensors(count=2, saved=(224 * MiB,), forward_extra=extra)
        return replay_steps(StepTensors(weights=(), layers=(layer,))).reserved

    real = (64 * MiB, 224 * MiB, 224 * MiB, 224 * MiB)
    assert reserved(sized(real, 736 * MiB, 224 * MiB)) == (64 + 4 * 224) * MiB
    assert reserved(split(736 * MiB, 224 * MiB)) == (4 * 184 + 2 * 224) * MiB


def test_float8_casts_at_their_sizes() -> None:
    """An eager float8 cast of n elements holds its fp32 scaled copy, the clamped copy and the float8
    result (4n, 4n, n). A converted Linear of 64 tokens, 128 in, 64 out: its forward's largest instant is
    the input's float8 copy (64 x 128 B) beside the weight's cast (9 B x 64 x 128 = 73,728 B: 81,920 in
    all, against the input's own cast, 73,728); with the weight arriving as float8 it is the input's cast."""
    from peakmem.formulas.activations import float8 as f8

    assert f8.cast_sizes(10) == (40, 40, 10)
    mk = 64 * 128
    assert f8.linear_forward_sizes(64, 128, 64, 2) == (mk, 4 * mk, 4 * mk, mk)
    assert f8.linear_forward_sizes(64, 128, 64, 2, weight_fp8=True) == (4 * mk, 4 * mk, mk)
    for recipe in f8.RECIPES.values():
        sizes = f8.linear_backward_sizes(64, 128, 64, 2, recipe)
        assert sum(sizes) == f8.linear_backward_peak(64, 128, 64, 2, recipe)


def test_float8_layer_sizes_eager_only() -> None:
    """Eager float8 Linears: the layer's forward, interior and backward temporaries at their sizes add up
    to their sums. Under torch.compile the casts fuse (not modelled): the float8 interior keeps no sizes
    (a stage of the layer's own, without casts, keeps its)."""
    from peakmem.formulas.activations import float8 as f8

    spec = spec_from_config(dict(LLAMA))
    for compiled, expect in ((False, True), (True, False)):
        setup = TrainingSetup(
            micro_batch=B, seq_len=S, precision=Precision.FLOAT8_TENSORWISE, compiled=compiled
        )
        sh = act.shapes(spec, setup)
        la = act.layer_activations(spec, spec.first_layer, sh)
        recipe = f8.recipe_of(setup.precision)
        assert recipe is not None
        f = f8.float8_layer(spec, spec.first_layer, sh, la, recipe, recomputed=True)
        assert f.interior > la.interior  # the output projection's casts beside its input
        assert (sum(f.interior_sizes) == f.interior) is expect
        if expect:
            assert sum(f.backward_sizes) == f.backward_transient + f.backward_freed - f.backward_grads
            assert sum(f.forward_sizes) == f.forward_transient


def test_tp_rank_splits_each_tensor_as_its_sum() -> None:
    """tp 2 + SP: each transient tensor is split as its sum is (T x F / 2 for the gated MLP's), the
    interior's T x H norm output stays whole (SP all-gathers it); under full checkpointing the end of
    the recomputation (the output projection's collective) is listed tensor by tensor as well."""
    from peakmem.formulas import model_parallel as mp
    from peakmem.parallel import Parallelism

    la, _ = _layer(attention=AttentionKernel.SDPA, kernel_policy=KernelPolicy.CPU)
    par = Parallelism(gpus=2, tp=2, sequence_parallel=True)
    th, tf = T * H * 2, T * F * 2
    tp = mp.tp_layer_activations(la, par, 0, linear_input=th)
    assert (
        tp.interior_sizes == (th, tf // 2, tf // 2, tf // 2, tf // 2)
        and sum(tp.interior_sizes) == tp.interior
    )
    assert tp.backward_sizes == tuple(x // 2 for x in la.backward_sizes)
    assert sum(tp.backward_sizes) == tp.backward_transient + tp.backward_freed - tp.backward_grads
    full = act.checkpointed(tp, Checkpointing.FULL)
    hidden = th // 2  # the rank's sequence shard
    tail = mp.dtensor_recompute_tail(full, par, hidden, th, hidden, 2 * hidden)
    assert tail.backward_transient > full.backward_transient  # the collective's instant is the larger
    # grad_in, its all-gathered copy, the residual stream and the norm output's shard, the partial sum,
    # the collective's output and SP's whole chunked copy
    assert tail.backward_sizes == (hidden, th, hidden, hidden, th, hidden, th)
    assert sum(tail.backward_sizes) == tail.backward_transient
