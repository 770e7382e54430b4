"""bitsandbytes' paged optimizers: states of tensors with at least 1e5 elements live in CUDA unified memory
(``get_state_buffer``: ``F.get_paged`` -> ``cudaMallocManaged``), on the device but outside torch's caching
allocator: not in ``max_memory_allocated`` / ``max_memory_reserved``, in nvidia-smi until paged out.
bitsandbytes PR #1908's benchmark shows it: Qwen3-0.6B's AdamW8bit and PagedAdamW8bit peaks differ by the
large tensors' 8-bit states (benchmarks/published_scale.json, bnb-pr1908-*)."""

from __future__ import annotations

from peakmem.estimate import estimate_training
from peakmem.formulas import lowbit_optim as lo
from peakmem.hf import spec_from_config
from peakmem.model import Tensor
from peakmem.training import OptimizerImpl, OptimizerName, Precision, TrainingSetup


def _t(numel: int) -> Tensor:
    return Tensor(name="w", module="w", shape=(numel,), component="mlp", kind="linear_weight")


def test_paged_adamw_rows_by_hand() -> None:
    # one 200,000-element tensor (paged: 2 fp32 states, 1.6 MB) and two of 50,000 (ordinary: 800 kB)
    rows = lo.paged_adamw_rows([(_t(200_000), 1), (_t(50_000), 2)])
    paged = [r for r in rows if r.unified_memory]
    device = [r for r in rows if not r.unified_memory]
    assert [r.bytes for r in paged] == [200_000 * 8] and [r.bytes for r in device] == [2 * 50_000 * 8]
    assert paged[0].params == 200_000 and device[0].params == 100_000


def test_paged_8bit_rows_split_the_codes() -> None:
    # 8-bit: the uint8 codes of the large tensor are paged (2 x 200,000 B); its fp32 absmax (2 x 782 blocks)
    # and the small tensor's codes stay on the device
    tensors = [(_t(200_000), 1), (_t(50_000), 1)]
    states = lo.bnb_8bit_states(tensors, paged=True)
    rows = lo.quant_state_rows("paged AdamW 8-bit", states, 250_000, lo.SRC_BNB)
    by = {r.tensor: (r.bytes, r.unified_memory) for r in rows}
    assert by["paged AdamW 8-bit states (uint8, paged: CUDA unified memory)"] == (400_000, True)
    assert by["paged AdamW 8-bit states (uint8)"] == (100_000, False)
    assert by["paged AdamW 8-bit block scales (fp32)"] == ((2 * 782 + 2 * 196) * 4 + 2 * 256 * 4, False)


SMALL = {
    "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 256,
    "intermediate_size": 704, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "vocab_size": 4096, "max_position_embeddings": 512, "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
}  # fmt: skip


def _run(optimizer: OptimizerName) -> object:
    setup = TrainingSetup(precision=Precision.MIXED_BF16, optimizer=optimizer,
                          optimizer_impl=OptimizerImpl.FUSED, micro_batch=1, seq_len=64)  # fmt: skip
    return estimate_training(spec_from_config(SMALL), setup)


def test_paged_states_leave_allocated_but_stay_on_the_device() -> None:
    # mixed-bf16 AdamW keeps fp32 m, v as PagedAdamW does. Tensors >= 1e5 elements: the embedding and head
    # (4096 x 256 = 1,048,576 each) and each layer's gate, up, down (256 x 704 = 180,224); q (65,536), k, v
    # and o are smaller. Their states (2 x 4 B an element) leave torch's allocator
    paged = (2 * 1_048_576 + 2 * 3 * 180_224) * 8
    plain, pg = _run(OptimizerName.ADAMW), _run(OptimizerName.PAGED_ADAMW)
    assert pg.extra["paged_optimizer_bytes"] == paged  # type: ignore[attr-defined]
    assert plain.peak_allocated_bytes - pg.peak_allocated_bytes == paged  # type: ignore[attr-defined]
    assert pg.device_total_bytes >= pg.peak_reserved_bytes + paged  # type: ignore[attr-defined]
    # the bytes/param table still lists every state byte
    assert plain.model_state_bytes == pg.model_state_bytes  # type: ignore[attr-defined]
