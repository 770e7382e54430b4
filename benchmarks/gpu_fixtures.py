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

The fsdp group is not in the default run (which it would push past the device budget); its own command::

    PYTHONPATH=src python benchmarks/gpu_fixtures.py --only fsdp; tar czf $OUT/fsdp.tgz -C tests/fixtures gpu

(4 cases of about 20-30 s each, estimated, not yet timed on a GPU: a fresh process, llama-3.2-1b built on
the GPU, 2 steps). It checks FSDP's side-stream pools (peakmem.formulas.fsdp2.StreamPools): FSDP2
(``fully_shard``) and FSDP1 trained over a 1-rank NCCL process group and as rank 0 of an 8-rank fake
process group, and records besides the peaks per phase (``phases``, ``steps``, ``reserved_steps``):

* ``streams_after_step1`` / ``streams_after_step2``: ``torch.cuda.memory_snapshot()``'s segments summed per
  stream (reserved, allocated, segments) after each step's zero_grad, FSDP's streams by attribute;
* ``pools_after_step2``: those of FSDP's streams by pool (reduce_scatter, all_gather, other): after
  zero_grad every block of a pool is free and cached for its stream, so this is the pool;
* ``at_step2_peak``: a stackless allocator trace of step 2 replayed per stream (:func:`stream_replay`):
  each stream's allocated and reserved bytes where step 2's allocated total peaks, and ``side_idle_bytes``,
  what FSDP's streams hold reserved but not allocated there (peakmem's ``side_stream_pool_bytes``);
* ``sharding_strategy`` (FSDP1 runs NO_SHARD at world size 1), ``backend``, ``world_size``, ``streams``;
  a fake world's nvidia-smi total (no NCCL communicator) as ``fake_world_device_total_bytes``, not as
  ``device_total_bytes``, which benchmarks/validate.py compares.
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
MAIN, FSDP = "main", "fsdp"  # case groups: the default run, and the FSDP side-stream cases (--only fsdp)


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
    group: str = MAIN  # MAIN runs by default; FSDP only with --only fsdp (its own device budget)

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
# The fsdp group (--only fsdp): FSDP's side-stream pools (peakmem.formulas.fsdp2.StreamPools) on one GPU.
# llama-3.2-1b (the catalog's smallest Llama, vocab 128,256) in mixed-bf16 as torchtitan trains it (fp32
# shards, MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)), AdamW foreach, batch 2 x seq 2048:
# peakmem puts every case's peak at the loss (backward, no layer done), where the reduce-scatter pool (the
# sharded gradients, freed by zero_grad) is idle; at batch 1 the foreach step peaks instead (grads alive).
FAKE_WORLD = 8  # ranks of the fake process group: one 8-GPU node (torchtitan's published points)
FSDP_ARGV = ("--precision", "mixed-bf16", "--seq", "2048", "--batch", "2", "--optimizer-impl", "foreach",
             "--fsdp", "full-shard")  # fmt: skip
ONE_RANK = ("a 1-rank NCCL process group; torch 2.13 FSDP2 at world size 1 never all-gathers "
            "(_fsdp_param_group.py unshard returns early, wait_for_unshard allocates the unsharded "
            "parameters on the current stream): only the reduce-scatter pool is on a side stream"
            )  # fmt: skip
