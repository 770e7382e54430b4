"""OpenRLHF (OpenRLHF/OpenRLHF) launch scripts: the flags of ``openrlhf.cli.train_ppo_ray``,
``train_dpo`` and ``train_kto`` mapped onto the post-training options; never read as SFT.

OpenRLHF renamed its flags twice; all three spellings are read (argparse in ``openrlhf/cli/*.py``):

* snake_case up to 2026-01 (commit ``SNAKE_COMMIT``): ``--pretrain``, ``--bf16``, ``--prompt_max_len``,
  ``--generate_max_len``, ``--micro_train_batch_size`` (default 4), ``--colocate_all_models``, ...;
* snake_case with ``--param_dtype`` / ``--max_len`` / ``--max_new_tokens`` (2026-01 to 2026-04);
* dotted from 2026-04-19 (commit ``DOTTED_COMMIT``): ``--actor.model_name_or_path``,
  ``--ds.param_dtype``, ``--train.micro_batch_size`` (default 1), ``--train.colocate_all``, ...

Each flag is brought to its dotted name (:data:`ALIASES`); defaults are those of the spelling's era.
Behaviour read in ``train_ppo_ray.py`` (``DOTTED_COMMIT``): a reference only when ``init_coef`` > 0; a
critic only for the ``gae`` estimator (its path defaults to the reward model's, else the actor's); a reward
model unless ``remote_url`` / ``agent_func_path``; vLLM engines only when ``num_engines`` > 0, on the
actor's GPUs only with ``colocate_all`` (else on GPUs of their own), sleeping only with ``colocate_all``;
``utils/deepspeed/deepspeed_utils.py``: DeepSpeed's bf16 / fp16 engine (fp32 when the old ``--bf16`` is
absent), ZeRO stage, ``offload_optimizer`` with ``adam_offload``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from peakmem.errors import InputError
from peakmem.fromfile.hf_trainer import _attention_impl, liger
from peakmem.fromfile.mapper import Converter, _Mapper, as_float, as_int, names_list, packed_rows, truthy
from peakmem.fromfile.script import Command

SNAKE_COMMIT = "f2f971fdff6f534dbc4df53cce43ef8da27eecd6"  # 2026-01-06, the last with --bf16
DOTTED_COMMIT = "3c3be6234e0cb353e76bb8019947db9dfe99fca7"  # 2026-08-13
PPO, DPO, KTO = "openrlhf.cli.train_ppo_ray", "openrlhf.cli.train_dpo", "openrlhf.cli.train_kto"
MODULES = (PPO, DPO, KTO)
OTHER_MODULES = (
    "openrlhf.cli.train_sft",
    "openrlhf.cli.train_rm",
    "openrlhf.cli.train_prm",
    "openrlhf.cli.train_kd",
)
SCRIPT_KEY = "__script__"

# old flag -> the dotted name (train_ppo_ray.py / train_dpo.py / train_kto.py at SNAKE_COMMIT and the
# commit before DOTTED's rename, 76351db1); DPO's --model.* policy flags are read as the actor's
ALIASES: dict[str, str] = {
    "pretrain": "actor.model_name_or_path",
    "model.model_name_or_path": "actor.model_name_or_path",
    "reward_pretrain": "reward.model_name_or_path",
    "critic_pretrain": "critic.model_name_or_path",
    "ref_pretrain": "ref.model_name_or_path",
    "remote_rm_url": "reward.remote_url",
    "agent_func_path": "train.agent_func_path",
    "advantage_estimator": "algo.advantage.estimator",
    "n_samples_per_prompt": "rollout.n_samples_per_prompt",
    "micro_train_batch_size": "train.micro_batch_size",
    "train_batch_size": "train.batch_size",
    "micro_rollout_batch_size": "rollout.micro_batch_size",
    "rollout_batch_size": "rollout.batch_size",
    "prompt_max_len": "data.prompt_max_len",
    "generate_max_len": "rollout.max_new_tokens",
    "max_new_tokens": "rollout.max_new_tokens",
    "max_len": "data.max_len",
    "init_kl_coef": "algo.kl.init_coef",
    "use_kl_loss": "algo.kl.use_loss",
    "zero_stage": "ds.zero_stage",
    "adam_offload": "ds.adam_offload",
    "gradient_checkpointing": "actor.gradient_checkpointing_enable",
    "model.gradient_checkpointing_enable": "actor.gradient_checkpointing_enable",
    "param_dtype": "ds.param_dtype",
    "data_type": "ds.param_dtype",
    "lora_rank": "ds.lora.rank",
    "lora_alpha": "ds.lora.alpha",
    "target_modules": "ds.lora.target_modules",
    "lora_dropout": "ds.lora.dropout",
    "load_in_4bit": "ds.load_in_4bit",
    "vllm_num_engines": "vllm.num_engines",
    "vllm_tensor_parallel_size": "vllm.tensor_parallel_size",
    "vllm_gpu_memory_utilization": "vllm.gpu_memory_utilization",
    "vllm_enable_sleep": "vllm.enable_sleep",
    "enforce_eager": "vllm.enforce_eager",
    "colocate_all_models": "train.colocate_all",
    "colocate_actor_ref": "train.colocate_actor_ref",
    "colocate_critic_reward": "train.colocate_critic_reward",
    "deepspeed_enable_sleep": "ds.enable_sleep",
    "ref_offload": "ref.offload",
    "actor_num_gpus_per_node": "actor.num_gpus_per_node",
    "actor_num_nodes": "actor.num_nodes",
    "ref_num_gpus_per_node": "ref.num_gpus_per_node",
    "ref_num_nodes": "ref.num_nodes",
    "critic_num_gpus_per_node": "critic.num_gpus_per_node",
    "critic_num_nodes": "critic.num_nodes",
    "reward_num_gpus_per_node": "reward.num_gpus_per_node",
    "reward_num_nodes": "reward.num_nodes",
    "beta": "model.beta",
    "ipo": "model.ipo_enable",
    "ring_attn_size": "ds.ring_attn_size",
    "packing_samples": "ds.packing_samples",
    "use_dynamic_batch": "train.dynamic_batch_enable",
    "train_max_tokens_per_gpu": "train.max_tokens_per_gpu",
    "rollout_max_tokens_per_gpu": "rollout.max_tokens_per_gpu",
    "attn_implementation": "ds.attn_implementation",
    "use_liger_kernel": "ds.use_liger_kernel",
    "ds_tensor_parallel_size": "ds.tensor_parallel_size",
    "zpg": "ds.zpg",
    "grad_accum_dtype": "ds.grad_accum_dtype",
    "enable_ema": "train.enable_ema",
    "async_train": "train.async_enable",
    "vllm_generate_batch_size": "rollout.vllm_generate_batch_size",
}
# Defaults that change memory, by spelling and command (argparse defaults at each commit)
_COMMON = {"ds.zero_stage": 2, "train.batch_size": 128}
DEFAULTS: dict[tuple[str, str], dict[str, Any]] = {
    ("dotted", PPO): {
        **_COMMON,
        "train.micro_batch_size": 1,
        "rollout.micro_batch_size": 1,
        "ds.param_dtype": "bf16",
        "data.max_len": 2048,
        "vllm.gpu_memory_utilization": 0.95,
        "vllm.tensor_parallel_size": 1,
        "algo.kl.init_coef": 0.01,
        "algo.advantage.estimator": "gae",
        "rollout.n_samples_per_prompt": 1,
        "rollout.batch_size": 1024,
        "actor.num_gpus_per_node": 8,
        "actor.num_nodes": 1,
        "train.max_tokens_per_gpu": 16192,
    },
    ("snake", PPO): {
        **_COMMON,
        "train.micro_batch_size": 4,
        "rollout.micro_batch_size": 8,
        "ds.param_dtype": "fp32",
        "data.prompt_max_len": 1024,
        "rollout.max_new_tokens": 1024,
        "vllm.gpu_memory_utilization": 0.95,
        "vllm.tensor_parallel_size": 1,
        "algo.kl.init_coef": 0.01,
        "algo.advantage.estimator": "gae",
        "rollout.n_samples_per_prompt": 1,
        "rollout.batch_size": 1024,
        "actor.num_gpus_per_node": 8,
        "actor.num_nodes": 1,
        "train.max_tokens_per_gpu": 16192,
    },
    ("dotted", DPO): {
        **_COMMON,
        "train.micro_batch_size": 8,
        "ds.param_dtype": "bf16",
        "data.max_len": 512,
        "model.beta": 0.1,
    },
    ("snake", DPO): {
        **_COMMON,
        "train.micro_batch_size": 8,
        "ds.param_dtype": "fp32",
        "data.max_len": 512,
        "model.beta": 0.1,
    },
    ("snake", KTO): {
        **_COMMON,
        "train.micro_batch_size": 8,
        "ds.param_dtype": "fp32",
        "data.max_len": 2048,
        "model.beta": 0.01,
    },
}
DEFAULTS[("dotted", KTO)] = DEFAULTS[("snake", KTO)]  # KTO was removed (2026-03) before the rename
# --algo.advantage.estimator -> peakmem objective; the critic-free ones other than rloo have GRPO's roles
OBJECTIVE = {
    "gae": "ppo",
    "rloo": "rloo",
    "group_norm": "grpo",
    "dr_grpo": "grpo",
    "reinforce": "grpo",
    "reinforce_baseline": "grpo",
}
_DTYPE = {"bf16": "mixed-bf16", "fp16": "mixed-fp16", "fp32": "fp32"}


def is_openrlhf(doc: Mapping[str, Any]) -> bool:
    script = doc.get(SCRIPT_KEY)
    return isinstance(script, Mapping) and str(script.get("module", "")).startswith("openrlhf.cli.")


def flags_document(command: Command, name: str) -> dict[str, Any]:
    """``--flag value`` / ``--flag`` / ``--flag a b`` (nargs) -> ``{"flags": {dotted name: value}}`` with
    the flag as written kept for the echo."""
    if command.module not in MODULES:
        raise InputError(
            f"--from {name}: {command.module}: not a post-training command (peakmem reads "
            f"{', '.join(MODULES)})"
        )
    flags: dict[str, Any] = {}
    written: dict[str, str] = {}
    argv = list(command.argv)
    i = 0
    while i < len(argv):
        word = argv[i]
        i += 1
        if not word.startswith("--"):
            continue
        flag, eq, inline = word[2:].partition("=")
        values: list[str] = [inline] if eq else []
        while not eq and i < len(argv) and not argv[i].startswith("--"):
            values.append(argv[i])
            i += 1
        canonical = ALIASES.get(flag, flag)
        flags[canonical] = True if not values else values[0] if len(values) == 1 else values
        written[canonical] = f"--{flag}"
        if flag == "flash_attn":  # OpenRLHF before 2025-08: --flash_attn
            flags["ds.attn_implementation"], written["ds.attn_implementation"] = (
                "flash_attention_2",
                "--flash_attn",
            )
        if flag == "bf16":
            flags["ds.param_dtype"], written["ds.param_dtype"] = "bf16", "--bf16"
        if flag == "ref_reward_offload":
            for role in ("ref", "reward"):
                flags[f"{role}.offload"], written[f"{role}.offload"] = True, "--ref_reward_offload"
    dotted = any("." in w.lstrip("-").split("=")[0] for w in argv if w.startswith("--"))
    return {
        SCRIPT_KEY: {
            "module": command.module,
            "style": "dotted" if dotted else "snake",
            "unresolved": list(command.unresolved),
            "passes_args": command.passes_args,
            "notes": list(command.notes),
            "written": written,
        },
        "flags": flags,
    }


class _Flags:
    def __init__(self, m: _Mapper, doc: Mapping[str, Any]) -> None:
        script = doc[SCRIPT_KEY]
        self.m = m
        self.module = str(script["module"])
        self.style = str(script["style"])
        self.flags: Mapping[str, Any] = doc.get("flags") or {}
        self.written: Mapping[str, str] = script.get("written") or {}
        self.defaults = DEFAULTS[(self.style, self.module)]
        self.read: set[str] = set()

    def _unresolved(self, key: str) -> bool:
        value = self.flags.get(key)
        return isinstance(value, str) and "$" in value

    def given(self, key: str) -> bool:
        self.read.add(key)
        return self.flags.get(key) is not None and not self._unresolved(key)

    def value(self, key: str) -> Any:
        return self.flags[key] if self.given(key) else self.defaults.get(key)

    def name_unresolved(self) -> None:
        """Flags read whose value is a shell variable the script does not set: named (the default, if
        any, counted); the others (paths, logging) in one note."""
        other: list[str] = []
        for key in self.flags:
            if self._unresolved(key):
                if key in self.read:
                    self.m.skip(
                        self.written.get(key, f"--{key}"),
                        self.flags[key],
                        "a shell variable the script does not set; OpenRLHF's default counted",
                    )
                else:
                    other.append(self.written.get(key, f"--{key}"))
        if other:
            self.m.notes.append(
                "shell variables the script does not set, in flags that do not change memory: "
                + ", ".join(other)
            )

    def number(self, key: str, convert: Converter) -> Any:
        """The flag's value (or its default) as a number; a bad value names the flag as written."""
        return convert(self.m, self.written.get(key, f"--{key}"), self.value(key))

    def on(self, key: str) -> bool:
        return self.given(key) and truthy(self.flags[key])

    def src(self, key: str) -> str:
        if self.given(key):
            return self.written.get(key, f"--{key}")
        era = DOTTED_COMMIT if self.style == "dotted" else SNAKE_COMMIT
        return f"(OpenRLHF default {key}={self.defaults.get(key)} @ {era[:8]})"

    def set(self, dest: str, value: Any, key: str, note: str = "") -> None:
        self.m.set(dest, value, self.src(key), note)
        if not self.given(key):
            self.m.defaults.add(dest)

    def skip(self, key: str, why: str) -> None:
        self.m.skip(self.written.get(key, f"--{key}"), self.flags.get(key), why)


