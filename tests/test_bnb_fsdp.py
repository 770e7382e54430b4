"""A bitsandbytes QLoRA base under FSDP: the packed weights are sharded and gathered, the quantization states
(absmax, nested absmax, codes, offset; int8's SCB) stay whole on every rank (formulas/bnb_fsdp.py).

Hand-derived on test_parallel's tiny spec (hidden 64, 4 layers: q and o 64 x 64, k and v 32 x 64, gate, up
and down 128 x 64, two norms of 64; vocabulary 1000, untied head). NF4 with double quantization, block 64,
one tensor of m elements: packed m / 2, state = m / 64 uint8 absmax + one fp32 nested absmax per 256 blocks
+ 256-entry fp32 nested code + fp32 offset + 16-entry fp32 code = m / 64 + 4 + 1024 + 4 + 64.
"""

from __future__ import annotations

from peakmem.adapters import LoraConfig, QuantConfig
from peakmem.formulas import model_parallel as mp
from peakmem.formulas import sharding
from peakmem.formulas.qlora import quant_state_bytes
from peakmem.formulas.technique import technique
from peakmem.parallel import FsdpMode, Parallelism
from peakmem.training import Framework, Method, Precision, TrainingSetup
from test_parallel import tiny

# per layer: q, o (4096: 64 + 1096), k, v (2048: 32 + 1096), gate, up, down (8192: 128 + 1096)
STATE_LAYER = 2 * 1160 + 2 * 1128 + 3 * 1224  # 8,248
STATE = 4 * STATE_LAYER  # 32,992
# stored: packed (2048, 1024, 4096) + state, and the two bf16 norms (256 B) a layer
LAYER = 2 * (2048 + 1160) + 2 * (1024 + 1128) + 3 * (4096 + 1224) + 256  # 26,936
ROOT = 2 * (64_000 + 64 + 64_000)  # embed, final norm, head in bf16
NF4_DQ = QuantConfig(quant="nf4", double_quant=True)


def _states(framework: Framework = Framework.HF) -> sharding.RankStates:
    lora = LoraConfig(rank=8, targets=("q_proj", "v_proj"))
    setup = TrainingSetup(seq_len=64, method=Method.QLORA, precision=Precision.BF16, quant=NF4_DQ, lora=lora,
                          framework=framework)  # fmt: skip
    par = Parallelism(gpus=2, fsdp=FsdpMode.FULL_SHARD, fsdp_version=1)
    return sharding.rank_states(technique(tiny(), setup), setup, par, mp.stage_params(tiny(), par, 0))


def _frozen(st: sharding.RankStates, what: str = "base weights") -> int:
    return sum(r.bytes for r in st.table if r.tensor.startswith(what))


def _units(st: sharding.RankStates) -> int:
    (item,) = [i for i in st.gathered_forward if i.key == "fsdp.units"]
    return item.bytes


def test_quant_state_bytes_by_hand() -> None:
    assert quant_state_bytes(tiny(), NF4_DQ) == STATE == 32_992
    # int8: one fp32 SCB per output row: q 64, k 32, v 32, o 64, gate 128, up 128, down 64 rows a layer
    scb_rows = 64 + 32 + 32 + 64 + 128 + 128 + 64
    assert quant_state_bytes(tiny(), QuantConfig(quant="int8")) == 4 * 4 * scb_rows


def test_fsdp_shards_the_packed_base_and_keeps_the_states_whole() -> None:
    whole = 4 * LAYER + ROOT  # 363,872: what one GPU stores
    st = _states()
    assert _frozen(st) == -(-(whole - STATE) // 2) == 165_440
    assert _frozen(st, "bitsandbytes quantization states") == STATE  # in all 198,432 (whole / 2: 181,936)


def test_the_states_are_never_gathered() -> None:
    # the current and the prefetched layer unit: each all-gathers its packed weights, not its states
    assert _units(_states(Framework.TORCHTUNE)) - _units(_states()) == 2 * STATE_LAYER


def test_torchtune_nf4tensor_shards_its_scales() -> None:
    st = _states(Framework.TORCHTUNE)
    assert _frozen(st) == (4 * LAYER + ROOT) // 2 and not _frozen(st, "bitsandbytes quantization states")


def test_transformers_4_expert_linears_carry_a_state_each() -> None:
    """Mixtral under transformers 4.x (QuantConfig.expert_linears): each expert's w1, w3 (128 x 64) and w2
    (64 x 128) is a Linear4bit with its own state; nf4 without double quantization: 8192 / 64 fp32 absmax
    + the 16-entry fp32 code = 576 B each. Attention: q, o 4096 (64 x 4 + 64 = 320), k, v 2048 (192)."""
    from peakmem.hf import spec_from_config
    from test_qlora import MIXTRAL

    spec = spec_from_config(MIXTRAL, name="m")
    attention = 2 * 320 + 2 * 192
    assert quant_state_bytes(spec, QuantConfig(quant="nf4")) == attention  # fused experts stay 16-bit
    per_expert = QuantConfig(quant="nf4", expert_linears=True)
    assert quant_state_bytes(spec, per_expert) == attention + 4 * 3 * 576
