"""What an accelerate release does that changes the bytes of a training step, one row per change.

peakmem's defaults read accelerate 1.16 (:data:`ACCELERATE_CURRENT`); ``--accelerate VERSION`` names the
release a job ran (the HF Trainer and everything on it: axolotl, TRL, LLaMA-Factory), and
:func:`release_facts` gives the row in force for it. Read in accelerate's git history
(huggingface/accelerate):

* ``Accelerator.no_sync`` under FSDP2. The HF Trainer runs every micro-batch but a step's last under
  ``accelerator.no_sync(model)`` (transformers 4.55.0 trainer.py ``_inner_training_loop`` l. 2575-2580;
  5.23 alike). From ec92b1af (2025-09-06, "model.set_requires_gradient_sync(False) should be called to
  turn off gradient synchronization in FSDP2", #3762; ``__version__`` 1.11.0.dev0, first in v1.11.0)
  ``no_sync`` calls ``model.set_requires_gradient_sync(False)`` when ``is_fsdp2``: FSDP2 keeps every
  unit's unsharded gradient until the last micro-batch. Before it (e.g. 9359a019, 2025-07-30,
  ``__version__`` 1.10.0.dev0, accelerator.py l. 1128-1134) ``no_sync`` is
  ``getattr(model, "no_sync", contextlib.nullcontext)``: an FSDP2 module (torch ``FSDPModule``, mixed
  into the model's class) has no ``no_sync`` method (torch 2.13 ``FSDPModule`` has only
  ``set_requires_gradient_sync``; transformers' ``PreTrainedModel`` has none), so the context is a no-op
  and every micro-batch's backward reduce-scatters. FSDP1 (``FullyShardedDataParallel.no_sync``) and
  DDP have the method in both.
"""

from __future__ import annotations

from dataclasses import dataclass

from peakmem.releases import Release, ReleaseTable

# The release peakmem's defaults read (peakmem.defaults GRAD_SYNC, REDUCE_DTYPE).
ACCELERATE_CURRENT = "1.16.0"


@dataclass(frozen=True, kw_only=True)
class AccelerateRelease:
    """What the releases from ``since`` on (until the previous row's) do, as far as a step's bytes go."""

    since: Release
    fsdp2_no_sync: bool  # Accelerator.no_sync turns off FSDP2's gradient sync
    source: str


# Newest first: the first row whose ``since`` is at most the version asked is the one in force.
ACCELERATE_RELEASES: tuple[AccelerateRelease, ...] = (
    AccelerateRelease(
        since=(1, 11, 0), fsdp2_no_sync=True,
        source="accelerate ec92b1af (v1.11.0) accelerator.py Accelerator.no_sync: "
        "model.set_requires_gradient_sync(False) when is_fsdp2",
    ),
    AccelerateRelease(
        since=(0, 0, 0), fsdp2_no_sync=False,
        source="accelerate 9359a019 (1.10.0.dev0) accelerator.py Accelerator.no_sync: "
        "getattr(model, 'no_sync', nullcontext); an FSDP2 module has no no_sync, so every micro-batch "
        "reduce-scatters",
    ),
)  # fmt: skip


# ``accelerate=`` as users type it (peakmem.releases: a leading v, dev / post / rc and +local tags) and the
# row in force for it
TABLE = ReleaseTable(
    field="accelerate", example="1.10.0", current=ACCELERATE_CURRENT, rows=ACCELERATE_RELEASES
)
parse_accelerate_version = TABLE.parse
release_facts = TABLE.facts


__all__ = [
    "ACCELERATE_CURRENT",
    "ACCELERATE_RELEASES",
    "AccelerateRelease",
    "parse_accelerate_version",
    "release_facts",
]