def map_openrlhf(m: _Mapper, doc: Mapping[str, Any]) -> None:
    f = _Flags(m, doc)
    script = doc[SCRIPT_KEY]
    m.notes.extend(str(n) for n in script.get("notes", ()))
    if script.get("passes_args"):
        m.notes.append("the script passes its own arguments on ($@): flags given when it runs are not seen")
    if f.given("actor.model_name_or_path"):
        f.set("model", str(f.value("actor.model_name_or_path")), "actor.model_name_or_path")
    _engine(f)
    _policy(f)
    if f.module == PPO:
        _ppo(f)
    else:
        objective = "kto" if f.module == KTO else "dpo"
        m.set("objective", objective, f"{m.name}:{f.module}", "the command the script runs")
        f.set("beta", f.number("model.beta", as_float), "model.beta")
        f.set(
            "reference",
            "separate",
            "ref.model_name_or_path" if f.given("ref.model_name_or_path") else "actor.model_name_or_path",
            "OpenRLHF loads the reference as a model of its own",
        )
        if f.on("ref.offload"):
            f.skip("ref.offload", "the reference's weights on CPU (ZeRO-3 offload) between its passes")
        if f.on("model.ipo_enable"):
            m.notes.append("IPO: DPO's memory")
        seq = f.number("data.max_len", as_int)
        f.set("seq", seq, "data.max_len", "chosen and rejected each up to max_len")
        f.set(
            "batch",
            f.number("train.micro_batch_size", as_int),
            "train.micro_batch_size",
        )
    f.name_unresolved()


