"""Parallelism: degrees, derived values, validation errors that name every number."""

from __future__ import annotations

import pytest

from peakmem.errors import InputError
from peakmem.hf import spec_from_config
from peakmem.model import ModelSpec
from peakmem.parallel import FsdpMode, Offload, Parallelism, PipelineSchedule, validate_for

# 4 layers, hidden 64, 8 heads (4 KV heads), SwiGLU 128, vocab 1000: 276,032 parameters
TINY_CONFIG: dict[str, object] = dict(
    model_type="llama",
    architectures=["LlamaForCausalLM"],
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=4,
    num_attention_heads=8,
    num_key_value_heads=4,
    vocab_size=1000,
    max_position_embeddings=256,
    tie_word_embeddings=False,
    rms_norm_eps=1e-5,
    hidden_act="silu",
)


def tiny(**over: object) -> ModelSpec:
    """:data:`TINY_CONFIG` with ``over`` applied."""
    return spec_from_config({**TINY_CONFIG, **over}, name="tiny")


def test_tiny_param_count_by_hand() -> None:
    # embed 1000*64 + 4 * (q 4096 + k 2048 + v 2048 + o 4096 + 3 * 8192 + 2 norms * 64) + norm 64 + head 64000
    assert tiny().params == 64_000 + 4 * 36_992 + 64 + 64_000 == 276_032


def test_dp_derived_from_gpus() -> None:
    par = Parallelism(gpus=64, tp=8, pp=2)
    assert par.dp == 4
    assert par.nodes == 8 and par.ranks_per_node == 8
    assert Parallelism().dp == 1 and Parallelism().engine == "none"
    assert Parallelism(gpus=8).engine == "ddp"


def test_world_size_mismatch_names_every_factor() -> None:
    with pytest.raises(InputError) as e:
        Parallelism(gpus=64, dp=2, tp=8, pp=2)
    assert str(e.value) == "dp*tp*pp*cp = 2*8*2*1 = 32 != gpus=64"


def test_gpus_not_divisible_by_model_parallel() -> None:
    with pytest.raises(InputError, match=r"gpus=12 is not divisible by tp\*pp\*cp = 8\*1\*1 = 8"):
        Parallelism(gpus=12, tp=8)


