"""Ulysses sequence parallelism, tiled MLP and token-budget micro-batches (peakmem.formulas.long_context),
hand-derived on the tiny Llama of test_parallel: hidden 64, 8 heads of 8 (4 k/v heads), SwiGLU 128, 4 layers,
mixed-bf16 (c = 2 bytes), flash attention."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import peakmem
from peakmem.cli import main
from peakmem.errors import InputError
from peakmem.formulas import activations as act
from peakmem.formulas import long_context as lc
from peakmem.formulas import nccl
from peakmem.fromfile import map_documents
from peakmem.parallel import Parallelism
from peakmem.training import TrainingSetup
from test_parallel import TINY_CONFIG, tiny

C = 2  # bf16 compute bytes
T_LOCAL = 64  # tokens one rank holds
A, G, D, H, WIDTH, LAYERS = 8, 4, 8, 64, 128, 4  # WIDTH: intermediate_size


def _layer_at(seq: int) -> tuple[act.Shapes, act.LayerActivations]:
    spec = tiny()
    sh = act.shapes(spec, TrainingSetup(seq_len=seq, attention="flash"))
    return sh, act.layer_activations(spec, spec.groups[0].layer, sh)


@pytest.fixture
def tiny_dir(tmp_path: Path) -> str:
    (tmp_path / "config.json").write_text(json.dumps(TINY_CONFIG))
    return str(tmp_path)


# --- layout ----------------------------------------------------------------------------------------
def test_ulysses_ranks_are_taken_from_the_world_and_shard_states() -> None:
    par = Parallelism(gpus=16, ulysses=4, zero_stage=3)
    assert par.dp == 4 and par.shard_degree == 16  # ZeRO over dp x ulysses (seq_data_parallel_group)
    assert "ulysses=4" in par.describe()
    # NCCL communicators: the sequence-data-parallel group (16) and the Ulysses group (4)
    assert nccl.communicators(par) == 2
    with pytest.raises(InputError, match=r"gpus=6 is not divisible by tp\*pp\*cp\*ulysses = 1\*1\*1\*4 = 4"):
        Parallelism(gpus=6, ulysses=4)


def test_heads_not_divisible_is_one_line_naming_the_field(capsys: pytest.CaptureFixture[str],
                                                           tiny_dir: str) -> None:  # fmt: skip
    with pytest.raises(InputError) as err:
        lc.check_ulysses(tiny(), TrainingSetup(seq_len=96), Parallelism(gpus=3, ulysses=3))
    assert str(err.value) == (
        "ulysses=3 does not divide num_attention_heads=8 (tiny): each rank attends with heads/ulysses heads"
    )
    assert main(["train", tiny_dir, "--seq", "96", "--gpus", "3", "--ulysses", "3"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "ulysses=3" in lines[0] and "num_attention_heads=8" in lines[0]


def test_kv_heads_must_divide_or_be_divided() -> None:
    spec = tiny(hidden_size=96, num_attention_heads=12, num_key_value_heads=4)  # head_dim 8
    with pytest.raises(InputError, match="ulysses=6 and num_key_value_heads=4"):
        lc.check_ulysses(spec, TrainingSetup(seq_len=96), Parallelism(gpus=6, ulysses=6))
    lc.check_ulysses(
        tiny(), TrainingSetup(seq_len=64), Parallelism(gpus=8, ulysses=8)
    )  # 8 = 2 x 4: replicated
    with pytest.raises(InputError, match="ulysses=8 does not divide seq/cp = 60"):
        lc.check_ulysses(tiny(), TrainingSetup(seq_len=60), Parallelism(gpus=8, ulysses=8))
    with pytest.raises(InputError, match="eager"):
        lc.check_ulysses(tiny(), TrainingSetup(seq_len=64, attention="eager"), Parallelism(gpus=8, ulysses=8))


def test_local_kv_heads() -> None:
    assert lc.local_kv_heads(4, Parallelism(gpus=2, ulysses=2)) == 2
    assert lc.local_kv_heads(4, Parallelism(gpus=8, ulysses=8)) == 1  # replicated 2x
    assert lc.local_kv_heads(4, Parallelism(gpus=4, tp=2, ulysses=2)) == 1


# --- Ulysses activations ---------------------------------------------------------------------------
def test_all_to_all_buffers_by_hand() -> None:
    sh, _ = _layer_at(T_LOCAL)
    layer = tiny().groups[0].layer
    local = T_LOCAL * (A * D + G * 2 * D) * C  # the caller's q, k, v: 16,384
    # N = 4: full sequence 256 with 2 q heads and 1 k/v head
    assert lc.all_to_all_bytes(layer, sh, Parallelism(gpus=4, ulysses=4)) == local + 256 * (2 * D + 2 * D) * C
    # N = 8: 512 tokens, 1 q head, 1 k/v head (4 k/v heads replicated 2x)
    assert lc.all_to_all_bytes(layer, sh, Parallelism(gpus=8, ulysses=8)) == local + 512 * (D + 2 * D) * C
    assert lc.all_to_all_bytes(layer, sh, Parallelism(gpus=8)) == 0


def test_saved_attention_grows_only_by_replicated_kv() -> None:
    spec, (sh, la) = tiny(), _layer_at(T_LOCAL)
    layer = spec.groups[0].layer
    qkv = {i.key: i.bytes for i in la.saved}["attn.qkv"]
    assert qkv == T_LOCAL * (A * D + 2 * G * D) * C
    same = lc.ulysses_attention(la, spec, layer, sh, Parallelism(gpus=4, ulysses=4))
    assert same.saved_bytes == la.saved_bytes  # q, out, logsumexp: s x a/N = s/N x a
    grown = lc.ulysses_attention(la, spec, layer, sh, Parallelism(gpus=8, ulysses=8))
    # k, v: 512 tokens x 1 head instead of 64 x 4: (8 - 4) x 64 x 16 x 2 more
    assert grown.saved_bytes - la.saved_bytes == (8 - G) * T_LOCAL * 2 * D * C == 8192


def test_estimate_per_rank_activations(tiny_dir: str) -> None:
    def activations(**kw: object) -> int:
        return int(peakmem.train(tiny_dir, attention="flash", **kw).to_dict()["breakdown"]["activations"])

    one = activations(seq=T_LOCAL)
    assert activations(seq=4 * T_LOCAL, gpus=4, ulysses=4) == one  # seq/N tokens a rank, nothing replicated
    assert activations(seq=8 * T_LOCAL, gpus=8, ulysses=8) == one + LAYERS * 8192


# --- tiled MLP -------------------------------------------------------------------------------------
def test_tiled_shards_default_is_deepspeeds_rule() -> None:
    assert lc.tiled_shards(tiny(), 64, 0) == 1 and lc.tiled_shards(tiny(), 1000, 0) == 16  # ceil(t / 64)
    assert lc.tiled_shards(tiny(), 1000, 5) == 5


def test_tiled_mlp_by_hand() -> None:
    spec, (sh, la) = tiny(), _layer_at(T_LOCAL)
    layer = spec.groups[0].layer
    interior = 4 * T_LOCAL * WIDTH * C  # gate, act(gate), up, product: 65,536
    mlp_bwd = 2 * T_LOCAL * WIDTH * C  # two T x I gradients in the MLP's backward
    x = T_LOCAL * H * C  # the input gradient / the concatenated output
    for shards in (1, 2):
        t = lc.tiled_mlp(la, spec, layer, sh, shards)
        assert t.saved_bytes == la.saved_bytes - interior
        assert t.forward_transient == interior // shards + x
        mlp_net = la.backward_stages[0][0]
        assert t.backward_stages[0][0] == mlp_net - mlp_bwd + (interior + mlp_bwd) // shards + x
        # the attention half's absolute bytes do not move: the MLP interior was freed before it either way
        assert t.backward_stages[1][0] - la.backward_stages[1][0] == interior


def test_tiled_mlp_in_the_estimate(tiny_dir: str) -> None:
    base = peakmem.train(tiny_dir, seq=T_LOCAL, attention="flash").to_dict()
    tiled = peakmem.train(tiny_dir, seq=T_LOCAL, attention="flash", tiled_mlp=True).to_dict()
    drop = base["breakdown"]["activations"] - tiled["breakdown"]["activations"]
    assert drop == LAYERS * 4 * T_LOCAL * WIDTH * C
    assert any("tiled MLP" in a for a in tiled["assumptions"])
    with pytest.raises(InputError, match="tiled_mlp_shards=2: needs tiled_mlp=True"):
        peakmem.train(tiny_dir, tiled_mlp_shards=2)


# --- token budget ----------------------------------------------------------------------------------
def test_token_budget_is_one_packed_row(tiny_dir: str) -> None:
    budget = peakmem.train(tiny_dir, max_tokens_per_gpu=128, seq=100, gpus=2, ulysses=2, attention="flash")
    fixed = peakmem.train(tiny_dir, seq=256, gpus=2, ulysses=2, attention="flash")
    assert budget.to_dict()["peak_allocated_bytes"] == fixed.to_dict()["peak_allocated_bytes"]
    with pytest.raises(InputError, match="max_tokens_per_gpu=128: the packed micro-batch"):
        peakmem.train(tiny_dir, max_tokens_per_gpu=128, seq=512, gpus=2, ulysses=2)
    with pytest.raises(InputError, match="batch=2 with max_tokens_per_gpu=128"):
        peakmem.train(tiny_dir, max_tokens_per_gpu=128, batch=2)


# --- one question, every face --------------------------------------------------------------------------
def test_cli_equals_api(capsys: pytest.CaptureFixture[str]) -> None:
    flags = ["--seq", "8192", "--gpus", "8", "--zero", "3", "--ulysses", "8", "--tiled-mlp",
             "--attention", "flash", "--json"]  # fmt: skip
    code = main(["train", "llama-3.2-1b", *flags])
    cli = json.loads(capsys.readouterr().out)
    result = peakmem.train(
        "llama-3.2-1b", seq=8192, gpus=8, zero=3, ulysses=8, tiled_mlp=True, attention="flash"
    )
    assert result.to_dict() == cli and result.exit_code == code


# --- --from: the long-context examples axolotl and TRL publish (tests/fixtures/frameworks/sources.md) -------
FRAMEWORKS = Path(__file__).parent / "fixtures" / "frameworks"
TRL_CONFIGS = FRAMEWORKS / "trl" / "examples" / "accelerate_configs"


def _json(argv: list[str], capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    assert main([*argv, "--json"]) in (0, 1)
    out: dict[str, Any] = json.loads(capsys.readouterr().out)
    return out


def _mapped(out: dict[str, Any]) -> dict[str, Any]:
    return {f["field"]: f["value"] for f in out["from_file"]["mapped"]}


@pytest.mark.parametrize("name", ["alst-llama3-8b-deepspeed.yaml", "alst-llama3-8b-fsdp2.yaml"])
def test_axolotl_alst_examples(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    """axolotl examples/alst: context_parallel_size 8 (ring attention at this axolotl commit:
    utils/trainer.py setup_parallelism_envs sets PARALLELISM_CONFIG_CP_SIZE), tiled_mlp without a shard
    count (patch.py: ceil(500,000 / 8 / 32,768) = 2 shards), activation_offloading legacy."""
    out = _json(["train", "--from", str(FRAMEWORKS / "axolotl" / name)], capsys)
    mapped = _mapped(out)
    assert (mapped["cp"], mapped["gpus"], mapped["seq"]) == (8, 8, 500_000)
    assert mapped["tiled-mlp"] is True and mapped["tiled-mlp-shards"] == 2
    assert mapped["activation-offload"] is True and mapped["checkpointing"] == "full"
    skipped = " ".join(out["from_file"]["not_modelled"])
    for key in ("tiled_mlp", "context_parallel_size", "activation_offloading"):
        assert key not in skipped
    assert out["parallelism"]["cp"] == 8 and out["setup"]["tiled_mlp"] is True


def test_axolotl_ring_fields_are_not_modelled_and_disk_offload_is_named() -> None:
    doc = {"base_model": "x", "context_parallel_size": 2, "heads_k_stride": 1,
           "ring_attn_func": "varlen_llama3", "activation_offloading": "disk", "tiled_mlp": True,
           "tiled_mlp_num_shards": 4}  # fmt: skip
    m = map_documents([("a.yml", doc)])
    assert m.options["tiled_mlp_shards"] == 4 and "activation_offload" not in m.options
    skipped = " ".join(m.not_modelled)
    for key in ("heads_k_stride", "ring_attn_func", "activation_offloading"):
        assert f"a.yml:{key}" in skipped


def test_trl_alst_accelerate_config_is_ulysses(capsys: pytest.CaptureFixture[str]) -> None:
    """TRL examples/accelerate_configs/alst_ulysses_4gpu.yaml: sp_size 2 (DeepSpeed backend) over 4 processes,
    ZeRO-3 with zero3_init_flag false (accelerate sets no HfDeepSpeedConfig: the model is built outside
    zero.Init), flash attention: the same answer as the flags."""
    alst = str(TRL_CONFIGS / "alst_ulysses_4gpu.yaml")
    out = _json(["train", "llama-3.2-1b", "--seq", "16384", "--from", alst], capsys)
    assert (out["parallelism"]["ulysses"], out["parallelism"]["dp"], out["parallelism"]["gpus"]) == (2, 2, 4)
    flags = _json(["train", "llama-3.2-1b", "--seq", "16384", "--gpus", "4", "--ulysses", "2", "--zero", "3",
                   "--attention", "flash", "--no-zero-init"], capsys)  # fmt: skip
    assert out["peak_allocated_bytes"] == flags["peak_allocated_bytes"]
    ring = str(TRL_CONFIGS / "context_parallel_2gpu.yaml")
    cp = _json(["train", "llama-3.2-1b", "--seq", "16384", "--from", ring], capsys)
    assert (cp["parallelism"]["cp"], cp["parallelism"]["gpus"]) == (2, 2)


def test_web_api_equals_cli(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("fastapi")
    pytest.importorskip("httpx")
    from fastapi.testclient import TestClient

    from peakmem.web import app as web

    body = {"model": "llama-3.2-1b", "seq": 8192, "gpu_count": 8, "zero": 3, "ulysses": 8, "tiled_mlp": True,
            "attention": "flash"}  # fmt: skip
    with TestClient(web.create_app()) as client:
        resp = client.post("/api/train", json=body)
    assert resp.status_code == 200, resp.text
    argv = ["train", "llama-3.2-1b", "--seq", "8192", "--gpus", "8", "--zero", "3", "--ulysses", "8",
            "--tiled-mlp", "--attention", "flash"]  # fmt: skip
    cli = _json(argv, capsys)
    assert {k: v for k, v in resp.json().items() if k not in ("headline", "chart")} == cli