FSDP_CASES = (
    Case(name="llama-3.2-1b-fsdp2-1rank-b2-seq2048", job="train", model="llama-3.2-1b",
         argv=(*FSDP_ARGV, "--gpus", "1", "--fsdp-version", "2"), group=FSDP, note=ONE_RANK),
    Case(name="llama-3.2-1b-fsdp1-1rank-b2-seq2048", job="train", model="llama-3.2-1b",
         argv=(*FSDP_ARGV, "--gpus", "1", "--fsdp-version", "1"), group=FSDP,
         note="a 1-rank NCCL process group; FSDP1 runs NO_SHARD at world size 1 (_init_utils.py "
              "_init_core_state clamps the strategy): the bf16 flat parameters on the pre-unshard stream, "
              "the fp32 gradients cast on the post-backward stream"),
    Case(name=f"llama-3.2-1b-fsdp2-fake{FAKE_WORLD}-b2-seq2048", job="train", model="llama-3.2-1b",
         argv=(*FSDP_ARGV, "--gpus", str(FAKE_WORLD), "--fsdp-version", "2"), group=FSDP,
         note=f"rank 0 of a {FAKE_WORLD}-rank fake process group: no-op collectives, real buffers"),
    Case(name=f"llama-3.2-1b-fsdp1-fake{FAKE_WORLD}-b2-seq2048", job="train", model="llama-3.2-1b",
         argv=(*FSDP_ARGV, "--gpus", str(FAKE_WORLD), "--fsdp-version", "1"), group=FSDP,
         note=f"rank 0 of a {FAKE_WORLD}-rank fake process group: FULL_SHARD as on {FAKE_WORLD} GPUs"),
)  # fmt: skip
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
    *FSDP_CASES,
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
        run = _infer if case.job == "infer" else _train_fsdp if case.group == FSDP else _train
        measured = run(case, device)
    except Exception as err:  # a case the runner refuses (QLoRA) or an OOM: recorded, not fatal
        measured = {"error": f"{type(err).__name__}: {str(err)[:300]}"}
    record.update(measured)
    if cuda:
        torch.cuda.synchronize()
        used = dev.used()
        record["device_total_bytes"] = used - baseline if used is not None and baseline is not None else None
        record["nvml_used_bytes"] = used
        if record.get("backend") == "fake":  # no NCCL communicator: not what one of the ranks would show
            record["fake_world_device_total_bytes"] = record.pop("device_total_bytes")
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


# --- FSDP on one GPU (the fsdp group) ------------------------------------------------------------------
# FSDP's streams besides the default one, by attribute, and the pool of StreamPools (formulas/fsdp2.py)
# whose blocks each caches: torch 2.13 torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py
# FSDPCommContext (FSDP2; the root state's _comm_ctx, shared by every unit at lazy init) and
# torch/distributed/fsdp/_runtime_utils.py _init_streams (FSDP1; the root FullyShardedDataParallel; its
# _all_reduce_stream is the default stream without HSDP). FSDP2 allocates the all-gather output on the
# copy-in stream and the reduce-scatter output on the reduce-scatter stream (_fsdp_collectives.py
# foreach_all_gather, foreach_reduce); FSDP1 the low-precision shard on the pre-unshard stream, the
# unsharded flat parameter on the unshard stream and the new sharded gradient on the post-backward stream.
FSDP2_STREAMS = {"all_gather_copy_in_stream": "all_gather", "all_gather_stream": "all_gather",
                 "reduce_scatter_stream": "reduce_scatter", "all_reduce_stream": "other"}  # fmt: skip
FSDP1_STREAMS = {"_pre_unshard_stream": "all_gather", "_unshard_stream": "all_gather",
                 "_post_backward_stream": "reduce_scatter", "_all_reduce_stream": "other"}  # fmt: skip
POOLS = ("reduce_scatter", "all_gather", "other")
DEFAULT_STREAM = "default"
# step 2's allocator events, without stacks: a few 10k for a 16-layer model; more would be truncated
TRACE_ENTRIES = 1_000_000


def layout(case: Case) -> Any:
    """The Parallelism ``peakmem train MODEL argv`` asks for (None: one GPU without an engine)."""
    from peakmem import options
    from peakmem.cli import build_parser
    from peakmem.question import parallelism

    args = build_parser().parse_args(["train", case.model, *case.argv])
    return parallelism(options.convert("train", {o.name: getattr(args, o.name) for o in options.of("train")}))


