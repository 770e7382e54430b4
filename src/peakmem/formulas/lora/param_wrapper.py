"""What peft's ``ParamWrapper`` (LoRA on a bare parameter: ``target_parameters``) costs in one layer's step.

Per targeted parameter of ``N = E x in x out`` elements (``p`` bytes each; the adapters' ``a``), as the
peft release does it (:mod:`peakmem.peft_versions`), with a consumer that reads the parameter once per
forward (transformers 5's grouped_mm / batched experts, a fused MoE kernel):

* saved: the merged weight ``W + scaling * B A`` (``N p``: its consumer keeps it for the input gradient),
  plus, on the factors path (0.21+, E > 1), the two factors cast to W's dtype when ``a != p`` (``baddbmm``
  saves both): :func:`peakmem.formulas.lora.deltas.param_wrapper_saved`;
* forward, delta path (0.17 .. 0.20, and any 2-D parameter): ``einsum(B, A) * scaling`` makes two
  full-size tensors in the adapters' dtype (``2 N a``), cast to W's dtype (``N p``, held by the proxy
  until the wrapped forward returns); every targeted parameter of the module holds its delta through the
  wrapped forward (the wrappers nest), and the merged weights are made after the last delta. The factors
  path makes nothing full-size beyond the merged weight;
* backward: the consumer now writes the merged weight's gradient (``N p``; a frozen base writes none); the
  factors path then computes only low-rank gradients; the delta path casts it to the adapters' dtype and
  multiplies by ``scaling`` (``ToCopyBackward``, ``MulBackward``: ``max(N (p + a), 2 N a)``, ``2 N a``
  when ``a == p``).

Measured with peakmem's LiveStorageTracker on the CPU (tiny gpt-oss: hidden 64, 4 experts, intermediate 96,
bf16 weights, fp32 adapters r=4 on layer 1's gate_up_proj (4, 64, 192) and down_proj (4, 96, 64),
transformers 5.23 grouped_mm, peft 0.21.2 and its 0.17 / 0.19 ``_activate_lora`` rebuilt by hand): the
factors path's largest live tensors are the two merged weights (98,304 and 49,152 B, ``baddbmm``) and,
in backward, the down merged weight's gradient (49,152 B); the delta path's forward peak holds the
gate_up einsum output and its scaled copy (196,608 B each, fp32) beside the down delta (49,152 B, bf16),
its backward peak the gate_up gradient's fp32 cast and scaled copy (196,608 B each). tests/
test_param_wrapper.py holds these against the formulas.

peft's own MoE conversion (``all-linear`` on Mixtral / Qwen-MoE under transformers 5: targets.py
``PEFT_MOE_CONVERSION``) runs the same ParamWrapper, so its merged-weight gradient is now counted too: a tiny
Mixtral (4 experts, 256 x 64 gate_up) LoRA all-linear step under full checkpointing read -2.5 % against the
CPU tracker and reads +2.7 % (the gradient is added on top of the layer's backward peak, an upper bound: it
is alive at the experts' backward only); without checkpointing, and tiny Qwen3-MoE, it does not move.

Not modelled: peft 0.17 .. 0.18 recompute the merged weight at every access of the parameter
(``cached()`` only inside the proxy's forward): a model that indexes the expert stack once per expert
(transformers' eager experts loop) makes one merged copy per expert hit; counted here once per forward.
"""

from __future__ import annotations

from dataclasses import dataclass

from peakmem.peft_versions import PeftRelease

from .targets import AdaptedModule


@dataclass(frozen=True, kw_only=True)
class WrapperCosts:
    """One layer's ParamWrapper bytes beyond what its frozen base costs (saved: see param_wrapper_saved)."""

    forward: int  # beyond the layer's saved bytes, while the wrapped module runs
    backward: int  # gradient temporaries of the merged weights, at the wrapped module's backward


def uses_factors(m: AdaptedModule, release: PeftRelease) -> bool:
    """peft 0.21+ folds a 3-D parameter's update into one baddbmm (one adapter: peakmem models one)."""
    return release.factors and m.experts > 1


def wrapper_costs(
    mods: list[AdaptedModule], release: PeftRelease, *, param_bytes: int, a_bytes: int
) -> WrapperCosts:
    """The forward and backward temporaries of the layer's targeted parameters (``mods``: the layer's
    adapted modules; those not of kind "param" cost nothing here)."""
    forward = held = forming = chain = 0
    merged = largest = 0
    for m in mods:
        if m.kind != "param":
            continue
        n = m.experts * m.in_features * m.out_features
        merged += n * param_bytes
        largest = max(largest, n * param_bytes)  # the consumer writes the merged weight's gradient
        if uses_factors(m, release):
            continue
        held += n * param_bytes  # the cast delta, held through the wrapped forward
        forming = max(forming, 2 * n * a_bytes - n * param_bytes)  # einsum output and its scaled copy
        cast = 0 if a_bytes == param_bytes else n * (param_bytes + a_bytes)
        chain = max(chain, cast, 2 * n * a_bytes)
    if held:
        # the deltas live through the wrapped forward, the merged weights (saved) come after the last one
        forward = held + max(0, forming - merged)
    # the delta chain (made before the consumer in forward) runs its backward after the consumer's, which
    # freed the merged weights it saved
    return WrapperCosts(forward=forward, backward=max(largest, chain - merged))
