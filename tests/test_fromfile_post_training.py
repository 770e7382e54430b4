"""Post-training files map to the post-training job, or name what is not modelled; none is read as SFT
(peakmem.fromfile.post_training; issue 29's "--from maps every memory field ... or names it")."""

from __future__ import annotations

from typing import Any

import pytest

from peakmem.errors import InputError
from peakmem.fromfile import map_documents
from peakmem.fromfile.merge import map_training_arguments
from peakmem.fromfile.post_training import POST_TRAINING_FIELDS, objective

# open-r1's GRPO recipes (recipes/*/grpo/config_demo.yaml) set these keys; values of this sketch
GRPO = {
    "model_name_or_path": "Qwen/Qwen2.5-1.5B-Instruct",
    "bf16": True,
    "per_device_train_batch_size": 16,
    "use_vllm": True,
    "vllm_mode": "colocate",
    "vllm_gpu_memory_utilization": 0.3,
    "num_generations": 16,
    "max_completion_length": 1024,
    "beta": 0.04,
}


def _keys(items: tuple[str, ...]) -> set[str]:
    return {item.split(":", 1)[1].split(" = ", 1)[0] for item in items}


def test_a_trl_grpo_file_maps_to_the_grpo_job() -> None:
    found = map_documents([("grpo.yaml", GRPO)])
    o = found.options
    assert (o["objective"], o["beta"], o["num_generations"], o["completion"]) == ("grpo", 0.04, 16, 1024)
    assert (o["rollout"], o["rollout_memory"], o["batch"]) == ("vllm-colocate", 0.3, 16)
    # TRL's GRPOConfig turns on gradient checkpointing by default; the file's bf16 is amp-bf16
    assert o["checkpointing"] == "full"
    assert not any("post-training" in item for item in found.not_modelled), found.not_modelled


def test_a_trl_grpo_file_answers_the_grpo_job() -> None:
    import peakmem

    doc = {
        **GRPO,
        "per_device_train_batch_size": 16,
        "max_prompt_length": 512,
        "model_name_or_path": "qwen2.5-0.5b",
    }
    got = peakmem.train(None, from_file=_write(doc), gpu="h100-80gb").to_dict()
    assert got["setup"]["post_training"] == {
        "objective": "grpo",
        "reference": "separate",
        "beta": 0.04,
        "rollout": "vllm-colocate",
        "num_generations": 16,
        "completion": 1024,
        "steps_per_generation": 1,
        "rollout_memory": 0.3,
        "rollout_sleep": False,
    }
    assert got["setup"]["seq_len"] == 512 + 1024  # max_prompt_length + max_completion_length
    assert set(got["phases"]) == {"rollout", "scoring", "forward", "backward", "optimizer"}


def _write(doc: dict[str, Any]) -> str:
    import json
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(doc, f)
    return f.name


@pytest.mark.parametrize(
    ("doc", "want"),
    [
        ({"base_model": "x", "rl": "dpo", "micro_batch_size": 2}, {"objective": "dpo"}),  # axolotl
        (
            {
                "base_model": "x",
                "rl": "grpo",
                "trl": {"beta": 0.001, "num_generations": 4, "use_vllm": True, "vllm_mode": "server"},
            },
            {"objective": "grpo", "beta": 0.001, "num_generations": 4, "rollout": "vllm-server"},
        ),  # axolotl's trl: block
        (
            {"model_name_or_path": "x", "stage": "dpo", "pref_beta": 0.1, "finetuning_type": "lora"},
            {"objective": "dpo", "beta": 0.1},
        ),  # LLaMA-Factory
        ({"model_name_or_path": "x", "stage": "dpo", "pref_loss": "simpo"}, {"objective": "simpo"}),
        (
            {"output_dir": "o", "precompute_ref_log_probs": True, "beta": 0.1},
            {
                "objective": "dpo",
                "reference": "precomputed",
                "checkpointing": "full",
                "precision": "amp-bf16",
            },
        ),
        ({"output_dir": "o", "beta": 0.1}, {"objective": "dpo"}),  # beta alone: DPO, never below the job
        ({"base_model": "x", "rl": "kto"}, {"objective": "kto"}),  # axolotl
        ({"output_dir": "o", "desirable_weight": 1.0, "beta": 0.2}, {"objective": "kto", "beta": 0.2}),
        (
            {"output_dir": "o", "rloo_k": 4, "vllm_enable_sleep_mode": True, "use_vllm": True},
            {"objective": "rloo", "num_generations": 4, "rollout": "vllm-colocate", "rollout_sleep": True},
        ),
    ],
)
def test_each_framework_maps_its_objective(doc: dict[str, Any], want: dict[str, Any]) -> None:
    found = map_documents([("f.yaml", doc)])
    assert {k: found.options.get(k) for k in want} == want, found.options
    assert not any("post-training job" in item for item in found.not_modelled), found.not_modelled


