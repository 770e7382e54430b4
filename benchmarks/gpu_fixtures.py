"""GPU fixtures: measure a prepared matrix of training and serving jobs on one CUDA GPU and write
``tests/fixtures/gpu/<case>.json`` (and gzipped memory snapshots) for ``tests/test_gpu_fixtures.py``,
which compares both estimators (analytic and simulate) with them. Never run in CI.

One command, from the repository root, on a machine with one CUDA GPU and the ``torch`` extra
(torch, transformers, peft; ``pynvml`` or ``nvidia-smi`` for the device's used memory)::

    PYTHONPATH=src python benchmarks/gpu_fixtures.py; tar czf $OUT/gpu-fixtures.tgz -C tests/fixtures gpu

(about 5-7 minutes on an H200: each case runs in a fresh Python process, so that the CUDA context,
the caching allocator and the peak statistics start clean and an OOM cannot spoil the next case; every
case has its own time limit and the whole run stops starting new cases after ``--budget`` seconds).
``--dry-run`` lists the matrix (no GPU needed); ``--only SUBSTRING`` runs a part of it;
``--no-snapshots`` skips the snapshots.

What each case records (all bytes):

* ``context_bytes``: the CUDA context, as nvidia-smi sees it: the device's used memory after
  ``torch.ones(1, device="cuda")`` minus before CUDA was initialised, minus what the allocator
  reserved for that tensor (HF docs "Model training anatomy" measure it this way);
* ``peak_allocated_bytes`` / ``peak_reserved_bytes``: ``torch.cuda.max_memory_allocated`` /
  ``max_memory_reserved`` (training: through ``peakmem.measure``'s runner, per phase; serving: around
  ``model.generate``, prefill and decode apart);
* ``device_total_bytes``: the device's used memory at the end of the run minus before CUDA was
  initialised (what nvidia-smi shows for this process; the allocator keeps its segments cached);
* ``snapshot``: ``torch.cuda.memory._record_memory_history(stacks="python")`` over the run, dumped with
  ``_dump_snapshot`` and gzipped (``peakmem explain`` and ``peakmem calibrate`` read it).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "gpu"
FORMAT = 1  # "fixture" in each file: bump when a field changes meaning
CASE_TIMEOUT_S = 150  # one case: a 1.5 B model is built on CPU in fp32, moved, and trained 2 steps
BUDGET_S = 330  # no case starts after this (+ one CASE_TIMEOUT_S: under 8 minutes in all)
STEPS = 2  # step 1 creates the optimizer states; step 2 is the steady state
# _record_memory_history max_entries: a 2-step run of a 16-layer model makes ~10k events of a few KB
# each ("several KB per entry", torch/cuda/memory.py _dump_snapshot); more would be truncated, which
# peakmem explain handles, and the gzipped files stay small enough to come back from a lent machine.
SNAPSHOT_ENTRIES = 50_000
NEW_TOKENS = 32  # serving: tokens generated after the prompt


@dataclass(frozen=True)
class Case:
    name: str
    job: str  # "train" or "infer"
    model: str  # a catalog name (its config ships with peakmem: nothing is downloaded) or a config path
    argv: tuple[str, ...] = ()  # `peakmem train MODEL ...` options (train) - the same parser builds the setup
    batch: int = 1  # infer: sequences
    prompt: int = 0  # infer: prompt tokens
    new_tokens: int = NEW_TOKENS
    snapshot: bool = False
    note: str = ""

    def command(self) -> str:
        if self.job == "train":
            return " ".join(["peakmem train", self.model, *self.argv])
        return (f"peakmem infer {self.model} --batch {self.batch} --context {self.prompt + self.new_tokens} "
                f"--prompt {self.prompt}")  # fmt: skip


GPT2_1K = ("--seq", "1024", "--batch", "4")
XL_FP16 = ("--precision", "mixed-fp16", "--seq", "1024")
LLAMA_BF16 = ("--precision", "bf16", "--seq", "2048")
LORA16 = ("--precision", "bf16", "--seq", "2048", "--lora-rank", "16")
CKPT = ("--checkpointing", "full")
MATRIX: tuple[Case, ...] = (
    Case(name="gpt2-fp32-seq1024", job="train", model="gpt2", argv=("--precision", "fp32", *GPT2_1K),
         snapshot=True),
    Case(name="gpt2-amp-bf16-seq1024-ckpt", job="train", model="gpt2",
         argv=("--precision", "amp-bf16", *GPT2_1K, *CKPT)),
    Case(name="gpt2-xl-mixed-fp16-seq1024", job="train", model="gpt2-xl", argv=XL_FP16,
         note="the seed's case (issue 16: analytic reserved 33.08 GiB, simulate 36.68 GiB)"),
    Case(name="gpt2-xl-mixed-fp16-seq1024-ckpt", job="train", model="gpt2-xl", argv=(*XL_FP16, *CKPT)),
    Case(name="llama-3.2-1b-bf16-seq2048", job="train", model="llama-3.2-1b", argv=LLAMA_BF16),
    Case(name="llama-3.2-1b-bf16-seq2048-ckpt", job="train", model="llama-3.2-1b", argv=(*LLAMA_BF16, *CKPT)),
    Case(name="llama-3.2-1b-lora-seq2048", job="train", model="llama-3.2-1b",
         argv=("--method", "lora", *LORA16), snapshot=True),
    Case(name="llama-3.2-1b-qlora-seq2048", job="train", model="llama-3.2-1b",
         argv=("--method", "qlora", *LORA16),
         note="peakmem.measure refuses QLoRA today; the case records why until it measures bitsandbytes"),
    Case(name="llama-3.2-1b-infer-b4-p2048", job="infer", model="llama-3.2-1b", batch=4, prompt=2048,
         snapshot=True),
    Case(name="gpt2-xl-infer-b8-p512", job="infer", model="gpt2-xl", batch=8, prompt=512),
    # HF generate of a 13B model, 512 + 512 tokens, batch 1 .. 16: issue 27's "the gap grows with batch"
    # (DynamicCache's concatenation keeps the old and the new cache alive together at every step)
    *(Case(name=f"llama-2-13b-infer-b{b}-p512-n512", job="infer", model="llama-2-13b", batch=b, prompt=512,
           new_tokens=512) for b in (1, 4, 16)),
    Case(name="llama-3.1-8b-infer-b16-p1024-n256", job="infer", model="llama-3.1-8b", batch=16, prompt=1024,
         new_tokens=256, note="GQA: 8 KV heads of 32"),
)  # fmt: skip


@dataclass
class Device:
    """The device's used memory, through NVML (no CUDA context needed) or nvidia-smi."""

    index: int = 0
    how: str = field(default="")

    def used(self) -> int | None:
        try:
            import pynvml

            pynvml.nvmlInit()
            handle = pynvml.nvmlDeviceGetHandleByIndex(self.index)
            self.how = "NVML nvmlDeviceGetMemoryInfo.used"
            return int(pynvml.nvmlDeviceGetMemoryInfo(handle).used)
        except Exception:
            pass
        if shutil.which("nvidia-smi"):
            out = subprocess.run(
                ["nvidia-smi", f"--id={self.index}", "--query-gpu=memory.used",
                 "--format=csv,noheader,nounits"],
                capture_output=True, text=True, check=False,
            )  # fmt: skip
            if out.returncode == 0 and out.stdout.strip():
                self.how = "nvidia-smi --query-gpu=memory.used (MiB)"
                return int(float(out.stdout.split()[0]) * 2**20)
        return None


