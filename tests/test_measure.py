"""peakmem.measure: the real-execution ground truth, checked against hand-derived bytes.

Tiny GPT-2 / Llama configs (2 layers, hidden 64, vocab 1000, batch 2 x seq 32): each run takes
~0.2 s on CPU. Expected bytes are derived by hand from the parameter count P:
fp32 weights 4P, AdamW exp_avg + exp_avg_sq 2 x 4P plus one 4-byte ``step`` per parameter
tensor, mixed-bf16 weights 2P + fp32 masters 4P, and so on.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from dataclasses import replace

import torch

from peakmem.breakdown import Category, Phase
from peakmem.errors import InputError
from peakmem.measure import measure_training
from peakmem.measure.tracker import LiveStorageTracker, StorageLedger, normalize_path
from peakmem.training import (
    AttentionKernel,
    Checkpointing,
    Method,
    OptimizerImpl,
    OptimizerName,
    Precision,
    TrainingSetup,
)
from tiny_models import GPT2, GPT2_P, GPT2_TENSORS, LLAMA, LLAMA_BUFFER_BYTES, LLAMA_P, LLAMA_TENSORS

pytestmark = pytest.mark.torch

BERT = {
    "model_type": "bert", "architectures": ["BertForSequenceClassification"], "vocab_size": 1000,
    "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
    "max_position_embeddings": 128,
}  # fmt: skip


def setup(**kw: object) -> TrainingSetup:
    kw.setdefault("micro_batch", 2)
    kw.setdefault("seq_len", 32)
    kw.setdefault("precision", Precision.FP32)
    return TrainingSetup(**kw)  # type: ignore[arg-type]


def cats(est: object, step: int, phase: str) -> dict[str, int]:
    for st in est.extra["steps"]:  # type: ignore[attr-defined]
        if st["step"] == step:
            return st["categories"][phase]
    raise AssertionError(step)


def row(est: object, tensor: str) -> int:
    return sum(r.bytes for r in est.per_param if r.tensor == tensor)  # type: ignore[attr-defined]


@pytest.fixture(scope="module")
def llama_fp32():
    return measure_training(LLAMA, setup())


@pytest.fixture(scope="module")
def llama_mixed():
    return measure_training(LLAMA, setup(precision=Precision.MIXED_BF16))


# --- the ledger and the tracker on hand-made tensors ------------------------------------------------


def test_ledger_peak_and_replay_by_phase():
    led = StorageLedger()
    a = led.alloc(100, op="a", tags={"param"})
    led.set_phase(Phase.FORWARD, 1)
    b = led.alloc(50, op="b", tags={"saved"})
    c = led.alloc(30, op="c")
    led.free(c)
    led.set_phase(Phase.BACKWARD, 1)
    led.free(b)
    d = led.alloc(10, op="d", tags={"grad"})
    peaks = {(s.step, s.phase): s for s in led.peaks()}
    assert peaks[(0, Phase.LOAD)].bytes == 100
    fwd = peaks[(1, Phase.FORWARD)]
    assert fwd.bytes == 180
    assert fwd.by_category() == {Category.PARAMETERS: 100, Category.ACTIVATIONS: 50, Category.TEMPORARIES: 30}
    # Backward's peak is the level it starts from (150), before b is freed.
    assert peaks[(1, Phase.BACKWARD)].bytes == 150
    assert led.current == 110
    assert led.is_live(a) and led.is_live(d) and not led.is_live(b)


def test_tracker_counts_views_once_and_sees_frees():
    tr = LiveStorageTracker()
    with tr:
        tr.set_phase(Phase.FORWARD, 1)
        a = torch.empty(100)  # 400 B
        v = a.view(10, 10)  # same storage: no new bytes
        a.mul_(0)  # in place: same storage
        c = a * 2  # 400 B
        del c
        d = torch.empty(25, dtype=torch.bfloat16)  # 50 B
    peak = max(s.bytes for s in tr.ledger.peaks())
    assert peak == 800
    assert tr.ledger.current == 450
    del a, v, d
    assert tr.ledger.current == 0


def test_tracker_tags_saved_tensors_as_activations():
    w = torch.nn.Parameter(torch.randn(8, 8))
    tr = LiveStorageTracker()
    with tr:
        x = torch.randn(4, 8)  # 128 B, saved by mm
        y = torch.tanh(x @ w)  # mm output (temporary, freed) + tanh output (saved by tanh's backward)
        snap = tr.ledger.live_snapshot()
    by_cat = snap.by_category()
    assert by_cat[Category.ACTIVATIONS] == 128 + 128  # x and tanh's output
    del y


def test_normalize_path():
    assert normalize_path("model.layers.12.mlp.up_proj") == "model.layers.*.mlp.up_proj"
    assert normalize_path("transformer.h.0") == "transformer.h.*"


# --- model states, hand-derived -----------------------------------------------------------------------


def test_llama_param_count(llama_fp32):
    assert llama_fp32.params == LLAMA_P == llama_fp32.trainable_params


def test_load_is_params_plus_buffers_exactly(llama_fp32):
    assert llama_fp32.extra["load_bytes"] == 4 * LLAMA_P + LLAMA_BUFFER_BYTES


def test_gpt2_load_and_tied_head_counted_once():
    est = measure_training(GPT2, setup())
    assert est.params == GPT2_P
    assert est.extra["load_bytes"] == 4 * GPT2_P  # no buffers in transformers 5.23's GPT-2
    assert row(est, "optimizer exp_avg") == 4 * GPT2_P
    assert row(est, "optimizer step") == 4 * GPT2_TENSORS


def test_fp32_adamw_states_and_grads(llama_fp32):
    assert row(llama_fp32, "optimizer exp_avg") == 4 * LLAMA_P
    assert row(llama_fp32, "optimizer exp_avg_sq") == 4 * LLAMA_P
    assert row(llama_fp32, "optimizer step") == 4 * LLAMA_TENSORS
    assert row(llama_fp32, "gradients") == 4 * LLAMA_P
    assert row(llama_fp32, "weights") == 4 * LLAMA_P
    states = 8 * LLAMA_P + 4 * LLAMA_TENSORS
    # Step 1 creates the states inside the optimizer phase; step 2's forward already carries them.
    assert cats(llama_fp32, 1, "optimizer")["optimizer_states"] == states
    assert "optimizer_states" not in cats(llama_fp32, 1, "forward")
    assert cats(llama_fp32, 2, "forward")["optimizer_states"] == states
    # foreach AdamW: one temporary the size of the parameters (sqrt of exp_avg_sq) at the step.
    opt = cats(llama_fp32, 2, "optimizer")
    assert opt["gradients"] == 4 * LLAMA_P
    assert opt["temporaries"] == 4 * LLAMA_P


def test_peak_is_the_optimizer_step_hand_derived(llama_fp32):
    # At seq 32 the step's 4P weights + 4P grads + 8P Adam + 4P foreach temporary (+ 4-byte steps
    # and the rotary buffers) beat backward's activations: peak = 20P + buffers + 4T, exactly.
    assert llama_fp32.peak_phase == Phase.OPTIMIZER
    assert llama_fp32.peak_allocated_bytes == 20 * LLAMA_P + LLAMA_BUFFER_BYTES + 4 * LLAMA_TENSORS
    assert llama_fp32.peak_allocated_bytes == sum(llama_fp32.by_category().values())
    assert llama_fp32.peak_reserved_bytes == llama_fp32.peak_allocated_bytes == llama_fp32.device_total_bytes
    assert max(p.bytes for p in llama_fp32.phases) == llama_fp32.peak_allocated_bytes
    # The start of backward holds the two fp32 B*S*V gradients of the loss (nll + log_softmax).
    assert cats(llama_fp32, 2, "backward")["temporaries"] >= 2 * 2 * 32 * 1000 * 4


def test_peak_is_step2_backward_at_longer_seq():
    est = measure_training(LLAMA, setup(seq_len=64))
    assert est.peak_phase == Phase.BACKWARD
    assert est.extra["peak_step"] == 2


def test_mixed_bf16_masters_and_fp32_grads_at_the_step(llama_mixed):
    p = LLAMA_P
    assert row(llama_mixed, "weights") == 2 * p
    assert row(llama_mixed, "gradients") == 2 * p  # 16-bit grads after backward
    assert row(llama_mixed, "master weights") == 4 * p
    assert row(llama_mixed, "optimizer exp_avg") == 4 * p
    assert llama_mixed.extra["load_bytes"] == 2 * p + LLAMA_BUFFER_BYTES // 2 + 4 * p
    opt = cats(llama_mixed, 2, "optimizer")
    assert opt["parameters"] == 2 * p
    assert opt["master_weights"] == 4 * p
    assert opt["gradients"] == 4 * p  # fp32 master grads; the 16-bit ones were freed as converted
    assert opt["optimizer_states"] == 8 * p + 4 * LLAMA_TENSORS
    assert opt["temporaries"] == 4 * p


def test_bf16_states_are_bf16():
    est = measure_training(LLAMA, setup(precision=Precision.BF16))
    assert row(est, "optimizer exp_avg") == 2 * LLAMA_P
    assert row(est, "gradients") == 2 * LLAMA_P
    assert row(est, "master weights") == 0


def test_amp_bf16_caches_weight_casts():
    est = measure_training(LLAMA, setup(precision=Precision.AMP_BF16))
    fwd = next(p for p in est.phases if p.phase == Phase.FORWARD)
    casts = {i.path: i.bytes for i in fwd.items if i.path.startswith("autocast weight cast")}
    assert casts["autocast weight cast: lm_head.weight"] == 1000 * 64 * 2
    assert row(est, "gradients") == 4 * LLAMA_P


def test_full_checkpointing_saves_activations(llama_fp32):
    est = measure_training(LLAMA, setup(checkpointing=Checkpointing.FULL))
    fwd_none = cats(llama_fp32, 2, "forward")["activations"]
    fwd_full = cats(est, 2, "forward")["activations"]
    assert fwd_full < fwd_none
    assert any(i.path.startswith("recomputed:") for p in est.phases for i in p.items)


def test_selective_checkpointing_drops_the_attention_core():
    eager = setup(attention=AttentionKernel.EAGER)
    none = measure_training(LLAMA, eager, steps=1)
    sel = measure_training(LLAMA, replace(eager, checkpointing=Checkpointing.SELECTIVE), steps=1)
    # Eager attention saves softmax probs (B*H*S*S fp32) and the GQA-repeated k, v per layer;
    # selective keeps only q, k, v and the mask, recomputing the rest in backward.
    probs = 2 * 4 * 32 * 32 * 4
    saved_none = cats(none, 1, "forward")["activations"]
    saved_sel = cats(sel, 1, "forward")["activations"]
    assert saved_none - saved_sel >= 2 * probs
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    assert "eager" not in ALL_ATTENTION_FUNCTIONS._local_mapping  # the wrapper is removed afterwards


def test_grad_accumulation_keeps_grads_through_the_next_forward():
    est = measure_training(LLAMA, setup(grad_accum=2), steps=1)
    assert cats(est, 1, "forward").get("gradients") == 4 * LLAMA_P


@pytest.mark.parametrize(
    ("optimizer", "impl", "state_bytes"),
    [
        (OptimizerName.SGD, OptimizerImpl.FOREACH, 0),
        (OptimizerName.SGD_MOMENTUM, OptimizerImpl.FUSED, 4 * LLAMA_P),
        (OptimizerName.ADAM, OptimizerImpl.FOR_LOOP, 8 * LLAMA_P + 4 * LLAMA_TENSORS),
        (OptimizerName.ADAMW, OptimizerImpl.FUSED, 8 * LLAMA_P + 4 * LLAMA_TENSORS),
        (OptimizerName.LION, OptimizerImpl.FOREACH, 4 * LLAMA_P),
        (OptimizerName.LION, OptimizerImpl.FOR_LOOP, 4 * LLAMA_P),
    ],
)
def test_optimizers_state_bytes(optimizer, impl, state_bytes):
    est = measure_training(LLAMA, setup(optimizer=optimizer, optimizer_impl=impl), steps=1)
    states = sum(r.bytes for r in est.per_param if r.category == Category.OPTIMIZER_STATES)
    assert states == state_bytes


def test_adafactor_factored_states():
    est = measure_training(LLAMA, setup(optimizer=OptimizerName.ADAFACTOR), steps=1)
    # torch.optim.Adafactor: a row (n x 1) and column (1 x m) vector per matrix, a full variance for vectors.
    matrices = [(1000, 64), (1000, 64)] + 2 * [
        (64, 64),
        (32, 64),
        (32, 64),
        (64, 64),
        (176, 64),
        (176, 64),
        (64, 176),
    ]
    assert row(est, "optimizer row_var") == 4 * sum(n for n, _ in matrices)
    assert row(est, "optimizer col_var") == 4 * sum(m for _, m in matrices)
    assert row(est, "optimizer variance") == 4 * 64 * 5  # the 5 RMSNorm weights


@pytest.mark.parametrize(
    "precision", [Precision.AMP_FP16, Precision.MIXED_FP16, Precision.BF16, Precision.AMP_BF16]
)
def test_each_precision_runs_on_gpt2_eager(precision):
    est = measure_training(GPT2, setup(precision=precision, attention=AttentionKernel.EAGER), steps=1)
    assert est.method == "measured"
    assert est.peak_allocated_bytes > est.extra["load_bytes"] > 0


def test_bert_sequence_classification():
    est = measure_training(BERT, setup(), steps=1)
    assert est.params > 0
    assert est.setup["precision"] == "fp32"


def test_tracker_matches_the_cpu_allocator():
    # fp32 + eager: no oneDNN bf16 matmul or CPU flash-attention kernel, whose internal scratch
    # (thread- and CPU-dependent) the allocator sees and the tracker, by design, does not.
    est = measure_training(LLAMA, setup(attention=AttentionKernel.EAGER), cross_check=True)
    # The profiler sees every CPU-allocator event: equal within a few 0-dim scalars.
    assert 0 <= est.extra["allocator_peak_bytes"] - est.peak_allocated_bytes <= 64


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"attention": AttentionKernel.FLASH}, "flash"),
        ({"method": Method.QLORA}, "not measurable"),
        ({"optimizer": OptimizerName.LION, "optimizer_impl": OptimizerImpl.FUSED}, "fused"),
        ({"compiled": True, "liger": True}, r"^compiled=True, liger=True: measure does not run it"),
        ({"optimizer_in_backward": True}, r"^optimizer_in_backward=True: measure does not run"),
    ],
)
def test_clear_errors(kw, message):
    with pytest.raises(InputError, match=message):
        measure_training(LLAMA, setup(**kw))


def test_lora_is_measured_with_a_frozen_base():
    est = measure_training(LLAMA, setup(method=Method.LORA))
    # peft's r=8 on every linear, r x (in + out): q 64->64, k and v 64->32, o 64->64, gate and up
    # 64->176, down 176->64; 2 layers.
    assert est.trainable_params == 2 * 8 * (128 + 96 + 96 + 128 + 240 + 240 + 240)
    assert row(est, "optimizer exp_avg") == 4 * est.trainable_params  # states for the adapters only


def test_bad_device():
    with pytest.raises(InputError, match="device"):
        measure_training(LLAMA, setup(), device="tpu")


@pytest.mark.gpu
def test_cuda_measurement_agrees_with_states():
    est = measure_training(LLAMA, setup(), device="cuda")
    assert est.peak_allocated_bytes >= 16 * LLAMA_P
    assert est.peak_reserved_bytes >= est.peak_allocated_bytes
    assert est.device_total_bytes >= est.peak_reserved_bytes
    assert row(est, "optimizer exp_avg") == 4 * LLAMA_P


class _FakeCudaStats:
    """Stands in for runner._CudaStats: per-phase peaks 1 MiB above what the tracker saw."""

    def __init__(self, tracker):
        self.tracker = tracker
        self.current = (0, Phase.LOAD)
        self.alloc: dict = {}
        self.reserved: dict = {}

    def set_phase(self, phase, step):
        tracked = [p.bytes for p in self.tracker.ledger.peaks() if (p.step, p.phase) == self.current]
        self.alloc[self.current] = max(tracked, default=self.tracker.ledger.current) + (1 << 20)
        self.reserved[self.current] = self.alloc[self.current] + (2 << 20)
        self.current = (step, phase)

    def device_total(self):
        return max(self.reserved.values()) + (500 << 20), "fake NVML"


def test_cuda_report_assembly_without_a_gpu():
    """The CUDA branch of the report (torch.cuda peaks + tracker categories), fed fake statistics."""
    from peakmem.measure import runner

    s = setup()
    model = runner.build_model(LLAMA, s)
    model.train()
    tracker = LiveStorageTracker(device_type="cpu")
    fake = _FakeCudaStats(tracker)
    result = runner._run(model, LLAMA, s, torch.device("cpu"), 2, 0, tracker, fake)
    est = runner._estimate(model, LLAMA, s, torch.device("cpu"), result, tracker, fake, None)
    assert est.peak_allocated_bytes == max(fake.alloc[k] for k in fake.alloc if k[0] <= 2)
    assert est.peak_reserved_bytes == est.peak_allocated_bytes + (2 << 20)
    assert est.device_total_bytes == est.peak_reserved_bytes + (500 << 20)
    untracked = [i for i in est.items if i.path.startswith("untracked")]
    assert untracked and untracked[0].bytes > 0
    assert sum(i.bytes for i in est.items) == est.peak_allocated_bytes
    assert all(p.bytes == sum(i.bytes for i in p.items) for p in est.phases)


def test_measure_and_simulate_build_the_same_class() -> None:
    """``config_and_class`` serves both: a training head named by ``architectures`` is used as is; BERT
    without one gets its classification head; other decoders AutoModelForCausalLM."""
    import transformers

    from peakmem.measure.runner import config_and_class

    drop = ("model_type", "transformers_version")
    assert config_and_class(LLAMA, drop=drop)[1] is transformers.LlamaForCausalLM
    bert = {"model_type": "bert", "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
            "intermediate_size": 64, "vocab_size": 100}  # fmt: skip
    assert config_and_class(bert, drop=drop)[1] is transformers.BertForSequenceClassification
    no_arch = {k: v for k, v in GPT2.items() if k != "architectures"}
    assert config_and_class(no_arch, drop=drop)[1] is transformers.AutoModelForCausalLM
    with pytest.raises(InputError, match="model_type is missing"):
        config_and_class({"hidden_size": 8}, drop=drop)
