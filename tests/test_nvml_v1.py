"""NVML's v1 ``used`` counts the driver's reservation that nvidia-smi reports apart (formulas/overhead.py
``nvml_v1_used_bytes``; the catalog's ``Gpu.driver_reserved_bytes``), by hand."""

from __future__ import annotations

import pytest

from peakmem.catalog import get_gpu
from peakmem.device import Gpu
from peakmem.errors import InputError
from peakmem.formulas.overhead import nvml_v1_used_bytes
from peakmem.units import GiB, MiB


def test_a100_80gb_reserves_what_its_two_totals_differ_by() -> None:
    # nvidia-smi's total 81920 MiB, torch.cuda.mem_get_info()'s 81050 MiB
    assert nvml_v1_used_bytes(10 * GiB, get_gpu("a100-80gb")) == 10 * GiB + 870 * MiB


def test_a_gpu_without_a_known_reservation_is_an_error_naming_it() -> None:
    gpu = Gpu(
        name="x",
        display_name="X",
        vendor="nvidia",
        architecture="ampere",
        memory_bytes=GiB,
        memory_source="t",
    )
    with pytest.raises(InputError, match="gpu='x'"):
        nvml_v1_used_bytes(GiB, gpu)


def test_a_reservation_must_fit_the_card() -> None:
    with pytest.raises(InputError, match="driver_reserved_bytes"):
        Gpu(name="x", display_name="X", vendor="nvidia", architecture="ampere", memory_bytes=GiB,
            memory_source="t", driver_reserved_bytes=GiB)  # fmt: skip