# --- one case, in its own process -------------------------------------------------------------------
def run_case(case: Case, out_dir: Path, *, device: str = "cuda", snapshots: bool = True) -> dict[str, Any]:
    """Measure ``case`` on ``device`` and return its fixture (also written to ``out_dir``). On CPU (the
    tests' smoke run) the CUDA-only figures are None."""
    t0 = time.perf_counter()
    cuda = device.startswith("cuda")
    dev = Device()
    baseline = dev.used() if cuda else None  # before torch touches CUDA
    import torch

    record: dict[str, Any] = {"fixture": FORMAT, **asdict(case), "command": case.command(), "device": device,
                              "torch": torch.__version__, "cuda": torch.version.cuda}  # fmt: skip
    record["argv"] = list(case.argv)
    if cuda:
        torch.ones(1, device=device)
        torch.cuda.synchronize()
        after = dev.used()
        context = None
        if after is not None and baseline is not None:
            context = after - baseline - torch.cuda.memory_reserved()
        record.update(
            gpu=torch.cuda.get_device_name(),
            gpu_total_bytes=torch.cuda.get_device_properties(0).total_memory,
            baseline_used_bytes=baseline,
            used_how=dev.how,
            context_bytes=context,
        )
        torch.cuda.reset_peak_memory_stats()
    snap = cuda and snapshots and case.snapshot
    if snap:
        torch.cuda.memory._record_memory_history(max_entries=SNAPSHOT_ENTRIES, stacks="python")
    try:
        measured = _train(case, device) if case.job == "train" else _infer(case, device)
    except Exception as err:  # a case the runner refuses (QLoRA) or an OOM: recorded, not fatal
        measured = {"error": f"{type(err).__name__}: {str(err)[:300]}"}
    record.update(measured)
    if cuda:
        torch.cuda.synchronize()
        used = dev.used()
        record["device_total_bytes"] = used - baseline if used is not None and baseline is not None else None
        record["nvml_used_bytes"] = used
    if snap:
        name = f"{case.name}.pickle.gz"
        raw = out_dir / f"{case.name}.pickle"
        torch.cuda.memory._dump_snapshot(str(raw))
        torch.cuda.memory._record_memory_history(enabled=None)
        with raw.open("rb") as src, gzip.open(out_dir / name, "wb", compresslevel=6) as dst:
            shutil.copyfileobj(src, dst)
        raw.unlink()
        record["snapshot"] = name
    else:
        record["snapshot"] = None
    record["seconds"] = round(time.perf_counter() - t0, 1)
    (out_dir / f"{case.name}.json").write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    return record


