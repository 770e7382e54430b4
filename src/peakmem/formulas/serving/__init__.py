"""Inference memory: weights + KV cache + runtime memory, per engine, and what fits on a GPU.

Engines, as people run them: ``hf`` (transformers ``generate``: :mod:`.generate`), ``vllm`` and
``sglang`` (a preallocated paged KV pool: :mod:`.paged`), ``llamacpp`` (:mod:`.llamacpp`). What they
share (the resolved request, weights per tensor-parallel rank, KV cache, recurrent state) is in
:mod:`.context`; the forward's layer temporaries in :mod:`.forward`.

What a request needs does not depend on the GPU, except where the engine itself sizes by it (SGLang's
cuda_graph_max_bs and chunked_prefill_size: peakmem.sglang_defaults, from ``setup.gpu_bytes`` when a GPU is
named): :func:`estimate_inference` reports it (:mod:`.estimate`). Whether it fits one GPU is
:func:`serving_fit`'s answer (:mod:`.fit`): for vLLM/SGLang, whether the pool the engine carves out of that
GPU holds the request.
"""

from peakmem.formulas.serving.estimate import estimate_inference
from peakmem.formulas.serving.fit import ServingFit, ServingVerdict, max_concurrent, max_context, serving_fit

__all__ = [
    "ServingFit",
    "ServingVerdict",
    "estimate_inference",
    "max_concurrent",
    "max_context",
    "serving_fit",
]
