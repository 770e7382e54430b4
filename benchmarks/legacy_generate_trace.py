"""transformers' own ``generate`` traced on the CPU against formulas/serving/cache_growth.py's replay.

A tiny LlamaForCausalLM made from a config generates greedily (``min_new_tokens = max_new_tokens``; one
case without it) under ``peakmem.measure.tracker.LiveStorageTracker(device_type="cpu")``, as
tests/test_cache_growth.py::test_parity_with_transformers_generate does; its storages above 1 MiB (less
the weights and buffers, which the formula counts apart) are replayed through the caching-allocator model
and printed next to ``replayed_reserved(growth_run(resolve_context(spec, setup)))`` for the same job, the
setup naming the transformers release that runs (``engine_version``: 4.35 in a venv with transformers
4.35.0, the legacy path; left out under 5.x). Attention is the release's default for a config-built model
(4.35: eager; 5.x: SDPA, set as the parity test does).

    PYTHONPATH=src /path/to/venv/bin/python benchmarks/legacy_generate_trace.py [--case NAME]
        [--dump STEP ... --layer L]   # one forward's large requests at one layer: trace, then formula

The last column replays every decode step (no stride, no steady-state shortcut).
``--dump``: the storages above 1 MiB allocated or freed in forward STEP (0: the prefill, 1: the first
decode forward, each with what ``generate`` does until the next one) whose module is layer L (by the
record's module path), then the step's requests outside the layers; then the formula's requests for the
same step (layer L's program and the forward's own), each with the allocator model's reserved after it.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from peakmem.breakdown import Phase
from peakmem.formulas.allocator import K_SMALL_SIZE, NO_ROUNDUP, round_request
from peakmem.formulas.caching_allocator import CachingAllocatorModel
from peakmem.formulas.serving import cache_growth as cg
from peakmem.formulas.serving.context import resolve_context
from peakmem.inference import Engine, InferenceSetup
from peakmem.measure.tracker import BUFFER, PARAM, LiveStorageTracker
from peakmem.resolve import resolve_model

MiB = 1024 * 1024


@dataclass(frozen=True)
class Case:
    name: str
    hidden: int
    heads: int
    kv: int
    width: int  # MLP intermediate size
    vocab: int
    layers: int
    batch: int
    prompt: int
    new: int
    min_new: bool = True  # generate(min_new_tokens=new); False: max_new_tokens only (no length processors)


CASES = (  # the parity test's two, and Llama-2-7B's layer (MHA, K 16 MiB at the prompt, 48 at the end)
    Case("mha-16x576", 512, 8, 8, 1024, 1024, 2, 16, 576, 96),
    Case("gqa-32x1280", 512, 8, 2, 1024, 1024, 2, 32, 1280, 96),
    Case("llama2-16x128+256", 4096, 32, 32, 11008, 32000, 2, 16, 128, 256),
    # the same job without min_new_tokens (5.x builds no logits processor for it)
    Case("llama2-16x128+256-nomin", 4096, 32, 32, 11008, 32000, 2, 16, 128, 256, min_new=False),
    # --case only: 8 of Llama-2-7B's layers; optimum-benchmark's Vicuna-7B-v1.5 job whole (32 layers; bf16
    # where the GPU ran fp16: over 45 minutes on 2 cores, 20 GB)
    Case("llama2-8L-16x128+256", 4096, 32, 32, 11008, 32000, 8, 16, 128, 256),
    Case("vicuna7b-16x128+256", 4096, 32, 32, 11008, 32000, 32, 16, 128, 256),
)
DEFAULT = 4  # the cases run without --case


def config_dict(c: Case) -> dict[str, Any]:
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": c.hidden,
        "intermediate_size": c.width, "num_attention_heads": c.heads, "num_key_value_heads": c.kv,
        "num_hidden_layers": c.layers, "vocab_size": c.vocab, "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    }  # fmt: skip


def transformers_release() -> tuple[str, bool]:
    """The installed transformers version and whether it is the legacy (tuple-cache) generate."""
    import transformers

    major, minor = (int(p) for p in transformers.__version__.split(".")[:2])
    return transformers.__version__, (major, minor) < (4, 36)


@dataclass
class Trace:
    ledger: Any
    starts: list[int]  # the event index where each forward starts (0: the prefill)


def trace(c: Case, folder: Path) -> Trace:
    import torch
    import transformers

    _, legacy = transformers_release()
    config = transformers.AutoConfig.from_pretrained(folder)
    if not legacy:
        config._attn_implementation = "sdpa"  # as the parity test
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)  # made in bf16 (32 Llama-2 layers in fp32 outgrow 24 GB)
    try:
        model = transformers.AutoModelForCausalLM.from_config(config).to(torch.bfloat16).eval()
    finally:
        torch.set_default_dtype(torch.float32)
    ids = torch.randint(0, c.vocab, (c.batch, c.prompt))
    tracker = LiveStorageTracker(device_type="cpu")
    tracker.register_module(model)
    starts: list[int] = []

    def mark(module: Any, args: Any) -> None:
        starts.append(len(tracker.ledger._events))
        tracker.ledger.set_phase(Phase.DECODE if starts[1:] else Phase.PREFILL, step=len(starts) - 1)

    hook = model.register_forward_pre_hook(mark)
    lengths = {"min_new_tokens": c.new} if c.min_new else {}
    with torch.no_grad(), tracker:
        tracker.set_phase(Phase.FORWARD, step=0)
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=c.new, do_sample=False,
                             pad_token_id=0, **lengths)  # fmt: skip
    hook.remove()
    if out.shape[1] != c.prompt + c.new:  # an EOS in every sequence stopped it early: another job
        print(f"  {c.name}: generate stopped after {out.shape[1] - c.prompt} of {c.new} new tokens")
    return Trace(tracker.ledger, starts)


def is_large(rec: Any) -> bool:
    """A storage the formula replays: above the small pool, not a weight or buffer (counted apart)."""
    return round_request(rec.nbytes, NO_ROUNDUP) > K_SMALL_SIZE and not ({PARAM, BUFFER} & rec.tags)


def replay_trace(t: Trace) -> tuple[int, list[int]]:
    """Peak reserved over the large storages' events, and the reserved peak up to each forward's end."""
    model = CachingAllocatorModel(NO_ROUNDUP)
    live: dict[int, int] = {}
    peak, ends = 0, []
    bounds = set(t.starts[1:])
    for i, (sid, delta) in enumerate(t.ledger._events):
        if i in bounds:
            ends.append(peak)
        if not is_large(t.ledger.records[sid]):
            continue
        new = live.get(sid, 0) + delta
        if new <= 0:
            live.pop(sid, None)
            model.free(sid)
        else:
            live[sid] = new
            model.malloc(sid, new)
        peak = max(peak, model.reserved)
    ends.append(peak)
    return peak, ends


def growth(c: Case, folder: Path, legacy: bool) -> cg.GenerateRun:
    spec = resolve_model(str(folder / "config.json"))
    setup = InferenceSetup(engine=Engine.HF, batch=c.batch, prompt=c.prompt, context=c.prompt + c.new,
                           weights="bf16", engine_version="4.35" if legacy else None)  # fmt: skip
    run = cg.growth_run(resolve_context(spec, setup))
    assert run is not None and run.legacy == legacy
    return replace(run, min_new_tokens=c.min_new)


class LoggedReplay(cg._Replay):
    """The formula's replay, each large request logged with the layer and the reserved after it."""

    def __init__(self) -> None:
        super().__init__(NO_ROUNDUP, None)
        self.log: list[tuple[str, int | None, str, int, int]] = []  # (op, layer, name, bytes, reserved)
        self.sizes: dict[object, int] = {}

    def alloc(self, name: str, nbytes: int) -> None:
        super().alloc(name, nbytes)
        if nbytes > K_SMALL_SIZE:
            self.sizes[name] = nbytes
            self.log.append(("+", None, name, nbytes, self.model.reserved))

    def free(self, *names: str | tuple[int, str]) -> None:
        for name in names:
            live = name in self.keys
            super().free(name)
            if live:
                layer = name[0] if isinstance(name, tuple) else None
                label = name[1] if isinstance(name, tuple) else name
                self.log.append(("-", layer, label, self.sizes.get(name, 0), self.model.reserved))

    def rename(self, old: str, new: str) -> None:
        super().rename(old, new)
        self.sizes[new] = self.sizes.get(old, 0)

    def run(self, program: list[cg._Op], layer: int) -> None:
        for op, name, arg, scoped in program:
            slot: str | tuple[int, str] = (layer, name) if scoped else name
            if op == cg.ALLOC:
                super().run([(op, name, arg, scoped)], layer)
                self.sizes[slot] = int(arg)
                self.log.append(("+", layer, name, int(arg), self.model.reserved))
            elif op == cg.FREE:
                if slot in self.keys:
                    super().run([(op, name, arg, scoped)], layer)
                    self.log.append(("-", layer, name, self.sizes.get(slot, 0), self.model.reserved))
            else:
                super().run([(op, name, arg, scoped)], layer)
                new = (layer, arg) if str(arg).startswith(cg.LAYER_SCOPED) else arg
                self.sizes[new] = self.sizes.get(slot, 0)


