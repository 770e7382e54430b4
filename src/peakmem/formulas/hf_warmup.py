"""transformers' caching-allocator warm-up at ``from_pretrained(..., device_map=...)``: the block's size.

From v4.50.0 ``_load_pretrained_model`` calls ``caching_allocator_warmup`` before any weight loads: one
``torch.empty(byte_count // factor, dtype=torch.float16)`` per GPU, dropped at once, so the caching
allocator keeps one block of ``2 * byte_count / factor`` bytes (``factor`` 2: ``byte_count``) and later
requests take slices of it. ``from_pretrained`` calls no ``empty_cache`` after it, and ``empty_cache``
releases only segments nothing lives in, so the block's free part stays reserved while any weight sits in
it. Which bytes it counts, by release (read in the wheels' ``modeling_utils.py`` / ``quantizers/base.py``):

* v4.50.0-v4.53.3: every key of ``model_to_load.state_dict()`` (``expand_device_map(device_map,
  expected_keys)``), so a tied LM head counts again beside its embedding; each at its meta dtype.
  v4.50.0 skips quantized loads (``device_map is not None and hf_quantizer is None``).
* v4.54.0-v4.57.x: the keys ``_get_tied_weight_keys(model)`` returns are skipped: the class's
  ``_tied_weights_keys`` (``lm_head.weight``), whether or not the config ties it, so an untied head is
  left out (its later allocation cuts its own segment; no block beyond the weights).
* Quantized loads, v4.51.0-v4.57.x: ``factor`` is the quantizer's ``get_cuda_warm_up_factor()``, 4 for
  bitsandbytes (the base class's: "half the model size"), over the meta model's sizes, where
  ``preprocess_model`` has made each Linear a Linear4bit / Linear8bitLt of the unquantized shape in the
  load dtype: half the 16-bit bytes, against a 4-bit model's quarter plus its 16-bit embeddings and head.
* v5.0.0 on: ``get_total_byte_count`` counts each parameter's quantized size
  (``hf_quantizer.param_element_size``) and skips only keys the config ties: the block is the weights.

The block's bytes before the factor are capped at the device's free memory less 1.2 GiB (v4.52 on; 95 % of
it in v4.50-v4.51), where the free memory is known (the caller's: a GPU's usable bytes, torch's total, less
the CUDA context; ``Gpu.usable_bytes`` leaves out the driver's own reserve where the catalog knows it, as
``mem_get_info`` does: 870 MiB on an A100-80GB, 265 MiB on a T4). Checked against
transformers 4.53.3 / 4.57.1 / 5.23.0's own ``caching_allocator_warmup`` in benchmarks/hf_load_warmup.py.
torchao's factors (4.53.0 ``quantizers/quantizer_torchao.py`` ``get_cuda_warm_up_factor``: 8 for int4,
4 for int8 and float8) size the block over the 16-bit meta sizes at or below the packed weights, which fill
it: no block beyond them (0 here). Not modelled: GPTQ / AWQ / fp8 loads (their packed or scaled parameters
and their own factors) and a ``device_map`` over several GPUs (each GPU's share).
"""

from __future__ import annotations

from peakmem import dtypes
from peakmem.model import ModelSpec
from peakmem.weight_formats import Scheme, WeightFormat

WARMUP_FROM = (4, 50)  # v4.50.0: caching_allocator_warmup in _load_pretrained_model
WARMUP_QUANTIZED_FROM = (4, 51)  # v4.51.0: quantized loads warmed too (factor 2 if no quantizer else 4)
WARMUP_SKIPS_TIED_KEYS = (4, 54)  # v4.54.0: tied_param_names = _get_tied_weight_keys(model) skipped
WARMUP_EXACT_SIZES = (5, 0)  # v5.0.0: get_total_byte_count, param_element_size, config-tied keys only
# torch.empty(byte_count // factor, dtype=torch.float16): factor 2 allocates byte_count bytes
BLOCK_DTYPE = dtypes.FP16
UNQUANTIZED_FACTOR = 2
BNB_WARMUP_FACTOR = 4  # quantizers/base.py HfQuantizer.get_cuda_warm_up_factor (bitsandbytes keeps it)
# a bitsandbytes load's meta Linears are in its torch_dtype: bf16 or fp16 (the quantizer's float16 default)
BNB_LOAD_DTYPE = dtypes.FP16
# the cap on byte_count: min(byte_count, max(0, int(device_memory - 1.2 * 1024**3))) from v4.52.0,
# min(byte_count, int(0.95 * device_memory)) before (device_memory: torch.cuda.mem_get_info's free bytes)
WARMUP_MARGIN_FROM = (4, 52)
WARMUP_FREE_MARGIN_GIB = 1.2  # in float arithmetic, as transformers computes it
WARMUP_FREE_FRACTION = 0.95
SRC = "transformers v4.50-v4.57 modeling_utils.py caching_allocator_warmup"


def block_bytes(spec: ModelSpec, version: tuple[int, ...], fmt: WeightFormat, free: int | None) -> int:
    """Bytes of the warm-up block on one GPU holding the whole model at transformers ``version``, 0 where
    the release or the format makes none, or where it is the weights' own size (v5.0 on); ``free``: the
    device's free bytes at the load (None: unknown, no cap)."""
    if version < WARMUP_FROM or version >= WARMUP_EXACT_SIZES:
        return 0
    bnb = fmt.scheme in (Scheme.BNB_4BIT, Scheme.BNB_INT8)
    if fmt.is_quantized and not (bnb and version >= WARMUP_QUANTIZED_FROM):
        return 0
    numel = spec.params
    if version < WARMUP_SKIPS_TIED_KEYS:  # every state-dict key: a tied head's again
        numel += spec.vocab_size * spec.head_in_features if spec.tie_word_embeddings else 0
    else:  # the class's lm_head key skipped, tied (counted once already) or not
        numel -= spec.params_by_component().get("head", 0)
    byte_count = BNB_LOAD_DTYPE.nbytes(numel) if bnb else numel * fmt.bits // 8
    if free is not None:
        cap = (
            int(free - WARMUP_FREE_MARGIN_GIB * 2**30)
            if version >= WARMUP_MARGIN_FROM
            else int(WARMUP_FREE_FRACTION * free)
        )
        byte_count = min(byte_count, max(0, cap))
    factor = BNB_WARMUP_FACTOR if bnb else UNQUANTIZED_FACTOR
    return BLOCK_DTYPE.nbytes(byte_count // factor)


__all__ = ["SRC", "block_bytes"]
