"""Side by side: DeepSpeed's own ZeRO memory estimator vs peakmem's per-rank model states.

DeepSpeed ships ``estimate_zero2_model_states_mem_needs`` (deepspeed/runtime/zero/stage_1_and_2.py)
and ``estimate_zero3_model_states_mem_needs`` (deepspeed/runtime/zero/stage3.py), behind the
``*_all_cold`` printers. This script installs deepspeed==0.19.8 into a throwaway venv under /tmp
(``DS_BUILD_OPS=0``: no CUDA ops are compiled; torch 2.13.0 is reused from this project's venv
through a ``.pth`` file, never downloaded), calls those functions for a table of models, GPU counts
and offload options, and prints them next to :func:`peakmem.formulas.state_terms.zero_model_state_terms`
with the difference explained term by term. If deepspeed cannot be installed or imported, it falls
back to the same formulas reimplemented below from the 0.19.8 source, and says so in the table.

Run: ``.venv/bin/python benchmarks/peers.py [--json] [--no-install]``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from peakmem.formulas.state_terms import zero_model_state_terms
from peakmem.model import ModelSpec
from peakmem.parallel import DS_SUB_GROUP_SIZE, Offload, Parallelism
from peakmem.resolve import resolve_model
from peakmem.training import TrainingSetup

VENV = Path("/tmp/peakmem-peers-venv")
DEEPSPEED = "deepspeed==0.19.8"
GPUS_PER_NODE = 8
MODELS = ("gpt2-xl", "llama-3.1-8b", "llama-3.1-70b")
GPU_COUNTS = (8, 64)
BUFFER_FACTOR = 1.5  # additional_buffer_factor default of both estimators
GiB = 2**30

# (stage, offload_optimizer, offload_param) as the estimators enumerate them (zero_init=True for stage 3)
OPTIONS = ((2, False, False), (2, True, False), (3, False, False), (3, True, False), (3, True, True))

CHILD = r"""
import json, sys
from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs
out = []
for c in json.load(sys.stdin):
    if c["stage"] == 2:
        cpu, gpu = estimate_zero2_model_states_mem_needs(
            total_params=c["params"], num_gpus_per_node=c["gpn"], num_nodes=c["nodes"],
            cpu_offload=c["off_opt"])
    else:
        cpu, gpu, _ = estimate_zero3_model_states_mem_needs(
            total_params=c["params"], largest_layer_params=c["largest"], num_gpus_per_node=c["gpn"],
            num_nodes=c["nodes"], cpu_offload=c["off_opt"], cpu_offload_params=c["off_par"], zero_init=True)
    out.append([cpu, gpu])
