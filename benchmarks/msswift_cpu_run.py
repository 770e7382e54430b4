"""Run ms-swift's ``swift sft`` for real on the CPU, and the same job as a plain HF Trainer script,
each under a live-storage tracker, to find what ms-swift holds that a plain HF job does not.

Why: the 16 ms-swift points in benchmarks/published_scale.json (examples at ms-swift@b40f31df7c,
3.0.0.dev0) read ~2 GiB above peakmem on one GPU whatever the length (brief h-msrun). This script
builds a tiny Qwen2 (2 layers, hidden 64, but Qwen2-7B's vocab 152064, so anything vocab x hidden
sized stands out: 152064 x 64 x 2 B = 19.5 MB in bf16), a BPE tokenizer with Qwen's special tokens
and a 32-row messages-format jsonl in a temp dir, then runs, each in a fresh child process:

* ``swift``: ``swift.llm.sft_main`` with the flags of examples/train/lazy_tokenize/train.sh
  (``--train_type lora``) or examples/train/full/train.sh (``--train_type full``) at b40f31df7c,
  plus ``--torch_dtype bfloat16`` (on a CPU ms-swift 3.0.0 picks float32 when none is given:
  swift/llm/model/register.py get_default_torch_dtype) and a few steps;
* ``plain``: transformers' AutoModelForCausalLM + peft's get_peft_model + the HF Trainer with the
  same model dir, rows (rendered in the same chatml), LoRA config, gradient checkpointing,
  ``enable_input_require_grads``, bf16 and adamw_torch.

The tracker is a TorchDispatchMode entered at the child's start (so the model load counts) that
keys every op output by its storage and watches its free with ``weakref.finalize`` (as
src/peakmem/measure/tracker.py LiveStorageTracker does); storages that never pass through the
dispatcher (safetensors' memory-mapped tensors become parameters without an op on a CPU) are
registered by a sweep of the live tensors (``gc``) at each phase change. It prints the process's
peak, the phase of the peak and the largest live storages there (shape, dtype, op, module, the
creating Python line), and per phase the peak.

Needs its own venv (NOT the project's): torch 2.13 CPU, ms-swift==3.0.0, transformers==4.46.3,
peft==0.13.2, trl==0.11.4 (brief h-msrun), e.g. ``/tmp/h-msrun-venv/bin/python
benchmarks/msswift_cpu_run.py --train-type lora``. Not a test; nothing imports it (the torch /
ms-swift imports are inside the functions main() calls).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from typing import Any

VOCAB = 152064  # Qwen2-7B-Instruct config.json vocab_size (kept, see the docstring)
TINY = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
}
QWEN_SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
ROWS = 32
# every row the same length (each word is one token of the BPE below), so both jobs' peaks come from
# equally long samples whatever ms-swift's shuffle and validation split pick
Q_WORDS, A_WORDS = 28, 80
BIG = 1 << 20  # storages of at least 1 MiB get their creating Python stack recorded
WORDS = (
    "memory",
    "tensor",
    "model",
    "layer",
    "token",
    "weight",
    "batch",
    "rank",
    "head",
    "loss",
    "step",
    "cache",
)


# ------------------------------------------------------------------------------------------------
# assets
def build_assets(root: str) -> dict[str, str]:
    import random

    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from tokenizers import decoders as tk_decoders
    from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen2TokenizerFast

    rng = random.Random(0)
    rows = []
    for _ in range(ROWS):
        q = " ".join(rng.choice(WORDS) for _ in range(Q_WORDS))
        a = " ".join(rng.choice(WORDS) for _ in range(A_WORDS))
        rows.append({"messages": [{"role": "user", "content": f"{q}?"}, {"role": "assistant", "content": a}]})
    data = os.path.join(root, "data.jsonl")
    with open(data, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tk_decoders.ByteLevel()
    texts = [m["content"] for r in rows for m in r["messages"]] + [
        "You are a helpful assistant.",
        "user assistant system",
    ]
    tok.train_from_iterator(
        texts,
        trainers.BpeTrainer(
            vocab_size=600, special_tokens=QWEN_SPECIAL, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
        ),
    )
    model_dir = os.path.join(root, "tiny-qwen2")
    os.makedirs(model_dir, exist_ok=True)
    chat = (
        "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
        "'<|im_end|>' + '\n'}}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
    )
    hf_tok = Qwen2TokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        bos_token=None,
        chat_template=chat,
    )
    hf_tok.save_pretrained(model_dir)

    cfg = Qwen2Config(
        vocab_size=VOCAB,
        max_position_embeddings=32768,
        rope_theta=1000000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        torch_dtype="bfloat16",
        bos_token_id=151643,
        eos_token_id=151645,
        sliding_window=131072,
        max_window_layers=28,
        use_sliding_window=False,
        **TINY,
    )
    cfg.architectures = ["Qwen2ForCausalLM"]
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(model_dir, safe_serialization=True)
    return {"model": model_dir, "data": data}


# ------------------------------------------------------------------------------------------------
# tracker
class _Tracker:
    """Live storage bytes of a whole process: dispatch-mode outputs + gc sweeps, with phases."""

    def __init__(self) -> None:
        import torch
        from torch.utils._python_dispatch import TorchDispatchMode

        self.torch = torch
        self.live: dict[int, int] = {}  # id(storage) -> sid
        self.info: dict[int, dict[str, Any]] = {}  # sid -> record
        self.events: list[tuple[int, int]] = []  # (sid, +-bytes)
        self.phase_marks: list[tuple[int, str]] = []  # (event index, phase)
        self.phase = "load"
        self.module_stack: list[str] = []
        self.names: dict[int, str] = {}
        self.next_sid = 0
        tracker = self

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
                out = func(*args, **(kwargs or {}))
                for t in torch.utils._pytree.tree_leaves(out):
                    if isinstance(t, torch.Tensor):
                        tracker.see(t, str(func.overloadpacket.__name__))
                return out

        self.mode = Mode()
        self.set_phase("load")

    def see(self, t: Any, op: str) -> None:
        import traceback
        import weakref

        if t.device.type == "meta" or t.is_sparse:
            return
        try:
            st = t.untyped_storage()
        except (RuntimeError, NotImplementedError):
            return
        key = id(st)
        if key in self.live:
            return
        nbytes = int(st.nbytes())
        sid = self.next_sid
        self.next_sid += 1
        rec: dict[str, Any] = {
            "bytes": nbytes,
            "shape": list(t.shape),
            "dtype": str(t.dtype).removeprefix("torch."),
            "op": op,
            "phase": self.phase,
            "module": self.module_stack[-1] if self.module_stack else "",
        }
        if nbytes >= BIG:
            frames = [f for f in traceback.extract_stack()[:-3] if "msswift_cpu_run" not in f.filename]
            rec["stack"] = [f"{_short(f.filename)}:{f.lineno} {f.name}" for f in frames[-6:]]
        self.info[sid] = rec
        self.live[key] = sid
        self.events.append((sid, nbytes))
        weakref.finalize(st, self._free, key, sid).atexit = False

    def _free(self, key: int, sid: int) -> None:
        if self.live.get(key) == sid:
            del self.live[key]
        self.events.append((sid, -self.info[sid]["bytes"]))

    def sweep(self, why: str) -> None:
        """Register live tensors the dispatcher never returned (memory-mapped loads, leaf copies)."""
        import gc

        for o in gc.get_objects():
            try:
                if isinstance(o, self.torch.Tensor):
                    self.see(o, f"sweep:{why}")
            except Exception:
                continue

    def set_phase(self, phase: str) -> None:
        self.phase = phase
        self.phase_marks.append((len(self.events), phase))

    def name_modules(self, model: Any) -> None:
        for n, m in model.named_modules():
            self.names[id(m)] = n or type(m).__name__

    def install_hooks(self) -> None:
        from torch.nn.modules import module as nn_module

        def pre(m: Any, _a: Any) -> None:
            self.module_stack.append(self.names.get(id(m), type(m).__name__))

        def post(m: Any, _a: Any, _o: Any) -> None:
            if self.module_stack:
                self.module_stack.pop()

        nn_module.register_module_forward_pre_hook(pre)
        nn_module.register_module_forward_hook(post)

    def report(self, top: int = 14) -> dict[str, Any]:
        cur = peak = 0
        peak_at = 0
        phase_peaks: dict[str, int] = {}
        marks = iter([*self.phase_marks, (len(self.events) + 1, "")])
        nxt = next(marks)
        phase = ""
        for i, (_sid, d) in enumerate(self.events):
            while nxt[0] <= i:
                phase, nxt = nxt[1], next(marks)
            cur += d
            phase_peaks[phase] = max(phase_peaks.get(phase, 0), cur)
            if cur > peak:
                peak, peak_at = cur, i + 1
        alive: dict[int, int] = {}
        for sid, d in self.events[:peak_at]:
            alive[sid] = alive.get(sid, 0) + d
        live = sorted((s for s, b in alive.items() if b > 0), key=lambda s: -self.info[s]["bytes"])
        peak_phase = ""
        for idx, ph in self.phase_marks:
            if idx < peak_at:
                peak_phase = ph
        return {
            "peak_bytes": peak,
            "peak_phase": peak_phase,
            "phase_peaks": phase_peaks,
            "largest_at_peak": [self.info[s] for s in live[:top]],
            "live_at_peak_by_op": _by(self.info, live, "op"),
            "live_at_peak_by_dtype": _by(self.info, live, "dtype"),
        }


def _by(info: dict[int, dict[str, Any]], live: list[int], key: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for s in live:
        out[str(info[s][key])] = out.get(str(info[s][key]), 0) + info[s]["bytes"]
    return dict(sorted(out.items(), key=lambda kv: -kv[1])[:12])


def _short(path: str) -> str:
    for mark in ("site-packages/", "benchmarks/"):
        if mark in path:
            return path.split(mark, 1)[1]
    return path


def _patch_phases(tr: _Tracker) -> None:
    """Phase markers on the HF Trainer / accelerate / torch.optim entry points both jobs go through."""
    import accelerate
    import torch.optim.optimizer as optimizer_mod
    import transformers

    T = transformers.Trainer
    step_no = [0]

    def wrap(owner: Any, name: str, phase: Any, after: str | None = None) -> None:
        orig = getattr(owner, name)

        def inner(*a: Any, **k: Any) -> Any:
            tr.sweep(name)
            tr.set_phase(phase() if callable(phase) else phase)
            try:
                return orig(*a, **k)
            finally:
                if after:
                    tr.set_phase(after)

        setattr(owner, name, inner)

    def on_train(*a: Any, **k: Any) -> Any:
        tr.name_modules(a[0].model)
        return orig_train(*a, **k)

    orig_train = T.train
    T.train = on_train
    wrap(T, "train", "train:prepare")

    def fwd() -> str:
        step_no[0] += 1
        return f"forward:{min(step_no[0], 3)}"

    wrap(T, "training_step", fwd, after="between steps")
    wrap(accelerate.Accelerator, "backward", lambda: f"backward:{min(step_no[0], 3)}")
    wrap(T, "evaluate", "eval", after="after eval")
    wrap(T, "_save_checkpoint", "save", after="after save")
    optimizer_mod.register_optimizer_step_pre_hook(lambda *a: tr.set_phase("optimizer.step"))
    optimizer_mod.register_optimizer_step_post_hook(lambda *a: tr.set_phase("after optimizer.step"))


# ------------------------------------------------------------------------------------------------
# the two jobs (each in its own child process)
def swift_argv(assets: dict[str, str], train_type: str, out: str, steps: int) -> list[str]:
    """examples/train/lazy_tokenize/train.sh (lora) or examples/train/full/train.sh at b40f31df7c."""
    argv = [
        "--model",
        assets["model"],
        "--model_type",
        "qwen2",
        "--train_type",
        train_type,
        "--dataset",
        assets["data"],
        "--torch_dtype",
        "bfloat16",
        "--num_train_epochs",
        "1",
        "--per_device_train_batch_size",
        "1",
        "--gradient_accumulation_steps",
        "16",
        "--eval_steps",
        str(steps),
        "--save_steps",
        str(steps),
        "--save_total_limit",
        "2",
        "--logging_steps",
        "1",
        "--max_steps",
        str(steps),
        "--model_author",
        "swift",
        "--model_name",
        "swift-robot",
        "--output_dir",
        out,
        "--dataloader_num_workers",
        "0",
        "--report_to",
        "none",
    ]
    if train_type == "lora":
        argv += [
            "--learning_rate",
            "1e-4",
            "--lora_rank",
            "8",
            "--lora_alpha",
            "32",
            "--lazy_tokenize",
            "true",
        ]
    else:
        argv += ["--learning_rate", "1e-5"]
    return argv


def run_swift(assets: dict[str, str], train_type: str, out: str, steps: int) -> None:
    from swift.llm import sft_main

    sft_main(swift_argv(assets, train_type, out, steps))


def run_plain(assets: dict[str, str], train_type: str, out: str, steps: int) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, Trainer, TrainingArguments

    tok = AutoTokenizer.from_pretrained(assets["model"])
    model = AutoModelForCausalLM.from_pretrained(assets["model"], torch_dtype=torch.bfloat16)
    with open(assets["data"]) as f:
        rows = [json.loads(line) for line in f]
    system = [{"role": "system", "content": "You are a helpful assistant."}]

    def encode(r: dict[str, Any]) -> dict[str, Any]:
        prompt = tok.apply_chat_template(
            system + r["messages"][:1], tokenize=False, add_generation_prompt=True
        )
        full = prompt + r["messages"][1]["content"] + "<|im_end|>"  # ms-swift's qwen template ends so
        ids = tok(full)["input_ids"]
        n = len(tok(prompt)["input_ids"])
        return {"input_ids": ids, "labels": [-100] * n + ids[n:]}

    data = [encode(r) for r in rows]

    def collate(batch: list[dict[str, Any]]) -> dict[str, Any]:
        return {k: torch.tensor([b[k] for b in batch]) for k in ("input_ids", "labels")}

    model.config.use_cache = False
    if train_type == "lora":
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(
            model,
            LoraConfig(
                r=8,
                lora_alpha=32,
                lora_dropout=0.05,
                task_type="CAUSAL_LM",
                target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
            ),
        )
    model.enable_input_require_grads()
    args = TrainingArguments(
        output_dir=out,
        per_device_train_batch_size=1,
        per_device_eval_batch_size=1,
        gradient_accumulation_steps=16,
        max_steps=steps,
        bf16=True,
        optim="adamw_torch",
        gradient_checkpointing=True,
        learning_rate=1e-4,
        logging_steps=1,
        eval_strategy="steps",
        eval_steps=steps,
        save_steps=steps,
        report_to="none",
        dataloader_num_workers=0,
        remove_unused_columns=False,
        use_cpu=True,
    )
    Trainer(
        model=model, args=args, train_dataset=data[1:], eval_dataset=data[:1], data_collator=collate
    ).train()


def child(job: str, assets: dict[str, str], train_type: str, out: str, steps: int, result: str) -> None:
    tr = _Tracker()
    tr.install_hooks()
    with tr.mode:
        _patch_phases(tr)
        (run_plain if job == "plain" else run_swift)(assets, train_type, out, steps)
        tr.sweep("end")
        tr.set_phase("end")
    rep = tr.report()
    import swift

    rep["job"] = (
        job if job == "plain" else f"{job} (ms-swift {swift.__version__}, {os.path.dirname(swift.__file__)})"
    )
    with open(result, "w") as f:
        json.dump(rep, f, indent=1)


# ------------------------------------------------------------------------------------------------
def _mib(b: int) -> str:
    return f"{b / 2**20:9.2f}"


def print_table(reps: list[dict[str, Any]]) -> None:
    for rep in reps:
        print(f"\n== {rep['job']}: peak {_mib(rep['peak_bytes'])} MiB in phase {rep['peak_phase']!r}")
        print(
            "phase peaks (MiB): " + ", ".join(f"{k} {v / 2**20:.2f}" for k, v in rep["phase_peaks"].items())
        )
        print(
            "live at the peak by dtype (MiB): "
            + ", ".join(f"{k} {v / 2**20:.2f}" for k, v in rep["live_at_peak_by_dtype"].items())
        )
        print(
            "live at the peak by op (MiB): "
            + ", ".join(f"{k} {v / 2**20:.2f}" for k, v in rep["live_at_peak_by_op"].items())
        )
        print(f"{'MiB':>9}  {'shape':<16} {'dtype':<9} {'phase':<16} {'op':<24} module / stack")
        for r in rep["largest_at_peak"]:
            where = r["module"] or " <- ".join(reversed(r.get("stack", [])[-3:]))
            shape = str(r["shape"])
            print(f"{_mib(r['bytes'])}  {shape:<16} {r['dtype']:<9} {r['phase']:<16} {r['op']:<24} {where}")
    plain = [r for r in reps if r["job"] == "plain"]
    for rep in reps:
        if plain and rep is not plain[0]:
            diff = (rep["peak_bytes"] - plain[0]["peak_bytes"]) / 2**20
            print(f"\npeak of {rep['job']} - plain: {diff:.2f} MiB")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--train-type", choices=("lora", "full"), default="lora")
    ap.add_argument("--jobs", default="swift,plain")
    ap.add_argument("--steps", type=int, default=2, help="optimizer steps (x16 accumulated micro-batches)")
    ap.add_argument("--workdir", default=None)
    ap.add_argument(
        "--swift-src",
        default=None,
        help="a folder holding an ms-swift source tree's swift/ (e.g. `git archive b40f31df7c swift` of the "
        "mirror): job 'swift-src' runs it instead of the installed release",
    )
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--assets", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--result", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        child(a.child, json.loads(a.assets), a.train_type, a.workdir, a.steps, a.result)
        return 0
    root = a.workdir or tempfile.mkdtemp(prefix="msswift-cpu-")
    assets = build_assets(root)
    reps = []
    for job in a.jobs.split(","):
        result = os.path.join(root, f"{job}-{a.train_type}.json")
        cmd = [
            sys.executable,
            os.path.abspath(__file__),
            "--child",
            job,
            "--assets",
            json.dumps(assets),
            "--train-type",
            a.train_type,
            "--workdir",
            os.path.join(root, f"out-{job}"),
            "--steps",
            str(a.steps),
            "--result",
            result,
        ]
        env = dict(os.environ)
        if job == "swift-src":
            if not a.swift_src:
                print("job swift-src needs --swift-src", file=sys.stderr)
                return 2
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [a.swift_src, env.get("PYTHONPATH")]))
        with open(os.path.join(root, f"{job}-{a.train_type}.log"), "w") as log:
            rc = subprocess.call(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        if rc:
            print(f"{job}: child exited {rc}; see {log.name}", file=sys.stderr)
            return rc
        with open(result) as f:
            reps.append(json.load(f))
    print_table(reps)
    print(f"\n(work dir {root})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
