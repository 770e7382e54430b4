"""DeepSpeed ZeRO-3's working set and gradient-reduce copies (peakmem.formulas.zero3), by hand.

Tiny spec (tests/test_parallel.py ``tiny``, mixed-bf16: 16-bit weights and gradients of 2 bytes):
embed 64,000; 4 layers of q 4,096, k 2,048, v 2,048, o 4,096, gate/up/down 8,192 each and 2 norms of
64; final norm 64; head 64,000; 276,032 in all. With ``param_persistence_threshold=100`` the 9 norms
(576 elements) stay whole on every rank: 275,456 elements are partitioned and gathered.
"""

from __future__ import annotations

from peakmem.breakdown import Phase
from peakmem.dtypes import BF16
from peakmem.formulas import model_parallel as mp
from peakmem.formulas import sharding, zero3
from peakmem.formulas.technique import technique
from peakmem.hf import spec_from_config
from peakmem.parallel import Offload, Parallelism
from peakmem.ranks import estimate_ranks
from peakmem.training import Checkpointing, Precision, TrainingSetup
from test_parallel import tiny

SETUP = TrainingSetup(seq_len=8)
NON_PERSISTENT = 276_032 - 9 * 64
OFFLOAD = dict(offload_optimizer=Offload.CPU, offload_params=Offload.CPU)


def _states(**par: object) -> sharding.RankStates:
    p = Parallelism(zero_stage=3, param_persistence_threshold=100, **par)  # type: ignore[arg-type]
    return sharding.rank_states(technique(tiny(), SETUP), SETUP, p, mp.stage_params(tiny(), p, 0))


def _gathered(items: tuple[object, ...]) -> int:
    return sum(i.bytes for i in items if i.key == "zero3.gathered")  # type: ignore[attr-defined]


def test_the_prefetcher_fills_up_to_max_live_parameters() -> None:
    # every module call prefetches at least one whole tensor, a layer's run consumes one per tensor: the
    # gathered set reaches max_live_parameters plus the last tensor added (at most the largest, 64,000)
    st = _states(gpus=4, max_live_parameters=10_000, prefetch_bucket_size=1_000)
    assert _gathered(st.gathered_forward) == 2 * (10_000 + 64_000)
    # backward: the reuse-distance keep (5e8 elements: the whole tiny model) is larger
    assert _gathered(st.gathered_backward) == 2 * NON_PERSISTENT
    # capped at what is partitioned
    assert _gathered(_states(gpus=4).gathered_forward) == 2 * NON_PERSISTENT


def test_no_prefetch_leaves_the_running_module() -> None:
    # prefetch_bucket_size 0 (no prefetch) or max_live_parameters 0 (min(0 - n_available, ...) <= 0):
    # the running module's largest tensor only
    for par in (dict(prefetch_bucket_size=0, max_live_parameters=10_000), dict(max_live_parameters=0)):
        assert _gathered(_states(gpus=4, **par).gathered_forward) == 2 * 64_000


def test_one_rank_gathers_nothing() -> None:
    # DeepSpeed >= 0.9.0: num_partitions == 1 -> _no_gather_coalesced, param.data = ds_tensor.data.to(device):
    # the partition is the whole parameter, on the GPU
    st = _states(gpus=1)
    assert _gathered(st.gathered_forward) == _gathered(st.gathered_backward) == 0
    assert st.engine_band_high == 0  # nor an older engine's embedding on top
    # the parameters offloaded: the same .to(device) copies each one in, as a gather does
    assert _gathered(_states(gpus=1, **OFFLOAD).gathered_forward) == 2 * NON_PERSISTENT
    # the optimizer alone offloaded: after backward the embedding is its own partition; its gradient
    # (64,000, alone: above the 20,000 bucket, no cat on one rank), the bf16 copy and the fp64 norm
    st = _states(gpus=1, reduce_bucket_size=20_000, offload_optimizer=Offload.CPU)
    end = sum(i.bytes for i in st.step if i.key == "zero3.reduce_end")
    assert end == 2 * 64_000 + 64_000 * (2 + 8) == 768_000


