"""verl (volcengine/verl) PPO-family jobs: a ``ppo_trainer.yaml``-shaped config (nested ``algorithm``,
``actor_rollout_ref``, ``critic``, ``reward_model``, ``data``, ``trainer``) or a launch script of Hydra
overrides (``python3 -m verl.trainer.main_ppo algorithm.adv_estimator=grpo data.max_prompt_length=512
...``), mapped onto the post-training options; never read as SFT.

Field names, defaults and behaviour read in verl's source at ``VERL_COMMIT`` (volcengine/verl):

* defaults: ``verl/trainer/config/_generated_ppo_trainer.yaml`` (the composed ``ppo_trainer.yaml``):
  ``algorithm.adv_estimator`` gae, ``rollout.gpu_memory_utilization`` 0.5, ``rollout.free_cache_engine``
  true, ``rollout.tensor_model_parallel_size`` 2, ``rollout.n`` 1, ``model.enable_gradient_checkpointing``
  true, ``actor.strategy`` fsdp, ``fsdp_config.model_dtype`` fp32 with ``dtype`` bfloat16, ``trainer``
  8 GPUs on 1 node, ``data.max_prompt_length`` / ``max_response_length`` 512, ``train_batch_size`` 1024;
  ``rollout.name`` has no default (``???``: required);
* ``verl/trainer/ppo/utils.py``: ``need_reference_policy`` = ``algorithm.use_kl_in_reward or
  actor.use_kl_loss``; ``need_critic`` = ``critic.enable`` if set, else ``adv_estimator == gae``;
* ``verl/trainer/main_ppo.py``: ``ref_in_actor = lora_rank > 0`` (the reference is the policy with its
  adapter disabled);
* ``verl/workers/rollout/vllm_rollout/vllm_async_server.py``: with ``free_cache_engine`` the hybrid
  engine sleeps at level 2 (weights and KV cache released) outside rollout;
  ``RolloutConfig.enable_sleep_mode`` defaults to True (``verl/workers/config/rollout.py``); the rollout
  shares the actor's GPUs
  (``actor_rollout_ref.hybrid_engine`` true);
* ``verl/workers/fsdp_workers.py``: FSDP ``MixedPrecision(param_dtype=bf16, reduce_dtype=fp32)`` over
  ``model_dtype`` fp32 weights, ``attn_implementation`` flash_attention_2 unless overridden;
* ``verl/workers/actor/dp_actor.py`` (via ``fsdp_workers.py``): ``ppo_mini_batch_size`` prompts x
  ``rollout.n`` split over the data-parallel ranks (GPUs / ulysses) in micro-batches of
  ``ppo_micro_batch_size_per_gpu``, or packed to ``ppo_max_token_len_per_gpu`` with ``use_dynamic_bsz``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from peakmem.fromfile.hf_trainer import _attention_impl, liger
from peakmem.fromfile.mapper import _Mapper, as_float, as_int, get, leaves, names_list, packed_rows, truthy
from peakmem.fromfile.script import Command

VERL_COMMIT = "b178a3cd56f58b2d502255daba591e92833930a7"
SRC = f"volcengine/verl @ {VERL_COMMIT[:12]}"
MODULE = "verl.trainer.main_ppo"  # the entry point every example script runs
SCRIPT_KEY = "__script__"  # a parsed script's record (module, unresolved variables) inside its document
MISSING = "???"  # OmegaConf's mandatory value: a key the run must set (rollout.name)

ARA = "actor_rollout_ref"
ACTOR, ROLLOUT, MODEL, REF = f"{ARA}.actor", f"{ARA}.rollout", f"{ARA}.model", f"{ARA}.ref"
# verl/trainer/config/_generated_ppo_trainer.yaml at VERL_COMMIT: the defaults that change memory
DEFAULTS: dict[str, Any] = {
    "algorithm.adv_estimator": "gae",
    "algorithm.use_kl_in_reward": False,
    "algorithm.kl_ctrl.kl_coef": 0.001,
    f"{ARA}.hybrid_engine": True,
    f"{MODEL}.enable_gradient_checkpointing": True,
    f"{MODEL}.lora_rank": 0,
    f"{MODEL}.lora_alpha": 16,
    f"{MODEL}.target_modules": "all-linear",
    f"{MODEL}.use_remove_padding": True,
    f"{ACTOR}.strategy": "fsdp",
    f"{ACTOR}.use_kl_loss": False,
    f"{ACTOR}.kl_loss_coef": 0.001,
    f"{ACTOR}.use_dynamic_bsz": False,
    f"{ACTOR}.ppo_max_token_len_per_gpu": 16384,
    f"{ACTOR}.ppo_mini_batch_size": 256,
    f"{ACTOR}.ulysses_sequence_parallel_size": 1,
    f"{ACTOR}.fsdp_config.param_offload": False,
    f"{ACTOR}.fsdp_config.optimizer_offload": False,
    f"{ACTOR}.fsdp_config.model_dtype": "fp32",
    f"{ACTOR}.fsdp_config.dtype": "bfloat16",
    f"{ROLLOUT}.gpu_memory_utilization": 0.5,
    f"{ROLLOUT}.free_cache_engine": True,
    f"{ROLLOUT}.tensor_model_parallel_size": 2,
    f"{ROLLOUT}.n": 1,
    "data.max_prompt_length": 512,
    "data.max_response_length": 512,
    "data.train_batch_size": 1024,
    "trainer.n_gpus_per_node": 8,
    "trainer.nnodes": 1,
}
# algorithm.adv_estimator (verl/trainer/ppo/core_algos.py AdvantageEstimator) -> peakmem objective
OBJECTIVE = {
    "gae": "ppo",
    "grpo": "grpo",
    "grpo_vectorized": "grpo",
    "rloo": "rloo",
    "rloo_vectorized": "rloo",
}
# critic-free estimators with GRPO's roles (policy, reference when KL, rollout of n per prompt)
GRPO_LIKE = frozenset(
    {
        "reinforce_plus_plus",
        "reinforce_plus_plus_baseline",
        "remax",
        "opo",
        "grpo_passk",
        "gpg",
        "optimal_token_baseline",
        "tir_optimal_token_baseline",
    }
)
ROLLOUT_ENGINES = {"vllm": "vllm", "sglang": "SGLang", "trtllm": "TensorRT-LLM"}
_DTYPE = {
    "bfloat16": "bf16",
    "bf16": "bf16",
    "float16": "fp16",
    "fp16": "fp16",
    "float32": "fp32",
    "fp32": "fp32",
}


def is_verl(doc: Mapping[str, Any]) -> bool:
    """A verl config: its ``actor_rollout_ref`` section (the one key only verl's trainer has)."""
    return isinstance(doc.get(ARA), Mapping) or (
        isinstance(doc.get(SCRIPT_KEY), Mapping) and doc[SCRIPT_KEY].get("module") == MODULE
    )


# --- a script of Hydra overrides -> the nested document -------------------------------------------
_INT = re.compile(r"^[+-]?\d[\d_]*$")
_FLOAT = re.compile(r"^[+-]?(\d[\d_]*\.?\d*|\.\d+)([eE][+-]?\d+)?$")


def hydra_value(text: str) -> Any:
    """A Hydra override's value (its grammar's primitives: null, true/false, int, float, else a string)."""
    s = text.strip()
    low = s.lower()
    if low in ("null", "~", "none"):
        return None
    if low in ("true", "false"):
        return low == "true"
    if _INT.match(s):
        return int(s.replace("_", ""))
    if _FLOAT.match(s) and any(c.isdigit() for c in s):
        return float(s.replace("_", ""))
    return s


def overrides_document(command: Command, name: str) -> dict[str, Any]:
    """The nested document a ``main_ppo`` command's overrides describe (``a.b=1`` -> ``{a: {b: 1}}``);
    ``+a=1`` / ``++a=1`` add, ``~a`` deletes (named), ``--config-name`` is kept."""
    doc: dict[str, Any] = {}
    notes = list(command.notes)
    config_name: str | None = None
    for arg in command.argv:
        if arg.startswith("--"):
            flag, _, value = arg[2:].partition("=")
            if flag == "config-name":
                config_name = value.strip().removesuffix(".yaml")
            continue
        if arg.startswith("~"):
            notes.append(f"{arg}: a key deleted from verl's config")
            continue
        key, eq, value = arg.lstrip("+").partition("=")
        if not eq or not key:
            notes.append(f"{arg!r}: not a Hydra override (key=value); not read")
            continue
        node = doc
        parts = [p.strip("'\"") for p in key.split(".")]
        for part in parts[:-1]:
            child = node.get(part)
            if not isinstance(child, dict):
                child = node[part] = {}
            node = child
        node[parts[-1]] = hydra_value(value)
    doc[SCRIPT_KEY] = {
        "module": command.module,
        "unresolved": list(command.unresolved),
        "passes_args": command.passes_args,
        "notes": notes,
        "config_name": config_name,
    }
    return doc


# --- the mapping -------------------------------------------------------------------------------------
class _Fields:
    """Reads dotted keys of one verl document: the file's value, else verl's default (named as such);
    a value holding a shell variable the script does not set is read as absent and named."""

    def __init__(self, m: _Mapper, doc: Mapping[str, Any]) -> None:
        self.m = m
        self.doc = doc
        self.script = SCRIPT_KEY in doc  # "$" is then a shell variable; in a YAML, an interpolation
        self.read: set[str] = set()

    def _get(self, key: str) -> Any:
        value = get(self.doc, key)
        if not self.script and isinstance(value, str) and "${" in value:
            return interpolate(self.doc, key, value)
        return value

    def _unresolved(self, key: str) -> bool:
        value = self._get(key)
        return isinstance(value, str) and "$" in value

    def raw(self, key: str) -> Any:
        """The file's own value (None where absent or unresolved)."""
        self.read.add(key)
        value = self._get(key)
        return None if self._unresolved(key) or value == MISSING else value

    def given(self, key: str) -> bool:
        return self.raw(key) is not None

    def value(self, key: str) -> Any:
        value = self.raw(key)
        return DEFAULTS.get(key) if value is None else value

    def source(self, key: str) -> str:
        if self.given(key) or key not in DEFAULTS:
            return key
        return f"(verl default: {key}={DEFAULTS[key]})"

    def set(self, dest: str, value: Any, key: str, note: str = "") -> None:
        self.m.set(dest, value, self.source(key), note)
        if not self.given(key):
            self.m.defaults.add(dest)

    def name_unresolved(self) -> None:
        """Fields read whose value is a shell variable the script does not set: named; the others (paths,
        logging) in one note."""
        other: list[str] = []
        for key in (k for k, _ in leaves(self.doc) if not k.startswith(SCRIPT_KEY)):
            if self._unresolved(key):
                if key in self.read:
                    self.m.skip(key, get(self.doc, key), f"{self.what()}; verl's default counted")
                else:
                    other.append(key)
        if other:
            self.m.notes.append(f"{self.what()}, in fields that do not change memory: " + ", ".join(other))

    def what(self) -> str:
        return "a shell variable the script does not set" if self.script else "an interpolation not resolved"


_INTERPOLATION = re.compile(r"^\$\{(?:oc\.select:)?\s*([^,}\s]+)\s*(?:,\s*([^}]*?)\s*)?\}$")
MAX_INTERPOLATION_DEPTH = 8  # ${a} -> ${b} -> ...: verl's configs chain two or three


def interpolate(doc: Mapping[str, Any], key: str, value: str, depth: int = 0) -> Any:
    """OmegaConf's ``${path}`` and ``${oc.select:path,default}`` (``.x``: a sibling of ``key``) as verl's
    composed config writes them; anything else is returned as written (unresolved)."""
    m = _INTERPOLATION.match(value.strip())
    if m is None or depth > MAX_INTERPOLATION_DEPTH:
        return value
    path, default = m.group(1), m.group(2)
    if path.startswith("."):
        up = len(path) - len(path.lstrip("."))
        base = key.split(".")[:-up]
        path = ".".join([*base, path.lstrip(".")])
    target = get(doc, path)
    if isinstance(target, str) and "${" in target:
        target = interpolate(doc, path, target, depth + 1)
    if target is None and default is not None:
        return hydra_value(default.strip("'\""))
    return target


def map_verl(m: _Mapper, doc: Mapping[str, Any]) -> None:
    """A verl config (YAML or a script's overrides) -> the post-training options; what peakmem does not
    model named in ``not_modelled``."""
    f = _Fields(m, doc)
    script = doc.get(SCRIPT_KEY)
    if isinstance(script, Mapping):
        _script_notes(m, script)
    if f.given(f"{MODEL}.path"):
        m.set("model", str(f.value(f"{MODEL}.path")), f"{MODEL}.path")
    gpus = _gpus(f)
    objective = _objective(f)
    _precision_and_sharding(f)
    lora = _policy(f)
    _reference(f, lora)
    _rollout(f)
    _sequence_and_batch(f, gpus)
    if objective == "ppo" or truthy(get(doc, "critic.enable")):
        _critic(f)
    _entropy(f)
    _reward_model(f)
    _named(f)
    f.name_unresolved()


def _script_notes(m: _Mapper, script: Mapping[str, Any]) -> None:
    m.notes.extend(str(n) for n in script.get("notes", ()))
    if script.get("passes_args"):
        m.notes.append(
            "the script passes its own arguments on ($@): overrides given when it runs are not seen"
        )
    name = script.get("config_name")
    if name and name != "ppo_trainer":
        m.skip("--config-name", name, "a config other than ppo_trainer.yaml: its own defaults are not read")
        if "megatron" in str(name):
            m.skip(
                "--config-name", name, "Megatron actor (tensor / pipeline parallel): not modelled for verl"
            )


def _gpus(f: _Fields) -> int:
    per_node = as_int(f.m, "trainer.n_gpus_per_node", f.value("trainer.n_gpus_per_node")) or 1
    nodes = as_int(f.m, "trainer.nnodes", f.value("trainer.nnodes")) or 1
    f.set(
        "gpus",
        per_node * nodes,
        "trainer.n_gpus_per_node",
        f"trainer.n_gpus_per_node {per_node} x nnodes {nodes}",
    )
    f.set("gpus_per_node", per_node, "trainer.n_gpus_per_node")
    return per_node * nodes


def _objective(f: _Fields) -> str:
    key = "algorithm.adv_estimator"
    estimator = str(f.value(key)).strip().lower()
    objective = OBJECTIVE.get(estimator)
    if objective is None and estimator in GRPO_LIKE:
        objective = "grpo"
        f.m.skip(
            key,
            estimator,
            "a critic-free advantage: read as GRPO's roles (policy, reference when a KL "
            "is used, n rollouts per prompt); its own extra passes are not modelled",
        )
    if objective is None:
        objective = "grpo"
        f.m.skip(key, estimator, "an advantage estimator peakmem does not know: read as GRPO's roles")
    note = {"ppo": "gae: PPO with a critic", "grpo": "", "rloo": ""}[objective]
    f.set("objective", objective, key, note)
    if objective != "ppo":  # ppo is verl's loop already (peakmem.ppo)
        f.set("trainer", "verl", key, "verl's loop: the actor's full logits, then the log-probs")
    return objective


def _precision_and_sharding(f: _Fields) -> None:
    m = f.m
    strategy = str(f.value(f"{ACTOR}.strategy")).lower()
    fsdp = f"{ACTOR}.fsdp_config"
    if strategy in ("fsdp", "fsdp2"):
        reshard = f.raw(f"{fsdp}.reshard_after_forward")
        mode = "shard-grad-op" if reshard is False else "full-shard"
        f.set("fsdp", mode, f"{ACTOR}.strategy", "reshard_after_forward false" if reshard is False else "")
        f.set("fsdp_version", 2 if strategy == "fsdp2" else 1, f"{ACTOR}.strategy")
        size = as_int(m, f"{fsdp}.fsdp_size", f.raw(f"{fsdp}.fsdp_size"))
        if size is not None and size > 0:
            m.skip(
                f"{fsdp}.fsdp_size",
                size,
                "hybrid sharding in groups of this size (HSDP) not modelled for verl",
            )
    else:
        m.skip(
            f"{ACTOR}.strategy", strategy, "an actor engine other than FSDP (Megatron): not modelled for verl"
        )
    if truthy(f.value(f"{fsdp}.param_offload")):
        f.set("offload_params", "cpu", f"{fsdp}.param_offload")
    if truthy(f.value(f"{fsdp}.optimizer_offload")):
        f.set("offload", "cpu", f"{fsdp}.optimizer_offload")
    if truthy(f.raw(f"{fsdp}.offload_policy")):
        m.skip(
            f"{fsdp}.offload_policy", True, "FSDP2 CPUOffloadPolicy (parameters, gradients and states on CPU)"
        )
    weights_key = f"{fsdp}.model_dtype"
    weights = _DTYPE.get(str(f.value(weights_key)).lower())
    mp = f.raw(f"{fsdp}.mixed_precision.param_dtype")
    compute_key = f"{fsdp}.mixed_precision.param_dtype" if mp is not None else f"{fsdp}.dtype"
    compute = _DTYPE.get(str(f.value(compute_key) if mp is None else mp).lower())
    if weights is None or compute is None:
        m.skip(weights_key, f.value(weights_key), "a weight / compute dtype peakmem does not know")
    elif weights == "fp32" and compute in ("bf16", "fp16"):
        f.set(
            "precision",
            f"amp-{compute}",
            compute_key,
            "FSDP MixedPrecision: fp32 sharded weights, grads and Adam states, 16-bit compute",
        )
    else:
        f.set("precision", "bf16" if weights == "bf16" else weights, weights_key, f"weights in {weights}")
    optimizer = str(f.raw(f"{ACTOR}.optim.optimizer") or "AdamW")
    if optimizer.lower() != "adamw":
        m.skip(f"{ACTOR}.optim.optimizer", optimizer, "an optimizer other than AdamW; AdamW counted")


def _policy(f: _Fields) -> bool:
    """Checkpointing, attention, kernels and the adapter of the actor; True for a LoRA policy."""
    m = f.m
    ckpt = f"{MODEL}.enable_gradient_checkpointing"
    f.set("checkpointing", "full" if truthy(f.value(ckpt)) else "none", ckpt)
    attn = f.raw(f"{MODEL}.override_config.attn_implementation")
    if attn is not None:
        _attention_impl(m, f"{MODEL}.override_config.attn_implementation", attn)
    else:
        m.set("attention", "flash", f"(verl default: attn_implementation=flash_attention_2, {SRC})")
        m.defaults.add("attention")
    if truthy(f.raw(f"{MODEL}.use_liger")):
        liger(m, f"{MODEL}.use_liger")
    if truthy(f.raw(f"{MODEL}.enable_activation_offload")):
        f.set("activation_offload", True, f"{MODEL}.enable_activation_offload")
    if truthy(f.raw(f"{MODEL}.tiled_mlp.enabled")):
        f.set("tiled_mlp", True, f"{MODEL}.tiled_mlp.enabled")
        shards = as_int(m, f"{MODEL}.tiled_mlp.num_shards", f.raw(f"{MODEL}.tiled_mlp.num_shards"))
        f.set("tiled_mlp_shards", shards or 4, f"{MODEL}.tiled_mlp.num_shards")  # hf_model.yaml: 4
    ulysses = as_int(
        m, f"{ACTOR}.ulysses_sequence_parallel_size", f.value(f"{ACTOR}.ulysses_sequence_parallel_size")
    )
    if ulysses and ulysses > 1:
        f.set("ulysses", ulysses, f"{ACTOR}.ulysses_sequence_parallel_size")
    rank = as_int(m, f"{MODEL}.lora_rank", f.value(f"{MODEL}.lora_rank")) or 0
    if rank <= 0:
        f.set("method", "full", f"{MODEL}.lora_rank", "no adapter: the actor trains every weight")
        return False
    f.set("method", "lora", f"{MODEL}.lora_rank")
    f.set("lora_rank", rank, f"{MODEL}.lora_rank")
    alpha = as_float(m, f"{MODEL}.lora_alpha", f.value(f"{MODEL}.lora_alpha"))
    if alpha is not None:
        f.set("lora_alpha", alpha, f"{MODEL}.lora_alpha")
    targets = f.value(f"{MODEL}.target_modules")
    f.set(
        "lora_targets",
        "all-linear" if targets == "all-linear" else ",".join(names_list(targets)),
        f"{MODEL}.target_modules",
    )
    return True


def _reference(f: _Fields, lora: bool) -> None:
    """verl loads a reference when a KL is used (in the loss or in the reward), whatever its coefficient."""
    m = f.m
    kl_loss = truthy(f.value(f"{ACTOR}.use_kl_loss"))
    kl_reward = truthy(f.value("algorithm.use_kl_in_reward"))
    if kl_loss:
        beta = as_float(m, f"{ACTOR}.kl_loss_coef", f.value(f"{ACTOR}.kl_loss_coef"))
        f.set("beta", beta, f"{ACTOR}.kl_loss_coef", "use_kl_loss: the KL in the actor's loss")
    elif kl_reward:
        beta = as_float(m, "algorithm.kl_ctrl.kl_coef", f.value("algorithm.kl_ctrl.kl_coef"))
        f.set("beta", beta, "algorithm.kl_ctrl.kl_coef", "use_kl_in_reward: the KL in the reward")
    else:
        f.set(
            "beta",
            0.0,
            f"{ACTOR}.use_kl_loss",
            "no KL (use_kl_loss and use_kl_in_reward false): no reference",
        )
        f.set("reference", "none", f"{ACTOR}.use_kl_loss")
        return
    if lora:
        f.set(
            "reference", "adapter", f"{MODEL}.lora_rank", "verl ref_in_actor: the actor with its adapter off"
        )
    else:
        f.set(
            "reference",
            "separate",
            f"{ACTOR}.use_kl_loss" if kl_loss else "algorithm.use_kl_in_reward",
            "a frozen copy of the policy",
        )
    if truthy(f.raw(f"{REF}.fsdp_config.param_offload")):
        m.skip(f"{REF}.fsdp_config.param_offload", True, "the reference's weights on CPU between its passes")


def _rollout(f: _Fields) -> None:
    m = f.m
    key = f"{ROLLOUT}.name"
    name = str(f.value(key)).lower() if f.given(key) else None
    if name is None:
        m.notes.append(f"{key} is not in the file (verl requires it): a vLLM rollout assumed")
        name = "vllm"
    if not truthy(f.value(f"{ARA}.hybrid_engine")):
        f.set("rollout", "vllm-server", f"{ARA}.hybrid_engine", "the rollout on GPUs of its own")
        return
    if name == "hf":
        f.set("rollout", "hf", key, "generate on the actor (verl before 0.5)")
        return
    if name not in ROLLOUT_ENGINES:
        m.skip(key, name, "a rollout engine peakmem does not know; vLLM's share counted")
    elif name == "trtllm":
        m.skip(key, name, "TensorRT-LLM's KV pool counted as vLLM's share of the GPU")
    mode = f.raw(f"{ROLLOUT}.mode")
    note = "verl's hybrid engine: the rollout shares the actor's GPUs" + (f" (mode {mode})" if mode else "")
    if name == "sglang":
        note += "; SGLang's mem_fraction_static counted as vLLM's share"
    f.set("rollout", "vllm-colocate", key if f.given(key) else "(verl: rollout.name required)", note)
    util = as_float(m, f"{ROLLOUT}.gpu_memory_utilization", f.value(f"{ROLLOUT}.gpu_memory_utilization"))
    if util is not None:
        f.set("rollout_memory", util, f"{ROLLOUT}.gpu_memory_utilization")
    if truthy(f.value(f"{ROLLOUT}.free_cache_engine")) and f.raw(f"{ROLLOUT}.enable_sleep_mode") is not False:
        f.set(
            "rollout_sleep",
            True,
            f"{ROLLOUT}.free_cache_engine",
            "the engine sleeps (weights and KV freed) outside rollout",
        )
    tp = as_int(m, f"{ROLLOUT}.tensor_model_parallel_size", f.value(f"{ROLLOUT}.tensor_model_parallel_size"))
    if tp and tp > 1:
        m.skip(
            f"{ROLLOUT}.tensor_model_parallel_size",
            tp if f.given(f"{ROLLOUT}.tensor_model_parallel_size") else f"{tp} (verl default)",
            "the rollout engine's tensor parallelism (one GPU per engine "
            "modelled: its weights counted whole)",
        )
    if f.raw(f"{ROLLOUT}.quantization") is not None:
        m.skip(f"{ROLLOUT}.quantization", f.raw(f"{ROLLOUT}.quantization"), "quantized rollout weights")
    if truthy(f.raw(f"{ROLLOUT}.layered_summon")):
        m.skip(f"{ROLLOUT}.layered_summon", True, "the weight sync gathers the actor layer by layer")


def _sequence_and_batch(f: _Fields, gpus: int) -> None:
    m = f.m
    prompt = as_int(m, "data.max_prompt_length", f.value("data.max_prompt_length")) or 0
    response = as_int(m, "data.max_response_length", f.value("data.max_response_length")) or 0
    f.set(
        "seq",
        prompt + response,
        "data.max_prompt_length",
        f"max_prompt_length {prompt} + max_response_length {response}",
    )
    f.set("completion", response, "data.max_response_length")
    n = as_int(m, f"{ROLLOUT}.n", f.value(f"{ROLLOUT}.n")) or 1
    f.set("num_generations", n, f"{ROLLOUT}.n")
    ulysses = (
        as_int(
            m, f"{ACTOR}.ulysses_sequence_parallel_size", f.value(f"{ACTOR}.ulysses_sequence_parallel_size")
        )
        or 1
    )
    dp = max(1, gpus // ulysses)
    prompts = as_int(m, "data.train_batch_size", f.value("data.train_batch_size")) or 0
    per_rank, rest = divmod(prompts * n, dp)
    if truthy(f.value(f"{ACTOR}.use_dynamic_bsz")):
        budget = as_int(
            m, f"{ACTOR}.ppo_max_token_len_per_gpu", f.value(f"{ACTOR}.ppo_max_token_len_per_gpu")
        )
        f.set("max_tokens_per_gpu", budget, f"{ACTOR}.ppo_max_token_len_per_gpu", "use_dynamic_bsz")
        f.set("batch", 1, f"{ACTOR}.use_dynamic_bsz", "one packed row per micro-batch")
        if budget:
            spg, note = packed_rows(per_rank, prompt + response, budget, n)
            f.set("steps_per_generation", spg, "data.train_batch_size", note)
        return
    key = f"{ACTOR}.ppo_micro_batch_size_per_gpu"
    micro = as_int(m, key, f.raw(key))
    if micro is None:
        total = as_int(m, f"{ACTOR}.ppo_micro_batch_size", f.raw(f"{ACTOR}.ppo_micro_batch_size"))
        if total is None:
            m.skip(key, None, "not set (nor use_dynamic_bsz), which verl requires: peakmem's batch 1 counted")
            return
        micro = max(1, total // dp)
        key = f"{ACTOR}.ppo_micro_batch_size"
    f.set("batch", micro, key)
    mini = as_int(m, f"{ACTOR}.ppo_mini_batch_size", f.value(f"{ACTOR}.ppo_mini_batch_size")) or 0
    accum, extra = divmod(mini * n // dp, micro)
    if accum >= 1 and not extra and not (mini * n) % dp:
        f.set(
            "grad_accum",
            accum,
            f"{ACTOR}.ppo_mini_batch_size",
            f"{mini} x n {n} / {dp} ranks / micro {micro}",
        )
    spg, left = divmod(per_rank, micro)
    if spg >= 1 and not left and not rest:
        f.set(
            "steps_per_generation",
            spg,
            "data.train_batch_size",
            f"{prompts} prompts x n {n} / {dp} ranks / micro {micro}",
        )
    else:
        m.skip(
            "data.train_batch_size",
            prompts,
            f"x n {n} is not a whole number of micro-batches of {micro} on each of {dp} ranks",
        )
    for role in ("rollout", "ref"):
        lkey = f"{ARA}.{role}.log_prob_micro_batch_size_per_gpu"
        lp = as_int(m, lkey, f.raw(lkey))
        if lp is not None and lp != micro:
            m.skip(lkey, lp, "the scoring pass's own micro-batch (the training micro-batch counted)")


def _critic(f: _Fields) -> None:
    m = f.m
    if f.given("critic.model.path"):
        f.set("critic", str(f.value("critic.model.path")), "critic.model.path")
    else:
        m.notes.append(
            "critic.model.path is not in the file (verl's default is a placeholder): the policy's model "
            "assumed for the critic"
        )
    same = {
        "critic.ppo_micro_batch_size_per_gpu": f"{ACTOR}.ppo_micro_batch_size_per_gpu",
        "critic.model.enable_gradient_checkpointing": f"{MODEL}.enable_gradient_checkpointing",
        "critic.model.fsdp_config.param_offload": f"{ACTOR}.fsdp_config.param_offload",
        "critic.model.fsdp_config.optimizer_offload": f"{ACTOR}.fsdp_config.optimizer_offload",
        "critic.model.lora_rank": f"{MODEL}.lora_rank",
        "critic.ulysses_sequence_parallel_size": f"{ACTOR}.ulysses_sequence_parallel_size",
    }
    if truthy(f.value(f"{ACTOR}.use_dynamic_bsz")):
        same["critic.ppo_max_token_len_per_gpu"] = f"{ACTOR}.ppo_max_token_len_per_gpu"
    for key, actor_key in same.items():
        value = f.raw(key)
        if value is not None and value != f.value(actor_key):
            m.skip(key, value, "the critic's own setup (the policy's setup counted for the critic)")


def _entropy(f: _Fields) -> None:
    """dp_actor.py update_policy: ``calculate_entropy = config.calculate_entropy or entropy_coeff != 0``."""
    coeff = f.raw(f"{ACTOR}.entropy_coeff")
    if coeff not in (None, 0, 0.0, "0") or truthy(f.raw(f"{ACTOR}.calculate_entropy")):
        key = f"{ACTOR}.calculate_entropy" if coeff in (None, 0, 0.0, "0") else f"{ACTOR}.entropy_coeff"
        f.set("entropy", True, key, "the actor's update computes the entropy from the logits")


def _reward_model(f: _Fields) -> None:
    m = f.m
    if not truthy(f.raw("reward_model.enable")):
        return
    path = f.raw("reward_model.model.path")
    if path is None:
        m.skip("reward_model.enable", True, "a reward model whose path is not in the file")
        return
    f.set("reward_model", str(path), "reward_model.model.path")
    for key, why in (
        (
            "reward_model.model.fsdp_config.param_offload",
            "the reward model's weights on CPU between its passes",
        ),
        ("reward_model.micro_batch_size_per_gpu", "the reward model's own micro-batch"),
        ("reward_model.enable_resource_pool", "the reward model on GPUs of its own"),
    ):
        value = f.raw(key)
        if value not in (None, False):
            m.skip(key, value, why)


def _named(f: _Fields) -> None:
    """Memory fields of verl that peakmem has no option for."""
    m = f.m
    for key, why in (
        (f"{ACTOR}.entropy_from_logits_with_chunking", "the entropy over the vocabulary in chunks"),
        (f"{ACTOR}.entropy_checkpointing", "the entropy recomputed in backward"),
        (f"{MODEL}.use_fused_kernels", "verl's fused log-prob kernel (no B x L x vocab logits)"),
        (f"{ARA}.model.lora_adapter_path", "a LoRA adapter loaded from a path"),
    ):
        if f.raw(key) not in (None, False, 0, ""):
            m.skip(key, f.raw(key), why)
    if truthy(f.value(f"{MODEL}.use_remove_padding")):
        m.notes.append(
            f"{MODEL}.use_remove_padding: verl drops the padding; every sample is counted at the full "
            "prompt + response length (an upper bound)"
        )
