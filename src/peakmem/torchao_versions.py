"""What a torchao release does that changes the bytes of a torchtune QLoRA job, one row per change.

torchtune's QLoRA keeps its frozen base weights as torchao ``NF4Tensor`` (``to_nf4``: NF4 codes, block 64,
the block scalers quantized per 256 blocks). peakmem's formulas read torchao 0.18.0 (:data:`TORCHAO_CURRENT`,
the installed wheel); ``--torchao VERSION`` names the release a job ran, and :func:`release_facts` gives the
row in force for it. Read in the released wheels (``pip download torchao==V --no-deps``):

* torchao 0.1 (pinned by torchtune@0914d5cfb pyproject.toml ``torchao==0.1``), dtypes/nf4tensor.py
  ``convert_to_norm_float_weight`` quantizes the whole weight at once: ``quantize_tensor_nearest`` takes
  ``(value.unsqueeze(-1) - nf4).abs()`` over all ``numel`` elements, a ``(numel, 16)`` difference and its
  ``abs`` in the weight's dtype alive together.
* torchao 0.2.0 (PR #196, 2024-05-01) added ``CHUNK_SIZE = 1024**2`` and quantizes in chunks of that many
  elements into a ``uint8`` buffer of ``numel``; unchanged through 0.18.0
  (quantization/quantize_/workflows/nf4/nf4_tensor.py ``CHUNK_SIZE = 1024**2``).

The bytes of one ``to_nf4`` are in :mod:`peakmem.formulas.nf4_load` (measured on CPU with both wheels' code).
"""

from __future__ import annotations

from dataclasses import dataclass

from peakmem.releases import Release, ReleaseTable

# The release peakmem's formulas read (the installed wheel).
TORCHAO_CURRENT = "0.18.0"
# torchao 0.2.0 dtypes/nf4tensor.py (and 0.18.0 nf4_tensor.py): CHUNK_SIZE = 1024**2 elements
NF4_CHUNK_ELEMENTS = 1024**2
Version = Release


@dataclass(frozen=True, kw_only=True)
class TorchaoRelease:
    """What the releases from ``since`` on (until the previous row's) do, as far as a QLoRA job's bytes go."""

    since: Version
    nf4_chunk: int | None  # elements to_nf4 quantizes at a time; None: the whole weight at once
    source: str


# Newest first: the first row whose ``since`` is at most the version asked is the one in force.
TORCHAO_RELEASES: tuple[TorchaoRelease, ...] = (
    TorchaoRelease(
        since=(0, 2, 0), nf4_chunk=NF4_CHUNK_ELEMENTS,
        source="torchao 0.2.0 dtypes/nf4tensor.py convert_to_norm_float_weight (PR #196): "
        "quantize_tensor_nearest per chunk of CHUNK_SIZE = 1024**2 elements into a uint8 buffer",
    ),
    TorchaoRelease(
        since=(0, 0, 0), nf4_chunk=None,
        source="torchao 0.1 dtypes/nf4tensor.py convert_to_norm_float_weight: quantize_tensor_nearest of the "
        "whole weight ((numel, 16) differences and their abs)",
    ),
)  # fmt: skip


# ``torchao=`` as users type it (peakmem.releases: a leading v, dev / post / rc and +local tags) and the
# row in force for it
TABLE = ReleaseTable(field="torchao", example="0.1", current=TORCHAO_CURRENT, rows=TORCHAO_RELEASES)
parse_torchao_version = TABLE.parse
release_facts = TABLE.facts


__all__ = [
    "NF4_CHUNK_ELEMENTS",
    "TORCHAO_CURRENT",
    "TORCHAO_RELEASES",
    "TorchaoRelease",
    "parse_torchao_version",
    "release_facts",
]