def _engine(f: _Flags) -> None:
    """DeepSpeed: precision, ZeRO stage, offload, tensor parallelism, ring attention."""
    dtype = str(f.value("ds.param_dtype")).lower()
    if dtype not in _DTYPE:
        f.skip("ds.param_dtype", "a weight dtype peakmem does not know")
    else:
        note = (
            "DeepSpeed engine: 16-bit weights and grads, fp32 master weights and states"
            if dtype != "fp32"
            else ("the snake_case CLI without --bf16: DeepSpeed in fp32")
        )
        f.set("precision", _DTYPE[dtype], "ds.param_dtype", note)
    stage = f.number("ds.zero_stage", as_int)
    f.set("zero", stage, "ds.zero_stage")
    if f.on("ds.adam_offload"):
        f.set("offload", "cpu", "ds.adam_offload", "DeepSpeedCPUAdam: Adam states on CPU")
    tp = f.number("ds.tensor_parallel_size", as_int) if f.given("ds.tensor_parallel_size") else None
    if tp and tp > 1:
        f.skip("ds.tensor_parallel_size", "DeepSpeed AutoTP training: not modelled for OpenRLHF")
    ring = f.number("ds.ring_attn_size", as_int) if f.given("ds.ring_attn_size") else None
    if ring and ring > 1:
        f.set("cp", ring, "ds.ring_attn_size", "ring attention: each sequence split over ring_attn_size GPUs")
    zpg = f.number("ds.zpg", as_int) if f.given("ds.zpg") else None
    if zpg and zpg > 1:
        f.skip("ds.zpg", "ZeRO++ hierarchical partitioning (a secondary copy of the weights per node)")
    for key, why in (
        ("ds.grad_accum_dtype", "the gradient accumulation buffer's dtype"),
        ("train.enable_ema", "an EMA copy of the actor"),
        ("train.async_enable", "asynchronous rollout and training"),
    ):
        if f.given(key) and f.flags[key] not in (False,):
            f.skip(key, why)