def test_the_step_flattens_the_gradient_partition() -> None:
    # stage_1_and_2.py step / stage3.py _prepare_fp32_grad_for_sub_group: self.flatten(averaged_gradients)
    # concatenates the partition's gradient views (a bf16 copy), then .to(fp32); the copy is freed before
    # the optimizer runs, so the step holds the larger of it and the optimizer's temporaries
    from peakmem.training import OptimizerImpl

    fused = TrainingSetup(seq_len=8, optimizer_impl=OptimizerImpl.FUSED)  # no temporaries
    part = 276_032 // 4
    for stage in (2, 3):
        p = Parallelism(gpus=4, zero_stage=stage)
        st = sharding.rank_states(technique(tiny(), fused), fused, p, mp.stage_params(tiny(), p, 0))
        assert {i.key: i.bytes for i in st.step} == {"zero.fp32_grad": 4 * part, "zero.flat_grad": 2 * part}
    # foreach AdamW: its exp_avg_sq sqrt (fp32, 4 bytes a partition element) outweighs the bf16 copy
    step = {i.key: i.bytes for i in _states(gpus=4).step}
    assert step == {"zero.fp32_grad": 4 * part, "optimizer.foreach_sqrt": 4 * part}


def test_the_fp16_step_checks_each_gradient_view_first() -> None:
    # stage_1_and_2.py step, fp16 and no offload: has_overflow_partitioned_grads_serial runs
    # _has_inf_or_nan (x.float() 4 + isnan 1 + isinf 1 + logical_or 1 + .float() 4 = 11 bytes an element)
    # over each gradient view of the partition before the flattened fp32 gradient exists
    from peakmem.training import OptimizerImpl

    def step(precision: Precision, gpus: int, stage: int = 2) -> dict[str, int]:
        s = TrainingSetup(seq_len=8, optimizer_impl=OptimizerImpl.FUSED, precision=precision)
        p = Parallelism(gpus=gpus, zero_stage=stage)
        st = sharding.rank_states(technique(tiny(), s), s, p, mp.stage_params(tiny(), p, 0))
        return {i.key: i.bytes for i in st.step}

    # 8 ranks: partition 34,504; the largest view is a whole partition (the embedding, 64,000, is cut at
    # its edge): 11 x 34,504 = 379,544 above the later moment's fp32 + fp16 copies (6 x 34,504)
    for stage in (1, 2):
        assert step(Precision.MIXED_FP16, 8, stage) == {"zero.step_check": 11 * 34_504}
    # one rank: the largest view is the embedding (64,000): 704,000 below 6 x 276,032
    assert step(Precision.MIXED_FP16, 1) == {"zero.fp32_grad": 4 * 276_032, "zero.flat_grad": 2 * 276_032}
    # bf16 skips the check (v0.11.2 on: if self.dtype == torch.float16); ZeRO-3 checks its flat buffer
    assert "zero.step_check" not in step(Precision.MIXED_BF16, 8)
    assert "zero.step_check" not in step(Precision.MIXED_FP16, 8, stage=3)


def test_reduce_in_a_layer_by_hand() -> None:
    # the bucket's torch.cat: 20,000 bf16 elements (reduce_scatter_coalesced)
    st = _states(gpus=4, reduce_bucket_size=20_000)
    assert st.layer_backward_extra == st.layer_backward_first_extra == 2 * 20_000
    assert st.layer_backward_item is not None and st.layer_backward_item.key == "zero3.reduce"
    assert not any(i.key == "zero3.reduce_end" for i in st.step)  # the partition buffer stays on the GPU
    # offloaded optimizer: + the largest in-layer partition (gate/up/down 8,192 / 4 = 2,048) copied back
    # to the GPU in bf16 and its fp64 norm: 2,048 x (2 + 8)
    off = _states(gpus=4, reduce_bucket_size=20_000, **OFFLOAD)
    assert off.layer_backward_extra == 40_000 + 2_048 * 10 == 60_480
    # a bucket larger than the model concatenates every gradient: 276,032 elements
    assert _states(gpus=4).layer_backward_extra == 2 * 276_032