print(json.dumps(out))
"""


# --- DeepSpeed 0.19.8's formulas, reimplemented (used only when deepspeed cannot run) ---------------
def ds_zero2(
    params: int, gpn: int, nodes: int, cpu_offload: bool, factor: float = BUFFER_FACTOR
) -> tuple[int, int]:
    """stage_1_and_2.py estimate_zero2_model_states_mem_needs -> (cpu_mem, gpu_mem)."""
    total_gpus = nodes * gpn
    if cpu_offload:
        return int(params * max(4 * total_gpus, 16) * factor), int(2 * params)
    return int(params * 4 * gpn * factor), int(2 * params + int(18 * params / total_gpus))


def ds_zero3(
    params: int,
    largest: int,
    gpn: int,
    nodes: int,
    cpu_offload: bool,
    cpu_offload_params: bool,
    factor: float = BUFFER_FACTOR,
) -> tuple[int, int]:
    """stage3.py estimate_zero3_model_states_mem_needs (zero_init=True) -> (cpu_mem, gpu_mem)."""
    total_gpus = nodes * gpn
    gpus_factor = 1 / nodes
    largest_mem = 4 * largest
    if cpu_offload and cpu_offload_params:
        return int(params * 18 * gpus_factor * factor), largest_mem
    if cpu_offload:
        return int(params * 16 * gpus_factor * factor), largest_mem + int(2 * params / total_gpus)
    return int(largest * 4 * gpn * factor), largest_mem + int(18 * params / total_gpus)


def largest_module_params(spec: ModelSpec) -> int:
    """DeepSpeed's model_to_params: the largest module's own (recurse=False) parameters."""
    modules: dict[str, int] = {}
    for t in spec.outer:
        key = "outer." + t.name.rsplit(".", 1)[0]
        modules[key] = modules.get(key, 0) + t.numel
    for g in spec.groups:
        for t in g.layer.tensors:
            key = "layer." + t.name.rsplit(".", 1)[0]
            modules[key] = modules.get(key, 0) + t.numel
    return max(modules.values())


@dataclass(frozen=True)
class Case:
    model: str
    params: int
    largest: int
    gpus: int
    stage: int
    off_opt: bool
    off_par: bool

    @property
    def nodes(self) -> int:
        return -(-self.gpus // GPUS_PER_NODE)

    def child_input(self) -> dict[str, object]:
        return {
            "params": self.params,
            "largest": self.largest,
            "gpn": GPUS_PER_NODE,
            "nodes": self.nodes,
            "stage": self.stage,
            "off_opt": self.off_opt,
            "off_par": self.off_par,
        }

    @property
    def options(self) -> str:
        parts = [f"ZeRO-{self.stage}"]
        if self.off_opt:
            parts.append("opt->cpu")
        if self.off_par:
            parts.append("params->cpu")
        return " ".join(parts)


def ensure_deepspeed(install: bool) -> Path | None:
    """The throwaway venv's python with deepspeed importable, or None."""
    python = VENV / "bin" / "python"
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "DS_BUILD_OPS": "0"}
    probe = [str(python), "-c", "import deepspeed.runtime.zero.stage3"]
    if python.exists() and subprocess.run(probe, env=env, capture_output=True).returncode == 0:
        return python
    if not install:
        return None
    try:
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True, capture_output=True)
        site = Path(sysconfig.get_paths()["purelib"])  # this venv's site-packages: torch 2.13.0 lives here
        venv_site = next((VENV / "lib").glob("python*/site-packages"))
        (venv_site / "_peakmem_reuse_torch.pth").write_text(f"{site}\n")
        subprocess.run(
            [str(python), "-m", "pip", "install", "-q", DEEPSPEED],
            env=env,
            check=True,
            capture_output=True,
            timeout=900,
        )
    except (subprocess.SubprocessError, OSError, StopIteration) as exc:
        print(
            f"# deepspeed could not be installed ({exc}); using the reimplemented formulas", file=sys.stderr
        )
        return None
    return python if subprocess.run(probe, env=env, capture_output=True).returncode == 0 else None