def _train_fsdp(case: Case, device: str) -> dict[str, Any]:
    """FSDP in this one process, over a process group of ``layout(case).gpus`` ranks: one rank over NCCL
    (gloo on CPU) with a file store, or rank 0 of a fake group of more ranks than there are GPUs
    (torch.testing._internal.distributed.fake_pg: every collective a no-op that leaves its buffers
    allocated, as peakmem.measure.parallel runs it on CPU and torchtitan's scripts/estimate in its real
    mode). The model is built in fp32 on the device, wrapped as :func:`_wrap` does, and trained STEPS steps
    of its own HF loss; on CUDA the fixture gets the peaks per phase (as peakmem.measure's runner takes
    them) and, per stream, the reserved and allocated bytes after each step and at step 2's allocated peak
    (:func:`stream_replay` on a stackless allocator trace of step 2)."""
    import tempfile

    import torch
    import torch.distributed as dist

    from peakmem.errors import InputError

    _, config, setup = training_setup(case)
    par = layout(case)
    if par is None or par.fsdp.value != "full-shard" or par.gpus != par.dp:
        raise InputError(f"{case.name}: the fsdp cases run FSDP full-shard over data-parallel ranks only")
    if setup.precision.value not in ("fp32", "mixed-bf16") or setup.grad_accum != 1:
        raise InputError(f"{case.name}: the fsdp cases run fp32 or mixed-bf16, one micro-batch per step")
    dev = torch.device(device)
    if dev.type == "cuda":  # an index: set_device refuses a bare "cuda"
        dev = torch.device("cuda", torch.cuda.current_device() if dev.index is None else dev.index)
        torch.cuda.set_device(dev)
    with tempfile.TemporaryDirectory() as tmp:
        if par.gpus == 1:
            backend = "nccl" if dev.type == "cuda" else "gloo"
            store: Any = dist.FileStore(os.path.join(tmp, "store"), 1)
        else:
            from torch.testing._internal.distributed.fake_pg import FakeStore

            backend, store = "fake", FakeStore()
        dist.init_process_group(backend, store=store, rank=0, world_size=par.gpus)
        try:
            out = _fsdp_steps(config, setup, par, dev)
        finally:
            dist.destroy_process_group()
    out.update(backend=backend, world_size=par.gpus, fsdp_version=par.fsdp_version, layout=par.describe())
    return out


def _build(config: dict[str, Any], setup: Any, dev: Any) -> Any:
    """peakmem.measure.runner.build_model's model (its class, attention, use_cache=False), built in fp32
    where it runs: a 1.2 B model initialised on the host would take most of a case's time."""
    import torch
    import transformers

    from peakmem.measure.runner import ATTN_IMPL, config_and_class

    cfg, cls = config_and_class(config, drop=("model_type", "transformers_version"))
    torch.manual_seed(0)
    kwargs = {"dtype": torch.float32, "attn_implementation": ATTN_IMPL[setup.attention]}
    with torch.device(dev):
        if cls is transformers.AutoModelForCausalLM:
            model = cls.from_config(cfg, **kwargs)
        else:
            model = cls._from_config(cfg, **kwargs)
    model.config.use_cache = False
    return model.train()


