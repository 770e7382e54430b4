"""SGLang's own defaults (peakmem/sglang_defaults.py: sglang 0.5.5 server_args.py
``_handle_gpu_memory_settings``), derived by hand: gpu_mem is nvidia-smi's total in MiB; the tier gives
chunked_prefill_size and cuda_graph_max_bs (the second at tp >= 4); the reserve is 512 + 1.5 x max(chunk,
2048) + 2 x max_bs + tp x pp x 1024 / 8 MiB (+ 3 and 1.5 x max_bs x dp with DP attention), at least 10 GiB
above 60 GiB, + 2 GiB EAGLE / 6 GiB standalone; mem_fraction_static = round((gpu_mem - reserve) / gpu_mem,
3)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from _infer_specs import tiny
from peakmem.errors import InputError
from peakmem.formulas.serving.sglang_graphs import sglang_capture
from peakmem.inference import Draft, InferenceSetup
from peakmem.sglang_defaults import sglang_defaults
from peakmem.units import MiB

H100, H200, RTX_4090, A100_40 = 81_559 * MiB, 143_771 * MiB, 24_564 * MiB, 40_536 * MiB  # nvidia-smi totals


def _figures(gpu_bytes: int | None, **kw: object) -> tuple[int, int, float | None, float]:
    d = sglang_defaults(gpu_bytes, **kw)  # type: ignore[arg-type]
    return d.chunked_prefill_size, d.cuda_graph_max_bs, d.reserved_mib, d.mem_fraction_static


def test_the_tiers_by_gpu_and_tp() -> None:
    # H100 tp 1 (below 90 GiB): 8192, 256; 512 + 12,288 + 512 + 128 = 13,440 MiB; 68,119 / 81,559 = 0.8352
    assert _figures(H100) == (8192, 256, 13_440, 0.835)
    # H200 tp 8 (below 160 GiB, tp >= 4): 8192, 512; 512 + 12,288 + 1,024 + 1,024 = 14,848; 128,923 / 143,771
    assert _figures(H200, tp=8) == (8192, 512, 14_848, 0.897)
    # RTX 4090 tp 2 (below 35 GiB): 2048, 24; 512 + 3,072 + 48 + 256 = 3,888 (no floor); 20,676 / 24,564
    assert _figures(RTX_4090, tp=2) == (2048, 24, 3_888, 0.842)
    # A100-40GB tp 4 (below 60 GiB, tp >= 4): 4096, 160; 512 + 6,144 + 320 + 512 = 7,488; 33,048 / 40,536
    assert _figures(A100_40, tp=4) == (4096, 160, 7_488, 0.815)
    # no GPU known: 4096, 160 and 0.88
    assert _figures(None) == (4096, 160, None, 0.88)


def test_speculation_dp_attention_pp_and_the_floor() -> None:
    # EAGLE on an H100: 13,440 + 2,048 = 15,488 MiB; 66,071 / 81,559 = 0.8101; n-gram adds nothing
    assert _figures(H100, draft_method="eagle")[2:] == (15_488, 0.81)
    assert _figures(H100, draft_method="ngram")[2:] == (13_440, 0.835)
    # H200 tp 8 with DP attention over 8: + 512 x 8 x 3 + 512 x 8 x 1.5 (max bs 512 > 300) = 18,432 MiB
    assert _figures(H200, tp=8, dp=8, dp_attention=True)[2:] == (33_280, 0.769)
    # pp 2 at tp 2: 512 + 12,288 + 512 + 512 = 13,824; max bs by tp alone (256); 67,735 / 81,559 = 0.83050
    assert _figures(H100, tp=2, pp=2)[1:] == (256, 13_824, 0.831)
    # given values enter the reserve; above 60 GiB it is at least 10 GiB: 512 + 3,072 + 16 + 128 = 3,728
    assert _figures(H100, chunked_prefill_size=2048, cuda_graph_max_bs=8) == (2048, 8, 10_240, 0.874)
    # a given fraction is kept as is
    assert _figures(H100, mem_fraction_static=0.7) == (8192, 256, None, 0.7)
    with pytest.raises(InputError, match=r"^tp="):
        sglang_defaults(H100, tp=0)


def test_the_setup_and_the_graph_term_follow_the_gpu() -> None:
    """InferenceSetup passes its layout and draft; SGLang's runner captures up to the GPU's max bs."""
    eagle = Draft(name="head", spec=tiny(), method="eagle")
    setup = InferenceSetup(engine="sglang", context=1024, tp=2, draft=eagle, num_speculative_tokens=3)  # type: ignore[arg-type]
    # RTX 4090 tp 2 with EAGLE: 3,888 + 2,048 = 5,936 MiB; 18,628 / 24,564 = 0.7583
    assert setup.memory_fraction(RTX_4090) == 0.758
    plain = InferenceSetup(engine="sglang", context=1024)  # type: ignore[arg-type]
    spec = tiny(max_pos=1024, hidden=128, heads=8, kv_heads=8)

    def largest(s: InferenceSetup) -> int:
        return max(sglang_capture(spec, s, act_bytes=2).capture_bs)

    assert largest(plain) == 160  # no GPU: SGLang's fallback
    assert largest(replace(plain, gpu_bytes=RTX_4090)) == 24
    assert largest(replace(plain, gpu_bytes=H200, tp=8)) == 512
    assert largest(replace(plain, gpu_bytes=H200, cuda_graph_max_bs=32)) == 32  # --cuda-graph-max-bs wins
