# mypy: disable-error-code="no-untyped-call,no-any-return,unused-ignore"
"""The :class:`~peakmem.model.ModelSpec` of a ``config.json`` the formulas do not know, from transformers.

:func:`derive_spec` builds the model on the meta device (:func:`~peakmem.simulate.derive.build.build_meta`),
reads its modules (:func:`~peakmem.simulate.derive.from_model.spec_from_model`) and, for blocks that keep a
recurrent state at inference (SSM, linear attention), measures that state after a fake prefill
(:func:`measure_state`; formulas/recurrent_state.py counts it).
"""

from __future__ import annotations

import dataclasses
import inspect
import re
from collections.abc import Mapping
from typing import Any

import torch

from peakmem import block_costs
from peakmem.model import STATE_DTYPES, LayerGroup, ModelSpec
from peakmem.simulate.derive.build import block_lists, build_meta, main_blocks, truncate, why
from peakmem.simulate.derive.from_model import block_keys, spec_from_model

# module classes of blocks that keep a recurrent state in transformers' cache (Mamba/Mamba-2 mixers,
# gated delta-nets, LFM2's short convolution, ...) beside SSM / linear-attention mixers (Falcon-H1's
# blocks run attention and Mamba-2 side by side): only their specs run the prefill below
_STATEFUL = re.compile(r"Mamba|Mixer(?!tral)|SSM|Ssm|Delta|ShortConv|LinearAttention|Lightning|Rwkv|RWKV")
STATE_PREFILL = (2, 8)  # (batch, tokens) of the fake prefill: longer than every conv kernel


def derive_spec(config: Mapping[str, Any], *, name: str | None = None) -> ModelSpec:
    """The :class:`ModelSpec` of the model transformers builds for ``config`` (see the module doc)."""
    config = dict(config)
    model = build_meta(config)
    spec = spec_from_model(model, config, name=name)
    mixers = {layer.derived.mixer for layer in spec.layers() if layer.derived is not None}
    if mixers & {"ssm", "linear_attention"} or _STATEFUL.search(
        " ".join({type(m).__name__ for m in model.modules()})
    ):
        spec = with_recurrent_state(spec, config)
    block_costs.register_config(config)
    block_costs.cache_spec(config, spec)
    return spec


