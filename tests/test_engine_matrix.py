"""One engine: a technique (method, precision, optimizer) is applied once, then an engine partitions what
exists. Over method x optimizer x sharding, every rank trains what one GPU trains: the same trainable
parameters, no more optimizer state, adapter-sized gradients and buckets, and (DDP/ZeRO/FSDP) the
same activations at the same micro-batch. Hand-derived values on the tiny Llama of test_parallel.py,
then a hypothesis property over the whole matrix.

Tiny LoRA (peft's r=8 on all linears, fp32 adapters): per layer q 8x64 + 64x8 = 1,024, k and v
8x64 + 32x8 = 768 each, o 1,024, gate and up 8x64 + 128x8 = 1,536 each, down 8x128 + 64x8 = 1,536:
8,192 per layer, 32,768 over 4 layers; the base (276,032) frozen in bf16.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as hs

from peakmem.adapters import QuantConfig
from peakmem.breakdown import Category, Estimate, Phase
from peakmem.estimate import TrainingEstimator, estimate_training
from peakmem.formulas import model_parallel as mp
from peakmem.formulas import sharding
from peakmem.formulas.activations.kernels import sdpa_call_backend
from peakmem.formulas.technique import technique
from peakmem.parallel import FsdpMode, Parallelism
from peakmem.ranks import estimate_ranks
from peakmem.training import Checkpointing, LossImpl, Method, OptimizerName, TrainingSetup
from test_parallel import tiny
from tiny_models import op_modelled

P = 276_032
ADAPTERS = 32_768
LORA = TrainingSetup(method=Method.LORA, seq_len=64)

METHODS = {"full": Method.FULL, "lora": Method.LORA, "qlora": Method.QLORA}
OPTIMIZERS = (
    OptimizerName.ADAMW,
    OptimizerName.LION,
    OptimizerName.ADAFACTOR,
    OptimizerName.ADAMW_8BIT,
    OptimizerName.PAGED_ADAMW,
)
LAYOUTS = {
    "ddp-2": Parallelism(gpus=2),
    "zero1-8": Parallelism(gpus=8, zero_stage=1),
    "zero2-8": Parallelism(gpus=8, zero_stage=2),
    "zero3-8": Parallelism(gpus=8, zero_stage=3),
    "fsdp-8": Parallelism(gpus=8, fsdp=FsdpMode.FULL_SHARD),
    "tp-2": Parallelism(gpus=2, tp=2),
}
DATA_PARALLEL = {"ddp-2", "zero1-8", "zero2-8", "zero3-8", "fsdp-8"}


def _stored_weights(est: Estimate) -> int:
    return sum(r.bytes for r in est.per_param if r.category is Category.PARAMETERS)


def _states(est: Estimate) -> int:
    return sum(r.bytes for r in est.per_param if r.category is Category.OPTIMIZER_STATES)


def _single_grads(est: Estimate) -> int:
    return sum(r.bytes for r in est.per_param if r.category is Category.GRADIENTS)


def _phase(est: Estimate, phase: Phase) -> list:  # type: ignore[type-arg]
    return next(p for p in est.phases if p.phase is phase).items


def _grads_held(est: Estimate) -> int:
    """Gradient bytes alive at the optimizer step and between steps, engine buffers of a configured
    size (ZeRO's ipg bucket: ``reduce_bucket_size`` elements whatever the model) left out."""
    items = _phase(est, Phase.OPTIMIZER)
    return sum(i.bytes for i in items if i.category is Category.GRADIENTS and i.key != "zero.ipg")


def _activations(est: Estimate) -> int:
    return sum(i.bytes for i in _phase(est, Phase.FORWARD) if i.category is Category.ACTIVATIONS)


def _check(setup: TrainingSetup, layout: str) -> None:
    spec = tiny()
    single = estimate_training(spec, setup)
    rank = estimate_ranks(spec, setup, LAYOUTS[layout]).most_loaded.estimate
    assert rank.trainable_params == single.trainable_params
    assert _states(rank) <= _states(single)
    # gradients: the trainable ones only, at most twice (DDP's bucket copy); fp32 copies at the step
    # of mixed-precision masters count as the single GPU's do
    assert _grads_held(rank) <= 2 * max(_single_grads(single), _grads_held(single))
    if layout in DATA_PARALLEL - {"fsdp-8"}:
        assert _activations(rank) == _activations(single)
    else:
        # FSDP2's forward can peak at its first unit's all-gather, before any layer saved anything (a
        # LoRA job's activations are small next to a gathered unit): no more than the single GPU's then
        assert _activations(rank) <= _activations(single)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("optimizer", OPTIMIZERS, ids=lambda o: o.value)
@pytest.mark.parametrize("method", METHODS)
def test_matrix(method: str, optimizer: OptimizerName, layout: str) -> None:
    _check(TrainingSetup(method=METHODS[method], optimizer=optimizer, seq_len=64), layout)


@settings(max_examples=60, deadline=None)
@given(
    method=hs.sampled_from(list(METHODS)),
    optimizer=hs.sampled_from(OPTIMIZERS),
    layout=hs.sampled_from(list(LAYOUTS)),
    micro_batch=hs.integers(1, 4),
    seq=hs.sampled_from([32, 64, 128]),
    grad_accum=hs.integers(1, 3),
    checkpointing=hs.sampled_from(list(Checkpointing)),
    keep_grads=hs.booleans(),
    compiled_loss=hs.booleans(),
    release=hs.sampled_from(["5.23.0", "4.48.1"]),
    kbit_prep=hs.sampled_from(["none", "peft", "trl"]),
)
def test_matrix_property(
    method: str,
    optimizer: OptimizerName,
    layout: str,
    micro_batch: int,
    seq: int,
    grad_accum: int,
    checkpointing: Checkpointing,
    keep_grads: bool,
    compiled_loss: bool,
    release: str,
    kbit_prep: str,
) -> None:
    quant = QuantConfig(kbit_prep=kbit_prep) if method == "qlora" else None
    setup = TrainingSetup(method=METHODS[method], optimizer=optimizer, micro_batch=micro_batch, seq_len=seq,
                          grad_accum=grad_accum, checkpointing=checkpointing,
                          grads_set_to_none=not keep_grads, quant=quant, transformers=release,
                          loss=LossImpl.COMPILED if compiled_loss else LossImpl.STANDARD)  # fmt: skip
    assume(op_modelled(tiny(), setup, LAYOUTS[layout].tp))
    _check(setup, layout)
    rank = estimate_ranks(tiny(), setup, LAYOUTS[layout]).most_loaded.estimate
    # FSDP's side-stream pools are reserved beside what the peak allocates (formulas/fsdp2.py StreamPools)
    assert rank.peak_reserved_bytes >= rank.peak_allocated_bytes + rank.extra.get("side_stream_pool_bytes", 0)
    if compiled_loss:
        # the compiled cross-entropy keeps its logits and two fp32 row statistics (max, log-sum-exp), the
        # eager one its log_softmax output (fp32): never more on any rank than the eager one, but for those
        # 8 bytes a token where the logits are fp32 themselves (a head peft's kbit preparation upcast)
        eager = estimate_ranks(tiny(), replace(setup, loss=LossImpl.STANDARD), LAYOUTS[layout]).most_loaded
        row_stats = 2 * 4 * micro_batch * seq
        assert rank.peak_allocated_bytes <= eager.estimate.peak_allocated_bytes + row_stats
    if keep_grads:  # gradients kept between steps never lower a rank's peak
        par = LAYOUTS[layout]
        kept = estimate_ranks(tiny(), setup, par).most_loaded.estimate.peak_allocated_bytes
        freed = estimate_ranks(tiny(), replace(setup, grads_set_to_none=True), par).most_loaded.estimate
        assert kept >= freed.peak_allocated_bytes
    peak = rank.peak_allocated_bytes
    par = LAYOUTS[layout]
    # transformers 4.48's loss copies the shifted logits, its SDPA path repeats k/v: never less than today's,
    # where both SDPA calls run one kernel (fp32 inputs: today's enable_gqa call falls back to math, 4.48's
    # repeated k/v run the memory-efficient one)
    today_setup = replace(setup, transformers="5.23.0")
    if release != "5.23.0" and sdpa_call_backend(tiny(), setup) == sdpa_call_backend(tiny(), today_setup):
        today = estimate_ranks(tiny(), today_setup, par).most_loaded.estimate
        assert peak >= today.peak_allocated_bytes
    # fp32 copies of the unquantized weights never lower the rank's stored weights (the model-state rows; the
    # peak they can lower: an fp32 residual stream needs no fp32 copy in the norms, and what FSDP holds
    # unsharded at the peak depends on where the peak falls)
    if quant is not None and kbit_prep != "none":
        bare = estimate_ranks(tiny(), replace(setup, quant=QuantConfig()), par).most_loaded.estimate
        assert _stored_weights(rank) >= _stored_weights(bare)
    # ZeRO-3 outside zero.Init (torch's F.linear keeps the gathered weights, the whole model loads first)
    # never lowers a rank's peak
    if par.zero_stage == 3:
        outside = estimate_ranks(tiny(), setup, replace(par, zero_init=False)).most_loaded.estimate
        assert outside.peak_allocated_bytes >= peak


# --- by hand --------------------------------------------------------------------------------------------
def _rank_states(setup: TrainingSetup, par: Parallelism) -> sharding.RankStates:
    tech = technique(tiny(), setup)
    return sharding.rank_states(tech, setup, par, mp.stage_params(tech.spec, par, 0))


def test_lora_technique_by_hand() -> None:
    tech = technique(tiny(), LORA)
    assert tech.trainable == ADAPTERS and tech.params == P
    assert tech.frozen is not None and tech.frozen.bytes == 2 * P  # bf16 base, no gradient, no state
    assert tech.layer_grads == (4 * 8_192, 4 * 8_192)  # fp32 adapter gradients; first layer on its own


def test_lora_ddp_bucket_is_adapter_sized() -> None:
    st = _rank_states(LORA, Parallelism(gpus=2))
    assert {i.key: i.bytes for i in st.resident} == {"ddp.buckets": 4 * ADAPTERS}
    single = estimate_training(tiny(), LORA)
    ddp = estimate_ranks(tiny(), LORA, Parallelism(gpus=2)).most_loaded.estimate
    assert ddp.peak_allocated_bytes == single.peak_allocated_bytes + 4 * ADAPTERS


def test_lora_zero2_by_hand() -> None:
    st = _rank_states(LORA, Parallelism(gpus=4, zero_stage=2))
    part = 8_192  # DeepSpeed's flat partition: ceil(32768 / (2 x 4)) x 2
    rows = {r.tensor: r.bytes for r in st.rows}
    assert rows == {
        "base weights (frozen) (whole on every rank)": 2 * P,  # not in the optimizer's groups
        "LoRA adapters (full copy)": 4 * ADAPTERS,
        "AdamW m (exp_avg) (1/4 partition)": 4 * part,
        "AdamW v (exp_avg_sq) (1/4 partition)": 4 * part,
    }
    backward = {i.key: i.bytes for i in st.grads_backward}
    assert backward["zero.grad_partition"] == 4 * part  # fp32 adapters: fp32 gradients
    step = {i.key: i.bytes for i in st.step}
    # no master copy for fp32 adapters: the step's gradient is self.flatten(averaged_gradients), its
    # .to(fp32) a no-op, alive while the optimizer runs
    assert step == {"zero.flat_grad": 4 * part, "optimizer.foreach_sqrt": 4 * part}


def test_lora_zero3_partitions_the_frozen_base() -> None:
    st = _rank_states(LORA, Parallelism(gpus=4, zero_stage=3, param_persistence_threshold=100))
    rows = {r.tensor: r.bytes for r in st.rows}
    assert rows["base weights (frozen) (1/4 partition)"] == 2 * P // 4
    assert rows["LoRA adapters (1/4 partition)"] == 4 * ADAPTERS // 4
    assert {i.key: i.bytes for i in st.resident}["zero.grad_partition"] == 4 * 8_192


def test_lora_fsdp_by_hand() -> None:
    st = _rank_states(LORA, Parallelism(gpus=4, fsdp=FsdpMode.FULL_SHARD))
    rows = {r.tensor: r.bytes for r in st.rows}
    assert rows["base weights (frozen) (1/4 shard)"] == 2 * P // 4
    assert rows["LoRA adapters (1/4 shard)"] == 4 * ADAPTERS // 4
    assert rows["AdamW m (exp_avg) (1/4 shard)"] == 4 * ADAPTERS // 4
    assert {i.key: i.bytes for i in st.accumulated} == {"grads": 4 * ADAPTERS // 4}
    assert st.grads_kept == 1 / 4  # each layer's adapter gradients are reduce-scattered to a quarter


def test_qlora_fsdp_shards_the_packed_base() -> None:
    setup = replace(LORA, method=Method.QLORA)
    tech = technique(tiny(), setup)
    assert tech.frozen is not None and tech.frozen.bytes < 2 * P  # NF4 + scales; embeddings, norms 16-bit
    st = _rank_states(setup, Parallelism(gpus=4, fsdp=FsdpMode.FULL_SHARD))
    rows = {r.tensor: r.bytes for r in st.rows}
    # the packed weights sharded, bitsandbytes' quantization states whole on every rank (test_bnb_fsdp.py)
    state = tech.frozen_state_bytes
    assert state == 32_992
    assert rows[f"{tech.frozen.tensor} (1/4 shard)"] == -(-(tech.frozen.bytes - state) // 4)
    assert rows["bitsandbytes quantization states (whole on every rank)"] == state


@pytest.mark.parametrize(
    ("optimizer", "key", "sharded"),
    [
        (OptimizerName.LION, "optimizer.lion_update", False),  # the largest tensor's update: not sharded
        (OptimizerName.ADAMW, "optimizer.foreach_sqrt", True),  # one per parameter: sharded
    ],
)
def test_step_temporaries_survive_sharding(optimizer: OptimizerName, key: str, sharded: bool) -> None:
    """The optimizer's own temporaries (optimizer.step_temporaries), at the shard's size: Lion's and
    Adafactor's no longer vanish under ZeRO."""
    setup = TrainingSetup(optimizer=optimizer, seq_len=64)
    one = {i.key: i.bytes for i in technique(tiny(), setup).temporaries}
    st = _rank_states(setup, Parallelism(gpus=4, zero_stage=2))
    part = 69_008  # ceil(276032 / 8) x 2
    expected = -(-one[key] * part // P) if sharded else one[key]
    assert {i.key: i.bytes for i in st.step}[key] == expected


def test_per_rank_activations_equal_single_gpu_for_lora() -> None:
    """The per-rank timeline is the single-GPU one: LoRA's first-layer split, frozen-base savings and
    adapter saves are the same on every data-parallel rank."""
    setup = replace(LORA, micro_batch=2, checkpointing=Checkpointing.FULL)
    single = estimate_training(tiny(), setup)
    est = TrainingEstimator(tiny())
    for par in (
        Parallelism(gpus=2),
        Parallelism(gpus=8, zero_stage=3),
        Parallelism(gpus=8, fsdp=FsdpMode.FULL_SHARD),
    ):
        rank = est.estimate(setup, par)
        assert _activations(rank) == _activations(single)
        assert [p.phase for p in rank.phases] == [p.phase for p in single.phases]


def test_answer_ai_fsdp_qlora_70b_recipe_is_explained() -> None:
    """Answer.AI's fsdp_qlora recipe (benchmarks_03_2024.md: Llama-2-70B, QLoRA r=64 on q/k/v/gate/up/down,
    pure bf16, batch 2 x 2048, gradient checkpointing, FSDP over 2 GPUs with CPU offload), here for
    Llama-3.1-70B: every term of the per-rank estimate names its source; the packed NF4 base and the
    optimizer states live in pinned CPU RAM; the GPU holds the gathered units, the root unit, the
    checkpointed inputs and one recomputed layer, under 24 GB."""
    from peakmem.adapters import LoraConfig
    from peakmem.parallel import Offload
    from peakmem.resolve import resolve_model
    from peakmem.training import Precision

    spec = resolve_model("llama-3.1-70b")
    targets = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj", "down_proj")
    lora = LoraConfig(rank=64, targets=targets)
    setup = TrainingSetup(method=Method.QLORA, precision=Precision.BF16, lora=lora, micro_batch=2,
                          seq_len=2048, checkpointing=Checkpointing.FULL)  # fmt: skip
    par = Parallelism(
        gpus=2, fsdp=FsdpMode.FULL_SHARD, offload_params=Offload.CPU, offload_optimizer=Offload.CPU
    )
    report = estimate_ranks(spec, setup, par)
    rank = report.most_loaded
    est = rank.estimate
    assert est.trainable_params == estimate_training(spec, setup).trainable_params
    assert all(i.source for i in est.items), [i.path for i in est.items if not i.source]
    cpu = {i.path: i.bytes for i in rank.cpu_items}
    base = next(r for r in technique(spec, setup).rows if r.tensor.startswith("base weights"))
    state = technique(spec, setup).frozen_state_bytes  # bitsandbytes' quantization states: whole, offloaded
    assert cpu[f"offloaded {base.tensor} (1/2 shard)"] == -(-(base.bytes - state) // 2)
    assert cpu["offloaded bitsandbytes quantization states (whole on every rank)"] == state
    assert est.device_total_bytes < 24 * 10**9
    keys = {i.key for p in est.phases for i in p.items}  # FSDP2 gathers no unit at the head's backward
    assert {"fsdp.root", "fsdp.units"} <= keys


def test_learned_positions_bound_the_sequence() -> None:
    """GPT-2 XL has 1,024 learned positions: seq 4096 cannot run, so it is refused, not estimated."""
    from peakmem.errors import InputError
    from peakmem.resolve import resolve_model

    spec = resolve_model("gpt2-xl")
    estimate_training(spec, TrainingSetup(seq_len=1024))
    with pytest.raises(InputError, match="seq=4096: gpt2-xl has 1,024 learned positions"):
        estimate_training(spec, TrainingSetup(seq_len=4096))


def test_kbit_prep_keeps_fp32_layer_inputs_and_recomputes_in_fp32() -> None:
    """Found by test_matrix_property (2026-12-06) as a prepared peak below the bare one, and not a fault: a
    prepared base's fp32 norms make the residual stream fp32 (formulas/kbit_prep.py), so under full
    checkpointing the prepared rank keeps fp32 layer inputs (twice the bytes), and RMSNorm's
    ``x.to(float32)`` is the layer input itself, not a new copy. The formulas then found the prepared peak
    lower (by 1.9 KiB on tiny(), ddp-2 and tp-2, with the compiled loss's small head); they left out what is
    alive when the recomputation stops at the down projection's adapter, fp32 behind the prepared norms
    (lora/deltas.py recompute_stop), and with it the prepared recomputation holds more, as the
    simulator measures where the layers decide the peak (tiny Llama h 256, full checkpointing: peft's and
    TRL's +42 % over the bare base's; tests/test_qlora_simulate.py)."""
    setup = TrainingSetup(method=Method.QLORA, micro_batch=1, seq_len=32, checkpointing=Checkpointing.FULL,
                          quant=QuantConfig(kbit_prep="trl"), loss=LossImpl.COMPILED)  # fmt: skip
    par = LAYOUTS["ddp-2"]
    prepared = estimate_ranks(tiny(), setup, par).most_loaded.estimate
    bare = estimate_ranks(tiny(), replace(setup, quant=QuantConfig()), par).most_loaded.estimate

    def part(est: Estimate, words: str) -> int:
        return sum(i.bytes for i in est.items if words in i.path)

    assert part(prepared, "layer input (checkpoint)") == 2 * part(bare, "layer input (checkpoint)")
    # the recomputed MLP interior (gate, act(gate), up: 3 x 32 tokens x 128 wide) in fp32, not bf16
    assert part(prepared, "recomputed activations") - part(bare, "recomputed activations") >= 3 * 32 * 128 * 2
