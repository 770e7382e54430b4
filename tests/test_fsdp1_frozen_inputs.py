"""FSDP1 frozen layer units under reentrant checkpointing (peakmem.formulas.fsdp1_frozen_inputs): each layer's
input and its gradient live from its backward to the end of backward; one layer unit gathered at a layer's
backward peak. Hand-derived on tiny specs; the mechanism itself: test_fsdp1_frozen_inputs_torch.py."""

from __future__ import annotations

import json
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

import peakmem
from peakmem.formulas.fsdp1_frozen_inputs import (
    backward_units,
    incoming_gradient,
    keeps_layer_inputs,
    kept_per_layer,
    one_layer_unit,
)
from peakmem.formulas.timeline import GroupCost, backward_peak
from peakmem.parallel import AdapterWrap, FsdpMode, Parallelism
from peakmem.training import Checkpointing
from peakmem.transformers_versions import TRANSFORMERS_CURRENT, release_facts

FSDP1 = Parallelism(gpus=2, fsdp=FsdpMode.FULL_SHARD, fsdp_version=1)


def test_when_inputs_are_kept() -> None:
    full = Checkpointing.FULL
    assert keeps_layer_inputs(FSDP1, True, full, True)
    assert not keeps_layer_inputs(FSDP1, False, full, True)  # full fine-tuning: the flat params need grad
    assert not keeps_layer_inputs(FSDP1, True, full, False)  # non-reentrant: no detached leaf inputs
    assert not keeps_layer_inputs(FSDP1, True, Checkpointing.SELECTIVE, True)
    in_layer = Parallelism(
        gpus=2, fsdp=FsdpMode.FULL_SHARD, fsdp_version=1, fsdp_adapter_wrap=AdapterWrap.IN_LAYER
    )
    assert not keeps_layer_inputs(in_layer, True, full, True)  # adapters inside: the unit needs grad
    fsdp2 = Parallelism(gpus=2, fsdp=FsdpMode.FULL_SHARD, fsdp_version=2)
    assert not keeps_layer_inputs(fsdp2, True, full, True)
    assert not keeps_layer_inputs(Parallelism(gpus=2), True, full, True)
    assert kept_per_layer(1000) == 2000  # the input and its gradient
    assert one_layer_unit(FSDP1, True)
    assert not one_layer_unit(FSDP1, False) and not one_layer_unit(in_layer, True)


def test_reentrant_before_transformers_5() -> None:
    assert release_facts("4.48.1").reentrant_checkpointing and release_facts("4.57.1").reentrant_checkpointing
    assert release_facts("4.30.0").reentrant_checkpointing
    assert not release_facts("5.0.0").reentrant_checkpointing
    assert not release_facts(TRANSFORMERS_CURRENT).reentrant_checkpointing


def test_kept_by_hand() -> None:
    """4 layers, checkpoint 10 B each, kept 20 B each (input + gradient), 10 B of it the incoming gradient
    the running layer's transient counts; transient 5, recompute 3. At the top layer: 40 + 5 + 3 = 48. At
    the bottom one (3 done): 10 left + 3 x 20 - 10 kept + 5 + 3 = 68. After the last: the 4 x 20 kept, 80."""
    g = GroupCost(count=4, saved=10, grads=0, backward_transient=5, recompute=3, kept=20)
    args = dict(base_saved=0, head_saved=0, start_extra=0, start_grads=0, tail_grads=0, grads_resident=False)
    incoming = incoming_gradient((g,))
    bp = backward_peak((g,), tail_extra=0, kept_in_transient=incoming, **args)  # type: ignore[arg-type]
    assert (bp.bytes, bp.layers_done, bp.kept) == (80, 4, 80)
    bp = backward_peak((g,), tail_extra=-13, kept_in_transient=10, **args)  # type: ignore[arg-type]
    assert (bp.bytes, bp.layers_done, bp.kept) == (68, 3, 50)
    plain = GroupCost(count=4, saved=10, grads=0, backward_transient=5, recompute=3)
    bp = backward_peak((plain,), tail_extra=0, kept_in_transient=10, **args)  # type: ignore[arg-type]
    assert (bp.bytes, bp.layers_done, bp.kept) == (48, 0, 0)


