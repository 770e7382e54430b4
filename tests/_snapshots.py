"""Synthetic CUDA memory snapshots built to PyTorch's documented structure (torch/cuda/memory.py
``_snapshot`` docstring: segments with blocks, device_traces with alloc / free_requested /
free_completed / segment_alloc / oom events, frames of {filename, line, name}).

One training step on device 0, sizes in MiB so the peak is hand-derived:

  parameters 40 (Module._apply) + optimizer states 80 (adamw _init_group)
  + activations 30 (a transformers forward) + gradients 40 (backward, Python-only stack)
  + a backward temporary 5 (backward with a C++ autograd frame)           = 195 MiB peak
  a forward temporary of 10 comes and goes before it; the optimizer step's 20 MiB temporary comes
  after the activations and the backward temporary are freed (40 + 80 + 40 + 20 = 180 < 195).
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

MiB = 2**20
BASE = 0x7F0000000000  # the segment's address
SEGMENT = 256 * MiB  # one large segment holds every block

PEAK = 195 * MiB
BY_CATEGORY = {"parameters": 40 * MiB, "gradients": 40 * MiB, "optimizer_states": 80 * MiB,
               "activations": 30 * MiB, "temporaries": 5 * MiB, "other": 0}  # fmt: skip
LIVE_AT_END = 40 * MiB + 80 * MiB + 40 * MiB  # parameters, optimizer states, gradients


def f(filename: str, name: str, line: int = 1) -> dict[str, Any]:
    return {"filename": filename, "line": line, "name": name}


SITE = "/usr/lib/python3.11/site-packages"
TRAIN = f("/home/me/train.py", "<module>", 42)
MODULE = f"{SITE}/torch/nn/modules/module.py"
PARAM = [f(MODULE, "_apply", 900), f(MODULE, "to"), TRAIN]
STATE = [f(f"{SITE}/torch/optim/adamw.py", "_init_group", 110), f(f"{SITE}/torch/optim/optimizer.py",
         "wrapper"), f("/home/me/train.py", "step", 50)]  # fmt: skip
FORWARD = [f(f"{SITE}/transformers/models/gpt2/modeling_gpt2.py", "forward", 300),
           f(f"{SITE}/torch/nn/modules/module.py", "_call_impl"), TRAIN]  # fmt: skip
GRAD = [f(f"{SITE}/torch/autograd/graph.py", "_engine_run_backward", 825),
        f(f"{SITE}/torch/_tensor.py", "backward"), TRAIN]  # fmt: skip
BWD_TMP = [f("??", "torch::autograd::Engine::evaluate_function(...)", 0), *GRAD]
OPT_TMP = [f(f"{SITE}/torch/optim/adamw.py", "_multi_tensor_adamw", 500), *STATE[1:]]

# (name, offset in MiB, size in MiB, frames)
BLOCKS = {
    "param": (0, 40, PARAM), "state": (40, 80, STATE), "act": (120, 30, FORWARD),
    "fwd_tmp": (150, 10, FORWARD), "grad": (160, 40, GRAD), "bwd_tmp": (200, 5, BWD_TMP),
    "opt_tmp": (120, 20, OPT_TMP),
}  # fmt: skip


def _addr(name: str) -> int:
    return BASE + BLOCKS[name][0] * MiB


def _alloc(name: str) -> dict[str, Any]:
    _, size, frames = BLOCKS[name]
    return {"action": "alloc", "addr": _addr(name), "size": size * MiB, "stream": 0, "frames": frames}


def _free(name: str) -> list[dict[str, Any]]:
    _, size, frames = BLOCKS[name]
    return [{"action": a, "addr": _addr(name), "size": size * MiB, "stream": 0, "frames": frames}
            for a in ("free_requested", "free_completed")]  # fmt: skip


def trace() -> list[dict[str, Any]]:
    return [
        {"action": "segment_alloc", "addr": BASE, "size": SEGMENT, "stream": 0, "frames": PARAM},
        _alloc("param"), _alloc("state"), _alloc("act"), _alloc("fwd_tmp"), *_free("fwd_tmp"),
        _alloc("grad"), _alloc("bwd_tmp"), *_free("act"), *_free("bwd_tmp"),
        _alloc("opt_tmp"), *_free("opt_tmp"),
        {"action": "snapshot", "addr": 0, "size": 0, "stream": 0, "frames": []},
    ]  # fmt: skip


def segments() -> list[dict[str, Any]]:
    """The segment at snapshot time: parameters, states and gradients live; the rest inactive."""
    live = ("param", "state", "grad")
    blocks = []
    offset = 0
    for name in ("param", "state", "opt_tmp", "fwd_tmp", "grad"):  # address order, gaps inactive
        start, size, frames = BLOCKS[name]
        if start > offset:
            gap = (start - offset) * MiB
            blocks.append({"address": BASE + offset * MiB, "size": gap, "requested_size": 0,
                           "state": "inactive", "frames": []})  # fmt: skip
        state = "active_allocated" if name in live else "inactive"
        blocks.append({"address": BASE + start * MiB, "size": size * MiB, "requested_size": size * MiB,
                       "state": state, "frames": frames if name in live else []})  # fmt: skip
        offset = start + size
    blocks.append({"address": BASE + offset * MiB, "size": SEGMENT - offset * MiB, "requested_size": 0,
                   "state": "inactive", "frames": []})  # fmt: skip
    return [{
        "device": 0, "address": BASE, "total_size": SEGMENT, "allocated_size": LIVE_AT_END,
        "active_size": LIVE_AT_END, "requested_size": LIVE_AT_END, "stream": 0, "segment_type": "large",
        "segment_pool_id": (0, 0), "is_expandable": False, "blocks": blocks,
    }]  # fmt: skip


def snapshot(events: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"segments": segments(), "device_traces": [trace() if events is None else events]}


def oom_snapshot(request: int, device_free: int) -> dict[str, Any]:
    """The step above, then a forward allocation of ``request`` bytes that fails."""
    events = trace()
    events.append({"action": "oom", "size": request, "stream": 0, "device_free": device_free,
                   "frames": FORWARD})  # fmt: skip
    return {"segments": segments(), "device_traces": [events]}


def write(path: Path, snap: dict[str, Any]) -> Path:
    path.write_bytes(pickle.dumps(snap))
    return path