def training_setup(case: Case) -> tuple[str, dict[str, Any], Any]:
    """The model's name, config and TrainingSetup ``peakmem train MODEL argv`` would use."""
    from peakmem.cli import _config_and_setup, build_parser

    args = build_parser().parse_args(["train", case.model, *case.argv])
    return _config_and_setup(args)


def _train(case: Case, device: str) -> dict[str, Any]:
    from peakmem.measure.runner import measure_training

    name, config, setup = training_setup(case)
    est = measure_training(config, setup, device=device, steps=STEPS, model_name=name)
    return {
        "peak_allocated_bytes": est.peak_allocated_bytes,
        "peak_reserved_bytes": est.peak_reserved_bytes,
        "runner_device_total_bytes": est.device_total_bytes,
        "peak_phase": est.peak_phase.value,
        "phases": {p.phase.value: p.bytes for p in est.phases},
        "breakdown": {c.value: b for c, b in est.by_category().items()},
        "steps": est.extra.get("steps"),
        "params": est.params,
        "trainable_params": est.trainable_params,
    }


def _infer(case: Case, device: str) -> dict[str, Any]:
    """HF generate in bf16 from the catalog config (random weights, greedy, exactly ``new_tokens``):
    peaks of prefill (the first forward) and decode (the rest) apart."""
    import torch
    import transformers

    from peakmem.resolve import resolve_config

    _, config = resolve_config(case.model)
    cfg = transformers.AutoConfig.for_model(
        **{k: v for k, v in config.items() if k != "transformers_version"}
    )
    torch.manual_seed(0)
    with torch.device(device):  # built where it runs: a 13B model in fp32 on the host would take 52 GB
        model = transformers.AutoModelForCausalLM.from_config(
            cfg, dtype=torch.bfloat16, attn_implementation="sdpa"
        )
    model = model.eval()
    cuda = device.startswith("cuda")
    ids = torch.randint(0, cfg.vocab_size, (case.batch, case.prompt), device=device)
    weights = torch.cuda.memory_allocated() if cuda else None
    peaks: dict[str, int] = {}
    calls = [0]

    def mark(module: object, args: object, kwargs: object) -> None:
        if calls[0] == 1 and cuda:  # the first decode step begins: prefill's peak is in
            torch.cuda.synchronize()
            peaks["prefill"] = torch.cuda.max_memory_allocated()
            torch.cuda.reset_peak_memory_stats()
        calls[0] += 1

    hook = model.register_forward_pre_hook(mark, with_kwargs=True)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    with torch.no_grad():
        model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=case.new_tokens,
                       min_new_tokens=case.new_tokens, do_sample=False)  # fmt: skip
    hook.remove()
    out: dict[str, Any] = {"forward_calls": calls[0], "weights_bytes": weights}
    if cuda:
        torch.cuda.synchronize()
        peaks["decode"] = torch.cuda.max_memory_allocated()
        out.update(
            phases=peaks,
            peak_allocated_bytes=max(peaks.values()),
            peak_reserved_bytes=torch.cuda.max_memory_reserved(),
            peak_phase=max(peaks, key=lambda p: peaks[p]),
        )
    return out


