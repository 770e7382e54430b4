"""The mechanism of peakmem.formulas.fsdp1_frozen_inputs on the real FSDP1 (torch's fake process group, rank 0
of 2, CPU): 4 blocks, each an FSDP unit with a frozen Linear and a trainable adapter Linear wrapped apart,
each under reentrant ``torch.utils.checkpoint``. When the last recomputation (the first block's) starts, the
inputs of the 3 blocks above are still alive with their gradients (``.grad`` of the detached leaves) when the
block's Linear is frozen, and none are when it trains (FSDP1's ordinary post-backward hook). One subprocess
(the fake process group is process-wide), about 6 s."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")
pytest.importorskip("torch.testing._internal.distributed.fake_pg")

pytestmark = pytest.mark.torch

SCRIPT = r"""
import functools, weakref
import torch, torch.nn as nn, torch.distributed as dist
import torch.utils.checkpoint as ckm
from torch.testing._internal.distributed.fake_pg import FakeStore
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp.wrap import lambda_auto_wrap_policy

dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
H, L, T = 32, 4, 16

class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.base = nn.Linear(H, H)
        self.adapter = nn.Linear(H, H, bias=False)

    def forward(self, x):
        return x + self.base(x) + self.adapter(x)

class Stack(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([Block() for _ in range(L)])

    def forward(self, h):
        for blk in self.layers:
            h = ckm.checkpoint(blk, h, use_reentrant=True)
        return h

def unit(m):  # the blocks, and the adapters apart (peft's fsdp_auto_wrap_policy)
    return isinstance(m, Block) or (type(m) is nn.Linear and m.bias is None)

refs, alive = [], []
detach = ckm.detach_variable
def recording(inputs):
    out = detach(inputs)
    alive[:] = [r() for r in refs if r() is not None]
    refs.extend(weakref.ref(t) for t in out if isinstance(t, torch.Tensor))
    return out
ckm.detach_variable = recording

for frozen in (True, False):
    torch.manual_seed(0)
    model = Stack()
    for b in model.layers:
        b.base.requires_grad_(not frozen)
    model = FSDP(model, auto_wrap_policy=functools.partial(lambda_auto_wrap_policy, lambda_fn=unit),
                 device_id=torch.device("cpu"), use_orig_params=True)
    refs.clear()
    model(torch.randn(T, H, requires_grad=True)).sum().backward()
    kept = [t for t in alive if t.grad is not None and t.grad.shape == t.shape]
    print("frozen" if frozen else "trainable", len(alive), len(kept))
    del alive[:], kept
"""


def test_frozen_units_keep_the_detached_inputs_and_their_gradients() -> None:
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = [line.split() for line in out.stdout.splitlines() if line.startswith(("frozen", "trainable"))]
    assert lines == [["frozen", "3", "3"], ["trainable", "0", "0"]], out.stdout
