"""The terms FSDP2 under mixed-bf16 (MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)) needed to
agree with the parallel oracle (peakmem.measure.parallel; tests/test_parallel_oracle_torch.py), each
by hand on a tiny Llama: the pre-norm block's second RMSNorm backward (fp32 temporaries, whole under TP
without SP), the end of a layer's forward (the 16-bit residual stream no norm saves), and when FSDP's
gradients are new bytes (sharded gradients never stay as written; under PP bf16 gradients are added into
the fp32 accumulated ones only at a unit's post-backward). No torch; well under a second."""

from __future__ import annotations

from typing import Any

from peakmem.dtypes import BF16, FP32
from peakmem.formulas import activations as act
from peakmem.formulas import fsdp2
from peakmem.formulas import model_parallel as mp
from peakmem.formulas.activations.norms import RMSNORM_BACKWARD_FP32
from peakmem.formulas.technique import technique
from peakmem.hf import spec_from_config
from peakmem.model import ModelSpec
from peakmem.parallel import FsdpMode, Parallelism
from peakmem.training import KernelPolicy, Precision, ReduceDtype, TrainingSetup

# peakmem.measure.parallel.TINY_LLAMA with a narrow MLP (64) and a 64-token vocabulary (the oracle test's
# ATTENTION_HEAVY): hidden 128, 2 layers, 4 heads of 32, 2 KV heads
NARROW: dict[str, Any] = {
    "model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 64, "hidden_size": 128,
    "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "max_position_embeddings": 256, "bos_token_id": 0, "eos_token_id": 0,
}  # fmt: skip
T, H, W = 2 * 64, 128, 64  # tokens (micro-batch 2 x seq 64), hidden, MLP width


def _setup(precision: Precision) -> TrainingSetup:
    return TrainingSetup(
        precision=precision, micro_batch=2, seq_len=64, kernel_policy=KernelPolicy.CPU,
        fsdp_reduce_dtype=ReduceDtype.FP32,  # torchtitan's policy, which the oracle runs
    )  # fmt: skip


def _layer(precision: Precision) -> tuple[ModelSpec, act.Shapes, act.LayerActivations]:
    spec = spec_from_config(NARROW, name="narrow")
    sh = act.shapes(spec, _setup(precision))
    grads = 3 * H * W * 2  # the MLP's bf16 gradients alone (gate, up, down); the attention's do not matter
    layer = spec.groups[0].layer
    mlp = sum(t.numel for t in layer.tensors if t.component == "mlp")
    return spec, sh, act.layer_activations(spec, layer, sh, grads * layer.params // mlp)


def test_second_rmsnorm_backward_by_hand() -> None:
    """mixed-bf16 (bf16 residual stream): at the post-attention RMSNorm's backward the oracle holds 5 fp32
    T x h temporaries (``mul`` x3, ``div``, ``pow``) and the bf16 residual gradient, with the MLP's bf16
    weight gradients written; the MLP's saved tensors (gate, act, up, product: 4 x T x W bf16), its
    input (the norm output) and the norm's bf16 weight-side y are freed by then."""
    _, sh, la = _layer(Precision.MIXED_BF16)
    assert (sh.c, sh.r) == (2, 2)
    ns = la.norm_stage
    assert RMSNORM_BACKWARD_FP32 == 5
    assert ns.hidden_temporaries == 5 * T * H * 4 + T * H * 2 == 360_448
    assert ns.hidden_freed == T * H * 2 + T * H * 2 == 65_536
    assert ns.other_freed == 4 * T * W * 2 == 65_536
    assert ns.grads == 3 * H * W * 2 == 49_152
    net = 360_448 + 49_152 - 65_536 - 65_536
    assert ns.stage() == (net, 131_072, 49_152)
    assert la.backward_transient == net  # above the MLP half's and the attention core's stages
    # TP2 without SP: the norm is replicated, its T x h tensors whole; the MLP's split
    assert ns.stage(2) == (360_448 + 24_576 - 65_536 - 32_768, 65_536 + 32_768, 24_576)
    tp = mp.tp_layer_activations(la, Parallelism(gpus=2, tp=2), 0)
    assert (tp.backward_transient, tp.backward_freed, tp.backward_grads) == ns.stage(2)
    # with SP every tensor of the stage is the rank's sequence shard
    assert ns.stage(2, sequence_parallel=True) == (180_224 + 24_576 - 32_768 - 32_768, 65_536, 24_576)


def test_layer_end_in_forward_by_hand() -> None:
    """The last residual add of a layer: the MLP's output and the new hidden states next to the layer's
    saved tensors; on a 16-bit residual stream (the norms save an fp32 copy) also the layer's input and
    the attention half's residual sum. fp32: the norms save the stream itself, so only the first two."""
    spec, sh, la = _layer(Precision.MIXED_BF16)
    assert act.input_saved_by_layer(spec, sh) == 0
    assert act.layer_end_forward(spec, sh) == (T * H * 2,) * 4
    assert la.forward_transient == 4 * T * H * 2 == 131_072 and la.forward_core == 0  # SDPA: no QK^T
    spec32, sh32, la32 = _layer(Precision.FP32)
    assert act.layer_end_forward(spec32, sh32) == (T * H * 4,) * 2
    assert la32.forward_transient == 2 * T * H * 4 == 131_072


def test_fsdp_gradients_are_new_bytes_by_hand() -> None:
    """An FSDP rank's layer gradients never stay as written, even where its shard has their bytes
    (mixed-bf16 over 2 ranks: fp32 / 2 = bf16); under PP, FSDP2 adds a new gradient into the accumulated
    one in place only when both have one dtype (fp32), and under mixed-bf16 holds the root's bf16
    gradients as written until its post-backward, as without PP."""
    spec = spec_from_config(NARROW, name="narrow")
    fsdp2x, tp2 = Parallelism(gpus=2, fsdp=FsdpMode.FULL_SHARD), Parallelism(gpus=2, tp=2)
    assert fsdp2.shards_written_grads(fsdp2x) and not fsdp2.shards_written_grads(tp2)
    pp = Parallelism(gpus=4, pp=2, fsdp=FsdpMode.FULL_SHARD)
    bf16, fp32 = technique(spec, _setup(Precision.MIXED_BF16)), technique(spec, _setup(Precision.FP32))
    assert fsdp2.accumulates_unsharded(bf16, pp) and fsdp2.accumulates_unsharded(fp32, pp)
    f32 = fsdp2.reduce_dt(bf16, _setup(Precision.MIXED_BF16))
    assert f32 is FP32 and fsdp2.reduce_dt(fp32, _setup(Precision.FP32)) is FP32
    assert fsdp2.accumulates_in_place(fp32, pp, False, FP32) and not fsdp2.accumulates_in_place(
        bf16, pp, False, f32
    )
    assert fsdp2.root_grads_whole(bf16, pp, False, f32) and not fsdp2.root_grads_whole(fp32, pp, False, FP32)
    assert fsdp2.root_grads_whole(fp32, fsdp2x, False, FP32) and not fsdp2.root_grads_whole(
        fp32, tp2, False, FP32
    )
    # accelerate's policy (reduce_dtype = param_dtype): the bf16 gradients are the accumulator
    assert fsdp2.accumulates_in_place(bf16, pp, False, BF16) and not fsdp2.root_grads_whole(
        bf16, pp, False, BF16
    )
