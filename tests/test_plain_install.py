"""A plain install (no extras) gives every command that needs no torch (issue 15).

A fresh venv (``python -m venv --without-pip``, no site packages), the wheel built from this
checkout installed into it with ``pip --python VENV install --no-deps --no-index`` (offline), and
the one core dependency, rich (with its own two, pygments and markdown-it-py/mdurl), linked in
from the test environment so that no network is needed. Nothing else: no torch, transformers,
matplotlib, FastAPI or huggingface_hub. The ``peakmem`` script the wheel installs is then run as a
user would run it.

Building the wheel also checks that setuptools prints no deprecation warning (the license field).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
RICH_AND_ITS_DEPENDENCIES = ("rich", "pygments", "markdown_it", "mdurl")
ABSENT = ("torch", "transformers", "peft", "matplotlib", "fastapi", "huggingface_hub")


def _run(cmd: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=120, check=False)


@pytest.fixture(scope="module")
def plain_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # importlib.metadata, not find_spec("pip"): setuptools' distutils hack answers a pip lookup by
    # clearing distutils, and a later `import setuptools` in the same process (torch.compile's C++
    # builder) then fails its assertion: an order-dependent failure under pytest-xdist
    try:
        importlib.metadata.version("pip")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("pip is not installed in the test environment")
    try:  # the test extra pins it; read its version without importing it (distutils hack)
        version = importlib.metadata.version("setuptools")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("setuptools is not installed in the test environment")
    if int(version.split(".")[0]) < 77:
        pytest.skip(f"setuptools {version} < 77 cannot build the license expression")
    tmp = tmp_path_factory.mktemp("plain")
    src = tmp / "src-copy"  # build from a copy: the build leaves build/ and *.egg-info behind
    shutil.copytree(ROOT / "src", src / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    build = _run(
        [sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "--no-build-isolation", "-w",
         str(tmp / "wheel"), str(src)],
        cwd=tmp,
    )  # fmt: skip
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    log = build.stdout + build.stderr
    for warning in ("BuildBackendWarning", "SetuptoolsDeprecationWarning", "license"):
        lines = [ln for ln in log.splitlines() if warning in ln and "warn" in ln.lower()]
        assert not lines, lines
    (wheel,) = (tmp / "wheel").glob("peakmem-*.whl")
    with zipfile.ZipFile(wheel) as z:
        metadata = z.read("peakmem-0.1.0.dist-info/METADATA").decode()
    # rich is what a plain `pip install peakmem` brings: a requirement without an extra marker
    core = [ln for ln in metadata.splitlines() if ln.startswith("Requires-Dist:") and "extra ==" not in ln]
    assert [ln.split()[1].split("=")[0] for ln in core] == ["rich"], core
    assert "License-Expression: Apache-2.0" in metadata

    venv = tmp / "venv"
    made = _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=tmp)
    assert made.returncode == 0, made.stderr
    python = venv / "bin" / "python"
    installed = _run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", "--no-index",
         str(wheel)],
        cwd=tmp,
    )  # fmt: skip
    assert installed.returncode == 0, installed.stderr
    site = Path(
        _run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], cwd=tmp
        ).stdout.strip()
    )
    for module in RICH_AND_ITS_DEPENDENCIES:
        spec = importlib.util.find_spec(module)
        assert spec is not None and spec.origin is not None, module
        os.symlink(Path(spec.origin).parent, site / module)
    return venv


def _peakmem(venv: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env["PATH"] = f"{venv / 'bin'}:{env.get('PATH', '')}"
    env["HF_HUB_OFFLINE"] = "1"
    return _run([str(venv / "bin" / "peakmem"), *args], cwd=venv.parent, env=env)


def test_the_plain_venv_has_no_extras(plain_venv: Path) -> None:
    probe = f"import importlib.util as u; print([m for m in {ABSENT!r} if u.find_spec(m)])"
    out = _run([str(plain_venv / "bin" / "python"), "-c", probe], cwd=plain_venv.parent)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
    where = _run([str(plain_venv / "bin" / "python"), "-c", "import peakmem; print(peakmem.__file__)"],
                 cwd=plain_venv.parent)  # fmt: skip
    assert str(plain_venv) in where.stdout, where.stdout + where.stderr  # the installed copy, not src/


@pytest.mark.parametrize(
    ("args", "code", "expected"),
    [
        (("train", "gpt2-xl"), 0, "gpt2-xl full fine-tuning"),
        (("train", "gpt2-xl", "--json"), 0, '"peak_allocated_bytes"'),
        (("fit", "gpt2-xl", "--gpu", "80GB"), 0, "gpt2-xl"),
        (("fit", "gpt2-xl", "--gpu", "8GB"), 1, "gpt2-xl"),
        (("infer", "gpt2-xl"), 0, "gpt2-xl inference"),
        (("plan", "gpt2-xl", "--gpu", "a100-40gb", "--max-gpus", "8"), 0, "gpt2-xl"),
        (("info", "gpt2-xl"), 0, "gpt2-xl"),
        (("models",), 0, "gpt2-xl"),
        (("gpus",), 0, "h100"),
    ],
)
def test_commands_that_need_no_torch_work(
    plain_venv: Path, args: tuple[str, ...], code: int, expected: str
) -> None:
    out = _peakmem(plain_venv, *args)
    assert out.returncode == code, out.stdout[-2000:] + out.stderr[-2000:]
    assert expected in out.stdout.replace("\n", " ") or expected in out.stdout
    assert "Traceback" not in out.stderr


@pytest.mark.parametrize("command", ["simulate", "measure"])
def test_torch_commands_name_the_extra(plain_venv: Path, command: str) -> None:
    out = _peakmem(plain_venv, command, "gpt2")
    assert out.returncode == 2, out.stdout + out.stderr
    assert "Traceback" not in out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert "pip install 'peakmem[torch]'" in lines[0]
