"""verl files map to the post-training job (peakmem.fromfile.verl; issue 29's "--from maps every memory
field of ... verl ... or names it in not_modelled; none is read as SFT").

Fixtures are verl's published files (tests/fixtures/frameworks/sources.md: volcengine/verl @ b178a3cd):
examples/grpo_trainer/run_qwen2-7b_seq_balance.sh, examples/grpo_trainer/run_qwen2_5-3b_gsm8k_grpo_lora.sh,
examples/ppo_trainer/run_deepseek7b_llm.sh and verl/trainer/config/_generated_ppo_trainer.yaml. Every
expected value below is read off the file (and the arithmetic shown), not off peakmem's output.
"""

from __future__ import annotations

import json
from contextlib import redirect_stderr, redirect_stdout
from io import StringIO
from pathlib import Path
from typing import Any

import pytest

from peakmem import cli
from peakmem.errors import InputError
from peakmem.fromfile import map_documents, parse_document, read_from_files
from peakmem.fromfile.verl import hydra_value

VERL = Path(__file__).parent / "fixtures" / "frameworks" / "verl"
SEQ_BALANCE = VERL / "run_qwen2-7b_seq_balance.sh"
LORA = VERL / "run_qwen2_5-3b_gsm8k_grpo_lora.sh"
PPO = VERL / "run_deepseek7b_llm.sh"
GENERATED = VERL / "_generated_ppo_trainer.yaml"


def _named(items: tuple[str, ...]) -> set[str]:
    """The keys ``not_modelled`` names (``file:key = value: why`` -> ``key``)."""
    return {item.split(":", 1)[1].split(" = ", 1)[0] for item in items}


def _pick(options: dict[str, Any], want: dict[str, Any]) -> dict[str, Any]:
    return {k: options.get(k) for k in want}


def test_grpo_script_with_sglang_and_dynamic_batch() -> None:
    found = read_from_files([SEQ_BALANCE])
    assert found.formats == ("verl",)
    want = {
        "objective": "grpo",  # algorithm.adv_estimator=grpo
        "model": "Qwen/Qwen2-7B-Instruct",
        "num_generations": 5,  # rollout.n=5
        "seq": 512 + 1024,  # data.max_prompt_length + data.max_response_length
        "completion": 1024,
        "max_tokens_per_gpu": 24000,  # use_dynamic_bsz=True + ppo_max_token_len_per_gpu=24000
        "batch": 1,  # the token budget is the micro-batch (one packed row)
        # 1024 prompts x n 5 over 8 ranks = 640 samples x 1536 tokens in rows of 24000: 40.96 -> 41 rows,
        # rounded up to 45, a multiple of n 5 (the generation batch holds whole groups)
        "steps_per_generation": 45,
        "beta": 0.001,  # use_kl_loss=True, kl_loss_coef=0.001
        "reference": "separate",  # full fine-tuning: a frozen copy
        # rollout.name=$rollout_name, the script's rollout_name="sglang": verl's hybrid engine colocates it
        "rollout": "vllm-colocate",
        "rollout_memory": 0.6,
        "rollout_sleep": True,  # free_cache_engine: verl's default True
        "checkpointing": "full",
        "gpus": 8 * 1,  # trainer.n_gpus_per_node x trainer.nnodes
        "fsdp": "full-shard",
        "fsdp_version": 1,  # actor.strategy: verl's default fsdp
        "precision": "amp-bf16",  # fsdp_config.model_dtype fp32 (default) under bf16 MixedPrecision
        "method": "full",
    }
    assert _pick(found.options, want) == want
    named = _named(found.not_modelled)
    assert {
        "actor_rollout_ref.ref.fsdp_config.param_offload",
        "actor_rollout_ref.rollout.tensor_model_parallel_size",
    } <= named
    assert any("$@" in n for n in found.notes)  # trainer.total_epochs=15 $@
    assert any("sglang" in f.note.lower() for f in found.mapped if f.field == "rollout")