def _policy(f: _Flags) -> None:
    m = f.m
    ckpt = "actor.gradient_checkpointing_enable"
    f.set("checkpointing", "full" if f.on(ckpt) else "none", ckpt)
    if f.given("ds.attn_implementation"):
        _attention_impl(m, f.src("ds.attn_implementation"), f.flags["ds.attn_implementation"])
    else:
        m.set("attention", "flash", "(OpenRLHF default: attn_implementation=flash_attention_2)")
        m.defaults.add("attention")
    if f.on("ds.use_liger_kernel"):
        liger(m, f.src("ds.use_liger_kernel"))
    rank = f.number("ds.lora.rank", as_int) if f.given("ds.lora.rank") else 0
    if rank and rank > 0:
        qlora = f.on("ds.load_in_4bit")
        f.set("method", "qlora" if qlora else "lora", "ds.lora.rank", "with load_in_4bit" if qlora else "")
        f.set("lora_rank", rank, "ds.lora.rank")
        alpha = f.number("ds.lora.alpha", as_float) if f.given("ds.lora.alpha") else 16.0
        f.set("lora_alpha", alpha, "ds.lora.alpha")
        if f.given("ds.lora.target_modules"):
            targets = f.flags["ds.lora.target_modules"]
            f.set(
                "lora_targets",
                "all-linear" if targets == "all-linear" else ",".join(names_list(targets)),
                "ds.lora.target_modules",
            )
    else:
        f.set("method", "full", "ds.lora.rank", "no adapter")
    if f.on("ds.packing_samples"):
        m.notes.append(
            f"{f.src('ds.packing_samples')}: samples packed without padding; each counted at its "
            "longest (an upper bound)"
        )


