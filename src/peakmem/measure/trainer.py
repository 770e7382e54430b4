"""The training step that ``peakmem measure`` runs: optimizers and the precision regimes.

Precision regimes (names from :class:`peakmem.training.Precision`):

* ``fp32``: fp32 weights, gradients and optimizer states; no autocast.
* ``amp-bf16`` / ``amp-fp16``: fp32 weights and gradients; forward and loss under
  ``torch.autocast(device, dtype)`` as HF Trainer (via accelerate) runs them; autocast caches
  the 16-bit copy of each weight for the duration of the forward. ``amp-fp16`` scales the loss
  with ``torch.amp.GradScaler`` and unscales the gradients in place before the step.
* ``mixed-bf16`` / ``mixed-fp16``: :class:`MasterWeightTrainer`: 16-bit model weights and
  gradients plus fp32 master weights with the optimizer over the masters, as DeepSpeed's
  ``FP16_Optimizer`` / ``BF16_Optimizer`` (deepspeed/runtime/fp16/fused_optimizer.py,
  deepspeed/runtime/bf16_optimizer.py) and Megatron's ``Float16OptimizerWithFloat16Params``
  (megatron/core/optimizer/optimizer.py) do. See that class for exactly what it allocates.
* ``bf16``: pure bf16 weights, gradients and optimizer states (torchtune), no masters.

Optimizers: ``torch.optim.AdamW`` / ``Adam`` / ``SGD`` (momentum 0 or 0.9) /
``torch.optim.Adafactor`` (torch's own, not ``transformers.optimization.Adafactor``: it is the
one with ``foreach`` and for-loop implementations; its factored second moment keeps a row and a
column vector per matrix) and :class:`Lion` (Chen et al. 2023, "Symbolic Discovery of
Optimization Algorithms", Algorithm 2; torch 2.13 has none), each with the ``foreach`` /
``fused`` / for-loop implementation the setup names where torch offers it on the device.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from peakmem.errors import InputError
from peakmem.measure.tracker import GRAD, MASTER, LiveStorageTracker
from peakmem.training import OptimizerImpl, OptimizerName, Precision, TrainingSetup

# Hyper-parameters do not change the bytes; these are common fine-tuning values.
LR = 1e-5
WEIGHT_DECAY = 0.01
MOMENTUM = 0.9  # sgd-momentum
LION_BETAS = (0.9, 0.99)  # Chen et al. 2023, Section 3 defaults
FP16_LOSS_SCALE = 2.0**10  # static scale for mixed-fp16; a dynamic scaler holds the same bytes

HALF = {
    Precision.AMP_BF16: torch.bfloat16, Precision.AMP_FP16: torch.float16,
    Precision.MIXED_BF16: torch.bfloat16, Precision.MIXED_FP16: torch.float16,
    Precision.BF16: torch.bfloat16,
}  # fmt: skip


def model_dtype(precision: Precision) -> torch.dtype:
    """The dtype the model's parameters are stored in."""
    if precision.states in (Precision.MIXED_BF16, Precision.MIXED_FP16, Precision.BF16):
        return HALF[precision.states]
    return torch.float32


class Lion(torch.optim.Optimizer):
    """Lion (Chen et al. 2023, Algorithm 2): one momentum state per parameter.

    ``c = b1*m + (1-b1)*g``; ``p -= lr*(sign(c) + wd*p)``; ``m = b2*m + (1-b2)*g``.
    For-loop: one temporary ``c`` per parameter at a time; foreach: all ``c`` at once.
    """

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = LR,
        betas: tuple[float, float] = LION_BETAS,
        weight_decay: float = 0.0,
        foreach: bool = False,
    ) -> None:
        super().__init__(params, {"lr": lr, "betas": betas, "weight_decay": weight_decay, "foreach": foreach})

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            grads = [p.grad for p in params]
            moms = []
            for p in params:
                state = self.state[p]
                if "exp_avg" not in state:
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                moms.append(state["exp_avg"])
            lr, wd = group["lr"], group["weight_decay"]
            b1, b2 = group["betas"]
            if not params:
                continue
            if group["foreach"]:
                if wd:
                    torch._foreach_mul_(params, 1 - lr * wd)
                updates = torch._foreach_lerp(grads, moms, b1)  # (1-b1)*g + b1*m
                torch._foreach_sign_(updates)
                torch._foreach_add_(params, updates, alpha=-lr)
                del updates
                torch._foreach_lerp_(moms, grads, 1 - b2)  # b2*m + (1-b2)*g
            else:
                for p, g, m in zip(params, grads, moms, strict=True):
                    if wd:
                        p.mul_(1 - lr * wd)
                    update = torch.lerp(g, m, b1).sign_()
                    p.add_(update, alpha=-lr)
                    del update
                    m.lerp_(g, 1 - b2)


