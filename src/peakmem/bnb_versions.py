"""What a bitsandbytes release does that changes the bytes of a QLoRA step, one row per change.

peakmem's formulas read bitsandbytes 0.50.2 (:data:`BNB_CURRENT`; adapters.py, formulas/qlora.py);
``--bitsandbytes VERSION`` names the release a job ran, and :func:`release_facts` gives the row in force
for it. Read in bitsandbytes' git history (github.com/bitsandbytes-foundation/bitsandbytes), file
``bitsandbytes/autograd/_functions.py``:

* ``MatMul4Bit`` (4-bit ``Linear4bit``: nf4 / fp4) came with the 4-bit refactor 4ea489d (2023-04-03),
  first released in 0.39.0 (tag 0.38.0, 7c65101, has no ``MatMul4Bit``; 0.39.1, 4395d68, has it).
  From then its forward, when A or B requires grad, kept its **input** A for backward:
  ``ctx.tensors = (A, B)`` (0.39.1 line 522; 0.41.1, 18e827d, line 523; 0.42.0 4870580; 0.43.0
  4876324; 0.43.1 4a6fb35, line 516), though the backward never reads A (``grad_B`` is not supported:
  ``# if req_gradB: grad_B = torch.matmul(grad_output.t(), A)``). PR #1270, commit 9e75374 (2024-07-16,
  "fix QLoRA mem bug: delete useless buffered activation"), made it ``ctx.tensors = (None, B)``; the
  first release with it is 0.43.2 (ce53caf, 2024-07-23, line 516), and it stays so through 0.49.2 and
  0.50.2. So from 0.39.0 to 0.43.1 every 4-bit Linear whose input requires grad keeps that input
  (:func:`peakmem.formulas.lora.deltas.adapt_layer` counts it once, with whatever else keeps the same
  tensor).
* Unchanged over the same releases, so not a row: the 4-bit backward dequantizes the weight in every
  one (``grad_A = torch.matmul(grad_output, F.dequantize_4bit(B, ctx.state)...)``: one 16-bit weight's
  temporary, formulas/qlora.py); ``MatMul8bitLt`` (LLM.int8, ``--quant int8``) keeps its input in every
  release read, 0.41.1 to 0.50.2 (``ctx.tensors = (CAt, subA, A)``), so the int8 base keeps its
  Linears' inputs whatever the version.
"""

from __future__ import annotations

from dataclasses import dataclass

from peakmem.releases import Release, ReleaseTable

# The release peakmem's QLoRA formulas read (the installed wheel's bitsandbytes/autograd/_functions.py:
# MatMul4Bit.forward ``ctx.tensors = (None, B)``).
BNB_CURRENT = "0.50.2"
# MatMul4Bit (4-bit Linear4bit) first released in 0.39.0 (4ea489d; absent at tag 0.38.0)
BNB_FIRST_4BIT = (0, 39, 0)
Version = Release


@dataclass(frozen=True, kw_only=True)
class BnbRelease:
    """What the releases from ``since`` on (until the next row's) do, as far as a QLoRA step's bytes go."""

    since: Version
    matmul4bit_saves_input: bool  # MatMul4Bit.forward keeps its input A for backward
    source: str


# Newest first: the first row whose ``since`` is at most the version asked is the one in force.
BNB_RELEASES: tuple[BnbRelease, ...] = (
    BnbRelease(
        since=(0, 43, 2), matmul4bit_saves_input=False,
        source="bitsandbytes PR #1270 (9e75374, released in 0.43.2): MatMul4Bit.forward "
        "ctx.tensors = (None, B)",
    ),
    BnbRelease(
        since=BNB_FIRST_4BIT, matmul4bit_saves_input=True,
        source="bitsandbytes 0.39.1-0.43.1 (0.41.1: 18e827d) autograd/_functions.py MatMul4Bit.forward "
        "ctx.tensors = (A, B)",
    ),
    BnbRelease(since=(0, 0, 0), matmul4bit_saves_input=False, source="no 4-bit Linear before 0.39.0"),
)  # fmt: skip


# ``bitsandbytes=`` as users type it (peakmem.releases: a leading v, dev / post / rc and +local tags) and the
# row in force for it
TABLE = ReleaseTable(field="bitsandbytes", example="0.41.1", current=BNB_CURRENT, rows=BNB_RELEASES)
parse_bnb_version = TABLE.parse
release_facts = TABLE.facts


def has_4bit(version: str) -> bool:
    """Whether the release has 4-bit Linears (``MatMul4Bit``, from :data:`BNB_FIRST_4BIT`)."""
    return parse_bnb_version(version) >= BNB_FIRST_4BIT


__all__ = [
    "BNB_CURRENT",
    "BNB_FIRST_4BIT",
    "BNB_RELEASES",
    "BnbRelease",
    "has_4bit",
    "parse_bnb_version",
    "release_facts",
]
