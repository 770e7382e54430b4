# mypy: disable-error-code="no-untyped-call,no-any-return,unused-ignore"
"""One fake-tensor training step of a model cut to a few blocks, and each block kind's bytes in it.

:func:`measure_one` runs the real model's forward and backward under fake tensors with
:mod:`peakmem.simulate.runner`'s machinery and tracker, on a copy of the meta model cut for measuring
(:func:`cut_model`, remembered per process: built before the steps are forked), and reads each block
kind's bytes off the tracker's ledger (:func:`peakmem.simulate.derive.analyse.analyse`).
"""

from __future__ import annotations

import copy
from typing import Any

import torch

from peakmem import block_costs
from peakmem.errors import InputError
from peakmem.simulate.derive.analyse import analyse
from peakmem.simulate.derive.build import block_paths, build_meta, truncate
from peakmem.simulate.derive.from_model import block_keys

Steps = dict[str, block_costs.Measured]  # block key -> its bytes in one step

# the meta model cut for measuring, per (config, attention kernel, cut, kinds), with its blocks' keys: built
# once per process, before the steps are forked (:func:`peakmem.simulate.derive.forked.measure_steps`), and
# copied for each step (Qwen3-Next-80B: the first build 4.3 s with the import of its transformers code, later
# ones 0.2 s, a copy of the cut 0.02 s; a family measures 7 to 14 steps)
_CUT_MODELS: dict[tuple[str, str, str, frozenset[str] | None], tuple[torch.nn.Module, dict[str, str]]] = {}
_CUT_MODELS_MAX = 4


def attn_of(setup: Any) -> str:
    """peakmem's attention kernel a step builds the model for (flash's fake step runs SDPA:
    :func:`~peakmem.simulate.derive.build.build_with`)."""
    return str(setup.attention.value)


def cut_model(
    config: dict[str, Any], attn: str, cut: str, kinds: frozenset[str] | None = None
) -> tuple[torch.nn.Module, dict[str, str]]:
    """The model ``config`` builds with ``attn``, cut as ``cut`` says
    (:func:`~peakmem.simulate.derive.build.truncate`; to blocks of ``kinds`` when given), and its blocks'
    paths -> kind keys; remembered (not to be changed by the caller: copy it)."""
    key = (block_costs.config_hash(config), attn, cut, kinds)
    hit = _CUT_MODELS.get(key)
    if hit is not None:
        return hit
    model = build_meta(config, attn=attn)
    path_keys = block_keys(model, config)
    if cut != "none":
        kept = truncate(model, path_keys, prefix=cut == "prefix", kinds=kinds)
        path_keys = kept if kept is not None else path_keys
    if len(_CUT_MODELS) >= _CUT_MODELS_MAX:
        _CUT_MODELS.clear()
    _CUT_MODELS[key] = (model, path_keys)
    return model, path_keys


def measure_one(
    config: dict[str, Any], setup: Any, *, cut: str, kinds: frozenset[str] | None = None
) -> Steps:
    """One fake-tensor training step; per block kind (saved, forward transient, backward transient,
    freed at the backward peak) of a representative block (the middle one of its kind)."""
    import gc

    from peakmem.measure.tracker import LiveStorageTracker
    from peakmem.measure.trainer import model_dtype
    from peakmem.simulate import kernels as kern
    from peakmem.simulate import runner
    from peakmem.simulate.fakeify import fakeify_module, prepare_adapters

    template, path_keys = cut_model(config, attn_of(setup), cut, kinds)
    model = copy.deepcopy(template)  # each step prepares, fakes and converts its own copy
    model.to(dtype=model_dtype(setup.precision))
    if hasattr(model.config, "use_cache"):
        model.config.use_cache = False
    # the blocks, before peft turns Linears into modules with children (a ModuleList of Linears, such as
    # Gemma 3n's altup_projections, would then look like a block list)
    blocks = set(block_paths(model))
    quant = prepare_adapters(model, setup, setup.lora)
    mode = runner._fake_mode()
    fakeify_module(model, mode)
    model.train()
    tracker = LiveStorageTracker()
    log = kern.KernelLog()
    paths_run = [p for p in block_paths(model) if p.removeprefix("base_model.model.") in blocks]
    outputs: dict[str, set[int]] = {}  # block module path -> the storages of its forward's output
    hooks = [
        model.get_submodule(p).register_forward_hook(_output_hook(tracker, outputs.setdefault(p, set())))
        for p in paths_run
    ]
    was = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        _forward_backward(model, setup, tracker, mode, log, quant)
    except runner._fake_limits() as err:
        raise InputError(
            f"model_type={config.get('model_type')!r}: its blocks cannot be measured with fake tensors "
            f"({type(err).__name__}: {err})"
        ) from err
    finally:
        for h in hooks:
            h.remove()
        if was:
            gc.enable()
    paths = [p.removeprefix("base_model.model.") if p not in path_keys else p for p in paths_run]
    keys = [path_keys[p] for p in paths]
    tracked = _tracked(model, paths)
    outs = [outputs[b] for b in paths_run]
    return analyse(tracker.ledger, tracked, keys, outs, adapters=setup.method.value != "full")