def impl_flags(impl: OptimizerImpl) -> dict[str, bool]:
    return {
        OptimizerImpl.FOREACH: {"foreach": True, "fused": False},
        OptimizerImpl.FUSED: {"foreach": False, "fused": True},
        OptimizerImpl.FOR_LOOP: {"foreach": False, "fused": False},
    }[impl]


def make_optimizer(name: OptimizerName, impl: OptimizerImpl, params: list[torch.nn.Parameter]) -> Any:
    flags = impl_flags(impl)
    if name in (OptimizerName.ADAMW, OptimizerName.ADAM):
        cls = torch.optim.AdamW if name == OptimizerName.ADAMW else torch.optim.Adam
        wd = WEIGHT_DECAY if name == OptimizerName.ADAMW else 0.0
        return cls(params, lr=LR, weight_decay=wd, foreach=flags["foreach"], fused=flags["fused"])
    if name in (OptimizerName.SGD, OptimizerName.SGD_MOMENTUM):
        momentum = MOMENTUM if name == OptimizerName.SGD_MOMENTUM else 0.0
        return torch.optim.SGD(params, lr=LR, momentum=momentum, **flags)
    if impl == OptimizerImpl.FUSED:
        raise InputError(f"optimizer_impl='fused': torch has no fused {name.value}; use foreach or for-loop")
    if name == OptimizerName.ADAFACTOR:
        return torch.optim.Adafactor(params, lr=LR, foreach=flags["foreach"])
    if name == OptimizerName.LION:
        return Lion(params, foreach=flags["foreach"])
    raise InputError(f"optimizer={name.value!r}: not measurable")


class PlainTrainer:
    """fp32, amp-* and bf16: the optimizer steps the model's own parameters."""

    def __init__(
        self,
        model: torch.nn.Module,
        setup: TrainingSetup,
        device: torch.device,
        tracker: LiveStorageTracker | None,
    ) -> None:
        self.model, self.setup, self.device, self.tracker = model, setup, device, tracker
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = make_optimizer(setup.optimizer, setup.optimizer_impl, self.params)
        self.scaler = None
        if setup.precision == Precision.AMP_FP16:
            self.scaler = torch.amp.GradScaler(device.type)

    def autocast(self) -> Any:
        if self.setup.precision in (Precision.AMP_BF16, Precision.AMP_FP16):
            return torch.autocast(self.device.type, dtype=HALF[self.setup.precision])
        return torch.autocast(self.device.type, enabled=False)

    def backward(self, loss: torch.Tensor) -> None:
        if self.scaler is not None:
            self.scaler.scale(loss).backward()  # type: ignore[no-untyped-call]
        else:
            loss.backward()  # type: ignore[no-untyped-call]

    def step(self) -> None:
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()

    def zero_grad(self) -> None:
        # set_to_none=False (--keep-grads, torch < 2.0's default): the zeroed gradients stay allocated
        self.optimizer.zero_grad(set_to_none=self.setup.grads_set_to_none)


