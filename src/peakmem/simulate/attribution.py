# mypy: disable-error-code="no-untyped-call,no-any-return,unused-ignore"
"""Which module made a tensor, in backward too.

The tracker knows the module of a forward allocation from module hooks (its module stack); in
backward no module runs, so a gradient temporary would only be known as "backward". Here:

* :class:`ForwardNodeTagger` (a ``TorchFunctionMode``) writes the innermost running module's name
  into ``grad_fn.metadata`` of every tensor a torch function returns in forward;
* :class:`BackwardModuleMode` (a ``TorchDispatchMode`` above the tracker's) reads the autograd node
  being executed (``torch._C._current_autograd_node()``) and, for the duration of each backward op,
  puts ``"<module> (backward)"`` on the tracker's module stack, so the tracker records it.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from peakmem.measure.tracker import LiveStorageTracker
from peakmem.simulate.kernels import DEVICE_QUERY

KEY = "peakmem_module"
MAX_WALK = 16  # nodes tagged per call: a composite makes a few; a first call may reach older ones


class ForwardNodeTagger(TorchFunctionMode):
    def __init__(self, tracker: LiveStorageTracker) -> None:
        super().__init__()
        self.stack: list[str] = tracker._module_stack  # the tracker's own list, shared

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if self.stack:
            if isinstance(out, torch.Tensor):
                _tag(out, self.stack[-1])
            elif isinstance(out, (tuple, list)):
                for t in out:
                    if isinstance(t, torch.Tensor):
                        _tag(t, self.stack[-1])
        return out


def _tag(t: torch.Tensor, module: str) -> None:
    """Tag the output's node and, through ``next_functions``, the untagged nodes a composite op
    (e.g. ``cross_entropy`` -> ``log_softmax`` + ``nll_loss``) created inside the same call."""
    todo = [t.grad_fn]
    seen = 0
    while todo and seen < MAX_WALK:
        fn = todo.pop()
        if fn is None:
            continue
        meta: dict[str, Any] = fn.metadata  # type: ignore[assignment]  # a property, typed as a method
        if KEY in meta or type(fn).__name__ == "AccumulateGrad":
            continue
        meta[KEY] = module
        seen += 1
        todo.extend(nxt for nxt, _ in fn.next_functions)


class BackwardModuleMode(TorchDispatchMode):
    def __init__(self, tracker: LiveStorageTracker) -> None:
        super().__init__()
        self.tracker = tracker
        self.stack: list[str] = tracker._module_stack

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        # checkpointing's recomputed forward: module hooks name it
        if func is DEVICE_QUERY or self.tracker.recomputing:
            return func(*args, **(kwargs or {}))
        node = torch._C._current_autograd_node()
        module = node.metadata.get(KEY) if node is not None else None  # type: ignore[attr-defined]
        if module is None:
            return func(*args, **(kwargs or {}))
        self.stack.append(f"{module} (backward)")
        try:
            return func(*args, **(kwargs or {}))
        finally:
            self.stack.pop()