def test_end_of_backward_by_hand() -> None:
    def end(**par: object) -> int:
        st = _states(**par, **OFFLOAD)  # type: ignore[arg-type]
        return sum(i.bytes for i in st.step if i.key == "zero3.reduce_end")

    # the embedding (64,000) does not fit a 20,000 bucket: reduced alone, its own gradient alive, no
    # cat (divides by 4); partition 16,000: bf16 copy + fp64 norm; the embedding still gathered
    assert end(gpus=4, reduce_bucket_size=20_000) == 2 * 64_000 + 2 * 64_000 + 16_000 * 10 == 416_000
    # 3 ranks: partition 21,334, padded to 64,002 by a cat
    assert end(gpus=3, reduce_bucket_size=20_000) == 2 * 64_000 + 2 * 64_000 + 2 * 64_002 + 21_334 * 10
    # in a larger bucket it is copied into the flat buffer: the cat of the last bucket (100,000) instead
    assert end(gpus=4, reduce_bucket_size=100_000) == 2 * 64_000 + 2 * 100_000 + 16_000 * 10 == 488_000


def test_the_fp64_norm_is_chunked() -> None:
    # _constant_buffered_norm2: part.data.double() per 2.5e8 elements
    assert zero3.partition_reduce_bytes(BF16, 1_000) == 1_000 * (2 + 8)
    assert zero3.partition_reduce_bytes(BF16, 300_000_000) == 2 * 300_000_000 + 8 * 250_000_000


def test_the_timeline_shows_them() -> None:
    par = Parallelism(gpus=4, zero_stage=3, param_persistence_threshold=100, reduce_bucket_size=20_000,
                      **OFFLOAD)  # type: ignore[arg-type]  # fmt: skip
    est = estimate_ranks(tiny(), SETUP, par).most_loaded.estimate
    phases = {p.phase: p for p in est.phases}
    backward = {i.key: i.bytes for i in phases[Phase.BACKWARD].items}
    assert backward["zero3.reduce"] == 60_480  # inside a layer's backward (the peak at seq 8)
    # after backward: the resident buffers (persistent norms, the ipg bucket, the model's buffers) and
    # the embedding's reduce; nothing of the optimizer (offloaded)
    optimizer = {i.key: i.bytes for i in phases[Phase.OPTIMIZER].items}
    assert optimizer == {
        "buffers": 32,
        "zero3.persistent": 2 * 576,
        "zero.ipg": 40_000,
        "zero3.reduce_end": 416_000,
    }
    assert phases[Phase.OPTIMIZER].bytes == sum(optimizer.values())


def test_gpt2_18b_shape_by_hand() -> None:
    """A GPT-2 of n_embd 4096 and 90 layers (vocab 50,257, tied) on one GPU, ZeRO-3 with parameters
    and optimizer offloaded, 2e8-element buckets (Lightning 1.7's DeepSpeedStrategy)."""
    config = dict(model_type="gpt2", n_embd=4096, n_layer=90, n_head=16, n_positions=1024, vocab_size=50257)
    spec = spec_from_config({**config, "tie_word_embeddings": True}, name="gpt2-4096x90")
    setup = TrainingSetup(precision=Precision.MIXED_FP16, seq_len=1024, checkpointing=Checkpointing.FULL)
    par = Parallelism(gpus=1, zero_stage=3, reduce_bucket_size=200_000_000, **OFFLOAD)  # type: ignore[arg-type]
    st = sharding.rank_states(technique(spec, setup), setup, par, mp.stage_params(spec, par, 0))
    wte, c_fc = 50_257 * 4_096, 4_096 * 16_384
    assert _gathered(st.gathered_backward) == 2 * (1_000_000_000 + wte)  # max_live + the embedding
    assert st.layer_backward_extra == 2 * 200_000_000 + 10 * c_fc == 1_071_088_640
    end = sum(i.bytes for i in st.step if i.key == "zero3.reduce_end")
    assert end == 2 * wte + 2 * wte + 2 * wte + 8 * wte == 2_881_937_408