def run_deepspeed(python: Path, cases: list[Case]) -> list[tuple[int, int]] | None:
    env = {**os.environ, "DS_ACCELERATOR": "cpu"}
    proc = subprocess.run(
        [str(python), "-c", CHILD],
        input=json.dumps([c.child_input() for c in cases]),
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    if proc.returncode != 0:
        print(f"# deepspeed estimator failed: {proc.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
        return None
    return [(int(cpu), int(gpu)) for cpu, gpu in json.loads(proc.stdout.strip().splitlines()[-1])]


def formula(c: Case) -> tuple[int, int]:
    if c.stage == 2:
        return ds_zero2(c.params, GPUS_PER_NODE, c.nodes, c.off_opt)
    return ds_zero3(c.params, c.largest, GPUS_PER_NODE, c.nodes, c.off_opt, c.off_par)


def explain(c: Case, gpu_terms: dict[str, int]) -> str:
    """Why peakmem and DeepSpeed differ, term by term."""
    persistent = gpu_terms.get("persistent small parameters (whole on every rank)", 0)
    notes: list[str] = []
    if c.stage == 2:
        notes.append(
            "GPU: same terms 2P + (2+4+4+8)P/N (peakmem pads the flat partition to 2N)"
            if not c.off_opt
            else "GPU: same 2P (16-bit params; grads go straight to CPU)"
        )
        if c.off_opt:
            notes.append(
                "CPU: DS = P*max(4*total_gpus, 16)*1.5 - its loading term uses total GPUs (peakmem: "
                "the node's 8 ranks) and its 16P pinned term is not divided by nodes; peakmem = "
                "max(8 ranks x 4P fp32 load, 16P/N x 8 pinned), no 1.5 factor"
            )
        else:
            notes.append("CPU: loading 8 ranks x 4P fp32 in both; DS adds the 1.5 buffer factor")
    else:
        if not c.off_opt:
            notes.append(
                f"GPU: peakmem adds the 16-bit gradient partition 2P/N (stage3.py "
                f"grad_partitions_flat_buffer), which DS's 18 B/param omits, and "
                f"{persistent / 2**20:.1f} MiB of persistent small params"
            )
            if c.params / c.gpus > DS_SUB_GROUP_SIZE:
                notes.append(
                    "peakmem counts fp32 gradients for one sub_group_size (1e9 elements) at a time "
                    "(stage3.py _prepare_fp32_grad_for_sub_group/_release_sub_group), DS for the "
                    "whole 4P/N partition"
                )
            notes.append("CPU: zero.Init loads one largest layer x 4 B x 8 ranks in both; DS x1.5")
        else:
            notes.append(
                f"GPU: same terms; peakmem adds {persistent / 2**20:.1f} MiB of persistent small params"
            )
            extra = "16-bit params 2 + " if c.off_par else ""
            notes.append(
                f"CPU: peakmem pins {extra}master 4 + Adam 8 + fp32 grads 4 + 16-bit grad partition 2 "
                "B/param (grad_partitions_flat_buffer lives on the CPU with offload); DS omits the "
                "last 2 and multiplies by 1.5"
            )
    return "; ".join(notes)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--no-install", action="store_true", help="use an existing venv or the formulas")
    args = ap.parse_args(argv)

    cases: list[Case] = []
    for name in MODELS:
        spec = resolve_model(name)
        for gpus in GPU_COUNTS:
            for stage, off_opt, off_par in OPTIONS:
                cases.append(
                    Case(name, spec.params, largest_module_params(spec), gpus, stage, off_opt, off_par)
                )
    python = ensure_deepspeed(install=not args.no_install)
    ds = run_deepspeed(python, cases) if python else None
    source = (
        f"{DEEPSPEED} (installed, called)" if ds else "DeepSpeed 0.19.8 formulas, reimplemented (NOT called)"
    )
    ds = ds or [formula(c) for c in cases]

    rows = []
    for c, (ds_cpu, ds_gpu) in zip(cases, ds, strict=True):
        par = Parallelism(
            gpus=c.gpus,
            gpus_per_node=GPUS_PER_NODE,
            zero_stage=c.stage,
            offload_optimizer=Offload.CPU if c.off_opt else Offload.NONE,
            offload_params=Offload.CPU if c.off_par else Offload.NONE,
        )
        terms = zero_model_state_terms(resolve_model(c.model), TrainingSetup(), par)
        rows.append(
            {
                "model": c.model,
                "gpus": c.gpus,
                "options": c.options,
                "ds_gpu": ds_gpu,
                "pm_gpu": terms.gpu_bytes,
                "ds_cpu_per_node": ds_cpu,
                "pm_cpu_per_node": terms.cpu_bytes,
                "gpu_diff_pct": 100 * (terms.gpu_bytes - ds_gpu) / ds_gpu,
                "cpu_vs_ds_over_1.5_pct": 100
                * (terms.cpu_bytes - ds_cpu / BUFFER_FACTOR)
                / (ds_cpu / BUFFER_FACTOR),
                "why": explain(c, terms.gpu),
            }
        )
    if args.json:
        json.dump({"source": source, "rows": rows}, sys.stdout, indent=2)
        print()
        return 0
    print(f"DeepSpeed side: {source}; {GPUS_PER_NODE} GPUs per node; mixed-bf16 AdamW; GiB = 2^30 B\n")
    print(
        "| model | GPUs | options | DS GPU | peakmem GPU | diff | DS CPU/node | peakmem CPU/node | "
        "vs DS/1.5 | why |"
    )
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|---|")
    for r in rows:
        gpu = f"{r['ds_gpu'] / GiB:.2f} | {r['pm_gpu'] / GiB:.2f} | {r['gpu_diff_pct']:+.2f}%"
        cpu = f"{r['ds_cpu_per_node'] / GiB:.1f} | {r['pm_cpu_per_node'] / GiB:.1f}"
        print(
            f"| {r['model']} | {r['gpus']} | {r['options']} | {gpu} | {cpu} | "
            f"{r['cpu_vs_ds_over_1.5_pct']:+.1f}% | {r['why']} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
