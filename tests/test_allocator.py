"""Caching-allocator rounding, the reserved model and the overhead table."""

from __future__ import annotations

import pytest

from peakmem.errors import InputError
from peakmem.estimate import estimate_training
from peakmem.formulas import allocator
from peakmem.formulas.overhead import CONTEXT_SIZES, Overheads
from peakmem.hf import spec_from_config
from peakmem.training import TrainingSetup
from peakmem.units import MiB
from tiny_models import LLAMA


def test_round_request() -> None:
    assert allocator.round_request(0) == 0
    assert allocator.round_request(1) == 512
    assert allocator.round_request(512) == 512
    assert allocator.round_request(513) == 1024


def test_segment_sizes() -> None:
    assert allocator.segment_size(1000) == 2 * MiB  # small pool
    assert allocator.segment_size(1 * MiB) == 2 * MiB
    assert allocator.segment_size(1 * MiB + 1) == 20 * MiB  # below kMinLargeAlloc: 20 MiB segment
    assert allocator.segment_size(10 * MiB) == 10 * MiB  # from 10 MiB: rounded to 2 MiB
    assert allocator.segment_size(11 * MiB) == 12 * MiB


def test_reserved_bytes() -> None:
    # 100 MiB resident + 0 rounding + 50 MiB churn x 1.1 = 155 MiB -> next 2 MiB multiple = 156 MiB
    got = allocator.reserved_bytes(resident=100 * MiB, resident_rounding=0, churn=50 * MiB, fragmentation=0.1)
    assert got == 156 * MiB


def test_overheads_validate_and_table() -> None:
    assert CONTEXT_SIZES["v100-cuda11-eager-loading"].bytes == 1343 * MiB
    with pytest.raises(InputError, match="fragmentation"):
        Overheads(fragmentation=1.5)
    with pytest.raises(InputError, match="context"):
        Overheads.for_context("tpu")


def test_device_total_is_reserved_plus_context() -> None:
    spec = spec_from_config(dict(LLAMA))
    ov = Overheads(context_bytes=300 * MiB, cublas_workspace_bytes=0, fragmentation=0.0)
    est = estimate_training(spec, TrainingSetup(micro_batch=2, seq_len=64), overheads=ov)
    assert est.device_total_bytes == est.peak_reserved_bytes + 300 * MiB
    assert est.peak_reserved_bytes % (2 * MiB) == 0
    assert est.peak_reserved_bytes >= est.peak_allocated_bytes
    assert any("fragmentation 0%" in a for a in est.assumptions)
    assert est.setup["precision"] == "mixed-bf16"


def test_reserved_bytes_expandable_segments() -> None:
    # expandable segments: no fragmentation slack; 100 + 50 MiB = 150 MiB -> next 20 MiB page = 160 MiB
    got = allocator.reserved_bytes(
        resident=100 * MiB, resident_rounding=0, churn=50 * MiB, fragmentation=0.1, expandable=True
    )
    assert got == 160 * MiB
    with pytest.raises(InputError, match="expandable_segments"):
        Overheads(expandable_segments="yes")  # type: ignore[arg-type]
