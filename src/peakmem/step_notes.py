"""The assumptions a training step's estimate states (``Estimate.assumptions``): the step, the dtypes, the
framework's profile and loop, dropout, the allocator, the CUDA context, checkpointing, mixed precision."""

from __future__ import annotations

from peakmem.formulas import activations as act
from peakmem.formulas import loop_held as _held
from peakmem.formulas.block_rounding import ROUNDUP_NOTE
from peakmem.formulas.overhead import Overheads
from peakmem.formulas.profiles import derived_code, profile_assumptions
from peakmem.formulas.technique import Technique
from peakmem.training import Checkpointing, Framework, TrainingSetup


def step_assumptions(tech: Technique, setup: TrainingSetup, sh: act.Shapes, ov: Overheads) -> tuple[str, ...]:
    """What a training step's estimate assumes, in the order ``Estimate.assumptions`` shows it."""
    spec = tech.spec
    dropout = f"attention {spec.attention_dropout}, hidden {spec.hidden_dropout}"
    dropout += f", embedding {spec.embedding_dropout}"
    out = [
        "steady-state step (>= 2): optimizer states exist in forward/backward; "
        f"zero_grad(set_to_none={setup.grads_set_to_none})",
        act.activation_dtype_note(sh),
        f"framework profile {sh.profile.name}: {sh.profile.source}",
        f"training mode: dropout active where the config sets it ({dropout})",
        _held.LOOP_NOTE if sh.profile.loop_keeps_output else _held.DROPS_NOTE,
        "expandable segments (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True): no fragmentation slack, "
        "reserved rounded to 20 MiB pages"
        if ov.expandable_segments
        else f"allocator fragmentation {ov.fraction:.0%} of the per-step churn "
        "(activations, gradients, temporaries); override with Overheads(fragmentation=...)",
        f"CUDA context {ov.context_bytes // (1024 * 1024)} MiB ({ov.context_source}); "
        f"cuBLAS workspace {ov.cublas_workspace_bytes} B",
    ]
    if ov.alloc_roundup_divisions > 1:
        out.append(ROUNDUP_NOTE.format(n=ov.alloc_roundup_divisions))
    if sh.kernel_note:
        out.append(f"attention kernel {setup.attention.value} runs as {sh.kernel.value}: {sh.kernel_note}")
    if setup.checkpointing is Checkpointing.FULL and setup.checkpoint_every > 1:
        rule = (
            "0-based index % N == 0, transformers"
            if setup.framework is Framework.HF
            else "1-based, torchtitan"
        )
        out.append(
            f"full checkpointing of every {setup.checkpoint_every}th layer ({rule}): those keep their "
            "input, the others all their tensors; one layer is recomputed at a time during backward"
        )
    elif setup.checkpointing is Checkpointing.FULL:
        out.append("full checkpointing: each layer keeps its input; one layer is recomputed during backward")
    if setup.checkpointing is Checkpointing.SELECTIVE:
        out.append("selective checkpointing (Korthikanti et al. 2022 §4.2): attention core recomputed")
    if setup.checkpointing is Checkpointing.OP:
        out.append(
            "op-level selective checkpointing (torchtitan selective_ac_option='op'): each layer keeps its "
            "input and every other bias-free matmul output (and SDPA's output on CUDA); the rest recomputed"
        )
    if tech.master is not None:
        out.append(
            "mixed precision: at the step each 16-bit grad is replaced by its fp32 copy on the "
            "master weight (master.grad = p.grad.float(); p.grad = None)"
        )
    out.extend(profile_assumptions(setup))
    if setup.framework is not Framework.HF and any(g.layer.derived is not None for g in spec.groups):
        code = derived_code(setup)
        out.append(
            f"framework {setup.framework.value}: this model's blocks were measured on transformers' code "
            + (f"built from the config {code}'s model code amounts to (no dropout, torch's fused GELU) "
               if code else "")
            + "(derived spec), so the framework's own model code (norms, attention, LoRA layout) is not "
            "applied to them; its loop and loss are"
        )  # fmt: skip
    out.extend(spec.notes)
    return tuple(out)


__all__ = ["step_assumptions"]