def test_zero_and_fsdp_exclusive() -> None:
    with pytest.raises(InputError, match="zero=3 and fsdp='full-shard' are exclusive"):
        Parallelism(gpus=8, zero_stage=3, fsdp=FsdpMode.FULL_SHARD)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(zero_stage=4), "zero=4"),
        (dict(tp=0), "tp=0"),
        (dict(sequence_parallel=True), "sequence_parallel=True needs tp > 1"),
        (dict(pp_schedule=PipelineSchedule.INTERLEAVED, virtual_stages=2), "pp=1"),
        (dict(virtual_stages=2), "virtual_stages=2"),
        (dict(offload_params=Offload.CPU, zero_stage=2), "offload_params='cpu'"),
        (dict(offload_optimizer=Offload.CPU), "offload_optimizer='cpu'"),
        (dict(fsdp=FsdpMode.FULL_SHARD, offload_optimizer=Offload.NVME), "offload=nvme"),
        (dict(ep=3), "ep=3 does not divide dp*cp = 8*1 = 8"),
        (dict(fsdp_version=3, fsdp=FsdpMode.FULL_SHARD), "fsdp_version=3"),
    ],
)
def test_bad_combinations(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(InputError, match=message.replace("*", r"\*").replace("(", r"\(")):
        Parallelism(gpus=8, **kwargs)  # type: ignore[arg-type]


def test_tp_must_divide_heads() -> None:
    with pytest.raises(InputError, match="tp=3 does not divide num_attention_heads=8"):
        validate_for(tiny(), Parallelism(gpus=3, tp=3))


def test_tp_must_divide_kv_heads() -> None:
    with pytest.raises(InputError, match="tp=8 does not divide num_key_value_heads=4"):
        validate_for(tiny(), Parallelism(gpus=8, tp=8))


def test_pp_larger_than_layers() -> None:
    with pytest.raises(InputError, match="pp=8 is larger than num_hidden_layers=4"):
        validate_for(tiny(), Parallelism(gpus=8, pp=8))


def test_interleaved_chunks_need_layers() -> None:
    par = Parallelism(gpus=4, pp=4, pp_schedule=PipelineSchedule.INTERLEAVED, virtual_stages=2)
    with pytest.raises(InputError, match=r"pp\*virtual_stages = 4\*2 = 8 > num_hidden_layers=4"):
        validate_for(tiny(), par)


def test_ep_needs_experts_that_divide() -> None:
    with pytest.raises(InputError, match="ep=2 needs a mixture-of-experts model"):
        validate_for(tiny(), Parallelism(gpus=2, ep=2))
    moe = tiny(
        model_type="mixtral", architectures=["MixtralForCausalLM"], num_local_experts=6, num_experts_per_tok=2
    )
    with pytest.raises(InputError, match="ep=4 does not divide num_experts=6"):
        validate_for(moe, Parallelism(gpus=4, ep=4))
    validate_for(moe, Parallelism(gpus=4, ep=2))


def test_shard_degrees() -> None:
    assert Parallelism(gpus=8).shard_degree == 1  # DDP replicates
    assert Parallelism(gpus=64, tp=8, pp=2, zero_stage=1).shard_degree == 4
    assert Parallelism(gpus=16, cp=2, zero_stage=3).shard_degree == 16  # dp * cp
    hybrid = Parallelism(gpus=32, fsdp=FsdpMode.HYBRID_SHARD)
    assert hybrid.shard_degree == 8  # one node
    assert Parallelism(gpus=16, ep=4, zero_stage=2).expert_shard_degree == 4


def test_describe() -> None:
    par = Parallelism(gpus=64, tp=8, pp=2, zero_stage=1, sequence_parallel=True)
    assert par.describe() == "64 GPUs, dp=4, tp=8, pp=2, sp, zero-1, 1f1b"


# --- types and physical limits (peakmem.validate) ---------------------------------------------------------
@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"gpus": True}, "gpus=True: must be an integer, not bool"),  # bool is an int subclass
        ({"gpus": 4, "pp": 2.0}, "pp=2.0: must be an integer, not float"),
        ({"gpus": 1_000_001}, "gpus=1000001: too large"),
        ({"gpus": 8, "virtual_stages": False}, "virtual_stages=False: must be an integer"),
    ],
)
def test_degrees_are_integers_within_any_cluster(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(InputError, match=match):
        Parallelism(**kwargs)  # type: ignore[arg-type]


def test_a_million_gpus_is_the_largest_layout() -> None:
    par = Parallelism(gpus=10**6, tp=8, pp=5, zero_stage=3)
    assert par.dp == 25_000  # 10^6 / (8 x 5)


def test_torch_pipeline_receive_buffers_by_hand() -> None:
    """torch.distributed.pipelining: one receive buffer per micro-batch and direction (stage.py)."""
    from peakmem.formulas import model_parallel as mp

    two, three = Parallelism(gpus=2, pp=2), Parallelism(gpus=3, pp=3)
    assert mp.torch_pipeline_buffers(two, 0, 4, 100) == 4 * 100  # first stage: output gradients only
    assert mp.torch_pipeline_buffers(two, 1, 4, 100) == 4 * 100  # last stage: activations only
    assert mp.torch_pipeline_buffers(three, 1, 4, 100) == 2 * 4 * 100  # middle: both
    assert mp.torch_pipeline_buffers(Parallelism(), 0, 4, 100) == 0


def test_dtensor_tp_terms_by_hand() -> None:
    """DTensor TP: one more copy of a row-parallel output inside a layer (the collective's output; its
    sequence shard under SP), none for the embedding; the vocab-parallel embedding's gradient whole
    without FSDP (tiny: 1000 x 64 fp32 = 256,000 bytes, of which tp=2 counts half)."""
    from peakmem.formulas import model_parallel as mp

    tp = Parallelism(gpus=2, tp=2)
    assert mp.dtensor_rowwise_copy(tp, 100) == 100
    assert mp.dtensor_rowwise_copy(Parallelism(gpus=2, tp=2, sequence_parallel=True), 50) == 50
    assert mp.dtensor_rowwise_copy(Parallelism(gpus=2, tp=2, zero_stage=1), 100) == 0

    def fp32(n: int) -> int:
        return 4 * n

    assert mp.dtensor_embedding_grad_extra(tiny(), tp, True, fp32, False) == 4 * 64_000 - 4 * 32_000
    assert mp.dtensor_embedding_grad_extra(tiny(), tp, False, fp32, False) == 0  # not the first stage
    fsdp = Parallelism(gpus=4, tp=2, fsdp=FsdpMode.FULL_SHARD)
    assert mp.dtensor_embedding_grad_extra(tiny(), fsdp, True, fp32, False) == 0  # FSDP2 shards it


def test_loss_parallel_head_by_hand() -> None:
    """torch's vocab-parallel loss on tp=4, T=10 tokens, V=1000, bf16 logits: each rank's fp32 T x V/4 is
    10 x 250 x 4 = 10,000 bytes; forward holds the bf16 logits (5,000), their fp32 copy (10,000) and
    ``shifted`` (10,000) next to the saved output; backward ``zeros_like``, ``exp`` and their sum
    (30,000), where the fused kernels hold 2 fp32 tensors (20,000). Under DeepSpeed (no DTensor TP) and
    for a loss without a log-softmax output the extra is 0."""
    from peakmem.breakdown import Category, MemoryItem
    from peakmem.formulas import model_parallel as mp
    from peakmem.formulas.loss import HeadActivations

    t, v = 10, 1000
    saved = (
        MemoryItem("loss.log_softmax output (fp32)", Category.ACTIVATIONS, t * v * 4, "", "loss.log_softmax"),
    )
    head = HeadActivations(
        saved=saved,
        forward_transient=t * v * 2 + t * v * 4,
        backward_transient=2 * t * v * 4,
        logits_grad=t * v * 2,
    )
    tp4 = Parallelism(gpus=4, tp=4)
    assert mp.loss_parallel_extra(head, tp4) == 10_000
    local = mp.tp_head_activations(head, tp4)
    assert local.forward_transient == 5_000 + 10_000 + 10_000
    assert local.backward_transient == 30_000
    assert local.saved[0].bytes == 10_000
    assert mp.loss_parallel_extra(head, Parallelism(gpus=4, tp=4, zero_stage=1)) == 0
    fused = HeadActivations(saved=(), forward_transient=0, backward_transient=0, logits_grad=0)
    assert mp.loss_parallel_extra(fused, tp4) == 0


def test_sp_head_gather_and_input_grad_by_hand() -> None:
    """The head on a TP rank where whole T x H tensors meet the vocab-sharded ones (formulas/
    model_parallel.py sp_head_gather, tp_head_input_grad; measured with the oracle): T = 100 tokens,
    H = 8, V = 64, fp32, tp 4. Under SP the head-input gather holds the functional all-gather's buffer
    (T x H x 4 = 3,200 B) and the final norm's shard (800 B) beyond the saved gathered input; in backward
    the head's whole input gradient (3,200 B) sits next to the logits' gradient shard (T x V/4 x 4)."""
    from peakmem.breakdown import Category, MemoryItem
    from peakmem.formulas import model_parallel as mp
    from peakmem.formulas.loss import HeadActivations

    t, h, v = 100, 8, 64
    lm_in = MemoryItem("lm_head input", Category.ACTIVATIONS, t * h * 4, "", "head.lm_head_input")
    log_sm = MemoryItem(
        "loss.log_softmax output (fp32)", Category.ACTIVATIONS, t * v * 4, "", "loss.log_softmax"
    )
    logits = t * v * 4
    head = HeadActivations(saved=(lm_in, log_sm), forward_transient=logits, backward_transient=2 * logits,
                           logits_grad=logits)  # fmt: skip
    sp = Parallelism(gpus=4, tp=4, sequence_parallel=True)
    assert mp.sp_head_gather(head, sp) == 3_200 + 800
    assert mp.sp_head_gather(head, Parallelism(gpus=4, tp=4)) == 0  # no gather without SP
    assert mp.tp_head_input_grad(head, sp) == 6_400 + 3_200
    assert mp.tp_head_input_grad(head, Parallelism(gpus=4, tp=4, zero_stage=1)) == 0
    local = mp.tp_head_activations(head, sp)
    # forward: the kernels' T x V/4 logits (6,400) and loss_parallel's extra log-softmax copy (6,400)
    # against the gather's 4,000; backward: 2 x 6,400 + 6,400 against 9,600
    assert local.forward_transient == max(6_400 + 6_400, 4_000) == 12_800
    assert local.backward_transient == max(12_800 + 6_400, 9_600) == 19_200
    small = mp.tp_head_activations(HeadActivations(saved=(lm_in,), forward_transient=0, backward_transient=0,
                                                   logits_grad=t * v * 4), sp)  # fmt: skip
    assert small.forward_transient == 4_000 and small.backward_transient == 9_600  # the SP terms decide
