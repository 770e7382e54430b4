"""transformers' SDPA path and GQA k/v (peakmem.transformers_versions.sdpa_repeats_kv, profiles.profile_of):
which releases and masks copy k/v to every head, and the bytes, hand-derived on the tiny GQA Llama."""

from __future__ import annotations

import pytest

from peakmem.formulas.activations import causal_mask_bytes, shapes
from peakmem.formulas.activations.attention import attention_terms
from peakmem.formulas.activations.layer import padding_mask_items
from peakmem.formulas.profiles import PROFILES, profile_of
from peakmem.hf import spec_from_config
from peakmem.training import Framework, KernelPolicy, TrainingSetup
from peakmem.transformers_versions import release_facts, sdpa_repeats_kv
from tiny_models import LLAMA

B, S = 2, 32
A, G, D = 4, 2, 16  # LLAMA: 4 heads, 2 kv heads, head size 64 / 4
C = 2  # bf16


@pytest.mark.parametrize(
    ("version", "masked", "repeats"),
    [
        ("4.36.0", False, True),  # per-model *SdpaAttention: repeat_kv
        ("4.48.1", False, True),  # integrations/sdpa_attention.py: repeat_kv always
        ("4.53.0", False, True),
        ("4.54.0", False, False),  # use_gqa_in_sdpa: enable_gqa without a mask
        ("4.54.0", True, True),
        ("4.57.1", False, False),
        ("5.23.0", False, False),
        ("5.23.0", True, True),
    ],
)
def test_which_releases_and_masks_repeat(version: str, masked: bool, repeats: bool) -> None:
    assert sdpa_repeats_kv(version, masked) is repeats


def test_padding_mask_is_boolean_from_4_53() -> None:
    assert [release_facts(v).bool_padding_mask for v in ("4.48.1", "4.52.1", "4.53.0", "5.23.0")] == [
        False, False, True, True,
    ]  # fmt: skip


def _setup(version: str, *, padded: bool = False, batch: int = B, **kw: object) -> TrainingSetup:
    kw.setdefault("kernel_policy", KernelPolicy.CPU)
    return TrainingSetup(
        precision="bf16", micro_batch=batch, seq_len=S, transformers=version,
        padded_lengths="varying" if padded else "fixed", **kw,
    )  # type: ignore[arg-type]  # fmt: skip


def test_profile_of() -> None:
    hf = PROFILES[Framework.HF]
    assert profile_of(_setup("5.23.0")) is hf
    assert profile_of(_setup("5.23.0", padded=True, batch=1)) is hf  # one row: nothing padded
    assert profile_of(_setup("5.23.0", padded=True)).padding_mask
    old = profile_of(_setup("4.48.1", padded=True))
    assert old.sdpa_call_repeats_kv and old.float_padding_mask
    assert profile_of(_setup("4.48.1", framework="torchtune")) is PROFILES[Framework.TORCHTUNE]


def _terms(setup: TrainingSetup) -> tuple[dict[str, int], int, int]:
    spec = spec_from_config(LLAMA, name="t")
    sh = shapes(spec, setup)
    items = attention_terms(spec, spec.first_layer, sh)[0]
    extra = sum(i.bytes for i in padding_mask_items(spec, sh))
    return {i.key: i.bytes for i in items}, causal_mask_bytes(spec, sh), extra


def test_repeated_kv_bytes_by_release_and_mask() -> None:
    t = B * S
    own = t * (A * D + 2 * G * D) * C  # q, and k, v at their 2 heads
    every = t * 3 * A * D * C  # k, v copied to the 4 heads
    new, mask, extra = _terms(_setup("5.23.0"))
    assert (new["attn.qkv"], mask, extra, "attn.sdpa_bias" in new) == (own, 0, 0, False)
    old, mask, extra = _terms(_setup("4.48.1"))
    assert (old["attn.qkv"], mask, extra) == (every, 0, 0)
    # 5.23 padded: repeat_kv, the boolean B x 1 x S x S mask, made additive (bf16) at the call
    padded, mask, extra = _terms(_setup("5.23.0", padded=True))
    assert (padded["attn.qkv"], padded["attn.sdpa_bias"], mask, extra) == (every, B * S * S * C, B * S * S, 0)
    # 4.48.1 padded: one additive bf16 mask for all layers, nothing made additive per call
    padded, mask, extra = _terms(_setup("4.48.1", padded=True))
    assert (padded["attn.qkv"], "attn.sdpa_bias" in padded, mask, extra) == (every, False, 0, B * S * S * C)


def test_flash_attn_never_repeats() -> None:
    got, _, _ = _terms(_setup("4.48.1", attention="flash", kernel_policy=KernelPolicy.CUDA))
    assert sum(v for k, v in got.items() if k.startswith("attn.q")) == B * S * (A * D + 2 * G * D) * C
