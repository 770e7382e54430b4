"""Post-training files are recognised and their memory fields named, never read as plain SFT
(peakmem.fromfile.post_training; issue 29's "none is read as SFT")."""

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


def test_a_trl_grpo_file_names_its_objective_and_every_memory_field() -> None:
    found = map_documents([("grpo.yaml", GRPO)])
    named = _keys(found.not_modelled)
    expected = {k for k in GRPO if k in POST_TRAINING_FIELDS}
    assert expected <= named, found.not_modelled
    assert any("a grpo post-training job" in item for item in found.not_modelled)
    assert found.options["batch"] == 16  # what is SFT-like is still read


@pytest.mark.parametrize(
    ("doc", "name"),
    [
        ({"base_model": "x", "rl": "dpo", "micro_batch_size": 2}, "dpo"),  # axolotl
        ({"base_model": "x", "rl": "kto"}, "kto"),
        ({"model_name_or_path": "x", "stage": "dpo", "pref_beta": 0.1, "finetuning_type": "lora"}, "dpo"),
        ({"model_name_or_path": "x", "stage": "ppo", "reward_model": "r", "finetuning_type": "lora"}, "ppo"),
        ({"output_dir": "o", "precompute_ref_log_probs": True, "beta": 0.1}, "dpo"),  # TRL DPOConfig
        ({"output_dir": "o", "num_ppo_epochs": 4, "vf_coef": 0.1}, "ppo"),  # TRL PPOConfig
        ({"output_dir": "o", "desirable_weight": 1.0}, "kto"),  # TRL KTOConfig
        ({"output_dir": "o", "beta": 0.1}, "preference"),  # ORPO / SimPO / CPO
    ],
)
def test_each_framework_objective_is_named(doc: dict[str, Any], name: str) -> None:
    assert objective(doc) is not None and objective(doc)[0] == name  # type: ignore[index]
    found = map_documents([("f.yaml", doc)])
    assert any(f"a {name} post-training job" in item for item in found.not_modelled), found.not_modelled


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
    doc = {"output_dir": "o", "per_device_train_batch_size": 2, "num_generations": 8}
    with pytest.raises(InputError, match=r"TrainingArguments\.num_generations=8: not modelled"):
        map_training_arguments(doc, model="m", method="full", weights=None, strict=True)
