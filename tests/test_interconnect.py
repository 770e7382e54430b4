"""``--interconnect``: how the tensor-parallel GPUs are joined, said by the user
(formulas/serving/cuda_graphs.py ``custom_all_reduce_off``). It overrides the catalog GPU's
``Gpu.interconnect`` and gives a plain size one; CLI = API = page. Hand-derived on Llama-3.1-8B (32 layers)
at vLLM 0.27's defaults."""

from __future__ import annotations

import typing
from typing import Any

import pytest

from _infer_specs import infer_cli_equals_api
from peakmem.device import INTERCONNECTS
from peakmem.formulas.serving.cuda_graphs import NCCL_ALLREDUCE_GRAPH_BYTES
from peakmem.units import KiB

# vLLM 0.27 at max_num_seqs 256 captures 51 PIECEWISE + 35 FULL graphs (test_cuda_graphs.py); with --tp each
# forward runs 2 all-reduces a layer (o_proj, down_proj: RowParallelLinear) + 1 (VocabParallelEmbedding):
# 2 x 32 + 1 = 65 a graph, 86 x 65 = 5,590 captured; where NCCL runs them each keeps 135 KiB
GRAPHS = 51 + 35
CAPTURED = GRAPHS * (2 * 32 + 1)
NCCL_BYTES = CAPTURED * 135 * KiB
JOB = {"engine": "vllm", "tp": 4, "context": 4096}


def _graphs(capsys: pytest.CaptureFixture[str], **kw: Any) -> tuple[int, int, dict[str, Any]]:
    out = infer_cli_equals_api(capsys, "llama-3.1-8b", **{**JOB, **kw})
    return out["cuda_graph_bytes"], out.get("cuda_graph_nccl_bytes", 0), out


def test_a_plain_size_said_pcie_captures_nccl_as_a_geforce_card(capsys: pytest.CaptureFixture[str]) -> None:
    # 4 GPUs on PCIe: vLLM's custom all-reduce is "not supported on more than two PCIe-only GPUs", so NCCL
    # runs them and the graphs capture it, as on 4 x RTX 4090 (the catalog's pcie-no-p2p)
    assert 135 * KiB == NCCL_ALLREDUCE_GRAPH_BYTES and NCCL_BYTES == 772_761_600
    pcie = _graphs(capsys, gpu="24GB", interconnect="pcie")
    geforce = _graphs(capsys, gpu="rtx-4090")
    nvlink = _graphs(capsys, gpu="24GB", interconnect="nvlink")
    assert pcie[:2] == geforce[:2] and pcie[1] == NCCL_BYTES
    assert nvlink[1] == 0 and pcie[0] - nvlink[0] == NCCL_BYTES
    assert pcie[2]["setup"]["interconnect"] == "pcie" and nvlink[2]["setup"]["interconnect"] == "nvlink"
    # not said: a plain size's links are not known; none in the term, and the note says how to say them
    plain = _graphs(capsys, gpu="24GB")
    assert plain[:2] == nvlink[:2] and "interconnect" not in plain[2]["setup"]
    (note,) = [a for a in plain[2]["assumptions"] if a.startswith("CUDA graphs")]
    assert "give --interconnect" in note


def test_an_nvlinked_pair_of_3090s_runs_custom_all_reduce(capsys: pytest.CaptureFixture[str]) -> None:
    # the catalog's RTX 3090 is pcie-no-p2p: at TP 2 "your platform lacks GPU P2P capability" turns custom
    # all-reduce off; an NVLink bridge joins the pair and custom all-reduce runs them: no NCCL term
    bare = _graphs(capsys, gpu="rtx-3090", tp=2)
    bridged = _graphs(capsys, gpu="rtx-3090", tp=2, interconnect="nvlink")
    assert bare[1] == NCCL_BYTES and bridged[1] == 0
    assert bare[0] - bridged[0] == NCCL_BYTES
    assert bridged[2]["device_total_bytes"] < bare[2]["device_total_bytes"]
    # and the user's word holds the other way: an H100 SXM node said to lack P2P captures NCCL (at the
    # 256 sequences these counts are for; vLLM's default there is 1024: peakmem.vllm_defaults)
    assert _graphs(capsys, gpu="h100-sxm", interconnect="pcie-no-p2p", max_num_seqs=256)[1] == NCCL_BYTES


def test_a_bad_value_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    import peakmem
    from peakmem.cli import main
    from peakmem.errors import InputError

    argv = ["infer", "llama-3.1-8b", "--engine", "vllm", "--tp", "2", "--interconnect", "infiniband"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("peakmem: error: interconnect='infiniband': one of") and "\n" not in err
    with pytest.raises(InputError, match=r"^interconnect='nvswitch': one of ''"):
        peakmem.infer("llama-3.1-8b", engine="vllm", tp=2, interconnect="nvswitch")
    # "" is "not said": the catalog GPU's (the rtx-4090's pcie-no-p2p captures NCCL at TP 4)
    unsaid = peakmem.infer("llama-3.1-8b", gpu="rtx-4090", interconnect="", **JOB).to_dict()
    assert unsaid["cuda_graph_nccl_bytes"] == NCCL_BYTES


def test_fit_infer_takes_it_for_every_gpu(capsys: pytest.CaptureFixture[str]) -> None:
    # GPUs of different kinds have no one interconnect of their own; the user's applies to all
    import peakmem

    mixed = peakmem.fit("llama-3.1-8b", infer=True, gpu="24GB,rtx-4090", **JOB).to_dict()
    said = peakmem.fit("llama-3.1-8b", infer=True, gpu="24GB,rtx-4090", interconnect="pcie", **JOB).to_dict()
    assert "interconnect" not in mixed["setup"] and said["setup"]["interconnect"] == "pcie"


def test_cli_equals_api_equals_the_page() -> None:
    pytest.importorskip("fastapi")
    import json

    from fastapi.testclient import TestClient

    import peakmem
    from peakmem.web.app import create_app
    from peakmem.web.schemas import InferRequest

    # the request's choices are the core's
    field = InferRequest.model_fields["interconnect"].annotation
    assert set(typing.get_args(typing.get_args(field)[0])) == set(INTERCONNECTS)
    body = {"model": "llama-3.1-8b", **JOB, "gpus": ["24GB"], "interconnect": "pcie"}
    client = TestClient(create_app())
    page = client.post("/api/infer", json=body).json()
    api = peakmem.infer("llama-3.1-8b", gpu="24GB", interconnect="pcie", **JOB).to_dict()
    assert page["cuda_graph_nccl_bytes"] == api["cuda_graph_nccl_bytes"] == NCCL_BYTES
    page.pop("headline"), page.pop("chart")
    assert json.loads(json.dumps(api)) == page
    bad = client.post("/api/infer", json={**body, "interconnect": "infiniband"})
    assert bad.status_code == 422 and bad.json()["field"] == "interconnect"
