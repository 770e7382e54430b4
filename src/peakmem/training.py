"""What a training job is: precision, optimizer, adapter, checkpointing, shapes.

Names follow what people run (DESIGN.md): ``amp-*`` is PyTorch autocast as HF Trainer uses it,
``mixed-*`` keeps 16-bit weights and gradients plus fp32 master weights (DeepSpeed, Megatron),
``bf16`` is pure bf16 weights, gradients and optimizer states (torchtune).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from peakmem.accelerate_versions import ACCELERATE_CURRENT, parse_accelerate_version
from peakmem.adapters import LayoutPrep, LoraConfig, QuantConfig
from peakmem.bnb_versions import BNB_CURRENT, has_4bit
from peakmem.choice import Choice
from peakmem.errors import InputError
from peakmem.peft_versions import PEFT_CURRENT, parse_peft_version
from peakmem.peft_versions import release_facts as peft_facts
from peakmem.torchao_versions import TORCHAO_CURRENT, parse_torchao_version
from peakmem.transformers_versions import TRANSFORMERS_CURRENT, parse_transformers_version
from peakmem.validate import MAX_GRAD_ACCUM, MAX_TOKENS, check_bool, check_int, coerce_choice

DEFAULT_SEQ_LEN = 2048  # DESIGN.md: seq = min(model context, 2048) unless the user gives one


class Precision(Choice):
    FP32 = "fp32"
    AMP_BF16 = "amp-bf16"
    AMP_FP16 = "amp-fp16"
    MIXED_BF16 = "mixed-bf16"
    MIXED_FP16 = "mixed-fp16"
    BF16 = "bf16"
    # torchao float8 training (convert_to_float8_training, torchao 0.18 Float8LinearConfig.from_recipe_name)
    # on mixed-bf16's model states (peakmem.formulas.activations.float8)
    FLOAT8_TENSORWISE = "float8-tensorwise"
    FLOAT8_ROWWISE = "float8-rowwise"
    FLOAT8_ROWWISE_GW_HP = "float8-rowwise-gw-hp"
    # torchao MXFP8 training (torchtitan's MX converter, recipes mxfp8_cublas / mxfp8_cublas_rceil: e4m3
    # elements with one e8m0 scale per 32, cuBLAS on SM100)
    FLOAT8_MXFP8 = "float8-mxfp8"

    @property
    def states(self) -> Precision:
        """The precision of the model states and of what the unconverted modules compute in: a float8
        recipe keeps the weights in high precision (pytorch/ao#1102; torchtitan: bf16 compute, fp32
        master and optimizer states), as mixed-bf16 does; every other precision is its own."""
        return Precision.MIXED_BF16 if self.value.startswith(FLOAT8_PREFIX) else self


FLOAT8_PREFIX = "float8-"


class OptimizerName(Choice):
    ADAMW = "adamw"
    ADAM = "adam"
    SGD = "sgd"
    SGD_MOMENTUM = "sgd-momentum"
    ADAFACTOR = "adafactor"
    LION = "lion"
    # bitsandbytes / torchao / galore-torch (peakmem.formulas.lowbit_optim)
    ADAMW_8BIT = "adamw-8bit"
    PAGED_ADAMW_8BIT = "paged-adamw-8bit"
    PAGED_ADAMW = "paged-adamw"  # bitsandbytes.optim.PagedAdamW (32-bit states)
    LION_8BIT = "lion-8bit"
    ADAMW_4BIT = "adamw-4bit"  # torchao.optim.AdamW4bit
    ADAMW_8BIT_TORCHAO = "adamw-8bit-torchao"  # torchao.optim.AdamW8bit
    ADAMW_FP8 = "adamw-fp8"  # torchao.optim.AdamWFp8
    GALORE_ADAMW = "galore-adamw"


class OptimizerImpl(Choice):
    FOREACH = "foreach"  # torch default on CUDA: multi-tensor kernels, temporaries per group
    FUSED = "fused"  # one kernel, no temporaries
    FOR_LOOP = "for-loop"  # one parameter at a time


class Checkpointing(Choice):
    NONE = "none"
    SELECTIVE = "selective"  # Korthikanti et al. 2022: recompute attention's core only
    FULL = "full"  # gradient_checkpointing_enable(): keep only each layer's input
    # op-level selective activation checkpointing (torchtitan ``selective_ac_option = "op"``): each
    # layer keeps its input and the outputs of a save-list of ops, every other matmul among them
    # (peakmem.formulas.activations.op_sac)
    OP = "op"


# ``--checkpointing every-N``: full checkpointing of every N-th layer (TrainingSetup.checkpoint_every),
# the others keep all their tensors; ``full`` is every-1.
EVERY_PREFIX = "every-"
MAX_CHECKPOINT_EVERY = 1024  # layers; no model has more


def parse_checkpointing(text: str) -> tuple[Checkpointing, int]:
    """``none|selective|op|full|every-N`` as (mode, every): ``every-N`` is (FULL, N), the others every 1."""
    spelled = text.lower()
    if spelled.startswith(EVERY_PREFIX):
        n = spelled[len(EVERY_PREFIX) :]
        if not n.isdigit() or not 1 <= int(n) <= MAX_CHECKPOINT_EVERY:
            raise InputError(
                f"checkpointing={text!r}: every-N takes a layer count N from 1 to {MAX_CHECKPOINT_EVERY} "
                "(every-2: full checkpointing of every second layer)"
            )
        return Checkpointing.FULL, int(n)
    if spelled not in {m.value for m in Checkpointing}:
        raise InputError(f"checkpointing={text!r}: unknown; choose one of none, selective, op, full, every-N")
    return Checkpointing.parse(spelled, "checkpointing"), 1


def checkpointed_layers(count: int, every: int, framework: Framework) -> tuple[bool, ...]:
    """Which of a stage's ``count`` layers (in order) full checkpointing wraps, every ``every``-th.

    transformers 5.23 (modeling_utils.py ``_set_gradient_checkpointing``, ``every_n_layers``): the
    decoder layer of 0-based index i is checkpointed when ``i % every_n_layers == 0`` (the first of each
    N). torchtitan (torchtitan/distributed/activation_checkpoint.py ``_apply_layer_sac``, commit
    01db32e9, ``selective_ac_option = "N"``): a 1-based counter per wrapped block, checkpointed when
    ``_layer_sac_count % ac_freq == 0`` (the last of each N); peakmem uses it for the frameworks that
    are not transformers. The count is the stage's own (torchtitan counts the blocks its rank builds).
    """
    first = 0 if framework is Framework.HF else 1
    return tuple((pos + first) % every == 0 for pos in range(count))


class AttentionKernel(Choice):
    EAGER = "eager"
    SDPA = "sdpa"
    FLASH = "flash"


class LossImpl(Choice):
    """How the cross-entropy runs (peakmem.formulas.lowbit_optim.adapt_head_loss)."""

    STANDARD = "standard"  # transformers ForCausalLMLoss: full logits, fp32 upcast
    CHUNKED = "chunked"  # torchtune CEWithChunkedOutputLoss, eager
    CHUNKED_COMPILED = "chunked-compiled"  # the same under torch.compile (torchtune compile=True)
    FUSED = "fused"  # fused linear cross-entropy (Liger, cut-cross-entropy)
    # cross_entropy on the 16-bit logits, no fp32 upcast (2022 transformers GPT-2 heads and custom loops on a
    # .half() / .bfloat16() model): peakmem.formulas.lowbit_optim.adapt_head_loss
    HALF = "half"
    # the standard loss under torch.compile (torchtitan compiles its cross_entropy_loss when compile is on;
    # HF models compiled whole with labels=): Inductor fuses the upcast, log_softmax and nll, keeps the
    # 16-bit logits and per-row statistics, writes the logits' gradient in one kernel
    # (peakmem.formulas.lowbit_optim.compiled_ce)
    COMPILED = "compiled"
    # TRL's fused log-prob head (peakmem.formulas.logprob_head): what its DPO / GRPO trainers run
    LOGPROB = "logprob"
    LOGPROB_ENTROPY = "logprob-entropy"  # ... with the entropy output (GRPO, RLOO)
    # TRL's chunked divergence head (peakmem.formulas.logprob_head.divergence_head): DistillationTrainer
    DIVERGENCE = "divergence"
    # verl's actor (peakmem.formulas.logprob_head.logits_logprob_head): full logits, then per-row log-probs
    LOGITS_LOGPROB = "logits-logprob"
    LOGITS_LOGPROB_ENTROPY = "logits-logprob-entropy"  # ... and the entropy from the logits


# the losses of post-training objectives (peakmem.jobs): TRL's heads and verl's logits-then-log-prob
POST_TRAINING_LOSSES = (
    LossImpl.LOGPROB,
    LossImpl.LOGPROB_ENTROPY,
    LossImpl.DIVERGENCE,
    LossImpl.LOGITS_LOGPROB,
    LossImpl.LOGITS_LOGPROB_ENTROPY,
)


class Method(Choice):
    FULL = "full"
    LORA = "lora"
    QLORA = "qlora"


class Framework(Choice):
    HF = "hf"  # transformers model code and loss, HF Trainer / plain PyTorch loop
    TORCHTUNE = "torchtune"  # torchtune's own model code and loss
    # unsloth's patched transformers models: offloaded gradient checkpointing (layer inputs in CPU
    # RAM) and its fused cross-entropy (peakmem.formulas.profiles)
    UNSLOTH = "unsloth"
    # LitGPT's own model code (litgpt/model.py, lora.py, 2024 on): fused qkv Linear and LoRA on it, RMSNorm
    # on an fp32 upcast, the LoRA loop's lm_head run in chunks (peakmem.formulas.profiles)
    LITGPT = "litgpt"
    # Lit-GPT as of 2023 (lit_gpt/, 8641822b): the same, with RMSNorm in the input dtype (its resource tables)
    LITGPT_2023 = "litgpt-2023"


# Lit-GPT's releases: one loop (finetune/*.py under Lightning Fabric), two generations of model code
LITGPT_FRAMEWORKS = frozenset({Framework.LITGPT, Framework.LITGPT_2023})


class GradSync(Choice):
    """When a data-parallel loop with gradient accumulation reduces the gradients (peakmem.defaults
    ``GRAD_SYNC``; what it costs under FSDP: peakmem.formulas.sharding).

    * ``each-micro-batch``: every micro-batch's backward reduce-scatters (FSDP keeps only gradient
      shards between micro-batches): torchtitan, torchtune, accelerate ``sync_each_batch=True``;
    * ``last-micro-batch``: every backward but the last runs without gradient sync (torch FSDP1
      ``no_sync``, FSDP2 ``set_requires_gradient_sync(False)``), so FSDP keeps each unit's unsharded
      gradient until the last one: HF Trainer / accelerate ``accumulate`` by default, Lightning Fabric
      ``no_backward_sync`` (Lit-GPT);
    * ``auto``: what the setup's framework runs (peakmem.defaults ``grad_sync``).
    """

    AUTO = "auto"
    EACH = "each-micro-batch"
    LAST = "last-micro-batch"


class ReduceDtype(Choice):
    """The dtype FSDP reduce-scatters gradients in, and FSDP2 keeps them accumulated unsharded in
    between micro-batches (peakmem.defaults ``REDUCE_DTYPE``; what it costs: peakmem.formulas.sharding).

    * ``param``: the gathered parameters' dtype, the gradients' as autograd writes them (accelerate's
      ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=bf16)``; FSDP2 with no ``reduce_dtype``);
    * ``fp32`` / ``bf16`` / ``fp16``: that dtype (torchtitan ``mixed_precision_reduce = "float32"``);
    * ``auto``: what the setup's framework runs (peakmem.defaults ``fsdp_reduce``).
    """

    AUTO = "auto"
    PARAM = "param"
    FP32 = "fp32"
    BF16 = "bf16"
    FP16 = "fp16"


class PaddedLengths(Choice):
    """How the loop's batches are shaped (peakmem.formulas.padded_lengths).

    * ``fixed``: every micro-batch is ``seq`` tokens long (packed or padded to a fixed length);
    * ``varying``: each batch padded to its longest sample, up to ``seq`` (HF DataCollatorWithPadding /
      DataCollatorForSeq2Seq, torchtune padded_collate, TRL without packing): tensor sizes change every
      step and the caching allocator keeps the segments every size cut.
    """

    FIXED = "fixed"
    VARYING = "varying"


class KernelPolicy(Choice):
    """Which device's kernels decide the bytes (DESIGN.md: CUDA by default)."""

    CUDA = "cuda"
    CPU = "cpu"  # CPU autocast keeps softmax/norms in bf16; SDPA math kernel with dropout


