"""vLLM's own batch defaults: the ``max_num_seqs`` and ``max_num_batched_tokens`` the V1 engine (0.8 on)
picks when they are not given, by GPU and by entry point, as each release's ``vllm/engine/arg_utils.py``
computes them (read in the releases' source distributions).

* **The entry point** (``UsageContext``): ``vllm serve`` / the OpenAI server is ``OPENAI_API_SERVER``,
  the offline ``LLM(...)`` class ``LLM_CLASS``; each has its own ``max_num_batched_tokens``.
* **The GPU**: ``current_platform.get_device_total_memory()`` (torch's ``total_memory``: peakmem's
  ``Gpu.usable_bytes``) and ``get_device_name().lower()`` (``torch.cuda.get_device_name``: the catalog's
  ``display_name``). When vLLM cannot read them (no GPU named here) it takes the small tier.
* **By release** (peakmem's versions are (major, minor); the 0.8 line is taken as 0.8.5, its last):

  - 0.8.0-0.8.3 (``_set_default_args_v1``): 16384 (LLM) / 8192 (serve) tokens when the name holds "h100"
    or "h200", else 8192 / 2048; max_num_seqs 1024 on every GPU. 0.8.4: 1024 sequences only on those,
    else 256.
  - 0.8.5: by memory, ``device_memory >= 70 * GiB_bytes``: 16384 / 8192 tokens and 1024 sequences; else
    8192 / 2048 and 256.
  - 0.9.0 on (PR #17885): the same, but a GPU whose name holds "a100" takes the small tier (0.9.2 to 0.27
    as ``get_batch_defaults``, 0.12 on in a classmethod of that name).
  - 0.11.1 on (``_set_default_max_num_seqs_and_batched_tokens_args``): with the defaults,
    ``max_num_batched_tokens = min(max_num_seqs x max_model_len, it)`` and then ``max_num_seqs =
    min(max_num_seqs, max_num_batched_tokens)``; peakmem applies it to the 0.11 line.
  - 0.28 on: a GPU of at least 160 GiB (B200, B300, MI300X; an H200 has 141 GB) takes 16384 tokens for the
    server too. 0.33's exception for GB10 (compute capability 12.1; not in the catalog) is not modelled.

Not modelled: V0 (before 0.8: max_num_seqs 256, peakmem keeps its 8192-token profile chunk there), the TPU
and CPU tiers, 0.27's ``performance_mode="throughput"`` (doubles both), a model without chunked prefill
(``max(max_model_len, tokens)``), multimodal prefix-LM floors.
"""

from __future__ import annotations

from dataclasses import dataclass

from peakmem.errors import require
from peakmem.units import GiB

VLLM_ENTRYPOINTS = ("serve", "llm")  # UsageContext.OPENAI_API_SERVER, UsageContext.LLM_CLASS
V1_RELEASE = (0, 8)  # the V1 engine's defaults; before it V0's
MEMORY_TIER_RELEASE = (0, 9)  # by total memory, A100 excluded (0.8.5 included it: the 0.8 line is 0.8.5)
CAPPED_RELEASE = (0, 11)  # min(max_num_seqs x max_model_len, tokens), min(seqs, tokens): 0.11.1 on
LARGEST_TIER_RELEASE = (0, 28)  # >= 160 GiB: 16384 tokens for the server too
LARGE_GPU_BYTES = 70 * GiB  # "device_memory >= 70 * GiB_bytes"
LARGEST_GPU_BYTES = 160 * GiB  # "device_memory >= 160 * GiB_bytes" (0.28 on)
A100_NAME = "a100"  # '"a100" not in device_name' (0.9.0 on; PR #17885: larger batches cost A100 throughput)


@dataclass(frozen=True, kw_only=True)
class Tier:
    """One of get_batch_defaults' branches: max_num_batched_tokens for ``vllm serve`` and for the LLM
    class, max_num_seqs, and the GPUs it covers (said in the answer)."""

    name: str
    serve_tokens: int
    llm_tokens: int
    max_num_seqs: int
    where: str


LARGE_TIER = Tier(name="large", serve_tokens=8192, llm_tokens=16384, max_num_seqs=1024,
                  where="a GPU of 70 GiB or more (not an A100)")  # fmt: skip
SMALL_TIER = Tier(name="small", serve_tokens=2048, llm_tokens=8192, max_num_seqs=256,
                  where="a GPU under 70 GiB, an A100, or none named")  # fmt: skip
