"""OpenRLHF launch scripts map to the post-training job (peakmem.fromfile.openrlhf; issue 29's "--from
maps every memory field of ... OpenRLHF ... or names it in not_modelled; none is read as SFT").

Fixtures are OpenRLHF's published scripts (tests/fixtures/frameworks/sources.md): the dotted CLI at
OpenRLHF/OpenRLHF @ 3c3be623 (examples/scripts/train_ppo_ray_hybrid_engine.sh, train_dpo_llama.sh,
train_reinforce_baseline_hybrid_engine.sh) and the snake_case CLI at @ f2f971fd (openrlhf/snake/: the
same PPO script, train_ppo_with_reward_fn.sh and train_kto_llama.sh). Expected values are read off the
files and OpenRLHF's argparse defaults at those commits, with the arithmetic shown.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from peakmem.errors import InputError
from peakmem.fromfile import map_documents, parse_document, read_from_files

FIX = Path(__file__).parent / "fixtures" / "frameworks" / "openrlhf"
PPO = FIX / "train_ppo_ray_hybrid_engine.sh"
DPO = FIX / "train_dpo_llama.sh"
REINFORCE = FIX / "train_reinforce_baseline_hybrid_engine.sh"
PPO_SNAKE = FIX / "snake" / "train_ppo_ray_hybrid_engine.sh"
REWARD_FN = FIX / "snake" / "train_ppo_with_reward_fn.sh"
KTO = FIX / "snake" / "train_kto_llama.sh"


def _named(items: tuple[str, ...]) -> set[str]:
    return {item.split(":", 1)[1].split(" = ", 1)[0] for item in items}


def _pick(options: dict[str, Any], want: dict[str, Any]) -> dict[str, Any]:
    return {k: options.get(k) for k in want}


# the hybrid-engine PPO job, as both spellings of the CLI write it
PPO_JOB = {
    "objective": "ppo",  # estimator gae (the default)
    "model": "OpenRLHF/Llama-3-8b-sft-mixture",
    "reward_model": "OpenRLHF/Llama-3-8b-rm-700k",
    "critic": "OpenRLHF/Llama-3-8b-rm-700k",  # no critic path: OpenRLHF starts it from the reward model
    "beta": 0.01,  # init_kl_coef 0.01 > 0: a reference
    "reference": "separate",
    "rollout": "vllm-colocate",  # 4 vLLM engines with colocate_all
    "rollout_memory": 0.5,
    "rollout_sleep": True,
    "zero": 3,
    "precision": "mixed-bf16",  # DeepSpeed bf16 engine
    "gpus": 8 * 1,  # actor num_gpus_per_node x num_nodes
    "checkpointing": "full",
    "max_tokens_per_gpu": 16384,  # dynamic batch
    "batch": 1,
    "num_generations": 1,
    # rollout.batch_size 1024 x n 1 over 8 ranks = 128 samples x 2048 tokens in rows of 16384: 16 rows
    "steps_per_generation": 16,
}


@pytest.mark.parametrize("path", [PPO, PPO_SNAKE])
def test_hybrid_engine_ppo_in_both_spellings(path: Path) -> None:
    found = read_from_files([path])
    assert found.formats == ("openrlhf",)
    assert _pick(found.options, PPO_JOB) == PPO_JOB
    named = _named(found.not_modelled)
    vllm_tp = "--vllm.tensor_parallel_size" if path == PPO else "--vllm_tensor_parallel_size"
    ds_sleep = "--ds.enable_sleep" if path == PPO else "--deepspeed_enable_sleep"
    assert {vllm_tp, ds_sleep} <= named


def test_sequence_lengths_by_spelling() -> None:
    new, old = read_from_files([PPO]).options, read_from_files([PPO_SNAKE]).options
    assert new["seq"] == 2048 and "completion" not in new  # --data.max_len 2048, no max_new_tokens
    assert "rollout.max_new_tokens" in _named(read_from_files([PPO]).not_modelled)
    assert (old["seq"], old["completion"]) == (1024 + 1024, 1024)  # prompt_max_len + generate_max_len


def test_remote_reward_separate_gpus_and_adam_offload() -> None:
    found = read_from_files([REWARD_FN])
    o = found.options
    assert "reward_model" not in o and "critic" not in o  # remote_rm_url; the critic from the actor
    assert (o["rollout"], o["offload"], o["batch"], o["gpus"]) == ("vllm-server", "cpu", 8, 2)
    # rollout_batch_size 1024 prompts x n 1 over 2 ranks, micro-batches of 8: 64 per generation
    assert o["steps_per_generation"] == 1024 * 1 // 2 // 8
    assert o["grad_accum"] == 128 // (8 * 2)  # train_batch_size 128 = micro 8 x accumulation x 2 ranks
    named = _named(found.not_modelled)
    assert {"--colocate_all_models", "--micro_rollout_batch_size"} <= named


def test_bash_arrays_and_variables() -> None:
    found = read_from_files([REINFORCE])
    want = {
        "model": "Qwen/Qwen3-4B-Thinking-2507",  # MODEL_PATH, expanded from ${CKPT_ARGS[@]}
        "objective": "grpo",  # reinforce_baseline: critic-free
        "num_generations": 8,
        "seq": 74240,
        "completion": 64000,
        "cp": 2,  # --ds.ring_attn_size 2
        "beta": 1e-5,
        "gpus": 4,
        "rollout": "vllm-colocate",
        "rollout_memory": 0.7,
    }
    assert _pick(found.options, want) == want
    assert "rollout_sleep" not in found.options  # no --vllm.enable_sleep
    assert "--algo.advantage.estimator" in _named(found.not_modelled)
    assert "reward_model" not in found.options  # --train.agent_func_path


def test_dpo_heredoc_and_kto() -> None:
    dpo = read_from_files([DPO]).options
    assert _pick(
        dpo,
        {
            "objective": "dpo",
            "beta": 0.1,
            "reference": "separate",
            "seq": 8192,
            "batch": 1,
            "zero": 3,
            "checkpointing": "full",
        },
    ) == {
        "objective": "dpo",
        "beta": 0.1,
        "reference": "separate",
        "seq": 8192,
        "batch": 1,
        "zero": 3,
        "checkpointing": "full",
    }
    kto = read_from_files([KTO]).options
    assert _pick(kto, {"objective": "kto", "beta": 0.1, "seq": 8192, "precision": "mixed-bf16"}) == {
        "objective": "kto",
        "beta": 0.1,
        "seq": 8192,
        "precision": "mixed-bf16",
    }


def _job(argv: str) -> Any:
    text = f"python3 -m openrlhf.cli.train_ppo_ray {argv}\n"
    return map_documents([("j.sh", parse_document(text, "j.sh"))])


def test_snake_case_defaults_of_their_era() -> None:
    o = _job(
        "--pretrain m --advantage_estimator group_norm --n_samples_per_prompt 4 --init_kl_coef 0"
    ).options
    # f2f971fd: no --bf16 -> DeepSpeed fp32; micro_train_batch_size 4; prompt 1024 + generate 1024
    assert (o["precision"], o["batch"], o["seq"], o["zero"]) == ("fp32", 4, 2048, 2)
    assert (o["objective"], o["reference"], o["beta"], o["rollout"]) == ("grpo", "none", 0.0, "hf")
    # rollout_batch_size 1024 x n 4 over 8 ranks (default actor GPUs) = 512, micro-batches of 4
    assert o["steps_per_generation"] == 1024 * 4 // 8 // 4


def test_lora_qlora_liger_and_unset_variable() -> None:
    found = _job(
        "--actor.model_name_or_path $MODEL --ds.lora.rank 16 --ds.load_in_4bit --ds.use_liger_kernel "
        "--ds.lora.target_modules q_proj v_proj --algo.advantage.estimator rloo"
    )
    o = found.options
    assert (o["method"], o["lora_rank"], o["lora_targets"], o["liger"]) == (
        "qlora",
        16,
        "q_proj,v_proj",
        True,
    )
    assert o["objective"] == "rloo" and "model" not in o
    assert "--actor.model_name_or_path" in _named(found.not_modelled)  # $MODEL: never set by the script
    assert any("give MODEL" in n for n in found.notes)


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("deepspeed --module openrlhf.cli.train_sft --pretrain x\n", "not a post-training command"),
        ("python3 -m openrlhf.cli.train_dpo --beta 'x\n", "cannot split"),
        ("python3 -m openrlhf.cli.train_dpo --zero_stage three\n", r"--zero_stage='three': must be a whole"),
        (
            "python3 -m openrlhf.cli.train_ppo_ray --vllm.num_engines 1 --train.colocate_all "
            "--vllm.gpu_memory_utilization high\n",
            "utilization='high'",
        ),
    ],
)
def test_one_line_errors(text: str, match: str) -> None:
    with pytest.raises(InputError, match=match) as e:
        map_documents([("bad.sh", parse_document(text, "bad.sh"))])
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("path", [PPO, DPO, REINFORCE, PPO_SNAKE, REWARD_FN, KTO])
def test_no_openrlhf_script_is_read_as_sft(path: Path) -> None:
    assert read_from_files([path]).options["objective"] in ("ppo", "grpo", "rloo", "dpo", "kto")