_CHOICE_FIELDS: tuple[tuple[str, type[Choice]], ...] = (
    ("method", Method),
    ("precision", Precision),
    ("optimizer", OptimizerName),
    ("optimizer_impl", OptimizerImpl),
    ("checkpointing", Checkpointing),
    ("attention", AttentionKernel),
    ("framework", Framework),
    ("kernel_policy", KernelPolicy),
    ("loss", LossImpl),
    ("grad_sync", GradSync),
    ("fsdp_reduce_dtype", ReduceDtype),
    ("padded_lengths", PaddedLengths),
)


@dataclass(frozen=True, kw_only=True)
class TrainingSetup:
    method: Method = Method.FULL
    precision: Precision = Precision.MIXED_BF16
    optimizer: OptimizerName = OptimizerName.ADAMW
    optimizer_impl: OptimizerImpl = OptimizerImpl.FOREACH
    micro_batch: int = 1
    seq_len: int = 2048
    grad_accum: int = 1
    checkpointing: Checkpointing = Checkpointing.NONE
    # checkpointing full: every N-th layer checkpointed (``--checkpointing every-N``; 1: all layers).
    # none and selective ignore it (the planner swaps the mode and keeps the user's N for full).
    checkpoint_every: int = 1
    attention: AttentionKernel = AttentionKernel.SDPA
    framework: Framework = Framework.HF
    kernel_policy: KernelPolicy = KernelPolicy.CUDA
    # optimizer.zero_grad(set_to_none=...): True is torch >= 2.0's default (grads freed between
    # steps); False (torch < 2.0, e.g. HF Trainer in 2022) keeps zeroed grads alive all the time.
    grads_set_to_none: bool = True
    # with grad_accum > 1, when the gradients are reduced: every micro-batch, or only the last (no_sync:
    # FSDP keeps the unsharded gradients between micro-batches); auto: the framework's (peakmem.defaults)
    grad_sync: GradSync = GradSync.AUTO
    # FSDP's reduce dtype (reduce-scatter, FSDP2's unsharded accumulation); auto: the framework's
    fsdp_reduce_dtype: ReduceDtype = ReduceDtype.AUTO
    # batches of one length (fixed) or padded to their longest sample (varying: reserved grows)
    padded_lengths: PaddedLengths = PaddedLengths.FIXED
    # Fine-tuning on a budget (peakmem.adapters; formulas lora / qlora / lowbit_optim):
    lora: LoraConfig | None = None  # method lora/qlora; None: peft's r=8 on all linears
    quant: QuantConfig | None = None  # method qlora: the base format; None: nf4 + double quant
    # the bitsandbytes release the quantized base runs (peakmem.bnb_versions: before 0.43.2 MatMul4Bit
    # keeps each 4-bit Linear's input for backward)
    bitsandbytes: str = BNB_CURRENT
    # the torchao release torchtune's NF4 base runs (peakmem.torchao_versions: before 0.2.0 to_nf4
    # quantizes a whole weight at once, at the model's build and load)
    torchao: str = TORCHAO_CURRENT
    # the transformers release whose model code and loss run (peakmem.transformers_versions: before 5.0 MoE
    # experts are per-expert Linears, bitsandbytes quantizes them; before 4.49 the loss copies the shifted
    # logits)
    transformers: str = TRANSFORMERS_CURRENT
    # the accelerate release under the HF Trainer (peakmem.accelerate_versions: before 1.11 its no_sync does
    # not stop FSDP2's gradient sync)
    accelerate: str = ACCELERATE_CURRENT
    # the peft release that wraps LoRA's target_parameters (peakmem.peft_versions: before 0.21 a full-size
    # delta weight per forward)
    peft: str = PEFT_CURRENT
    # the checkpoint stores MoE experts as MXFP4 (its config's quantization_config: gpt-oss), which
    # transformers dequantizes to bf16 on the GPU as it loads them for training (peakmem.step_load)
    mxfp4_checkpoint: bool = False
    loss: LossImpl = LossImpl.STANDARD
    optimizer_in_backward: bool = False  # torchtune optimizer_in_bwd: grads freed per parameter
    activation_offload: bool = False  # torchtune enable_activation_offloading
    # torch.compile of each decoder layer (torchtune compile=True, HF Trainer torch_compile=True):
    # Inductor's partitioner recomputes pointwise ops in backward (peakmem.formulas.activations)
    compiled: bool = False
    # Liger kernels (liger_kernel.transformers.apply_liger_kernel_to_*; HF Trainer use_liger_kernel,
    # axolotl/LLaMA-Factory liger options): RMSNorm, SwiGLU, RoPE and fused linear cross-entropy
    liger: bool = False
    # tokens per sequence the loss scores (a post-training job's completion; None: every position)
    scored_tokens: int | None = None
    # distillation (loss divergence): the teacher's hidden width and whether the divergence is a JSD
    # (0 < beta < 1: a second pass over the vocabulary)
    teacher_hidden: int | None = None
    divergence_jsd: bool = False
    # ALST tiled MLP (DeepSpeed ulysses_sp.py TiledMLP; axolotl tiled_mlp): the MLP in sequence shards,
    # recomputed in backward; shards 0: DeepSpeed's ceil(seqlen / hidden) (peakmem.formulas.long_context)
    tiled_mlp: bool = False
    tiled_mlp_shards: int = 0
    # torchao Float8LinearConfig(enable_fsdp_float8_all_gather=True): FSDP2 all-gathers the converted
    # Linears' weights in float8 (tensorwise only; peakmem.formulas.activations.float8)
    float8_all_gather: bool = False
    # a TRL release's peft preparation per kind of layout, when --trl filled kbit_prep / adapter_dtype
    # (peakmem.question.trl_layout_prep): the planner's layouts take their own (planner where_it_acts)
    layout_prep: LayoutPrep | None = None

    def __post_init__(self) -> None:
        # Types first (the Python API passes anything): enums from their spelling, no bool or
        # float where an int belongs; then ranges and physical limits, before any work is done.
        for attr, enum in _CHOICE_FIELDS:
            coerce_choice(self, attr, enum)
        what = "layers; no model has more"
        check_int("checkpoint_every", self.checkpoint_every, maximum=MAX_CHECKPOINT_EVERY, what=what)
        check_int("batch", self.micro_batch)
        parse_torchao_version(self.torchao)  # a malformed release's one-line error
        parse_transformers_version(self.transformers)
        parse_accelerate_version(self.accelerate)
        parse_peft_version(self.peft)
        check_int("seq", self.seq_len)
        steps = "accumulation steps; no recipe has more"
        check_int("grad_accum", self.grad_accum, maximum=MAX_GRAD_ACCUM, what=steps)
        if self.scored_tokens is not None:
            check_int("scored_tokens", self.scored_tokens)
        if self.teacher_hidden is not None:
            check_int("teacher_hidden", self.teacher_hidden)
        if self.micro_batch * self.seq_len > MAX_TOKENS:
            raise InputError(
                f"batch x seq = {self.micro_batch} x {self.seq_len} = {self.micro_batch * self.seq_len:,} "
                f"tokens: too large (more than {MAX_TOKENS:,} tokens in one micro-batch; "
                "no cluster holds them)"
            )
        for attr in (
            "grads_set_to_none",
            "optimizer_in_backward",
            "activation_offload",
            "compiled",
            "liger",
            "tiled_mlp",
            "float8_all_gather",
        ):
            check_bool(attr, getattr(self, attr))
        if self.float8_all_gather and self.precision is not Precision.FLOAT8_TENSORWISE:
            raise InputError(
                f"float8_all_gather=True with precision={self.precision.value!r}: torchao's float8 "
                "all-gather is tensorwise only (use --precision float8-tensorwise)"
            )
        check_int("tiled_mlp_shards", self.tiled_mlp_shards, minimum=0, maximum=MAX_TOKENS, what="shards")
        if self.tiled_mlp_shards and not self.tiled_mlp:
            raise InputError(f"tiled_mlp_shards={self.tiled_mlp_shards}: needs tiled_mlp=True")
        self._check_budget_configs()
        if self.method is Method.FULL and self.lora is not None:
            raise InputError(
                "method='full': LoRA options (rank, targets, alpha, dropout, dora, adapter dtype) "
                "need --method lora or qlora"
            )
        if self.method is not Method.QLORA and self.quant is not None:
            raise InputError(f"method={self.method.value!r}: a quantized base (--quant) needs --method qlora")
        params = self.lora is not None and self.lora.target_parameters
        if params and not peft_facts(self.peft).target_parameters:
            raise InputError(f"peft={self.peft!r}: lora_target_parameters needs peft 0.17.0 or later")
        four_bit = self.method is Method.QLORA and (self.quant is None or self.quant.is_4bit)
        if not has_4bit(self.bitsandbytes) and four_bit:  # has_4bit first: a malformed version's error
            raise InputError(
                f"bitsandbytes={self.bitsandbytes!r}: no 4-bit Linear before 0.39.0 (use --quant int8 "
                "or a later release)"
            )
        if self.optimizer_in_backward and self.grad_accum > 1:
            raise InputError(
                f"grad_accum={self.grad_accum}: optimizer-in-backward steps at every micro-batch; "
                "use grad_accum 1"
            )

    def _check_budget_configs(self) -> None:
        if self.lora is not None and not isinstance(self.lora, LoraConfig):
            raise InputError(f"lora={self.lora!r}: must be a LoraConfig or None")
        if self.quant is not None and not isinstance(self.quant, QuantConfig):
            raise InputError(f"quant={self.quant!r}: must be a QuantConfig or None")

    @property
    def checkpointing_spelled(self) -> str:
        """``--checkpointing`` as spelled: ``every-N`` for full checkpointing of every N-th layer."""
        full_every = self.checkpointing is Checkpointing.FULL and self.checkpoint_every > 1
        return f"{EVERY_PREFIX}{self.checkpoint_every}" if full_every else self.checkpointing.value

    @property
    def tokens(self) -> int:
        return self.micro_batch * self.seq_len

    def check_oracle_runs(self, command: str) -> None:
        """An InputError naming the options set here that ``peakmem measure`` and ``simulate``
        (``command``) do not run: they execute the transformers model eagerly, with its own loss and
        a torch optimizer stepping after backward, so their answer would carry a setup it did not run."""
        flags = (
            ("optimizer_in_backward", self.optimizer_in_backward),
            ("activation_offload", self.activation_offload),
            ("compiled", self.compiled),
            ("liger", self.liger),
            ("tiled_mlp", self.tiled_mlp),
            ("float8_all_gather", self.float8_all_gather),
        )
        if command != "measure" and self.precision.states is not self.precision:
            raise InputError(
                f"precision={self.precision.value!r}: {command} does not run torchao float8 "
                + (
                    "(peakmem train estimates it)"
                    if self.precision is Precision.FLOAT8_MXFP8
                    else "(peakmem measure does; peakmem train estimates it)"
                )
            )
        loss = () if self.loss is LossImpl.STANDARD else (f"loss={self.loss.value!r}",)
        other = loss + tuple(f"{name}=True" for name, on in flags if on)
        if other:
            raise InputError(
                f"{', '.join(other)}: {command} does not run it ({command} executes the transformers model "
                "eagerly, with its own loss and the optimizer after backward); peakmem train estimates it"
            )


