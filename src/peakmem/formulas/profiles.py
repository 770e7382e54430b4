"""Framework profiles: the same architecture saves different tensors in different model code.

* ``Framework.HF`` - transformers 5.23 model code and ``ForCausalLMLoss``.
* ``Framework.TORCHTUNE`` - torchtune's own modules (torchtune/modules/rms_norm.py,
  torchtune/modules/attention.py, torchtune/modules/transformer.py):
  - ``RMSNorm.forward``: ``x_fp32 = x.float(); x_normed = x_fp32 * rsqrt(...); (x_normed *
    scale).type_as(x)`` - the product with the fp32 ``scale`` keeps ``x_normed`` in fp32
    (4 B instead of transformers' 16-bit y);
  - ``MultiHeadAttention``: for GQA, k and v are expanded to all heads
    (``k.unsqueeze(2).expand(...).flatten(1, 2)``) before SDPA, so SDPA saves full-head k, v;
  - ``TransformerDecoder``: ``output = self.output(h).float()`` and the recipe's
    ``CEWithChunkedOutputLoss``/``CrossEntropyLoss`` on fp32 logits; the recipe deletes the
    logits before ``loss.backward()``.
"""

from __future__ import annotations

from dataclasses import dataclass

from peakmem.training import Framework


@dataclass(frozen=True, kw_only=True)
class Profile:
    name: str
    rmsnorm_normed_fp32: bool  # RMSNorm keeps the normalised x in fp32 (torchtune)
    sdpa_repeats_kv: bool  # GQA k/v expanded to all heads before SDPA
    source: str


PROFILES: dict[Framework, Profile] = {
    Framework.HF: Profile(
        name="hf", rmsnorm_normed_fp32=False, sdpa_repeats_kv=False,
        source="transformers 5.23 modeling_*.py, integrations/sdpa_attention.py (enable_gqa)",
    ),
    Framework.TORCHTUNE: Profile(
        name="torchtune", rmsnorm_normed_fp32=True, sdpa_repeats_kv=True,
        source="torchtune modules/rms_norm.py, modules/attention.py, modules/transformer.py",
    ),
}  # fmt: skip


def profile(framework: Framework) -> Profile:
    return PROFILES[framework]