def formula_steps(run: cg.GenerateRun) -> tuple[list[int], list[int]]:
    """The formula's replay of every decode step (no stride, no steady-state shortcut): the reserved
    peak up to each forward's end, and where each forward's log starts."""
    r = LoggedReplay()
    ends, starts = [], [0]
    cg._forward(r, run, run.prompt, run.prompt, prefill=True)
    ends.append(r.peak)
    for cached in range(run.prompt + 1, run.context):
        starts.append(len(r.log))
        cg._forward(r, run, 1, cached, prefill=False)
        ends.append(r.peak)
    formula_steps.last = r  # type: ignore[attr-defined]
    return ends, starts


def layer_of(module: str) -> int | None:
    parts = module.split(".")
    return int(parts[2]) if len(parts) > 2 and parts[1] == "layers" else None


def dump_trace(t: Trace, step: int, layer: int) -> None:
    events = t.ledger._events
    lo = t.starts[step]
    hi = t.starts[step + 1] if step + 1 < len(t.starts) else len(events)
    print(f"trace, forward {step} (events {lo}..{hi}): layer {layer}, then outside the layers")
    for want_layer in (layer, None):
        for i in range(lo, hi):
            sid, delta = events[i]
            rec = t.ledger.records[sid]
            if not is_large(rec) or layer_of(rec.module) != want_layer:
                continue
            sign = "+" if delta > 0 else "-"
            born = f" (from forward {rec.step})" if delta < 0 else ""
            what = f"{rec.op:16s} {rec.dtype:9s} {rec.shape!s:22s} {rec.module or '-'}{born}"
            print(f"  {i:7d} {sign} {rec.nbytes / MiB:8.2f} MiB {what}")


