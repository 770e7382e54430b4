"""vLLM's batch defaults by release, GPU and entry point (peakmem.vllm_defaults), derived by hand from each
release's vllm/engine/arg_utils.py; CLI = API = page for --vllm-entrypoint and --prefill-chunk."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from _infer_specs import infer_cli_equals_api
from peakmem.catalog import get_gpu
from peakmem.errors import InputError
from peakmem.inference import InferenceSetup
from peakmem.units import GiB
from peakmem.vllm_defaults import batch_note, vllm_batch

H100 = get_gpu("h100-sxm")
A100 = get_gpu("a100-80gb")
L40S = get_gpu("l40s")
B200 = get_gpu("b200")


def _batch(version: tuple[int, int], gpu: Any, entrypoint: str = "serve", **kw: Any) -> tuple[int, int, str]:
    b = vllm_batch(version, gpu_bytes=gpu.usable_bytes if gpu else None,
                   gpu_name=gpu.display_name if gpu else "", entrypoint=entrypoint,
                   max_model_len=kw.pop("max_model_len", 8192), **kw)  # fmt: skip
    return b.max_num_seqs, b.max_num_batched_tokens, b.tier.name if b.tier else "v0"


@pytest.mark.parametrize(
    ("version", "gpu", "entrypoint", "want"),
    [
        # 0.19 (get_batch_defaults): >= 70 GiB and no "a100" in the name: 1024 sequences, 8192 / 16384 tokens
        ((0, 19), H100, "serve", (1024, 8192, "large")),
        ((0, 19), H100, "llm", (1024, 16384, "large")),
        # the A100-80GB has the memory, its name keeps it small (PR #17885, 0.9.0 on)
        ((0, 19), A100, "serve", (256, 2048, "small")),
        ((0, 19), A100, "llm", (256, 8192, "small")),
        ((0, 19), L40S, "serve", (256, 2048, "small")),  # 45 GiB
        ((0, 19), None, "serve", (256, 2048, "small")),  # no GPU read: device_memory = 0
        # 0.8 (taken as 0.8.5): by memory alone, the A100-80GB in the large tier
        ((0, 8), A100, "serve", (1024, 8192, "large")),
        # 0.28 on: 160 GiB or more takes 16384 tokens for the server too; before, the large tier
        ((0, 28), B200, "serve", (1024, 16384, "largest")),
        ((0, 27), B200, "serve", (1024, 8192, "large")),
        # V0: EngineArgs' 256 sequences, the 8192-token chunk peakmem profiles there
        ((0, 6), H100, "serve", (256, 8192, "v0")),
    ],
)  # fmt: skip
def test_defaults_by_release_gpu_and_entry_point(
    version: tuple[int, int], gpu: Any, entrypoint: str, want: tuple[int, int, str]
) -> None:
    assert _batch(version, gpu, entrypoint) == want


def test_the_values_given_are_kept_and_capped_by_the_model_length() -> None:
    assert _batch((0, 19), H100, max_num_seqs=64, max_num_batched_tokens=4096)[:2] == (64, 4096)
    # 0.11.1 on, with the defaults: tokens = min(max_num_seqs x max_model_len, tokens), then max_num_seqs =
    # min(max_num_seqs, tokens): 1024 x 4 = 4096 tokens; 1024 sequences of 4 tokens
    assert _batch((0, 19), H100, max_model_len=4)[:2] == (1024, 4096)
    assert _batch((0, 19), L40S, max_num_seqs=2, max_model_len=512)[:2] == (2, 1024)
    assert _batch((0, 19), H100, max_num_batched_tokens=512)[:2] == (512, 512)  # seqs capped by tokens
    assert _batch((0, 10), H100, max_model_len=4)[:2] == (1024, 8192)  # before 0.11: no cap


def test_an_h100_profiles_1024_rows_of_the_sampler(capsys: pytest.CaptureFixture[str]) -> None:
    """Llama-3.1-8B on an H100 (vLLM 0.27): the sampler warm-up over 1024 rows of 128,256 logits at
    2 + 13.25 B (formulas/serving/vllm_profile.py) is the profile's peak, 2,002,845,696 B; the 8192-token
    chunk's 8192 x 102,400 B is below it."""
    out = infer_cli_equals_api(capsys, "llama-3.1-8b", engine="vllm", context=8192, gpu="h100-sxm")
    assert (out["max_num_seqs"], out["prefill_chunk_tokens"]) == (1024, 8192)
    assert any("sampler warm-up over 1024 rows" in a and "(2002845696 B)" in a for a in out["assumptions"])
    assert any(
        a.startswith("vLLM's batch defaults for vllm serve on a GPU of 70 GiB") for a in out["assumptions"]
    )
    llm = infer_cli_equals_api(capsys, "llama-3.1-8b", engine="vllm", context=8192, gpu="h100-sxm",
                               vllm_entrypoint="llm")  # fmt: skip
    assert llm["prefill_chunk_tokens"] == 16384 and llm["setup"]["vllm_entrypoint"] == "llm"
    given = infer_cli_equals_api(capsys, "llama-3.1-8b", engine="vllm", context=8192, gpu="h100-sxm",
                                 max_num_seqs=256, prefill_chunk=8192)  # fmt: skip
    assert (given["max_num_seqs"], given["prefill_chunk_tokens"]) == (256, 8192)
    assert not any(a.startswith("vLLM's batch defaults") for a in given["assumptions"])
    # at 256 sequences the profile's peak is the chunk (8192 x 102,400 B > the sampler's 256 rows): the
    # pool grows by the difference of the two peaks
    pool = given["verdicts"][0]["kv_pool_bytes"] - out["verdicts"][0]["kv_pool_bytes"]
    assert pool == int(1024 * 128_256 * 15.25) - 8192 * (3 * 14336 * 2 + 2 * 4096 * 2) == 1_163_984_896