def walk(groups: tuple[GroupCost, ...], incoming: int, tail: int) -> int:
    """Layer by layer: what the layers done keep, less the incoming gradient the running one counts."""
    layers = [g for g in groups for _ in range(g.count)]
    act, kept, best = sum(g.saved for g in layers), 0, 0
    best = act
    for i, g in enumerate(layers):
        best = max(best, act + g.backward_transient + g.recompute + kept - (min(kept, incoming) if i else 0))
        act -= g.saved
        kept += g.kept
    return max(best, act + kept + tail)


group = st.builds(
    GroupCost, count=st.integers(1, 20), saved=st.integers(0, 10**5), grads=st.just(0),
    backward_transient=st.integers(0, 10**6), recompute=st.integers(0, 10**5), kept=st.integers(0, 10**5),
)  # fmt: skip


@settings(max_examples=100, deadline=None)
@given(
    groups=st.lists(group, min_size=1, max_size=3), incoming=st.integers(0, 10**5), tail=st.integers(0, 10**5)
)
def test_closed_form_equals_layer_walk(groups: list[GroupCost], incoming: int, tail: int) -> None:
    got = backward_peak(
        tuple(groups), base_saved=0, head_saved=0, start_extra=0, start_grads=0, tail_extra=tail,
        tail_grads=0, grads_resident=False, kept_in_transient=incoming,
    )  # fmt: skip
    assert got.bytes == walk(tuple(groups), incoming, tail)


def test_units_item_halved() -> None:
    from peakmem.breakdown import Category, MemoryItem

    units = MemoryItem(path="u", category=Category.PARAMETERS, bytes=200, source="s", key="fsdp.units")
    root = MemoryItem(path="r", category=Category.PARAMETERS, bytes=7, source="s", key="fsdp.root")
    assert [i.bytes for i in backward_units((root, units), FSDP1, True, 8)] == [7, 100]
    assert [i.bytes for i in backward_units((root, units), FSDP1, False, 8)] == [7, 200]
    assert [i.bytes for i in backward_units((root, units), FSDP1, True, 1)] == [7, 200]  # one layer: one unit


LLAMA = {
    "model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 256, "hidden_size": 64,
    "intermediate_size": 224, "num_hidden_layers": 6, "num_attention_heads": 4, "num_key_value_heads": 1,
    "max_position_embeddings": 512, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
}  # fmt: skip


def test_tiny_llama_lora_fsdp1(tmp_path: Path) -> None:
    """LoRA on a bf16 6-layer Llama, FSDP1 on 2 GPUs, 2 x 128 tokens: with transformers 4.48.1 the kept item
    is (2 x done - 1) layer inputs of 2 x 128 x 64 x 2 B = 32,768 B (the checkpoints of the layers done and
    all but the incoming one of their gradients); transformers 5.0 (non-reentrant) keeps none."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps(LLAMA))
    opts = dict(method="lora", precision="bf16", batch=2, seq=128, checkpointing="full", gpus=2,
                fsdp="full-shard", fsdp_version=1, lora_rank=8,
                lora_targets="q_proj,k_proj,v_proj,o_proj")  # fmt: skip
    old = peakmem.train(str(path), transformers="4.48.1", **opts).data  # type: ignore[arg-type]
    new = peakmem.train(str(path), transformers="5.0.0", **opts).data  # type: ignore[arg-type]
    done = old["backward_peak_layers_done"]
    layer_input = 2 * 128 * 64 * 2
    kept = [i["bytes"] for i in old["items"] if i["path"].startswith("FSDP1 frozen units")]
    assert done >= 1 and kept == [(2 * done - 1) * layer_input]
    assert not [i for i in new["items"] if i["path"].startswith("FSDP1 frozen units")]
    assert old["peak_allocated_bytes"] > new["peak_allocated_bytes"]
    assert [i for i in old["items"] if i["path"].startswith("FSDP all-gathered unit (the running layer")]
