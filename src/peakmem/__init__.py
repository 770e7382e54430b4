"""peakmem: how much GPU memory an LLM job takes, where every byte goes, and what makes it fit.

``import peakmem`` stays light: it imports only the standard library (no torch, no rich).

The Python API answers what the command line answers; options are the CLI's flags with underscores,
and ``result.to_dict()`` equals ``peakmem COMMAND ... --json``::

    import peakmem
    r = peakmem.train("gpt2-xl", precision="mixed-fp16", seq=1024, gpu="rtx-4090")
    r.fits, r["device_total_bytes"], r.to_dict()["bytes_per_param"]
    peakmem.infer("llama-3.1-8b", engine="vllm", context=8192, batch=16, gpu="rtx-4090")
    peakmem.fit("llama-3.1-8b", gpu="rtx-4090", method="lora", seq=4096, batch=4)
    peakmem.plan("llama-3.1-70b", gpu="h100-80gb", max_gpus=64)

Bad values raise ``ValueError`` subclasses (:class:`peakmem.errors.InputError`) naming the field;
unknown models and GPUs raise :class:`peakmem.errors.UnknownNameError` with close names.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from peakmem.api import Result

__version__ = "0.1.0"
__all__ = ["fit", "infer", "info", "plan", "train"]


def train(model: str | None = None, **options: Any) -> Result:
    """Training memory of ``model`` (``peakmem train``): method, precision, optimizer, batch, seq, ..."""
    from peakmem.api import run

    return run("train", model, options)


def infer(model: str, **options: Any) -> Result:
    """Serving memory of ``model`` (``peakmem infer``): weights, kv_cache, batch, context, engine, ..."""
    from peakmem.api import run

    return run("infer", model, options)


def fit(model: str | None = None, **options: Any) -> Result:
    """Verdicts on ``gpu`` and the ranked changes that make it fit (``peakmem fit``)."""
    from peakmem.api import run

    return run("fit", model, options)


def plan(model: str, **options: Any) -> Result:
    """The fastest parallel layout on up to ``max_gpus`` of ``gpu`` (``peakmem plan``)."""
    from peakmem.api import run

    return run("plan", model, options)


def info(model: str, *, cross_check: bool = False) -> dict[str, Any]:
    """Architecture, exact parameter breakdown and which path answered (``peakmem info --json``);
    ``cross_check``: also derive the spec from transformers' modules (torch) and compare."""
    from peakmem.api import info_json

    return info_json(model, cross_check=cross_check)