def test_ppo_script_has_a_critic_and_no_reference() -> None:
    found = read_from_files([PPO])
    want = {
        "objective": "ppo",  # adv_estimator=gae
        "critic": "deepseek-ai/deepseek-llm-7b-chat",  # critic.model.path
        "reference": "none",  # use_kl_loss=False, use_kl_in_reward=False: verl loads no reference
        "beta": 0.0,
        "batch": 16,  # ppo_micro_batch_size_per_gpu
        # ppo_mini_batch_size 256 prompts x n 1 over 8 ranks = 32 per rank, in micro-batches of 16
        "grad_accum": 256 * 1 // 8 // 16,
        # data.train_batch_size 1024 prompts x n 1 over 8 ranks = 128 per rank = 8 micro-batches of 16
        "steps_per_generation": 1024 * 1 // 8 // 16,
        "rollout_memory": 0.4,
        "seq": 512 + 512,
        "num_generations": 1,
    }
    assert _pick(found.options, want) == want
    assert "reward_model" not in found.options  # a function reward (no reward_model.enable)
    named = _named(found.not_modelled)
    assert {
        "actor_rollout_ref.rollout.tensor_model_parallel_size",  # =4
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu",  # 32 != 16
        "critic.ppo_micro_batch_size_per_gpu",  # the critic's 32 != the actor's 16
    } <= named


def test_lora_script_uses_the_adapter_disabled_reference() -> None:
    found = read_from_files([LORA])
    want = {
        "method": "lora",
        "lora_rank": 64,
        "lora_alpha": 32.0,
        "lora_targets": "all-linear",  # hf_model.yaml's default target_modules
        "reference": "adapter",  # main_ppo.py: ref_in_actor = lora_rank > 0
        "beta": 0.001,
        "gpus": 2,
        "batch": 40,
        # 16 prompts x n 5 = 80 over 2 ranks = 40 per rank: one micro-batch of 40
        "steps_per_generation": 16 * 5 // 2 // 40,
        "grad_accum": 16 * 5 // 2 // 40,
    }
    assert _pick(found.options, want) == want
    assert "actor_rollout_ref.rollout.layered_summon" in _named(found.not_modelled)


def test_generated_config_reads_verls_defaults_and_names_what_it_lacks() -> None:
    found = read_from_files([GENERATED])
    o = found.options
    # the composed ppo_trainer.yaml: gae, no KL, rollout.name ??? (required), 0.5 of the GPU, 8 GPUs
    assert _pick(o, {"objective": "ppo", "reference": "none", "rollout_memory": 0.5, "gpus": 8}) == {
        "objective": "ppo",
        "reference": "none",
        "rollout_memory": 0.5,
        "gpus": 8,
    }
    assert o["seq"] == 512 + 512 and o["num_generations"] == 1
    named = _named(found.not_modelled)
    assert "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu" in named  # null: verl requires it
    assert "actor_rollout_ref.rollout.tensor_model_parallel_size" in named  # 2 in the file
    assert any("rollout.name" in n for n in found.notes)  # "???": a vLLM rollout assumed, said so


@pytest.mark.parametrize("path", [SEQ_BALANCE, LORA, PPO, GENERATED])
def test_no_verl_file_is_read_as_sft(path: Path) -> None:
    found = read_from_files([path])
    assert found.options["objective"] in ("grpo", "ppo", "rloo")
    assert found.options["rollout"] != "hf"


def _script(body: str) -> dict[str, Any]:
    return parse_document("set -x\npython3 -m verl.trainer.main_ppo \\\n" + body + "\n", "job.sh")


def test_overrides_defaults_and_unset_variables() -> None:
    doc = _script(
        "    algorithm.adv_estimator=rloo \\\n"
        "    actor_rollout_ref.rollout.n=$N \\\n"  # the script never sets N
        "    actor_rollout_ref.rollout.name=vllm \\\n"
        "    algorithm.use_kl_in_reward=True \\\n"
        "    algorithm.kl_ctrl.kl_coef=0.02 \\\n"
        "    +actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4 \\\n"
        "    actor_rollout_ref.rollout.tensor_model_parallel_size=1 \\\n"
        "    trainer.n_gpus_per_node=4 trainer.nnodes=2 2>&1 | tee log.txt"
    )
    found = map_documents([("job.sh", doc)])
    o = found.options
    assert o["objective"] == "rloo"
    assert (o["beta"], o["reference"]) == (0.02, "separate")  # the KL in the reward: kl_ctrl.kl_coef
    assert o["num_generations"] == 1  # $N unresolved: verl's default rollout.n 1, and named
    assert "actor_rollout_ref.rollout.n" in _named(found.not_modelled)
    assert (o["gpus"], o["gpus_per_node"], o["batch"]) == (4 * 2, 4, 4)
    assert "actor_rollout_ref.rollout.tensor_model_parallel_size" not in _named(found.not_modelled)
    # 1024 prompts (default) x n 1 over 8 ranks = 128 per rank = 32 micro-batches of 4
    assert o["steps_per_generation"] == 1024 // 8 // 4