# --- setup families: what a derived spec's measured block costs depend on ------------------------------
_ADAPTERS: dict[str, tuple[Any, Any]] = {}  # adapter key -> (LoraConfig, QuantConfig) it stands for


_CODE = "|code="  # the family's last part where the blocks are measured on a framework's model config


def family_key(
    *,
    precision: str,
    kernel: str,
    policy: str,
    method: str,
    adapter: str = "",
    objects: Any = None,
    code: str = "",
) -> str:
    """What measured costs depend on: ``mixed-bf16|sdpa|cuda|full`` (``|<adapter>`` for LoRA/QLoRA:
    the adapter's settings; ``objects``, the (LoraConfig, QuantConfig) pair, is remembered for the
    oracle that measures them, which builds the same adapters; ``|code=<name>`` where the blocks are
    measured on the config a framework's model code amounts to: peakmem.formulas.profiles.code_config)."""
    parts = [precision, kernel, policy, method]
    if adapter:
        parts.append(adapter)
        if objects is not None:
            _ADAPTERS[adapter] = objects
    return "|".join(parts) + (_CODE + code if code else "")


def family_code(family: str) -> tuple[str, str]:
    """(the family without its ``|code=`` part, the code's name or "")."""
    head, sep, code = family.rpartition(_CODE)
    return (head, code) if sep else (family, "")


def adapter_objects(adapter: str) -> Any:
    """The (LoraConfig, QuantConfig) an adapter key was made from in this process (None if unknown)."""
    return _ADAPTERS.get(adapter)