LARGEST_TIER = Tier(name="largest", serve_tokens=16384, llm_tokens=16384, max_num_seqs=1024,
                    where="a GPU of 160 GiB or more")  # fmt: skip
# V0: EngineArgs max_num_seqs 256; the profile's chunk peakmem takes there (V0's max(max_model_len, 2048)
# not modelled)
V0_MAX_NUM_SEQS = 256
V0_MAX_NUM_BATCHED_TOKENS = 8192


@dataclass(frozen=True, kw_only=True)
class VllmBatch:
    """What vLLM schedules per step: the values given, else its defaults for the GPU and entry point."""

    max_num_seqs: int
    max_num_batched_tokens: int
    defaulted: bool  # at least one of them is vLLM's choice (the answer says which tier)
    tier: Tier | None  # None: the V0 engine (before 0.8)


def check_entrypoint(entrypoint: object) -> None:
    """``vllm_entrypoint`` is one of :data:`VLLM_ENTRYPOINTS` (one line naming the field)."""
    choices = ", ".join(VLLM_ENTRYPOINTS)
    require(entrypoint in VLLM_ENTRYPOINTS, "vllm_entrypoint", entrypoint,
            f"choose one of {choices} (vllm serve, or the offline LLM class)")  # fmt: skip


def _tier(version: tuple[int, int], gpu_bytes: int | None, gpu_name: str) -> Tier:
    """The tier vLLM ``version`` puts a GPU of ``gpu_bytes`` named ``gpu_name`` in."""
    memory = gpu_bytes or 0  # vLLM's "device_memory = 0" when it cannot read the device
    a100 = version >= MEMORY_TIER_RELEASE and A100_NAME in gpu_name.lower()
    if version >= LARGEST_TIER_RELEASE and memory >= LARGEST_GPU_BYTES:
        return LARGEST_TIER
    if memory >= LARGE_GPU_BYTES and not a100:
        return LARGE_TIER
    return SMALL_TIER


def vllm_batch(
    version: tuple[int, int],
    *,
    gpu_bytes: int | None,
    gpu_name: str = "",
    entrypoint: str = "serve",
    max_model_len: int | None,
    max_num_seqs: int | None = None,
    max_num_batched_tokens: int | None = None,
) -> VllmBatch:
    """vLLM ``version``'s max_num_seqs and max_num_batched_tokens (the ones given kept) on a GPU of
    ``gpu_bytes`` (None: not known) named ``gpu_name`` for a model of ``max_model_len`` tokens (None: not
    known, no cap by it)."""
    check_entrypoint(entrypoint)
    defaulted = max_num_seqs is None or max_num_batched_tokens is None
    if version < V1_RELEASE:
        seqs = max_num_seqs if max_num_seqs is not None else V0_MAX_NUM_SEQS
        tokens = max_num_batched_tokens if max_num_batched_tokens is not None else V0_MAX_NUM_BATCHED_TOKENS
        return VllmBatch(max_num_seqs=seqs, max_num_batched_tokens=tokens, defaulted=defaulted, tier=None)
    tier = _tier(version, gpu_bytes, gpu_name)
    seqs = max_num_seqs if max_num_seqs is not None else tier.max_num_seqs
    if max_num_batched_tokens is not None:
        chunk = max_num_batched_tokens
    else:
        chunk = tier.serve_tokens if entrypoint == "serve" else tier.llm_tokens
        if version >= CAPPED_RELEASE and max_model_len is not None:
            chunk = min(seqs * max_model_len, chunk)
    if max_num_seqs is None and version >= CAPPED_RELEASE:
        seqs = min(seqs, chunk)
    return VllmBatch(max_num_seqs=seqs, max_num_batched_tokens=chunk, defaulted=defaulted, tier=tier)


def batch_note(batch: VllmBatch, entrypoint: str) -> str:
    """The answer's assumption line where vLLM chose either value."""
    if batch.tier is None:
        return (
            f"vLLM V0 (before 0.8): max_num_seqs {batch.max_num_seqs} (EngineArgs); the profile's chunk "
            f"taken as {batch.max_num_batched_tokens} tokens (V0's own max(max_model_len, 2048) not "
            "modelled; peakmem.vllm_defaults)"
        )
    how = "vllm serve" if entrypoint == "serve" else "the offline LLM class"
    return (
        f"vLLM's batch defaults for {how} on {batch.tier.where}: max_num_seqs {batch.max_num_seqs}, "
        f"max_num_batched_tokens {batch.max_num_batched_tokens} (the values given kept; "
        "--vllm-entrypoint llm for the LLM class; peakmem.vllm_defaults)"
    )
