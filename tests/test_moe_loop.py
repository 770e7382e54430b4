"""transformers 4.x gpt-oss experts in training (peakmem.formulas.moe_loop): the loop's weight copies and
full-size per-expert gradients, by hand, measured on the CPU, and in a gpt-oss-20b estimate."""

from __future__ import annotations

from typing import Any

import pytest

from peakmem.formulas import moe_loop
from peakmem.transformers_versions import gpt_oss_expert_loop


def test_formulas_by_hand() -> None:
    assert moe_loop.experts_hit(32, 4096, 4) == 32
    assert moe_loop.experts_hit(32, 3, 4) == 12  # 12 routed rows reach 12 experts at most
    gate_up, down = moe_loop.expert_tensors(4, 8, 16, 2)
    assert (gate_up, down) == (4 * 8 * 32 * 2, 4 * 16 * 8 * 2)
    assert moe_loop.index_copies(3, 8, 16, 2) == 3 * (8 * 32 + 16 * 8) * 2
    # two gate_up-sized tensors and the down sum alive; the first two experts' copies freed
    net, freed, grads = moe_loop.loop_backward(1000, 500, 30)
    assert (freed, grads) == (60, 1500)
    assert net == 1000 + 1500 - 60
    assert moe_loop.loop_backward(1000, 500, 0) == (2500, 0, 1500)  # 4.56 on: views, no copies


@pytest.mark.parametrize(
    ("version", "style"),
    [("4.55.0", "index"), ("4.55.4", "index"), ("4.56.0", "select"), ("4.57.1", "select"), ("5.0.0", None),
     ("5.23.0", None)],
)  # fmt: skip
def test_release_facts(version: str, style: str | None) -> None:
    assert gpt_oss_expert_loop(version) == style


E, H, W, T, K = 4, 128, 64, 32, 2  # experts, hidden, expert width, tokens, top-k: every expert hit


def _loop(
    hs: Any, w1: Any, b1: Any, w2: Any, b2: Any, router_indices: Any, routing_weights: Any, select: bool
) -> Any:
    """transformers 4.55.0 models/gpt_oss/modeling_gpt_oss.py GptOssExperts.forward l. 93-114 (training);
    ``select``: 4.56.0 l. 98-120 (``expert_idx = expert_idx[0]``, a 0-d index: views, not copies)."""
    import torch

    next_states = torch.zeros_like(hs)
    with torch.no_grad():
        mask = torch.nn.functional.one_hot(router_indices, num_classes=E).permute(2, 1, 0)
        hit = torch.greater(mask.sum(dim=(-1, -2)), 0).nonzero()
    for expert_idx in hit[:]:
        if select:
            expert_idx = expert_idx[0]
        with torch.no_grad():
            _, token_idx = torch.where(mask[expert_idx if select else expert_idx[0]])
        gate_up = hs[token_idx] @ w1[expert_idx] + b1[expert_idx]
        gate, up = gate_up[..., ::2], gate_up[..., 1::2]
        gate, up = gate.clamp(min=None, max=7.0), up.clamp(min=-7.0, max=7.0)
        glu = gate * torch.sigmoid(gate * 1.702)
        out = ((up + 1) * glu) @ w2[expert_idx] + b2[expert_idx]
        out = out if select else out[0]
        weighted = out * routing_weights[token_idx, expert_idx, None]
        next_states.index_add_(0, token_idx, weighted.to(hs.dtype))
    return next_states


MARK = 12_345  # a uint8 tensor of this size marks the end of forward among the profiler's memory events


