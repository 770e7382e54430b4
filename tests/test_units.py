import pytest

from peakmem.errors import InputError
from peakmem.units import GB, GiB, MiB, fmt_both, fmt_bytes, parse_size


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("24GB", 24 * GB),
        ("24 GB", 24 * GB),
        ("24GiB", 24 * GiB),
        ("24g", 24 * GB),
        ("80 gib", 80 * GiB),
        ("512MiB", 512 * MiB),
        ("1.5GB", 1_500_000_000),
    ],
)
def test_parse_size_forms(text: str, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["24", "GB", "24 parsecs", "-3GB", ""])
def test_parse_size_rejects_with_accepted_forms(text: str) -> None:
    with pytest.raises(InputError, match="24GiB"):
        parse_size(text)


def test_formatting_labels_decimal_and_binary() -> None:
    # The seed's model states: 1,557,611,200 params x 16 bytes.
    assert fmt_both(24_921_779_200) == "24.92 GB (23.21 GiB)"
    assert fmt_bytes(3 * MiB + MiB // 2) == "3.50 MiB"
    assert fmt_bytes(100) == "100 B"