def _ppo(f: _Flags) -> None:
    m = f.m
    key = "algo.advantage.estimator"
    estimator = str(f.value(key)).lower()
    objective = OBJECTIVE.get(estimator)
    if objective is None:
        f.skip(key, "an advantage estimator peakmem does not know: read as GRPO's roles")
        objective = "grpo"
    elif objective == "grpo" and estimator != "group_norm":
        m.skip(
            f.src(key), estimator, "critic-free: read as GRPO's roles (policy, reference when a KL is used)"
        )
    f.set("objective", objective, key, "gae: PPO with a critic" if objective == "ppo" else "")
    per_node = f.number("actor.num_gpus_per_node", as_int) or 1
    nodes = f.number("actor.num_nodes", as_int) or 1
    gpus = per_node * nodes
    f.set("gpus", gpus, "actor.num_gpus_per_node", f"actor {per_node} GPUs per node x {nodes} nodes")
    f.set("gpus_per_node", per_node, "actor.num_gpus_per_node")
    colocated = f.on("train.colocate_all")
    _roles(f, objective, colocated)
    _rollout(f, colocated)
    _batch(f, gpus)


def _roles(f: _Flags, objective: str, colocated: bool) -> None:
    m = f.m
    kl = f.number("algo.kl.init_coef", as_float) or 0.0
    f.set(
        "beta",
        kl,
        "algo.kl.init_coef",
        "in the loss (use_loss)" if f.on("algo.kl.use_loss") else "in the reward",
    )
    if kl > 0:
        f.set(
            "reference", "separate", "algo.kl.init_coef", "OpenRLHF loads the reference as a model of its own"
        )
        if f.on("ref.offload"):
            f.skip("ref.offload", "the reference's weights on CPU (ZeRO-3 offload) between its passes")
    else:
        f.set("reference", "none", "algo.kl.init_coef", "init_coef 0: no reference")
    remote = f.given("reward.remote_url") or f.given("train.agent_func_path")
    reward = f.value("reward.model_name_or_path") if f.given("reward.model_name_or_path") else None
    if reward is not None and not remote:
        names = names_list(reward)
        f.set("reward_model", names[0], "reward.model_name_or_path")
        if len(names) > 1:
            f.skip("reward.model_name_or_path", f"{len(names)} reward models: the first counted")
        if f.on("reward.offload"):
            f.skip("reward.offload", "the reward model's weights on CPU (ZeRO-3 offload) between its passes")
    if objective == "ppo":
        if f.given("critic.model_name_or_path"):
            f.set("critic", str(f.value("critic.model_name_or_path")), "critic.model_name_or_path")
        elif reward is not None and not remote:
            f.set(
                "critic",
                names_list(reward)[0],
                "reward.model_name_or_path",
                "OpenRLHF: the critic starts from the reward model",
            )
        # else: the critic starts from the actor (absent = the policy's own model)
    if not colocated:
        shared = "the reference" if f.on("train.colocate_actor_ref") else ""
        flag = "--train.colocate_all" if f.style == "dotted" else "--colocate_all_models"
        m.not_modelled.append(
            f"{m.name}:{flag} = false: "
            "the reference, critic and reward model run on GPUs of their own (per-role num_gpus_per_node)"
            + (f" ({shared} shares the actor's)" if shared else "")
            + "; peakmem counts every role on the actor's GPUs (an upper bound)"
        )


