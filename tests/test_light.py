"""The core stays light: `import peakmem` and its core modules import only the standard library."""

import subprocess
import sys

HEAVY = ("torch", "transformers", "rich", "matplotlib", "fastapi", "huggingface_hub", "numpy")
CORE = (
    "peakmem", "peakmem.units", "peakmem.dtypes", "peakmem.model", "peakmem.hf", "peakmem.catalog",
    "peakmem.breakdown", "peakmem.training", "peakmem.estimate", "peakmem.errors",
)  # fmt: skip


def test_core_imports_no_heavy_module() -> None:
    code = (
        "import sys\n"
        f"for m in {CORE!r}: __import__(m)\n"
        f"print(' '.join(m for m in {HEAVY!r} if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