def test_bad_values_name_the_field() -> None:
    with pytest.raises(InputError, match=r"^vllm_entrypoint='offline': choose one of serve, llm"):
        InferenceSetup(engine="vllm", vllm_entrypoint="offline")  # type: ignore[arg-type]
    with pytest.raises(InputError, match=r"^vllm_entrypoint='llm': an option of engine=vllm, not hf"):
        InferenceSetup(vllm_entrypoint="llm")
    with pytest.raises(InputError, match=r"^gpu_name=3: must be text"):
        InferenceSetup(gpu_name=3)  # type: ignore[arg-type]


def test_the_note_names_the_tier() -> None:
    b = vllm_batch((0, 19), gpu_bytes=40 * GiB, entrypoint="llm", max_model_len=None)
    assert batch_note(b, "llm").startswith(
        "vLLM's batch defaults for the offline LLM class on a GPU under 70 GiB, an A100, or none named: "
        "max_num_seqs 256, max_num_batched_tokens 8192"
    )


def test_web_api_takes_the_options() -> None:
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    import peakmem
    from peakmem.web.app import create_app

    client = TestClient(create_app())
    body = {"model": "llama-3.1-8b", "engine": "vllm", "context": 8192, "gpus": ["h100-sxm"],
            "vllm_entrypoint": "llm", "prefill_chunk": 4096}  # fmt: skip
    page = client.post("/api/infer", json=body).json()
    api = peakmem.infer("llama-3.1-8b", engine="vllm", context=8192, gpu="h100-sxm", vllm_entrypoint="llm",
                        prefill_chunk=4096).to_dict()  # fmt: skip
    assert page["device_total_bytes"] == api["device_total_bytes"] and page["prefill_chunk_tokens"] == 4096
    bad = client.post("/api/infer", json={**body, "vllm_entrypoint": "batch"})
    assert bad.status_code == 422 and bad.json()["field"] == "vllm_entrypoint"


def test_fit_offers_vllms_smaller_batch_where_it_frees_the_profile() -> None:
    """Llama-3.1-8B, 55 sequences of 8192 tokens on an H100: vLLM's 1024 rows of sampler warm-up (1.87 GiB)
    leave a pool of 54 1-GiB sequences; --max-num-seqs 256 brings the profile's peak down to the 8192-token
    chunk (0.78 GiB) and the pool holds 55. On a 4090 vLLM already runs 256: no such change is offered;
    given --max-num-seqs, or more than 256 sequences at once, the family is not applicable."""
    from peakmem.planner.serving import fit_inference
    from peakmem.resolve import resolve_model

    spec = resolve_model("llama-3.1-8b")
    setup = InferenceSetup(engine="vllm", context=8192, batch=55)  # type: ignore[arg-type]
    report = fit_inference(spec, setup, [H100, get_gpu("rtx-4090")])
    h100, geforce = report.gpus
    assert not h100.fits and h100.max_concurrent == 54
    (single,) = [c for c in h100.singles if c.steps == ("max-num-seqs 256",)]
    assert single.fits and single.max_concurrent == 55
    (change,) = single.changes
    assert (change.field, change.old, change.new) == ("max_num_seqs", "1024", "256")
    assert not any("max-num-seqs" in c.label for c in (*geforce.singles, *geforce.candidates))
    family = next(f for f in report.search_space if f.name.startswith("fewer sequences per step"))
    assert family.status == "searched" and family.options == ("256",)
    for job in (replace(setup, max_num_seqs=512), replace(setup, batch=300)):
        fam = next(f for f in fit_inference(spec, job, [H100]).search_space if f.name == family.name)
        assert fam.status == "not applicable"