def _measure(select: bool) -> tuple[int, int]:
    """(bytes saved at the end of forward, most alive in backward), both above the inputs and weights, from
    the profiler's ``[memory]`` events (each allocation and free, in order; kineto's raw results). Not under
    a dispatch mode such as peakmem's storage tracker: with one active, ATen's ``isTensorSubclassLike`` is
    true, so the engine sums gradients out of place (input_buffer.cpp ``accumulate``) and
    ``index_backward`` takes ``index_put`` over ``_index_put_impl_``: one more full-size tensor than a
    plain run has."""
    torch = pytest.importorskip("torch")
    from torch.profiler import ProfilerActivity, profile

    torch.manual_seed(0)
    bf16 = torch.bfloat16
    x = torch.randn(T, H, dtype=bf16, requires_grad=True)
    ri = torch.stack([torch.randperm(E)[:K] for _ in range(T)])
    w1 = torch.randn(E, H, 2 * W, dtype=bf16, requires_grad=True)
    b1 = torch.randn(E, 2 * W, dtype=bf16, requires_grad=True)
    w2 = torch.randn(E, W, H, dtype=bf16, requires_grad=True)
    b2 = torch.randn(E, H, dtype=bf16, requires_grad=True)
    rw = torch.zeros(T, E, dtype=bf16).scatter_(1, ri, torch.full((T, K), 0.5, dtype=bf16))
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        y = _loop(x, w1, b1, w2, b2, ri, rw, select)
        mark = torch.empty(MARK, dtype=torch.uint8)
        del mark
        y.sum().backward()
    events = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events()
                    if e.name() == "[memory]")  # fmt: skip
    live = peak = saved = 0
    for _, nbytes in events:
        if abs(nbytes) == MARK:  # the mark itself: its allocation is the end of forward
            saved = saved or live
            continue
        live += nbytes
        peak = max(peak, live)
    return saved, peak


@pytest.mark.torch
def test_loop_measured_on_the_cpu() -> None:
    """4.55.0's loop saves a copy of every hit expert's weights (the formula to the byte, beside the 4.56
    loop's saved tensors, plus the 1-element index of each expert's routing weights); both loops' backward
    peak is the formula's (two gate_up-sized tensors, the down sum, the copies not yet freed) within two
    T x H tensors: the routed rows' gradients alive there, less their saved tensors already freed."""
    saved_index, peak_index = _measure(select=False)
    saved_select, peak_select = _measure(select=True)
    copies = moe_loop.index_copies(E, H, W, 2)
    assert 0 <= saved_index - saved_select - copies <= 8 * E
    gate_up, down = moe_loop.expert_tensors(E, H, W, 2)
    slack = 2 * T * H * 2
    for saved, peak, per_expert in ((saved_index, peak_index, copies // E), (saved_select, peak_select, 0)):
        net, _, _ = moe_loop.loop_backward(gate_up, down, per_expert)
        assert abs(peak - (saved + net)) <= slack


def _peak(version: str, checkpointing: str = "full") -> tuple[int, dict[str, int]]:
    import peakmem

    est = peakmem.train("gpt-oss-20b", method="full", precision="bf16", optimizer="adamw", batch=1, seq=512,
                        checkpointing=checkpointing, attention="flash", transformers=version)  # fmt: skip
    items = {i["path"]: i["bytes"] for i in est.data["items"]}
    return est.data["peak_allocated_bytes"], items


def test_gpt_oss_estimate_by_release() -> None:
    """gpt-oss-20b (32 experts, H = I = 2,880): without checkpointing 4.55.0 saves the copies in every layer
    (32 x (H x 2I + I x H) x 2 B each); 4.56.0-4.57.x saves none, but its backward holds the loop's peak,
    more than the grouped_mm experts' of 5.0.0 on (what the derived block measured)."""
    _, items = _peak("4.55.0", checkpointing="none")
    copies = [b for p, b in items.items() if "weight copy, saved by its matmuls" in p]
    assert len(copies) == 23  # at the peak layer 23 is in backward (its saved tensors folded in one item)
    assert set(copies) == {moe_loop.index_copies(32, 2880, 2880, 2)}
    p457, items = _peak("4.57.1")
    assert not any("weight copy" in p for p in items)
    p500, _ = _peak("5.0.0")
    assert p457 > p500
