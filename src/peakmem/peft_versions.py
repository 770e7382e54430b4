"""What a peft release does that changes the bytes of LoRA on bare parameters (``target_parameters``).

peakmem's LoRA formulas read peft 0.21.2 (:data:`PEFT_CURRENT`: the installed wheel); ``--peft VERSION``
names the release a job ran, and :func:`release_facts` gives the row in force for it. Read in
huggingface/peft's tags (``git show vX:src/peft/tuners/lora/layer.py``) and the 0.17.0 / 0.21.0 wheels:

* ``target_parameters`` and ``lora.ParamWrapper`` came in 0.17.0 (v0.16.0 has neither). In 0.17.0 ..
  0.20.x ``ParamWrapper._activate_lora`` forms the delta weight once per forward: ``get_delta_weight``
  ``torch.einsum("o r e, e r i -> e i o", lora_B, lora_A) * scaling`` (two tensors the size of the whole
  parameter, in the adapters' dtype), ``.to(param.dtype)`` (a third, held by the proxy until the wrapper's
  forward returns), then registers ``_LoraParameterProxy`` (``W + delta_weight``) as a parametrization.
* In 0.17.0 .. 0.18.x ``nn.utils.parametrize.cached()`` wraps only the proxy's own forward: every
  access of the parameter computes ``W + delta`` again (a model that indexes the expert stack once per
  expert makes one merged copy per expert hit). PR #2912 (b10527e82, 2025-11-21, "FIX Caching for LoRA
  target_parameters"; first tag v0.19.0) caches the whole wrapped forward: one merged weight per forward.
* 0.21.0 (``_LoraFactorsProxy``; absent from v0.20.0): with one active adapter on a 3-D parameter (E > 1,
  not a float8 dtype) the parametrization is ``torch.baddbmm(W, lhs, rhs, alpha=scaling)`` over the two
  factors cast to W's dtype: no full-size delta; the merged weight is the only full-size tensor.

Measured on the CPU (tiny gpt-oss, grouped_mm experts, peft 0.21.2 and its 0.17 / 0.19 ``_activate_lora``
rebuilt by hand, under peakmem's LiveStorageTracker): :mod:`peakmem.formulas.lora.param_wrapper`.
"""

from __future__ import annotations

from dataclasses import dataclass

from peakmem.releases import Release, ReleaseTable

PEFT_CURRENT = "0.21.2"
PEFT_FIRST_TARGET_PARAMETERS = (0, 17, 0)


@dataclass(frozen=True, kw_only=True)
class PeftRelease:
    """What the releases from ``since`` on (until the next row's) do to a targeted bare parameter."""

    since: Release
    target_parameters: bool  # LoraConfig(target_parameters=...) exists
    factors: bool  # _LoraFactorsProxy: W + scaling * lhs @ rhs in one baddbmm, no full-size delta
    cached_forward: bool  # the merged weight is made once per wrapped forward (else once per access)
    source: str


PEFT_RELEASES: tuple[PeftRelease, ...] = (
    PeftRelease(
        since=(0, 21, 0), target_parameters=True, factors=True, cached_forward=True,
        source="peft 0.21.0 tuners/lora/layer.py _LoraFactorsProxy (torch.baddbmm over the factors cast to "
        "W's dtype) in ParamWrapper._activate_lora",
    ),
    PeftRelease(
        since=(0, 19, 0), target_parameters=True, factors=False, cached_forward=True,
        source="peft PR #2912 (b10527e82, in v0.19.0): parametrize.cached() around the wrapped forward; "
        "get_delta_weight einsum * scaling in the adapters' dtype, .to(param.dtype)",
    ),
    PeftRelease(
        since=PEFT_FIRST_TARGET_PARAMETERS, target_parameters=True, factors=False, cached_forward=False,
        source="peft v0.17.0 tuners/lora/layer.py ParamWrapper (l. 1788-2110): _LoraParameterProxy "
        "W + delta_weight, cached() only inside the proxy's forward",
    ),
    PeftRelease(since=(0, 0, 0), target_parameters=False, factors=False, cached_forward=False,
                source="no target_parameters before peft 0.17.0 (v0.16.0 tuners/lora/config.py)"),
)  # fmt: skip


TABLE = ReleaseTable(field="peft", example="0.17.0", current=PEFT_CURRENT, rows=PEFT_RELEASES)
parse_peft_version = TABLE.parse
release_facts = TABLE.facts

__all__ = [
    "PEFT_CURRENT",
    "PEFT_FIRST_TARGET_PARAMETERS",
    "PEFT_RELEASES",
    "PeftRelease",
    "parse_peft_version",
    "release_facts",
]