def _wrap(model: Any, setup: Any, par: Any, dev: Any) -> tuple[Any, str]:
    """FSDP2 as torchtitan applies it (fully_shard per decoder layer, then the root: embeddings, final norm
    and head in the root unit, reshard_after_forward=True) or FSDP1 as accelerate/HF Trainer wrap a
    transformer (TRANSFORMER_BASED_WRAP: one unit per decoder layer, FULL_SHARD, use_orig_params=True,
    torch's default prefetch), both with param_dtype=bf16 under mixed-bf16, reduce_dtype fp32 for FSDP2
    (torchtitan's mixed_precision_reduce) and bf16 for FSDP1 (accelerate's policy: reduce_dtype = the
    mixed-precision dtype, utils/dataclasses.py; what peakmem's FSDP1 reduce-scatter assumes); and the
    sharding strategy that runs (FSDP1 clamps any to NO_SHARD at world size 1)."""
    import warnings

    import torch

    mixed = setup.precision.value == "mixed-bf16"
    layers = list(model.model.layers)
    if par.fsdp_version == 2:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        mesh = init_device_mesh(dev.type, (par.gpus,))
        kwargs: dict[str, Any] = {"mesh": mesh, "reshard_after_forward": True}
        if mixed:
            kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for layer in layers:
            fully_shard(layer, **kwargs)
        fully_shard(model, **kwargs)
        return model, "fully_shard"
    from torch.distributed.fsdp import FullyShardedDataParallel, MixedPrecision, ShardingStrategy
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    policy = MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16) if mixed else None
    with warnings.catch_warnings():  # the clamp to NO_SHARD at world size 1: recorded, expected
        warnings.filterwarnings("ignore", message="FSDP is switching to use `NO_SHARD`")
        wrapped = FullyShardedDataParallel(
            model, auto_wrap_policy=ModuleWrapPolicy({type(layers[0])}),
            sharding_strategy=ShardingStrategy.FULL_SHARD, use_orig_params=True, device_id=dev,
            mixed_precision=policy,
        )  # fmt: skip
    return wrapped, str(wrapped.sharding_strategy.name)


def fsdp_streams(model: Any, version: int) -> dict[str, Any]:
    """FSDP's streams after its lazy init (the first forward), by attribute (FSDP2_STREAMS /
    FSDP1_STREAMS): the ones this torch has."""
    holder = model._get_fsdp_state()._comm_ctx if version == 2 else model
    found = {attr: getattr(holder, attr, None) for attr in (FSDP2_STREAMS if version == 2 else FSDP1_STREAMS)}
    return {attr: stream for attr, stream in found.items() if stream is not None}


def _stream_names(model: Any, version: int) -> dict[int, str]:
    """Stream handle -> name: the default stream and FSDP's."""
    import torch

    names = {int(torch.cuda.default_stream().cuda_stream): DEFAULT_STREAM}
    for attr, stream in fsdp_streams(model, version).items():
        names.setdefault(int(stream.cuda_stream), attr)
    return names


def _stream_name(names: dict[int, str], stream: object) -> str:
    key = int(str(stream))
    return names.get(key, f"stream {key:#x}")


def per_stream(segments: list[dict[str, Any]], names: dict[int, str]) -> dict[str, dict[str, int]]:
    """``torch.cuda.memory_snapshot()``'s segments summed by the stream that owns them (a segment and
    every block cut from it serve one stream: c10/cuda/CUDACachingAllocator.cpp get_free_block)."""
    out: dict[str, dict[str, int]] = {}
    for seg in segments:
        name = _stream_name(names, seg["stream"])
        row = out.setdefault(name, {"reserved": 0, "allocated": 0, "segments": 0})
        row["reserved"] += int(seg["total_size"])
        row["allocated"] += int(seg["allocated_size"])
        row["segments"] += 1
    return out


def pools_of(streams: dict[str, dict[str, int]], version: int) -> dict[str, int]:
    """The reserved bytes of the non-default streams, by StreamPools pool."""
    roles = FSDP2_STREAMS if version == 2 else FSDP1_STREAMS
    out = dict.fromkeys(POOLS, 0)
    for name, row in streams.items():
        if name != DEFAULT_STREAM:
            out[roles.get(name, "other")] += row["reserved"]
    return out


