"""SGLang speculative decoding (formulas/serving/sglang_spec.py): the draft's weights and KV pool
against mem_fraction_static, before and after sglang PR #23862, derived by hand on tiny specs."""

from __future__ import annotations

import pytest

from _infer_specs import tiny
from peakmem.errors import InputError
from peakmem.formulas.serving import estimate_inference
from peakmem.formulas.serving.fit import serving_fit
from peakmem.inference import Draft, InferenceSetup
from peakmem.sglang_defaults import sglang_defaults
from peakmem.units import GiB

# target tiny(): 2 layers x (K, V) x 2 KV heads x 16 x bf16 = 256 B per token (one-token pages)
TARGET_CELL = 2 * 2 * 2 * 16 * 2
# draft: 1 layer, 1 KV head of 16: 64 B per token; its weights as in tests/test_speculative.py
DRAFT_CELL = 1 * 2 * 1 * 16 * 2
DRAFT_WEIGHT_BYTES = 35_008
K = 2
# draft_runner_cache_size's headroom: 48 requests x (K steps x topk 1 + K + 1 verify tokens) + 100
HEADROOM = 48 * K * 1 + 48 * (K + 1) + 100


def _draft() -> Draft:
    return Draft(
        name="tiny-draft", spec=tiny(layers=1, hidden=32, heads=2, kv_heads=1, head_dim=16, inter=64)
    )


def _sglang(version: str, fraction: float = 0.5, **kw: object) -> InferenceSetup:
    return InferenceSetup(engine="sglang", gpu_bytes=1 * GiB, context=1024, enforce_eager=True,
                          gpu_memory_utilization=fraction, engine_version=version, **kw)  # type: ignore[arg-type]  # fmt: skip


def _pool(version: str) -> int:
    pool = estimate_inference(tiny(max_pos=2048), _sglang(version)).extra["kv_pool_bytes"]
    assert isinstance(pool, int)
    return pool


def test_before_pr_23862_the_draft_is_allocated_past_the_budget() -> None:
    assert HEADROOM == 340
    pool = _pool("0.5")  # budget less the target's weights
    est = estimate_inference(tiny(max_pos=2048), _sglang("0.5", draft=_draft(), num_speculative_tokens=K))
    e = est.extra
    assert e["kv_pool_bytes"] == pool  # the target profiles alone
    tokens = pool // TARGET_CELL
    assert e["sglang_pool_tokens"] == tokens and e["sglang_draft_headroom_tokens"] == HEADROOM
    assert e["sglang_draft_cache_tokens"] == tokens + HEADROOM
    # past the budget: both pools' headroom, the draft's weights and its whole pool
    beyond = HEADROOM * (TARGET_CELL + DRAFT_CELL) + DRAFT_WEIGHT_BYTES + tokens * DRAFT_CELL
    assert e["sglang_beyond_budget_bytes"] == beyond
    # the pool holds the target's KV only: as many 1024-token sequences as without a draft
    assert e["max_concurrent_sequences"] == pool // (1024 * TARGET_CELL)


def test_from_the_budgeted_release_one_budget_holds_both() -> None:
    pool = _pool("0.6")
    e = estimate_inference(tiny(max_pos=2048), _sglang("0.6", draft=_draft(), num_speculative_tokens=K)).extra
    assert e["kv_pool_bytes"] == pool - DRAFT_WEIGHT_BYTES
    tokens = (pool - DRAFT_WEIGHT_BYTES) // (TARGET_CELL + DRAFT_CELL)
    assert e["sglang_pool_tokens"] == tokens
    assert e["sglang_beyond_budget_bytes"] == HEADROOM * (TARGET_CELL + DRAFT_CELL)
    assert e["max_concurrent_sequences"] == (pool - DRAFT_WEIGHT_BYTES) // (1024 * (TARGET_CELL + DRAFT_CELL))


