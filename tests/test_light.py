"""The house rules that keep the core pure and light (DESIGN.md, "Rules"), held by tests.

* Every core module - everything in ``src/peakmem`` but the faces, the oracles and the edges listed
  below - imports only the standard library: importing it, alone, in a fresh interpreter loads none of
  the heavy packages.
* No core module imports a face (render, render_plan, plot, cli, web) or an oracle (simulate,
  measure), not even lazily inside a function; no module in ``formulas/`` imports ``catalog`` or ``hf``
  (formulas see a ModelSpec and a :class:`peakmem.device.Gpu`, never config keys or catalog entries).

The module list is discovered by walking the package's files, so a new module is covered the day it
is added.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import peakmem

HEAVY = ("torch", "transformers", "rich", "matplotlib", "fastapi", "huggingface_hub", "numpy")
FACES = ("peakmem.render", "peakmem.render_plan", "peakmem.plot", "peakmem.cli", "peakmem.web", "peakmem.api")
ORACLES = ("peakmem.simulate", "peakmem.measure")
# Edges that are neither face nor oracle: the ``python -m peakmem`` entry point (runs the CLI), a
# future integrations package, and the one module that goes online (imports huggingface_hub when a
# fetch is asked for; checked light at import below all the same).
EDGES = ("peakmem.__main__", "peakmem.integrations", "peakmem.hub")
FORMULAS = "peakmem.formulas"
NOT_FOR_FORMULAS = ("peakmem.catalog", "peakmem.hf")

ROOT = Path(peakmem.__file__).resolve().parent


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _within(name: str, packages: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in packages)


ALL_MODULES: dict[str, Path] = {_module_name(p): p for p in sorted(ROOT.rglob("*.py"))}
CORE: tuple[str, ...] = tuple(m for m in ALL_MODULES if not _within(m, FACES + ORACLES + EDGES))


def test_the_walk_finds_the_core() -> None:
    """A guard on the discovery itself: the modules named in DESIGN.md are found and classed."""
    named = ("units", "model", "hf", "catalog", "device", "estimate", "planner", "formulas.activations")
    for name in ("peakmem", *(f"peakmem.{m}" for m in named)):
        assert name in CORE, name
    for name in ("peakmem.cli", "peakmem.render", "peakmem.web.app", "peakmem.simulate.runner"):
        assert name in ALL_MODULES and name not in CORE
    assert len(CORE) >= 35


@pytest.mark.parametrize("module", [*CORE, "peakmem.hub"])
def test_core_module_imports_no_heavy_package(module: str) -> None:
    code = f"import sys, {module}\nprint(' '.join(m for m in {HEAVY!r} if m in sys.modules))\n"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"import {module} loads {out.stdout.strip()}"


def _imports(module: str, path: Path) -> set[str]:
    """Every module ``module`` imports, anywhere in its file (top level, functions, TYPE_CHECKING)."""
    is_package = path.name == "__init__.py"
    package = module if is_package else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            found.add(target)
            # ``from peakmem import cli`` imports the submodule peakmem.cli
            found.update(f"{target}.{alias.name}" for alias in node.names)
    return found


def _violations(forbidden: tuple[str, ...], modules: tuple[str, ...]) -> list[str]:
    out = []
    for module in modules:
        for target in sorted(_imports(module, ALL_MODULES[module])):
            if _within(target, forbidden):
                out.append(f"{module} imports {target}")
    return out


# The package's own peakmem.train/infer/fit/plan hand the call to the Python API face, lazily, inside
# each function: ``import peakmem`` stays light (checked above); nothing else in the core may.
PACKAGE_API = {
    "peakmem imports peakmem.api",
    "peakmem imports peakmem.api.run",
    "peakmem imports peakmem.api.Result",
    "peakmem imports peakmem.api.info_json",
}


def test_core_imports_no_face_and_no_oracle() -> None:
    assert [v for v in _violations(FACES + ORACLES, CORE) if v not in PACKAGE_API] == []


def test_formulas_import_neither_catalog_nor_hf() -> None:
    formulas = tuple(m for m in CORE if _within(m, (FORMULAS,)))
    assert len(formulas) >= 15
    assert _violations(NOT_FOR_FORMULAS, formulas) == []


def test_the_import_scan_sees_relative_lazy_and_from_imports(tmp_path: Path) -> None:
    """The scanner resolves the forms the rules must catch (a check that cannot fail proves nothing)."""
    src = (
        "from __future__ import annotations\n"
        "from ..catalog import Gpu\n"
        "from . import activations\n"
        "def f():\n"
        "    from peakmem import render\n"
        "    import peakmem.measure.runner\n"
    )
    path = tmp_path / "x.py"
    path.write_text(src, encoding="utf-8")
    found = _imports("peakmem.formulas.x", path)
    assert {
        "peakmem.catalog",
        "peakmem.formulas.activations",
        "peakmem.render",
        "peakmem.measure.runner",
    } <= found