def stream_replay(
    start: list[dict[str, Any]], trace: list[dict[str, Any]], names: dict[int, str]
) -> dict[str, Any]:
    """An allocator trace (``_record_memory_history`` events) replayed per stream from the segments at its
    start: at the first event where the allocated total peaks, each stream's allocated and reserved bytes,
    and ``side_idle_bytes``, what the non-default streams hold reserved but not allocated there (what
    peakmem's ``side_stream_pool_bytes`` predicts). As peakmem.measure.snapshot.replay: allocated drops at
    free_requested (max_memory_allocated's rule; a free of a block older than the trace carries its size
    and stream), segments grow at segment_alloc/segment_map and shrink at segment_free/segment_unmap."""
    alloc: dict[int, int] = {}
    reserved: dict[int, int] = {}
    for seg in start:
        key = int(seg["stream"])
        alloc[key] = alloc.get(key, 0) + int(seg["allocated_size"])
        reserved[key] = reserved.get(key, 0) + int(seg["total_size"])
    live: dict[int, tuple[int, int]] = {}  # address -> (size, stream) of the blocks the trace allocated
    total = sum(alloc.values())
    best = (total, -1, dict(alloc), dict(reserved))
    for i, e in enumerate(trace):
        action, addr = e.get("action"), e.get("addr")
        key, size = int(e.get("stream", 0)), int(e.get("size", 0))
        if action == "alloc":
            live[int(str(addr))] = (size, key)
            alloc[key] = alloc.get(key, 0) + size
            total += size
            if total > best[0]:
                best = (total, i, dict(alloc), dict(reserved))
        elif action == "free_requested":
            size, key = live.pop(int(str(addr)), (size, key))
            alloc[key] = alloc.get(key, 0) - size
            total -= size
        elif action in ("segment_alloc", "segment_map"):
            reserved[key] = reserved.get(key, 0) + size
        elif action in ("segment_free", "segment_unmap"):
            reserved[key] = reserved.get(key, 0) - size
    peak, event, at_alloc, at_reserved = best
    streams = {
        _stream_name(names, k): {"allocated": at_alloc.get(k, 0), "reserved": at_reserved.get(k, 0)}
        for k in sorted(set(at_alloc) | set(at_reserved))
    }
    side = sum(max(0, r["reserved"] - r["allocated"]) for n, r in streams.items() if n != DEFAULT_STREAM)
    return {"allocated_bytes": peak, "reserved_bytes": sum(at_reserved.values()), "side_idle_bytes": side,
            "event": event, "events": len(trace), "truncated": len(trace) >= TRACE_ENTRIES,
            "streams": streams}  # fmt: skip