def test_an_oversized_launch_does_not_fit() -> None:
    # fraction 0.99 of 1 GiB leaves 10.7 MB; the draft's pool of ~4 M tokens x 64 B does not fit there
    setup = _sglang("0.5", fraction=0.99, draft=_draft(), num_speculative_tokens=K)
    fit = serving_fit(tiny(max_pos=2048), setup, 1 * GiB)
    assert not fit.fits and fit.headroom_bytes < 0
    assert any(n.startswith("does not launch") for n in fit.estimate.assumptions)
    assert serving_fit(tiny(max_pos=2048), _sglang("0.6", fraction=0.99, draft=_draft(),
                                                   num_speculative_tokens=K), 1 * GiB).fits  # fmt: skip


def test_default_fraction_reserves_for_the_draft() -> None:
    # 80 GiB (A100/H100 tier), tp 1: reserve 512 + 8192 x 1.5 + 256 x 2 + 128 = 13,440 MiB; then +2 GiB for
    # the EAGLE family, +6 GiB standalone, nothing for n-gram (server_args.py 0.5.5)
    def fraction(method: str | None) -> float:
        return sglang_defaults(80 * GiB, draft_method=method).mem_fraction_static

    assert fraction(None) == round((81920 - 13440) / 81920, 3) == 0.836
    assert fraction("eagle3") == round((81920 - 15488) / 81920, 3) == 0.811
    assert fraction("draft_model") == round((81920 - 19584) / 81920, 3) == 0.761
    assert fraction("ngram") == 0.836
    lookup = Draft(name="ngram", spec=None, method="ngram")
    ngram = InferenceSetup(engine="sglang", context=1024, draft=lookup, num_speculative_tokens=K)
    assert "sglang_pool_tokens" not in estimate_inference(tiny(), ngram).extra
    with pytest.raises(InputError, match=r"^num_speculative_tokens="):
        InferenceSetup(engine="sglang", context=1024, draft=_draft())


def test_mtp_and_eagle3_drafts_load_their_own_embedding_first() -> None:
    """SGLang builds an MTP / EAGLE draft with its own embedding and head (EAGLE-3: the embedding; its
    draft-vocabulary head stays) and points them at the target's only after the draft worker's weights
    and KV pool exist (eagle_worker.py set_embed_and_head): by hand on tiny() (vocabulary 128, already a
    multiple of 64; hidden 64; bf16), per tensor-parallel rank; before the budgeted release they add to
    what launch allocates past mem_fraction_static."""
    from peakmem.formulas.serving.speculative import mtp_draft_spec

    target = tiny(max_pos=2048)
    mtp = Draft(name="mtp", spec=mtp_draft_spec(target, 1), method="mtp")
    copy = 128 * 64 * 2  # one vocab x hidden bf16 tensor
    old, new = (estimate_inference(target, _sglang(v, draft=mtp, num_speculative_tokens=K)).extra
                for v in ("0.5", "0.6"))  # fmt: skip
    assert old["sglang_draft_load_copies_bytes"] == new["sglang_draft_load_copies_bytes"] == 2 * copy
    without = old["sglang_beyond_budget_bytes"] - 2 * copy  # the same launch with the copies left out
    assert without == (HEADROOM * (TARGET_CELL + DRAFT_CELL * 2)  # the MTP layer's cell: 2 KV heads
                       + old["draft_weight_bytes"] + old["sglang_pool_tokens"] * DRAFT_CELL * 2)  # fmt: skip
    assert new["sglang_beyond_budget_bytes"] == HEADROOM * (TARGET_CELL + DRAFT_CELL * 2)  # inside the budget
    tp2 = estimate_inference(target, _sglang("0.5", draft=mtp, num_speculative_tokens=K, tp=2)).extra
    assert tp2["sglang_draft_load_copies_bytes"] == copy  # vocabulary-parallel: half a copy each, twice
    eagle3 = Draft(name="e3", spec=_draft().spec, method="eagle3", draft_vocab_size=32)
    e3 = estimate_inference(target, _sglang("0.5", draft=eagle3, num_speculative_tokens=K)).extra
    assert e3["sglang_draft_load_copies_bytes"] == 128 * 32 * 2  # its embedding only (hidden 32)
    assert (
        "sglang_draft_load_copies_bytes"
        not in estimate_inference(target, _sglang("0.5", draft=_draft(), num_speculative_tokens=K)).extra
    )  # a separate draft model keeps its own