def test_script_variables_defaults_and_arrays() -> None:
    text = (
        "MODEL=${MODEL_PATH:-Qwen/Qwen2.5-0.5B}\n"
        "LEN=2048\n"
        "python3 -m verl.trainer.main_ppo algorithm.adv_estimator=grpo \\\n"
        "  actor_rollout_ref.model.path=$MODEL \\\n"
        "  data.max_response_length=${LEN} 'data.max_prompt_length=1024' # a comment\n"
    )
    o = map_documents([("j.sh", parse_document(text, "j.sh"))]).options
    assert (o["model"], o["completion"], o["seq"]) == ("Qwen/Qwen2.5-0.5B", 2048, 1024 + 2048)


@pytest.mark.parametrize(
    ("estimator", "objective", "named"),
    [
        ("gae", "ppo", False),
        ("grpo", "grpo", False),
        ("rloo", "rloo", False),
        ("remax", "grpo", True),
        ("reinforce_plus_plus", "grpo", True),
        ("brand_new", "grpo", True),
    ],
)
def test_estimators(estimator: str, objective: str, named: bool) -> None:
    doc = {
        "actor_rollout_ref": {"actor": {"ppo_micro_batch_size_per_gpu": 2}},
        "algorithm": {"adv_estimator": estimator},
    }
    found = map_documents([("v.yaml", doc)])
    assert found.options["objective"] == objective
    assert ("algorithm.adv_estimator" in _named(found.not_modelled)) is named


def test_fsdp2_offload_and_hybrid_engine_off() -> None:
    doc = {
        "actor_rollout_ref": {
            "hybrid_engine": False,
            "actor": {
                "strategy": "fsdp2",
                "ppo_micro_batch_size_per_gpu": 2,
                "ulysses_sequence_parallel_size": 2,
                "fsdp_config": {"param_offload": True, "optimizer_offload": True, "model_dtype": "bf16"},
            },
            "model": {"enable_gradient_checkpointing": False},
        },
        "reward_model": {"enable": True, "model": {"path": "rm/path"}},
        "critic": {"model": {"path": "c/path"}},
    }
    o = map_documents([("v.yaml", doc)]).options
    assert (o["fsdp_version"], o["offload_params"], o["offload"]) == (2, "cpu", "cpu")
    assert (o["precision"], o["checkpointing"], o["ulysses"]) == ("bf16", "none", 2)
    assert o["rollout"] == "vllm-server"  # not the hybrid engine: the rollout on GPUs of its own
    assert (o["reward_model"], o["critic"]) == ("rm/path", "c/path")  # gae (default): a critic


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("null", None),
        ("True", True),
        ("false", False),
        ("12", 12),
        ("1e-6", 1e-6),
        ("0.6", 0.6),
        ("1_000", 1000),
        ("vllm", "vllm"),
        ('["console","wandb"]', '["console","wandb"]'),
    ],
)
def test_hydra_values(text: str, want: Any) -> None:
    assert hydra_value(text) == want


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("echo hello\n", "runs no training command"),
        ("python3 -m verl.trainer.main_ppo data.x='unclosed\n", "cannot split"),
        ("x=1\n" * 6000, "lines"),
        ("A=aaaaaaaa\n" + "A=$A$A\n" * 20 + "python3 -m verl.trainer.main_ppo x=$A\n", "expands past"),
    ],
)
def test_bad_scripts_are_one_line_errors(text: str, match: str) -> None:
    with pytest.raises(InputError, match=match) as e:
        parse_document(text, "bad.sh")
    assert "\n" not in str(e.value)


def _cli_json(argv: list[str]) -> dict[str, Any]:
    buf = StringIO()
    with redirect_stdout(buf), redirect_stderr(StringIO()):
        code = cli.main([*argv, "--json"])
    assert code in (0, 1), code
    out: dict[str, Any] = json.loads(buf.getvalue())
    return out