def measure_state(config: Mapping[str, Any]) -> dict[str, tuple[int, int, int]]:
    """Per block key: (elements in the model's dtype, elements in fp32, conv window) of the recurrent
    state one sequence keeps in transformers' cache after a prefill of :data:`STATE_PREFILL` under fake
    tensors (bf16 model, ``use_cache=True``): the ``conv_states`` and ``recurrent_states`` of each cache
    layer (``cache_utils.py`` ``LinearAttentionLayer``; Mamba's ``cache_params``), divided by the batch.
    The conv window is the conv states' last dimension (``LinearAttentionLayer.lazy_initialization``:
    ``(*conv_states.shape[:-1], conv_kernel_size)``), kept only where the conv states are all the
    model-dtype state of the layer (0 otherwise: the serving engines' conv count then stays transformers').
    The model is cut to a few blocks of each kind first
    (:func:`~peakmem.simulate.derive.build.truncate`: a prefix, so the cache's layer indices keep
    their blocks)."""
    config = dict(config)
    model = build_meta(config)
    path_keys = block_keys(model, config)
    main_path = main_blocks(block_lists(model))[0]
    truncate(model, path_keys, prefix=True)
    batch = STATE_PREFILL[0]
    result: dict[str, tuple[int, int, int]] = {}
    for i, (states, convs) in enumerate(_cache_states(_prefill(model))):
        model_dtype, fp32 = _elements(states)
        key = path_keys.get(f"{main_path}.{i}")
        if key is not None and (model_dtype or fp32):
            result[key] = (model_dtype // batch, fp32 // batch, _conv_window(convs, model_dtype))
    return result


def _conv_window(convs: list[Any], model_dtype: int) -> int:
    """The window (last dimension) of a layer's conv states, when they are all its model-dtype state
    and share one window; else 0."""
    tensors = [t for t in convs if isinstance(t, torch.Tensor) and t.dtype != torch.float32]
    windows = {int(t.shape[-1]) for t in tensors}
    if len(windows) != 1 or sum(t.numel() for t in tensors) != model_dtype:
        return 0
    return windows.pop()


def _prefill(model: torch.nn.Module) -> Any:
    """The output of a fake bf16 prefill of :data:`STATE_PREFILL` with ``use_cache=True``."""
    from peakmem.simulate import kernels as kern
    from peakmem.simulate import runner
    from peakmem.simulate.fakeify import fakeify_module

    model.to(dtype=torch.bfloat16)
    model.eval()
    mode = runner._fake_mode()
    fakeify_module(model, mode)
    batch, tokens = STATE_PREFILL
    # explicit positions: a cache of linear-attention layers only (a cut model) has no token count
    # (``DynamicCache.get_seq_length`` raises), which a model reads when it makes positions itself
    positions = "position_ids" in inspect.signature(model.forward).parameters
    with runner._transformers_patches(), mode, kern.ScalarValueMode(), torch.no_grad():
        inputs: dict[str, Any] = {
            "input_ids": torch.zeros((batch, tokens), dtype=torch.long),
            "use_cache": True,
        }
        if positions:
            inputs["position_ids"] = torch.arange(tokens).unsqueeze(0).expand(batch, -1)
        return model(**inputs)


def _cache_states(out: Any) -> list[tuple[list[Any], list[Any]]]:
    """The state tensors of each layer of the cache a prefill's output holds, and its conv states."""
    cache = getattr(out, "past_key_values", None) or getattr(out, "cache_params", None)
    layers = list(getattr(cache, "layers", None) or ())
    linear = list(getattr(cache, "linear_cache", None) or ())  # MiniMaxCache: lightning-attention state
    per_layer: list[tuple[list[Any], list[Any]]] = []
    for i in range(max(len(layers), len(linear))):
        states: list[Any] = []
        convs: list[Any] = []
        if i < len(layers):
            convs = list((getattr(layers[i], "conv_states", None) or {}).values())
            states += convs + list((getattr(layers[i], "recurrent_states", None) or {}).values())
        if i < len(linear):
            states.append(linear[i])
        per_layer.append((states, convs))
    return per_layer


def _elements(states: list[Any]) -> tuple[int, int]:
    """(elements not in fp32, elements in fp32) of the tensors among ``states``."""
    model_dtype = fp32 = 0
    for state in states:
        if not isinstance(state, torch.Tensor):
            continue
        if state.dtype == torch.float32:
            fp32 += state.numel()
        else:
            model_dtype += state.numel()
    return model_dtype, fp32


def with_recurrent_state(spec: ModelSpec, config: Mapping[str, Any]) -> ModelSpec:
    """``spec`` with each block's measured recurrent state (:func:`measure_state`) and the config's
    ``mamba_ssm_dtype`` (the state dtype it asks serving engines for: ModelSpec.mamba_ssm_dtype, read from
    ``text_config`` first, as SGLang's ``mamba2_state_dtype`` and vLLM's Qwen3.5 hook read it); a note,
    and no state, when the prefill cannot run under fake tensors."""
    try:
        state = measure_state(config)
    except Exception as err:  # a model whose prefill needs tensor values: say so, keep the spec
        note = f"inference: the recurrent state per sequence could not be measured ({why(err)}); not counted"
        return dataclasses.replace(spec, notes=(*spec.notes, note))
    groups = []
    for g in spec.groups:
        info = g.layer.derived
        if info is not None and info.key in state:
            elems, fp32, window = state[info.key]
            info = dataclasses.replace(
                info, state_elements=elems, state_fp32_elements=fp32, conv_kernel=window
            )
            g = LayerGroup(count=g.count, layer=dataclasses.replace(g.layer, derived=info))
        groups.append(g)
    return dataclasses.replace(spec, groups=tuple(groups), mamba_ssm_dtype=config_ssm_dtype(config))


def config_ssm_dtype(config: Mapping[str, Any]) -> str | None:
    """The config's ``mamba_ssm_dtype`` (``text_config``'s first), when it is one the engines read."""
    text = config.get("text_config")
    value = text.get("mamba_ssm_dtype") if isinstance(text, Mapping) else None
    value = value if value is not None else config.get("mamba_ssm_dtype")
    return value if value in STATE_DTYPES else None