def _fsdp_steps(config: dict[str, Any], setup: Any, par: Any, dev: Any) -> dict[str, Any]:
    import gc

    import torch

    from peakmem.measure.trainer import make_optimizer

    cuda = dev.type == "cuda"
    model = _build(config, setup, dev)
    params_count = sum(p.numel() for p in model.parameters())
    model, strategy = _wrap(model, setup, par, dev)
    optimizer = make_optimizer(setup.optimizer, setup.optimizer_impl, [p for p in model.parameters()])
    vocab = int(config["vocab_size"])
    gen = torch.Generator().manual_seed(0)
    out: dict[str, Any] = {"params": params_count, "sharding_strategy": strategy}
    peaks: dict[int, dict[str, int]] = {}
    reserved_peaks: dict[int, dict[str, int]] = {}
    current = [0, "load"]

    def phase(name: str, step: int) -> None:  # as peakmem.measure.runner's _CudaStats
        if cuda:
            torch.cuda.synchronize(dev)
            s, p = current
            if s:
                step_peaks = peaks.setdefault(s, {})
                step_peaks[p] = max(step_peaks.get(p, 0), torch.cuda.max_memory_allocated(dev))
                step_reserved = reserved_peaks.setdefault(s, {})
                step_reserved[p] = max(step_reserved.get(p, 0), torch.cuda.max_memory_reserved(dev))
            torch.cuda.reset_peak_memory_stats(dev)
        current[:] = [step, name]

    gc.collect()
    if cuda:  # what wrapping freed (the unsharded fp32 parameters) leaves the cache: the run starts clean
        torch.cuda.synchronize(dev)
        torch.cuda.empty_cache()
        out.update(setup_allocated_bytes=torch.cuda.memory_allocated(dev),
                   setup_reserved_bytes=torch.cuda.memory_reserved(dev))  # fmt: skip
    names: dict[int, str] = {}
    start: list[dict[str, Any]] = []
    tracing = False
    gc_was_enabled = gc.isenabled()
    gc.disable()  # frees at refcount zero, deterministically (as the runner)
    try:
        for step in range(1, STEPS + 1):
            if cuda and step == STEPS:
                torch.cuda.synchronize(dev)
                start = torch.cuda.memory_snapshot()
                try:  # without a trace the pools and the peaks are still measured
                    torch.cuda.memory._record_memory_history(max_entries=TRACE_ENTRIES, context=None)
                    tracing = True
                except (RuntimeError, TypeError, ValueError) as err:
                    out["trace_error"] = f"{type(err).__name__}: {err}"
            phase("forward", step)
            ids = torch.randint(0, vocab, (setup.micro_batch, setup.seq_len), generator=gen).to(dev)
            loss = model(input_ids=ids, labels=ids).loss
            phase("backward", step)
            loss.backward()
            del loss, ids
            phase("optimizer", step)
            optimizer.step()
            optimizer.zero_grad(set_to_none=setup.grads_set_to_none)
            if cuda:
                torch.cuda.synchronize(dev)
                names = names or _stream_names(model, par.fsdp_version)
                streams = per_stream(torch.cuda.memory_snapshot(), names)
                out[f"streams_after_step{step}"] = streams
                out[f"pools_after_step{step}"] = pools_of(streams, par.fsdp_version)
        phase("load", STEPS + 1)
        out["streams"] = sorted(fsdp_streams(model, par.fsdp_version))
        if tracing:
            snap = torch.cuda.memory._snapshot()
            torch.cuda.memory._record_memory_history(enabled=None)
            trace = snap["device_traces"][dev.index]
            out["at_step2_peak"] = stream_replay(start, trace, names)
    finally:
        if gc_was_enabled:
            gc.enable()
    if cuda:
        phases = {p: max(s.get(p, 0) for s in peaks.values()) for p in ("forward", "backward", "optimizer")}
        out.update(
            phases=phases, steps=peaks, reserved_steps=reserved_peaks,
            peak_allocated_bytes=max(phases.values()), peak_phase=max(phases, key=lambda p: phases[p]),
            peak_reserved_bytes=max(max(s.values()) for s in reserved_peaks.values()),
            step2_peak_allocated_bytes=max(peaks[STEPS].values()),
        )  # fmt: skip
    return out


# --- the matrix ----------------------------------------------------------------------------------------
def selected(only: str) -> list[Case]:
    """The cases whose name contains ``only``; without it, the default run's (group MAIN)."""
    if not only:
        return [c for c in MATRIX if c.group == MAIN]
    return [c for c in MATRIX if only in c.name]


def dry_run(cases: list[Case], only: str = "") -> str:
    lines = [f"{len(cases)} cases -> {FIXTURES.relative_to(ROOT)}/<case>.json"]
    for c in cases:
        extra = " +snapshot" if c.snapshot else ""
        lines.append(f"  {c.name:36} {c.job:5} {c.command()}{extra}")
    if not only:  # the groups the default run leaves out
        for group in sorted({c.group for c in MATRIX} - {MAIN}):
            rest = [c for c in MATRIX if c.group == group]
            lines.append(f"group {group}: {len(rest)} more cases, not in the default run (--only {group})")
            lines += [f"  {c.name:36} {c.job:5} {c.command()}" for c in rest]
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
        print(dry_run(cases, args.only))
        return 0
    if args.case is not None:  # the child: one case, then exit
        (case,) = [c for c in MATRIX if c.name == args.case]
        rec = run_case(case, args.out, snapshots=not args.no_snapshots)
        shown = ("name", "peak_allocated_bytes", "peak_reserved_bytes", "device_total_bytes", "context_bytes",
                 "error")  # fmt: skip
        line = {k: rec.get(k) for k in shown}
        if case.group == FSDP and "error" not in rec:
            line.update(pools=rec.get("pools_after_step2"),
                        side_idle=(rec.get("at_step2_peak") or {}).get("side_idle_bytes"))  # fmt: skip
        print(json.dumps(line))
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