def dump_formula(run: cg.GenerateRun, step: int, layer: int) -> None:
    r = LoggedReplay()
    cg._forward(r, run, run.prompt, run.prompt, prefill=True)
    start = 0
    for cached in range(run.prompt + 1, run.prompt + step + 1):
        start = len(r.log)
        cg._forward(r, run, 1, cached, prefill=False)
    print(f"formula, forward {step} (cache {run.prompt + step} tokens): layer {layer}, then outside")
    for want in (layer, None):
        for op, lay, name, nbytes, reserved in r.log[start:]:
            if lay == want:
                print(f"  {op} {nbytes / MiB:8.2f} MiB {name:18s} reserved {reserved / MiB:9.1f} MiB")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--case", choices=[c.name for c in CASES], action="append")
    p.add_argument("--dump", type=int, action="append", help="a forward to list (0: the prefill), repeatable")
    p.add_argument("--layer", type=int, default=1)
    p.add_argument("--curve", action="store_true", help="the reserved peak after each forward, both")
    a = p.parse_args()
    version, legacy = transformers_release()
    print(f"transformers {version} ({'legacy tuple cache, eager' if legacy else 'DynamicCache, SDPA'})")
    head = ("case", "traced MiB", "formula MiB", "formula/trace", "every step MiB")
    print("{:24s} {:>11s} {:>12s} {:>14s} {:>15s}".format(*head))
    for c in CASES if a.case else CASES[:DEFAULT]:
        if a.case and c.name not in a.case:
            continue
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp)
            (folder / "config.json").write_text(json.dumps(config_dict(c)))
            t = trace(c, folder)
            run = growth(c, folder, legacy)
        traced, trace_ends = replay_trace(t)
        formula = cg.replayed_reserved(run)
        ends, _ = formula_steps(run)  # no stride
        print(f"{c.name:24s} {traced / MiB:11.1f} {formula / MiB:12.1f} {formula / traced:14.4f} "
              f"{max(ends) / MiB:15.1f}", flush=True)  # fmt: skip
        if a.curve:
            print("  forward  traced-peak  formula-peak (MiB, printed where either changes)")
            prev = None
            for i, (x, y) in enumerate(zip(trace_ends, ends, strict=False)):
                if (x, y) != prev:
                    print(f"  {i:7d} {x / MiB:11.1f} {y / MiB:13.1f}")
                    prev = (x, y)
        for step in a.dump or ():
            dump_trace(t, step, a.layer)
            dump_formula(run, step, a.layer)


if __name__ == "__main__":
    main()
