"""Speculative decoding (formulas/serving/speculative.py): a draft model's weights and KV cache next
to the target's, derived by hand on tiny specs."""

from __future__ import annotations

from dataclasses import replace

import pytest

import peakmem
from _infer_specs import infer_cli_equals_api, tiny
from peakmem.cli import main
from peakmem.errors import InputError
from peakmem.formulas.serving import estimate_inference, max_concurrent
from peakmem.formulas.serving.speculative import mtp_draft_spec
from peakmem.inference import Draft, InferenceSetup
from peakmem.units import GiB

# target tiny(): 2 layers x (K, V) x 2 KV heads x 16 x bf16 = 256 B per token
TARGET_KV_PER_TOKEN = 2 * 2 * 2 * 16 * 2
# draft: 1 layer, hidden 32, 2 heads / 1 KV head of 16, MLP 64 (gated), vocab 128, untied head
DRAFT_KV_PER_TOKEN = 1 * 2 * 1 * 16 * 2
# q, k, v, o; gate, up, down; 2 norms
DRAFT_LAYER_PARAMS = 32 * 32 + 32 * 16 + 32 * 16 + 32 * 32 + 3 * 32 * 64 + 2 * 32
DRAFT_PARAMS = 128 * 32 + 32 * 128 + 32 + DRAFT_LAYER_PARAMS  # embeddings, head, final norm, the layer
DRAFT_WEIGHT_BYTES = DRAFT_PARAMS * 2  # bf16: the target's compute dtype (vLLM's rule)
GPU = 1 * GiB
BLOCK = 16


def _draft(vocab: int = 128) -> Draft:
    return Draft(name="tiny-draft", spec=tiny(layers=1, hidden=32, heads=2, kv_heads=1, head_dim=16,
                                             inter=64, vocab=vocab))  # fmt: skip


def _vllm(**kw: object) -> InferenceSetup:
    # eager: vLLM 0.21+'s CUDA graphs (86 x 6 MiB at its defaults, more with speculative tokens) would take
    # this 1 GiB GPU's whole KV pool; they have their own tests (tests/test_cuda_graphs.py)
    return InferenceSetup(engine="vllm", gpu_bytes=GPU, context=1024, enforce_eager=True, **kw)  # type: ignore[arg-type]