@pytest.mark.parametrize(
    ("doc", "name"),
    [
        ({"model_name_or_path": "x", "stage": "ppo", "reward_model": "r", "finetuning_type": "lora"}, "ppo"),
        ({"output_dir": "o", "num_ppo_epochs": 4, "vf_coef": 0.1}, "ppo"),  # TRL PPOConfig
    ],
)
def test_objectives_not_modelled_are_named(doc: dict[str, Any], name: str) -> None:
    assert objective(doc) is not None and objective(doc)[0] == name  # type: ignore[index]
    found = map_documents([("f.yaml", doc)])
    assert any(f"a {name} post-training job: not modelled" in item for item in found.not_modelled)
    assert "objective" not in found.options
    for key in doc:
        if key in POST_TRAINING_FIELDS and key not in ("rl", "stage"):
            assert key in _keys(found.not_modelled)


def test_memory_fields_not_modelled_are_named() -> None:
    found = map_documents([("g.yaml", {**GRPO, "vllm_tensor_parallel_size": 2, "num_iterations": 2})])
    assert {"vllm_tensor_parallel_size", "num_iterations"} <= _keys(found.not_modelled)


@pytest.mark.parametrize(
    "doc",
    [
        {"base_model": "x", "micro_batch_size": 2},
        {"model_name_or_path": "x", "stage": "sft", "finetuning_type": "lora"},
        {"model_name_or_path": "x", "stage": "pt", "finetuning_type": "full"},
        {"output_dir": "o", "per_device_train_batch_size": 4, "beta": 0},  # beta 0: no reference model
    ],
)
def test_supervised_files_gain_no_post_training_entry(doc: dict[str, Any]) -> None:
    assert objective(doc) is None
    found = map_documents([("f.yaml", doc)])
    assert not any("post-training" in item for item in found.not_modelled)


def test_strict_mapping_refuses_a_post_training_job_naming_the_field() -> None:
    doc = {"output_dir": "o", "per_device_train_batch_size": 2, "num_ppo_epochs": 4}
    with pytest.raises(InputError, match=r"TrainingArguments\.num_ppo_epochs=4: not modelled"):
        map_training_arguments(doc, model="m", method="full", weights=None, strict=True)


def test_open_r1_recipe_maps_with_the_trl_it_pins() -> None:
    """open-r1's published GRPO recipe (tests/fixtures/frameworks/open-r1/config_demo.yaml,
    huggingface/open-r1 @ 1416fa0c recipes/Qwen2.5-1.5B-Instruct/grpo/config_demo.yaml): a GRPOConfig run
    by open-r1's scripts,
    which pin trl==0.18.0, whose GRPOConfig defaults vllm_mode to "server" and beta to 0.04 (v0.18.0
    trl/trainer/grpo_config.py); the file sets neither."""
    from pathlib import Path

    from peakmem.fromfile import read_from_files

    path = Path(__file__).parent / "fixtures" / "frameworks" / "open-r1" / "config_demo.yaml"
    found = read_from_files([path])
    want = {
        "objective": "grpo",
        "model": "Qwen/Qwen2.5-1.5B-Instruct",
        "num_generations": 16,
        "completion": 1024,
        "seq": 512 + 1024,
        "batch": 16,
        "grad_accum": 4,
        "checkpointing": "full",
        "beta": 0.04,
        "rollout": "vllm-server",  # TRL 0.18.0's defaults, not 1.16's (0.0, colocate)
    }
    assert {k: found.options.get(k) for k in want} == want
    assert not any("no sequence length" in n for n in found.notes)  # prompt + completion is the sequence
    assert any("trl==0.18.0" in n for n in found.notes)
    # a plain TRL GRPOConfig (no reward_funcs) keeps TRL 1.16's defaults
    plain = map_documents([("g.yaml", {"output_dir": "o", "use_vllm": True, "num_generations": 4})]).options
    assert plain["rollout"] == "vllm-colocate" and "beta" not in plain


def test_a_trl_distillation_file_maps_to_the_distill_job() -> None:
    # trl/trainer/distillation_config.py: teacher_model_name_or_path, beta (the divergence), the
    # completion length; the student generates on-policy
    doc = {"model_name_or_path": "Qwen/Qwen3-1.7B", "teacher_model_name_or_path": "Qwen/Qwen3-8B",
           "beta": 0.5, "max_completion_length": 256, "per_device_train_batch_size": 4}  # fmt: skip
    found = map_documents([("distill.yaml", doc)])
    o = found.options
    assert (o["objective"], o["teacher"], o["beta"], o["completion"]) == (
        "distill",
        "Qwen/Qwen3-8B",
        0.5,
        256,
    )
    assert not any("post-training" in item for item in found.not_modelled), found.not_modelled


def test_a_gkd_file_is_named_not_modelled() -> None:
    # trl.experimental.gkd GKDConfig (lmbda, seq_kd): full-vocabulary logits, not the chunked head
    doc = {
        "teacher_model_name_or_path": "Qwen/Qwen3-8B",
        "lmbda": 0.5,
        "beta": 0.5,
        "per_device_train_batch_size": 2,
    }
    found = map_documents([("gkd.yaml", doc)])
    assert found.options.get("objective") in (None, "sft")
    assert any(item.startswith("gkd.yaml:lmbda") and "gkd post-training job: not modelled" in item
               for item in found.not_modelled), found.not_modelled  # fmt: skip
    assert any("teacher_model_name_or_path" in item for item in found.not_modelled)