def test_an_older_deepspeed_keeps_the_embedding_on_top_in_the_band() -> None:
    # v0.7.0-v0.15.x: the embedding (64,000) gathered on top of today's working set, while the model has
    # more than max_live_parameters + one tensor to gather (10,000 + 64,000 of 275,456)
    from peakmem.formulas import band

    par = Parallelism(gpus=4, zero_stage=3, param_persistence_threshold=100, max_live_parameters=10_000,
                      prefetch_bucket_size=1_000, reduce_bucket_size=20_000)  # fmt: skip
    sp = mp.stage_params(tiny(), par, 0)
    # backward keeps the whole tiny model within max_reuse_distance: nothing left to add
    assert zero3.version_drift(sp, par, NON_PERSISTENT, NON_PERSISTENT) == 0
    assert zero3.version_drift(sp, par, NON_PERSISTENT, 74_000) == 64_000
    assert zero3.version_drift(sp, par, NON_PERSISTENT, NON_PERSISTENT - 1_000) == 1_000  # capped
    no_prefetch = Parallelism(gpus=4, zero_stage=3, param_persistence_threshold=100, prefetch_bucket_size=0)
    assert zero3.version_drift(sp, no_prefetch, NON_PERSISTENT, 64_000) == 0
    term = band.zero3_version_term(2 * 64_000)
    assert (term.low_bytes, term.high_bytes, term.level) == (0, 128_000, "allocated")


def test_the_band_holds_the_older_engine_on_a_gpt2_shape() -> None:
    # the 18B GPT-2 of test_gpt2_18b_shape_by_hand gathers max_live + the embedding today; an older release
    # adds the embedding again: 2 x 50,257 x 4,096 bytes on the allocated band's high end
    config = dict(model_type="gpt2", n_embd=4096, n_layer=90, n_head=16, n_positions=1024, vocab_size=50257)
    spec = spec_from_config({**config, "tie_word_embeddings": True}, name="gpt2-4096x90")
    setup = TrainingSetup(precision=Precision.MIXED_FP16, seq_len=1024, checkpointing=Checkpointing.FULL)
    par = Parallelism(gpus=1, zero_stage=3, reduce_bucket_size=200_000_000, **OFFLOAD)  # type: ignore[arg-type]
    est = estimate_ranks(spec, setup, par).most_loaded.estimate
    terms = {t.name: t for t in est.band.terms}
    assert terms["zero3_engine_version"].high_bytes == 2 * 50_257 * 4_096


def test_zero_offload_keeps_a_gpu_buffer_and_checks_each_gradient() -> None:
    # ZeRO-1/2 + offload_optimizer (stage_1_and_2.py cpu_offload): temp_grad_buffer_for_gpu_offload, 16-bit,
    # the largest trainable parameter (embedding / head: 64,000 elements), and at that gradient's hook
    # _has_inf_or_nan's fp32 copy, isnan, isinf, logical_or masks and .float(): 4 + 1 + 1 + 1 + 4 bytes an
    # element (above the slice's fp64 norm, 8)
    for stage in (1, 2):
        p = Parallelism(gpus=4, zero_stage=stage, offload_optimizer=Offload.CPU)
        st = sharding.rank_states(technique(tiny(), SETUP), SETUP, p, mp.stage_params(tiny(), p, 0))
        assert {i.key: i.bytes for i in st.resident}["zero.offload_buffer"] == 2 * 64_000
        assert st.layer_backward_extra == st.layer_backward_first_extra == 11 * 64_000
        assert st.layer_backward_item is not None and st.layer_backward_item.key == "zero.offload_check"
        # at the step the fp32 partition (276,032 / 4 elements) comes back to the GPU whole before its cast
        assert {i.key: i.bytes for i in st.step} == {"zero.offload_step": 4 * (276_032 // 4)}
    # without the offload neither (the gradient partition stays on the GPU)
    p = Parallelism(gpus=4, zero_stage=2)
    st = sharding.rank_states(technique(tiny(), SETUP), SETUP, p, mp.stage_params(tiny(), p, 0))
    assert "zero.offload_buffer" not in {i.key for i in st.resident} and st.layer_backward_extra == 0