# --- the matrix ----------------------------------------------------------------------------------------
def selected(only: str) -> list[Case]:
    return [c for c in MATRIX if only in c.name]


def dry_run(cases: list[Case]) -> str:
    lines = [f"{len(cases)} cases -> {FIXTURES.relative_to(ROOT)}/<case>.json"]
    for c in cases:
        extra = " +snapshot" if c.snapshot else ""
        lines.append(f"  {c.name:36} {c.job:5} {c.command()}{extra}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry-run", action="store_true", help="list the matrix and exit")
    ap.add_argument("--only", default="", help="only the cases whose name contains this")
    ap.add_argument("--out", type=Path, default=FIXTURES)
    ap.add_argument("--no-snapshots", action="store_true")
    ap.add_argument("--budget", type=float, default=BUDGET_S, help="start no case after this many seconds")
    ap.add_argument("--case", default=None, help=argparse.SUPPRESS)  # the child process's one case
    args = ap.parse_args(argv)
    cases = selected(args.only)
    if args.dry_run:
        print(dry_run(cases))
        return 0
    if args.case is not None:  # the child: one case, then exit
        (case,) = [c for c in MATRIX if c.name == args.case]
        rec = run_case(case, args.out, snapshots=not args.no_snapshots)
        shown = ("name", "peak_allocated_bytes", "peak_reserved_bytes", "device_total_bytes", "context_bytes",
                 "error")  # fmt: skip
        print(json.dumps({k: rec.get(k) for k in shown}))
        return 0
    import torch

    if not torch.cuda.is_available():
        print("gpu_fixtures: no CUDA device; nothing measured (see --dry-run)", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]),
               TRANSFORMERS_VERBOSITY="error", PYTHONUNBUFFERED="1")  # fmt: skip
    failed = 0
    for case in cases:
        if time.perf_counter() - t0 > args.budget:
            print(f"{case.name}: skipped (budget of {args.budget:.0f} s spent)", flush=True)
            continue
        cmd = [sys.executable, __file__, "--case", case.name, "--out", str(args.out)]
        if args.no_snapshots:
            cmd.append("--no-snapshots")
        try:
            done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=CASE_TIMEOUT_S)
            line = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr.strip()[-500:]
            failed += done.returncode != 0
        except subprocess.TimeoutExpired:
            line, failed = f"timed out after {CASE_TIMEOUT_S} s", failed + 1
        print(f"{case.name} ({time.perf_counter() - t0:.0f} s): {line}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
