"""Load a script of benchmarks/ as a module in a test (benchmarks/ is not a package)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


def load_benchmark(stem: str, name: str | None = None) -> ModuleType:
    """``benchmarks/<stem>.py`` as module ``name`` (default ``_bench_<stem>``): registered in sys.modules
    (dataclasses look their module up), with benchmarks/ on sys.path (scripts import their siblings)."""
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    name = name or f"_bench_{stem}"
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{stem}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