class MasterWeightTrainer(PlainTrainer):
    """``mixed-bf16`` / ``mixed-fp16``: 16-bit model, fp32 masters, optimizer over the masters.

    What it allocates, and when:

    * at construction (phase ``load``): one fp32 master per trainable parameter,
      ``p.detach().float()`` (4 bytes/param), as DeepSpeed's optimizers do at initialization;
      the optimizer is built over the masters, so its states (created lazily at the first
      step, as torch does) are fp32;
    * forward/backward: the model's own 16-bit activations; ``AccumulateGrad`` leaves 16-bit
      gradients (2 bytes/param) on the model parameters;
    * ``step()`` (phase ``optimizer``): for each parameter in turn, ``master.grad =
      p.grad.float()`` (4 bytes/param, fp32) then ``p.grad = None`` (frees the 16-bit
      gradient), so the 16-bit gradients turn into fp32 gradients one tensor at a time (at
      most one extra 16-bit gradient alive; DeepSpeed's ``FP16_Optimizer`` instead builds
      a flat fp32 buffer per group, which briefly holds each group's fp32 gradients twice);
      ``mixed-fp16`` then unscales them in place
      (``torch._amp_foreach_non_finite_check_and_unscale_``, one 4-byte flag); the optimizer
      steps the masters (states created at step 1, plus the implementation's temporaries);
      ``master.grad = None`` frees the fp32 gradients; each master is copied into its 16-bit
      weight in place (``p.copy_(master)``: a converting copy, no new storage);
    * ``zero_grad()``: nothing left to free (the 16-bit gradients were dropped in ``step``).

    So at the optimizer step: 2 (16-bit weights) + 4 (masters) + 4 (fp32 gradients) + the
    optimizer states bytes/param, plus the optimizer's temporaries; at the end of backward:
    2 + 2 + 4 + states, plus what backward still holds.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        setup: TrainingSetup,
        device: torch.device,
        tracker: LiveStorageTracker | None,
    ) -> None:
        self.model, self.setup, self.device, self.tracker = model, setup, device, tracker
        self.params = [p for p in model.parameters() if p.requires_grad]
        names = {id(p): n for n, p in model.named_parameters()}
        self.masters: list[torch.nn.Parameter] = []
        for p in self.params:
            m = torch.nn.Parameter(p.detach().float())
            if tracker is not None:
                tracker.tag(m, MASTER, names.get(id(p), ""))
            self.masters.append(m)
        self.optimizer = make_optimizer(setup.optimizer, setup.optimizer_impl, self.masters)
        self.scaler = None
        self.loss_scale = FP16_LOSS_SCALE if setup.precision == Precision.MIXED_FP16 else 1.0

    def autocast(self) -> Any:
        return torch.autocast(self.device.type, enabled=False)

    def backward(self, loss: torch.Tensor) -> None:
        (loss * self.loss_scale if self.loss_scale != 1.0 else loss).backward()  # type: ignore[no-untyped-call]

    @torch.no_grad()
    def step(self) -> None:
        for p, m in zip(self.params, self.masters, strict=True):
            if p.grad is None:
                continue
            m.grad = p.grad.float()
            if self.tracker is not None:
                self.tracker.tag(m.grad, GRAD)
            p.grad = None
        grads = [m.grad for m in self.masters if m.grad is not None]
        if self.loss_scale != 1.0 and grads:
            found_inf = torch.zeros(1, device=self.device)
            inv = torch.full((1,), 1.0 / self.loss_scale, device=self.device)
            torch._amp_foreach_non_finite_check_and_unscale_(grads, found_inf, inv)
            del found_inf, inv
        del grads
        self.optimizer.step()
        for m in self.masters:
            m.grad = None
        for p, m in zip(self.params, self.masters, strict=True):
            p.copy_(m)

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None
        self.optimizer.zero_grad(set_to_none=True)


def make_trainer(
    model: torch.nn.Module, setup: TrainingSetup, device: torch.device, tracker: LiveStorageTracker | None
) -> PlainTrainer:
    if setup.precision.states in (Precision.MIXED_BF16, Precision.MIXED_FP16):
        return MasterWeightTrainer(model, setup, device, tracker)
    return PlainTrainer(model, setup, device, tracker)