def _output_hook(tracker: Any, sids: set[int]) -> Any:
    """A forward hook recording the ledger id of a block's output hidden states (which the next block or
    the final norm may keep for backward): the first tensor it returns (transformers' decoder layers
    return the hidden states first; BLOOM's also returns its attention probabilities, which its own
    backward keeps)."""
    from torch.utils._pytree import tree_flatten

    def hook(module: Any, args: Any, out: Any) -> None:
        first = next((t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)), None)
        if first is not None:
            sids.add(tracker.sid_of(first))

    return hook


def _tracked(model: torch.nn.Module, paths: list[str]) -> list[str]:
    """The block paths as the tracker names modules (a peft wrapper prefixes them)."""
    names = {name for name, _ in model.named_modules()}
    return [p if p in names else f"base_model.model.{p}" for p in paths]


def _forward_backward(model: Any, setup: Any, tracker: Any, mode: Any, log: Any, quant: Any) -> None:
    """One forward and backward of a training step as :func:`peakmem.simulate.runner._run` runs
    them (same trainer, modes and tracker), without the optimizer step the costs do not need."""
    import contextlib

    from peakmem.breakdown import Phase
    from peakmem.measure.tracker import INPUT
    from peakmem.measure.trainer import make_trainer
    from peakmem.simulate import kernels as kern
    from peakmem.simulate import runner

    policy = setup.kernel_policy
    tracker.register_module(model)
    quant.register(tracker)
    fmode = kern.function_mode(policy, log)
    # flash's backward pads its fp32 scratch to round128(S) rows, a per-sequence constant below 128
    # tokens (B x const) that the five terms of the fit cannot represent: fitted over SHAPES (32..128)
    # it went into the s^2 and s terms and the backward transient at batch 2 x seq 128 came out 0 (tiny
    # Gemma, Qwen3, Phi-3 under full checkpointing: the derived peak 4.5-5.5% under simulate's). Measured
    # at S rows the scratch is per-token; at a length that is a multiple of 128 that is exact, elsewhere
    # the padding (< 128 rows) is left out. Longer SHAPES would not fit models of 256 positions.
    dmode = kern.dispatch_mode(policy, log, pad_rows=False)
    with contextlib.ExitStack() as stack:
        runner.enter_fake_modes(stack, mode, tracker, dmode, fmode)
        tracker.set_phase(Phase.LOAD, 0)
        trainer = make_trainer(model, setup, torch.device("cpu"), tracker)
        tracker.watch_gradients(model.named_parameters())
        tracker.set_phase(Phase.FORWARD, 1)
        batch = runner._batch(model, (setup.micro_batch, setup.seq_len))
        for t in batch.values():
            tracker.tag(t, INPUT)
        with trainer.autocast():
            out = model(**batch, use_cache=False) if runner._takes_use_cache(model) else model(**batch)
        loss = out.loss
        del out
        tracker.set_phase(Phase.BACKWARD, 1)
        trainer.backward(loss)
        del loss, batch
        tracker.set_phase(Phase.LOAD, 2)  # closes the backward segment