def _blocks(tokens: int) -> int:
    return -(-tokens // BLOCK) * BLOCK


def test_draft_weights_by_hand() -> None:
    assert DRAFT_WEIGHT_BYTES == 35_008
    est = estimate_inference(tiny(), _vllm(draft=_draft(), num_speculative_tokens=2))
    rows = {i.path: i.bytes for i in est.items}
    assert rows["draft weights (tiny-draft, bf16)"] == DRAFT_WEIGHT_BYTES
    assert est.extra["draft_weight_bytes"] == DRAFT_WEIGHT_BYTES
    # fp16 target weights: vLLM loads the draft in the target's dtype
    fp16 = estimate_inference(tiny(), _vllm(weights="fp16", draft=_draft(), num_speculative_tokens=2))
    assert {i.path: i.bytes for i in fp16.items}["draft weights (tiny-draft, fp16)"] == DRAFT_WEIGHT_BYTES


def test_the_pool_shrinks_by_the_draft_weights_and_holds_target_plus_draft_kv() -> None:
    spec = tiny(max_pos=2048)
    base = estimate_inference(spec, _vllm())
    spec_dec = estimate_inference(spec, _vllm(draft=_draft(), num_speculative_tokens=2, batch=3))
    pool = base.extra["kv_pool_bytes"]
    assert isinstance(pool, int)
    assert spec_dec.extra["kv_pool_bytes"] == pool - DRAFT_WEIGHT_BYTES
    # one sequence: 1024 tokens + 2 lookahead slots = 1026 -> 65 blocks of 16 = 1040 tokens
    per_seq = _blocks(1024 + 2) * (TARGET_KV_PER_TOKEN + DRAFT_KV_PER_TOKEN)
    assert per_seq == 1040 * 320
    assert spec_dec.extra["kv_bytes_per_sequence"] == per_seq
    assert spec_dec.extra["draft_kv_bytes_per_token"] == DRAFT_KV_PER_TOKEN
    assert spec_dec.extra["max_concurrent_sequences"] == (pool - DRAFT_WEIGHT_BYTES) // per_seq
    assert base.extra["max_concurrent_sequences"] == pool // (1024 * TARGET_KV_PER_TOKEN)
    # a block costs the target's layers and the draft's
    assert spec_dec.extra["kv_pool_blocks"] == (pool - DRAFT_WEIGHT_BYTES) // (BLOCK * 320)
    rows = {i.path: i.bytes for i in spec_dec.items}
    assert rows["draft kv cache (1024 + 2 lookahead tokens x 3, same pool)"] == 3 * 1040 * DRAFT_KV_PER_TOKEN
    assert rows["kv cache (1024 + 2 lookahead tokens x 3, 16-token blocks)"] == 3 * 1040 * TARGET_KV_PER_TOKEN


def test_fit_infer_counts_sequences_with_the_draft() -> None:
    spec = tiny(max_pos=2048)
    setup = _vllm(draft=_draft(), num_speculative_tokens=4)
    pool = estimate_inference(spec, _vllm()).extra["kv_pool_bytes"]
    assert isinstance(pool, int)
    per_seq = _blocks(1024 + 4) * (TARGET_KV_PER_TOKEN + DRAFT_KV_PER_TOKEN)
    assert max_concurrent(spec, setup, GPU) == (pool - DRAFT_WEIGHT_BYTES) // per_seq


def test_assisted_generation_holds_the_assistant_and_its_cache() -> None:
    spec = tiny()
    base = estimate_inference(spec, InferenceSetup(engine="hf", context=512))
    est = estimate_inference(spec, InferenceSetup(engine="hf", context=512, draft=_draft()))
    decode = {i.path: i.bytes for i in est.phases[1].items}
    assert decode["draft weights (tiny-draft, bf16)"] == DRAFT_WEIGHT_BYTES
    assert decode["draft kv cache (512 tokens, the assistant's DynamicCache)"] == 512 * DRAFT_KV_PER_TOKEN
    assert est.phases[1].bytes == base.phases[1].bytes + DRAFT_WEIGHT_BYTES + 512 * DRAFT_KV_PER_TOKEN


def test_a_draft_of_another_vocabulary_is_not_checked() -> None:
    est = estimate_inference(tiny(), _vllm(draft=_draft(vocab=256), num_speculative_tokens=2))
    assert est.extra["draft_weight_bytes"] == DRAFT_WEIGHT_BYTES + 2 * 128 * 32 * 2  # embeddings + head
    assert any("not checked" in a for a in est.assumptions)


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        (dict(engine="vllm", draft=_draft(), num_speculative_tokens=0), "num_speculative_tokens"),
        (dict(engine="vllm", draft=_draft(), num_speculative_tokens=-3), "num_speculative_tokens"),
        (dict(engine="vllm", draft=_draft()), "num_speculative_tokens"),
        (dict(engine="vllm", num_speculative_tokens=2), "num_speculative_tokens"),
        (dict(engine="llamacpp", weights="q4_k_m", draft=_draft()), "draft"),
        (dict(engine="sglang", draft=_draft()), "num_speculative_tokens"),  # its speculative_num_steps
        (dict(engine="hf", draft=_draft(), batch=2), "batch"),
    ],
)
def test_bad_values_name_the_field(kw: dict[str, object], field: str) -> None:
    with pytest.raises(InputError, match=f"^{field}="):
        InferenceSetup(context=512, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize("k", [0, -1])
def test_api_refuses_a_bad_count_in_one_line(k: int) -> None:
    with pytest.raises(InputError) as err:
        peakmem.infer("llama-3.1-8b", engine="vllm", draft="llama-3.2-1b", num_speculative_tokens=k)
    assert "\n" not in str(err.value) and str(err.value).startswith(f"num_speculative_tokens={k}")


def test_draft_with_llamacpp_is_refused() -> None:
    with pytest.raises(InputError, match=r"^draft="):
        peakmem.infer("llama-3.1-8b", engine="llamacpp", weights="q4_k_m", draft="llama-3.2-1b")


def test_cli_equals_api(capsys: pytest.CaptureFixture[str]) -> None:
    kw = dict(engine="vllm", context=8192, batch=8, gpu="a100-80gb", draft="llama-3.2-1b",
              num_speculative_tokens=4)  # fmt: skip
    cli = infer_cli_equals_api(capsys, "llama-3.1-8b", **kw)
    assert cli["draft"] == "llama-3.2-1b" and cli["num_speculative_tokens"] == 4
    assert any(i["path"].startswith("draft weights (llama-3.2-1b") for i in cli["items"])
    plain = peakmem.infer("llama-3.1-8b", **{**kw, "draft": None, "num_speculative_tokens": None})
    # the draft's KV takes pool pages: fewer sequences fit
    assert cli["verdicts"][0]["max_concurrent"] < plain.to_dict()["verdicts"][0]["max_concurrent"]


def test_the_headline_names_the_draft(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["infer", "llama-3.1-8b", "--engine", "vllm", "--context", "8192", "--gpu", "a100-80gb"]
    main([*argv, "--draft", "llama-3.2-1b", "--num-speculative-tokens", "4"])
    text = " ".join(capsys.readouterr().out.split())
    assert "and draft llama-3.2-1b (" in text and "4 speculative tokens)" in text
    main(argv)
    assert "draft" not in capsys.readouterr().out.split("\n")[0]


def test_the_echo_names_the_draft_only_when_given() -> None:
    with_draft = _vllm(draft=_draft(), num_speculative_tokens=2)
    assert with_draft.echo()["draft"] == "tiny-draft" and with_draft.echo()["num_speculative_tokens"] == 2
    assert "draft" not in replace(with_draft, draft=None, num_speculative_tokens=None).echo()


# --draft mtp: the target's last decoder layer + eh_proj (2h -> h) + enorm, hnorm, shared_head.norm;
# tiny(): q 64x64, k 64x32, v 64x32, o 64x64, gate/up/down 64x128, 2 norms of 64
TINY_LAYER_PARAMS = 64 * 64 + 64 * 32 + 64 * 32 + 64 * 64 + 3 * 64 * 128 + 2 * 64
TINY_MTP_PARAMS = TINY_LAYER_PARAMS + 2 * 64 * 64 + 3 * 64  # embeddings and head shared with the target


def test_mtp_layers_by_hand() -> None:
    mtp = mtp_draft_spec(tiny(), 1)
    assert mtp.params == TINY_MTP_PARAMS == 45_376
    draft = Draft(name="mtp", spec=mtp, method="mtp")
    est = estimate_inference(tiny(), _vllm(draft=draft, num_speculative_tokens=1))
    assert est.extra["draft_weight_bytes"] == TINY_MTP_PARAMS * 2
    # one MTP layer's KV: (K, V) x 2 KV heads x 16 x bf16
    assert est.extra["draft_kv_bytes_per_token"] == 2 * 2 * 16 * 2
    assert est.extra["kv_bytes_per_sequence"] == _blocks(1024 + 1) * (TARGET_KV_PER_TOKEN + 128)
    with pytest.raises(InputError, match=r"^draft="):
        InferenceSetup(engine="hf", context=512, draft=draft)


def test_mtp_from_the_config() -> None:
    out = peakmem.infer("deepseek-v3", engine="vllm", context=4096, tp=8, draft="mtp",
                        num_speculative_tokens=1).to_dict()  # fmt: skip
    # num_nextn_predict_layers 1: one MLA layer caching the latent: (kv_lora_rank 512 + rope 64) x bf16
    assert out["draft_kv_bytes_per_token"] == (512 + 64) * 2
    assert out["draft_weights"] == "fp8-block"  # the MTP layer is in the target's checkpoint
    with pytest.raises(InputError, match="no MTP layers"):
        peakmem.infer("llama-3.1-8b", engine="vllm", draft="mtp", num_speculative_tokens=1)


def test_web_api_equals_api_and_reads_no_paths() -> None:
    pytest.importorskip("fastapi")
    pytest.importorskip("httpx")
    from fastapi.testclient import TestClient

    from peakmem.web.app import create_app

    client = TestClient(create_app())
    body = dict(model="llama-3.1-8b", engine="vllm", context=8192, gpus=["a100-80gb"], draft="llama-3.2-1b",
                num_speculative_tokens=4)  # fmt: skip
    got = client.post("/api/infer", json=body)
    assert got.status_code == 200
    api = peakmem.infer("llama-3.1-8b", engine="vllm", context=8192, gpu="a100-80gb", draft="llama-3.2-1b",
                        num_speculative_tokens=4).to_dict()  # fmt: skip
    assert got.json()["draft_weight_bytes"] == api["draft_weight_bytes"]
    assert got.json()["verdicts"][0]["max_concurrent"] == api["verdicts"][0]["max_concurrent"]
    assert client.post("/api/infer", json={**body, "draft": "/etc/config.json"}).status_code == 404
    bad = client.post("/api/infer", json={**body, "num_speculative_tokens": 0})
    assert bad.status_code == 422 and "num_speculative_tokens" in bad.text


def test_qwen35_mtp_from_mtp_num_hidden_layers() -> None:
    # Qwen3.5-27B's config names mtp_num_hidden_layers 1 (vLLM qwen3_next_mtp.py reads it as
    # num_nextn_predict_layers): its last decoder layer (full attention, gated q: 24 heads x 256 x 2;
    # 4 KV heads x 256; o 6144 -> 5120; q/k norms of 256; 2 norms) + MLP 3 x 5120 x 17408
    # + fc 2h -> h + 3 norms; embeddings and head shared with the target
    layer = 5120 * 12288 + 2 * 5120 * 1024 + 6144 * 5120 + 2 * 256 + 2 * 5120 + 3 * 5120 * 17408
    params = layer + 2 * 5120 * 5120 + 3 * 5120
    out = peakmem.infer("qwen3.5-27b", engine="vllm", context=8192, draft="mtp", num_speculative_tokens=2)
    assert out.to_dict()["draft_weight_bytes"] == params * 2 == 849_398_784
    # one full-attention layer's KV: (K, V) x 4 KV heads x 256 x bf16
    assert out.to_dict()["draft_kv_bytes_per_token"] == 2 * 4 * 256 * 2