def _rollout(f: _Flags, colocated: bool) -> None:
    engines = f.number("vllm.num_engines", as_int) if f.given("vllm.num_engines") else 0
    if not engines:
        f.set("rollout", "hf", "vllm.num_engines", "no vLLM engine: generate on the actor")
        return
    if not colocated:
        f.set("rollout", "vllm-server", "vllm.num_engines", f"{engines} vLLM engines on GPUs of their own")
        return
    f.set("rollout", "vllm-colocate", "train.colocate_all", "vLLM on the actor's GPUs")
    f.set(
        "rollout_memory",
        f.number("vllm.gpu_memory_utilization", as_float),
        "vllm.gpu_memory_utilization",
    )
    if f.on("vllm.enable_sleep"):
        f.set("rollout_sleep", True, "vllm.enable_sleep")
    tp = f.number("vllm.tensor_parallel_size", as_int) or 1
    if tp > 1:
        f.skip(
            "vllm.tensor_parallel_size", "the rollout engine's tensor parallelism (its weights counted whole)"
        )
    if f.on("ds.enable_sleep"):
        f.skip("ds.enable_sleep", "the DeepSpeed models' states offloaded to CPU during rollout")


def _batch(f: _Flags, gpus: int) -> None:
    m = f.m
    n = f.number("rollout.n_samples_per_prompt", as_int) or 1
    f.set("num_generations", n, "rollout.n_samples_per_prompt")
    if f.given("data.prompt_max_len") or (f.style == "snake" and not f.given("data.max_len")):
        prompt = f.number("data.prompt_max_len", as_int) or 0
        completion = f.number("rollout.max_new_tokens", as_int) or 0
        f.set(
            "seq",
            prompt + completion,
            "data.prompt_max_len",
            f"prompt_max_len {prompt} + generate_max_len {completion}",
        )
        f.set("completion", completion, "rollout.max_new_tokens")
        seq = prompt + completion
    else:
        seq = f.number("data.max_len", as_int)
        f.set("seq", seq, "data.max_len", "prompt + response")
        if f.given("rollout.max_new_tokens"):
            f.set(
                "completion",
                f.number("rollout.max_new_tokens", as_int),
                "rollout.max_new_tokens",
            )
        else:
            m.not_modelled.append(
                f"{m.name}:rollout.max_new_tokens = (not set): completions up to max_len minus "
                "each prompt; peakmem's default completion counted"
            )
    ring = f.number("ds.ring_attn_size", as_int) if f.given("ds.ring_attn_size") else 1
    dp = max(1, gpus // (ring or 1))
    if f.on("train.dynamic_batch_enable"):
        budget = f.number("train.max_tokens_per_gpu", as_int)
        f.set("max_tokens_per_gpu", budget, "train.max_tokens_per_gpu", "dynamic_batch_enable")
        f.set("batch", 1, "train.dynamic_batch_enable", "one packed row per micro-batch")
        samples = (f.number("rollout.batch_size", as_int) or 0) * n // dp
        if budget and samples and seq:
            spg, note = packed_rows(samples, seq, budget, n)
            f.set("steps_per_generation", spg, "rollout.batch_size", note)
        return
    micro = f.number("train.micro_batch_size", as_int) or 1
    f.set("batch", micro, "train.micro_batch_size")
    total = f.number("train.batch_size", as_int) or 0
    accum, left = divmod(total, micro * dp)
    if accum >= 1 and not left:  # train_batch_size is global: micro-batch x accumulation x ranks
        f.set("grad_accum", accum, "train.batch_size", f"{total} / (micro {micro} x {dp} ranks)")
    prompts = f.number("rollout.batch_size", as_int) or 0
    spg, rest = divmod(prompts * n, dp * micro)
    if spg >= 1 and not rest:
        f.set(
            "steps_per_generation",
            spg,
            "rollout.batch_size",
            f"{prompts} prompts x n {n} / {dp} ranks / micro {micro}",
        )
    rollout_micro = f.number("rollout.micro_batch_size", as_int)
    if rollout_micro is not None and rollout_micro != micro:
        m.skip(
            f.src("rollout.micro_batch_size"),
            rollout_micro,
            "the scoring passes' own micro-batch (the training micro-batch counted)",
        )