def test_cli_from_the_lora_script_on_one_gpu_equals_the_same_flags() -> None:
    """The published 2-GPU LoRA GRPO script, asked on one GPU of a catalog model (multi-GPU post-training
    estimates are not there yet): --from gives the same answer as the flags the file maps to."""
    from_file = _cli_json(["train", "qwen2.5-0.5b", "--from", str(LORA), "--gpus", "1", "--gpu", "h100-80gb"])
    flags = [
        "train",
        "qwen2.5-0.5b",
        "--gpu",
        "h100-80gb",
        "--gpus",
        "1",
        "--gpus-per-node",
        "2",
        "--method",
        "lora",
        "--lora-rank",
        "64",
        "--lora-alpha",
        "32",
        "--lora-targets",
        "all-linear",
        "--precision",
        "amp-bf16",
        "--batch",
        "40",
        "--seq",
        "1536",
        "--grad-accum",
        "1",
        "--checkpointing",
        "full",
        "--attention",
        "flash",
        "--fsdp",
        "full-shard",
        "--fsdp-version",
        "1",
        "--objective",
        "grpo",
        "--reference",
        "adapter",
        "--beta",
        "0.001",
        "--rollout",
        "vllm-colocate",
        "--rollout-memory",
        "0.6",
        "--rollout-sleep",
        "--num-generations",
        "5",
        "--completion",
        "1024",
        "--steps-per-generation",
        "1",
        "--trainer",
        "verl",
    ]
    flagged = _cli_json(flags)
    assert {k: v for k, v in from_file.items() if k != "from_file"} == flagged
    assert from_file["setup"]["post_training"]["objective"] == "grpo"
    assert from_file["setup"]["post_training"]["trainer"] == "verl"
    assert from_file["peak_phase"] in ("rollout", "scoring", "forward", "backward", "optimizer")


def test_a_variable_set_in_one_branch_only_is_unknown() -> None:
    text = (
        "N=2\nN=4\n"  # a later assignment replaces an earlier one
        "R=vllm\n"
        'if [ "$X" = "1" ]; then\n    R=sglang\nfi\n'  # which branch runs is not known
        "python3 -m verl.trainer.main_ppo actor_rollout_ref.rollout.name=$R actor_rollout_ref.rollout.n=$N\n"
    )
    found = map_documents([("j.sh", parse_document(text, "j.sh"))])
    assert found.options["num_generations"] == 4
    assert "actor_rollout_ref.rollout.name" in _named(found.not_modelled)


def test_a_reward_model_the_command_cannot_hold_is_named(tmp_path: Path) -> None:
    """Until `reward_model` is an option (another session adds it), the file's reward model is named in
    not_modelled by the CLI, never dropped silently."""
    from peakmem.options import OPTIONS

    script = tmp_path / "rm.sh"
    script.write_text(
        "python3 -m verl.trainer.main_ppo algorithm.adv_estimator=grpo actor_rollout_ref.rollout.n=4 "
        "actor_rollout_ref.rollout.name=vllm actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4 "
        "reward_model.enable=True reward_model.model.path=rm trainer.n_gpus_per_node=1 "
        "data.train_batch_size=4\n"
    )
    out = _cli_json(["train", "qwen2.5-0.5b", "--from", str(script), "--gpu", "h100-80gb"])
    named = any("reward_model.model.path = rm" in n for n in out["from_file"]["not_modelled"])
    assert named != any(o.name == "reward_model" for o in OPTIONS)


def test_a_ppo_script_maps_its_critic_to_the_critic_role(tmp_path: Path) -> None:
    """verl's gae estimator on one GPU: critic.model.path is --critic (a role peakmem models), not a
    not-modelled field; the answer has the critic's update among its phases."""
    script = tmp_path / "ppo.sh"
    script.write_text(
        "python3 -m verl.trainer.main_ppo algorithm.adv_estimator=gae "
        "actor_rollout_ref.model.path=qwen2.5-0.5b critic.model.path=qwen2.5-7b "
        "actor_rollout_ref.rollout.name=vllm "
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4 critic.ppo_micro_batch_size_per_gpu=4 "
        "trainer.n_gpus_per_node=1 data.train_batch_size=4 data.max_prompt_length=512 "
        "data.max_response_length=512 actor_rollout_ref.actor.entropy_coeff=0.001\n"
    )
    out = _cli_json(["train", "--from", str(script), "--gpu", "h100-80gb"])
    post = out["setup"]["post_training"]
    assert (post["objective"], post["critic"], post["reference"]) == ("ppo", "qwen2.5-7b", "none")
    assert post["entropy"] is True  # entropy_coeff 0.001: dp_actor computes the entropy in the update
    assert "critic update" in out["phases"]
    assert not any("critic" in n for n in out["from_file"]["not_modelled"])
