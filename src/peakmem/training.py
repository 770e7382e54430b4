"""What a training job is: precision, optimizer, adapter, checkpointing, shapes.

Names follow what people run (DESIGN.md): ``amp-*`` is PyTorch autocast as HF Trainer uses it,
``mixed-*`` keeps 16-bit weights and gradients plus fp32 master weights (DeepSpeed, Megatron),
``bf16`` is pure bf16 weights, gradients and optimizer states (torchtune).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from peakmem.choice import Choice
from peakmem.errors import InputError, require

if TYPE_CHECKING:  # only annotations: formulas.lora imports this module
    from peakmem.formulas.lora import LoraConfig
    from peakmem.formulas.qlora import QuantConfig


DEFAULT_SEQ_LEN = 2048  # DESIGN.md: seq = min(model context, 2048) unless the user gives one


class Precision(Choice):
    FP32 = "fp32"
    AMP_BF16 = "amp-bf16"
    AMP_FP16 = "amp-fp16"
    MIXED_BF16 = "mixed-bf16"
    MIXED_FP16 = "mixed-fp16"
    BF16 = "bf16"


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
    LION_8BIT = "lion-8bit"
    ADAMW_4BIT = "adamw-4bit"
    GALORE_ADAMW = "galore-adamw"


class OptimizerImpl(Choice):
    FOREACH = "foreach"  # torch default on CUDA: multi-tensor kernels, temporaries per group
    FUSED = "fused"  # one kernel, no temporaries
    FOR_LOOP = "for-loop"  # one parameter at a time


class Checkpointing(Choice):
    NONE = "none"
    SELECTIVE = "selective"  # Korthikanti et al. 2022: recompute attention's core only
    FULL = "full"  # gradient_checkpointing_enable(): keep only each layer's input


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


class Method(Choice):
    FULL = "full"
    LORA = "lora"
    QLORA = "qlora"


class Framework(Choice):
    HF = "hf"  # transformers model code and loss, HF Trainer / plain PyTorch loop
    TORCHTUNE = "torchtune"  # torchtune's own model code and loss


class KernelPolicy(Choice):
    """Which device's kernels decide the bytes (DESIGN.md: CUDA by default)."""

    CUDA = "cuda"
    CPU = "cpu"  # CPU autocast keeps softmax/norms in bf16; SDPA math kernel with dropout


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
    attention: AttentionKernel = AttentionKernel.SDPA
    framework: Framework = Framework.HF
    kernel_policy: KernelPolicy = KernelPolicy.CUDA
    # optimizer.zero_grad(set_to_none=...): True is torch >= 2.0's default (grads freed between
    # steps); False (torch < 2.0, e.g. HF Trainer in 2022) keeps zeroed grads alive all the time.
    grads_set_to_none: bool = True
    # Fine-tuning on a budget (peakmem.formulas.lora / qlora / lowbit_optim):
    lora: LoraConfig | None = None  # method lora/qlora; None: peft's r=8 on all linears
    quant: QuantConfig | None = None  # method qlora: the base format; None: nf4 + double quant
    loss: LossImpl = LossImpl.STANDARD
    optimizer_in_backward: bool = False  # torchtune optimizer_in_bwd: grads freed per parameter
    activation_offload: bool = False  # torchtune enable_activation_offloading

    def __post_init__(self) -> None:
        require(self.micro_batch > 0, "batch", self.micro_batch, "must be a positive integer")
        require(self.seq_len > 0, "seq", self.seq_len, "must be a positive integer")
        require(self.grad_accum > 0, "grad_accum", self.grad_accum, "must be a positive integer")
        if self.method is Method.FULL and self.lora is not None:
            raise InputError(
                "method='full': LoRA options (rank, targets, alpha, dropout, dora, adapter dtype) "
                "need --method lora or qlora"
            )
        if self.method is not Method.QLORA and self.quant is not None:
            raise InputError(f"method={self.method.value!r}: a quantized base (--quant) needs --method qlora")
        if self.optimizer_in_backward and self.grad_accum > 1:
            raise InputError(
                f"grad_accum={self.grad_accum}: optimizer-in-backward steps at every micro-batch; "
                "use grad_accum 1"
            )

    @property
    def tokens(self) -> int:
        return self.micro_batch * self.seq_len
