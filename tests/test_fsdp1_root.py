"""FSDP1's root unit at the end of backward (peakmem.formulas.fsdp1_root): its parameters' gradients held
until the embedding's, their ``torch.cat`` into the flat gradient, the layer units resharded by then.
Hand-derived values on a tiny spec; the oracle parity is in test_fsdp1_root_oracle_torch.py."""

from __future__ import annotations

from peakmem.breakdown import Category, MemoryItem, Phase
from peakmem.formulas.fsdp1_root import flat_grad_extra, holds_root_grads, resharded_at_tail
from peakmem.hf import spec_from_config
from peakmem.parallel import FsdpMode, Parallelism
from peakmem.ranks import estimate_ranks
from peakmem.training import KernelPolicy, OptimizerImpl, Precision, TrainingSetup

# hidden 16, 1 layer, vocabulary 4096: the root (2 x 4096 x 16 + 16 elements) dominates
CONFIG = {
    "model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 4096, "hidden_size": 16,
    "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
    "max_position_embeddings": 64, "tie_word_embeddings": False,
}  # fmt: skip
V, H = 4096, 16
FSDP1 = Parallelism(gpus=4, fsdp=FsdpMode.FULL_SHARD, fsdp_version=1)


def _item(key: str, nbytes: int) -> MemoryItem:
    return MemoryItem(path=key, category=Category.PARAMETERS, bytes=nbytes, source="test", key=key)


def test_flat_grad_extra_is_the_cat_beyond_the_root_gradients_alive() -> None:
    # untied: head 100 B held + embedding 100 B written + norm 4 B = the 204 B flat gradient's inputs
    assert flat_grad_extra(204, 204) == 204
    # tied: the head's contribution, the embedding's and their sum (300 B) + norm (4 B) alive at the
    # InputBuffer's sum; the cat instant (2 x 104 B) is lower
    assert flat_grad_extra(104, 304) == 0


def test_holds_root_grads_fsdp1_only() -> None:
    assert holds_root_grads(FSDP1)
    assert not holds_root_grads(Parallelism(gpus=4, fsdp=FsdpMode.FULL_SHARD, fsdp_version=2))
    assert not holds_root_grads(Parallelism(gpus=4))


def test_resharded_at_tail_credits_layer_units_only_under_full_shard() -> None:
    items = [_item("fsdp.root", 1000), _item("fsdp.units", 30), _item("fsdp.reduce_scatter", 10)]
    assert resharded_at_tail(FSDP1, items, 500) == 40
    assert resharded_at_tail(FSDP1, items, 39) == 39  # never more than the tail adds
    grad_op = Parallelism(gpus=4, fsdp=FsdpMode.SHARD_GRAD_OP, fsdp_version=1)
    assert resharded_at_tail(grad_op, items, 500) == 0


def _backward(par: Parallelism, grad_accum: int = 1) -> dict[str, int]:
    setup = TrainingSetup(precision=Precision.FP32, micro_batch=1, seq_len=8, grad_accum=grad_accum,
                          kernel_policy=KernelPolicy.CPU, optimizer_impl=OptimizerImpl.FOREACH)  # fmt: skip
    est = estimate_ranks(spec_from_config(CONFIG, name="llama"), setup, par).role("all ranks").estimate
    peak = next(p for p in est.phases if p.phase is Phase.BACKWARD)
    return {i.key: i.bytes for i in peak.items}


def test_fsdp1_backward_peak_holds_the_root_gradients_and_their_cat() -> None:
    items = _backward(FSDP1)
    head, norm, embed = 4 * V * H, 4 * H, 4 * V * H  # fp32 gradients as written
    assert items["fsdp.root_grads"] == head + norm  # held from the head's backward, whole
    assert items["fsdp1.root_cat"] == head + norm + embed  # the flat gradient of the root unit
    assert items["fsdp.root"] == head + norm + embed  # its unsharded parameters (fp32)
    assert "fsdp.units" not in items and "fsdp.reduce_scatter" not in items  # resharded by then
