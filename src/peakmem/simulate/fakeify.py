# mypy: disable-error-code="no-untyped-call,no-any-return,unused-ignore"
"""Meta-device model -> fake CPU tensors; LoRA/DoRA adapters with peft; quantized bases analytically.

``fakeify_module`` replaces every parameter, buffer and plain tensor attribute of a meta-device
model by a fake CPU tensor (``FakeTensorMode``: shape, dtype, strides and storage, no memory).
Each meta *storage* becomes one fake storage, and tensors sharing a storage (tied weights, aliasing
buffers) become views of it, so tying survives. ``Parameter`` objects stay ``Parameter`` objects
with their ``requires_grad``; a parameter object used twice (tied) maps to one fake parameter.

Quantized bases (QLoRA): bitsandbytes has no fake kernels, so each frozen ``nn.Linear`` of the base
model (every one but the output head, as transformers' bitsandbytes integration skips
``lm_head``) is replaced by :class:`Fake4bitLinear`: its weight is a packed byte tensor of
the size bitsandbytes stores (``Linear4bit``/``Params4bit``, the ``QuantConfig``'s blocksize: ``numel/2``
bytes of 4-bit codes + per block an fp32 absmax, with double quantization a uint8 one plus fp32
second-level scales per 256 blocks, their 256-entry fp32 code book and an fp32 offset; the 16-entry fp32
NF4/FP4 table: peakmem.formulas.weights' constants), and its forward allocates what ``bnb.matmul_4bit``
does: a dequantized compute-dtype copy of the weight for the matmul (with double quantization the fp32
absmax rebuilt first), freed after it (and again in backward for the input gradient); nothing is saved for
backward (``MatMul4Bit`` saves only the quantized weight, which is resident anyway).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from peakmem.adapters import ALL_LINEAR, QuantConfig, quant_of
from peakmem.adapters import LoraConfig as LoraSpec
from peakmem.breakdown import Category, PerParamRow
from peakmem.dtypes import parse_dtype
from peakmem.errors import InputError
from peakmem.formulas.kbit_prep import AXOLOTL_NORM_NAME
from peakmem.formulas.lora.deltas import base_keeps_input
from peakmem.formulas.model_states import precision_plan
from peakmem.formulas.weights import BNB_4BIT_CODE_ENTRIES, BNB_DQ_BLOCKSIZE, BNB_DQ_CODE_ENTRIES
from peakmem.measure.tracker import PARAM, LiveStorageTracker
from peakmem.training import Method, TrainingSetup


def fakeify_module(model: torch.nn.Module, mode: Any) -> None:
    """Replace every tensor of ``model`` (on the meta device) by a fake CPU tensor, in place."""
    bases: dict[int, torch.Tensor] = {}  # meta storage key -> fake flat base
    done: dict[int, torch.Tensor] = {}  # id(meta tensor) -> fake tensor

    def fake(t: torch.Tensor) -> torch.Tensor:
        if id(t) in done:
            return done[id(t)]
        st = t.untyped_storage()
        key = st._cdata
        nbytes = st.nbytes()
        with mode:
            base = bases.get(key)
            if base is None:
                base = torch.empty((nbytes,), dtype=torch.uint8, device="cpu")
                bases[key] = base
            if nbytes == 0:
                f = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="cpu")
            else:
                f = torch.empty((0,), dtype=t.dtype, device="cpu")
                f.set_(base.untyped_storage(), t.storage_offset(), t.shape, t.stride())
        if isinstance(t, torch.nn.Parameter):
            f = torch.nn.Parameter(f, requires_grad=t.requires_grad)
        done[id(t)] = f
        return f

    for mod in model.modules():
        for name, p in list(mod._parameters.items()):
            if p is not None:
                mod._parameters[name] = fake(p)  # type: ignore[assignment]
        for name, b in list(mod._buffers.items()):
            if b is not None:
                mod._buffers[name] = fake(b)
        for name, v in list(vars(mod).items()):
            if isinstance(v, torch.Tensor) and not isinstance(v, torch.nn.Parameter) and v.is_meta:
                setattr(mod, name, fake(v))


# ------------------------------------------------------------------------------------------------
# LoRA / QLoRA
# ------------------------------------------------------------------------------------------------


@dataclass
class QuantInfo:
    """The quantized base weights (QLoRA), registered with the tracker as parameters."""

    weights: list[tuple[str, Any]] = field(default_factory=list)  # (name, Fake4bitLinear)
    params: int = 0  # elements of the quantized weights (not torch parameters)
    method: str = "full"
    lora: LoraSpec | None = None
    format: str = ""  # QuantConfig.label()

    def register(self, tracker: LiveStorageTracker) -> None:
        for name, mod in self.weights:
            for t in mod.storages():
                tracker.sid_of(t, op="quantized weight", tags=(PARAM,), name=f"{name}.weight")

    def nbytes(self) -> int:
        return sum(sum(int(t.untyped_storage().nbytes()) for t in m.storages()) for _, m in self.weights)

    def rows(self) -> tuple[PerParamRow, ...]:
        if not self.weights:
            return ()
        b = self.nbytes()
        return (PerParamRow(tensor="weights (quantized base)", dtype="nf4", bytes_per_param=b / self.params,
                            bytes=b, params=self.params, category=Category.PARAMETERS,
                            source="bitsandbytes Params4bit: 4-bit codes + double-quantized absmax"),)  # fmt: skip  # noqa: E501

    def assumptions(self) -> list[str]:
        out = []
        if self.lora is not None:
            lo = self.lora
            out.append(
                f"{self.method}: peft {'DoRA' if lo.dora else 'LoRA'} r={lo.rank}, alpha={lo.alpha}, dropout "
                f"{lo.dropout}, targets {','.join(lo.targets) or '(peft default)'}, adapters in "
                f"{lo.adapter_dtype}; base weights frozen"
            )
        if self.weights:
            out.append(
                "qlora: bitsandbytes has no fake kernels, so each base Linear (all but the output head) is a "
                f"stand-in holding the bytes bitsandbytes stores ({self.format}: {self.nbytes()} B for "
                f"{self.params} weights) and allocating a dequantized 16-bit copy of its "
                "weight around each matmul, forward and backward, as bnb.matmul_4bit does"
            )
        return out


def _dequantize(shape: tuple[int, int], dtype: torch.dtype, nested_blocks: int) -> torch.Tensor:
    """bitsandbytes 0.49.1 functional.py ``dequantize_4bit``: with double quantization (``nested``) the
    fp32 absmax is rebuilt first (``dequantize_blockwise``, one per block), alive while the weight is
    written and freed on return; the output is the weight in ``dtype``."""
    absmax = torch.empty((nested_blocks,), dtype=torch.float32) if nested_blocks else None
    w = torch.empty(shape, dtype=dtype)
    del absmax
    return w


class _Dequant4bitMatmul(torch.autograd.Function):
    """``y = x @ dequant(W).T``, W frozen: the dequantized copy lives only around each matmul. With
    ``keep`` the input stays for backward where it requires grad, as bitsandbytes before 0.43.2 keeps it
    (``MatMul4Bit``: ``ctx.tensors = (A, B)``; LLM.int8's ``MatMul8bitLt`` always: peakmem.bnb_versions).
    bitsandbytes 0.49.1 autograd/_functions.py ``MatMul4Bit``: forward ``F.linear(A,
    dequantize_4bit(B).to(A.dtype).t())``, backward ``grad_A = torch.matmul(grad_output,
    dequantize_4bit(B).to(grad_output.dtype).t())``: the weight is freed when each returns."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, shape: tuple[int, int], keep: bool, nested: int) -> torch.Tensor:  # type: ignore[override]
        ctx.shape, ctx.dtype, ctx.nested = shape, x.dtype, nested
        if keep and ctx.needs_input_grad[0]:
            ctx.save_for_backward(x)
        w = _dequantize(shape, x.dtype, nested)
        with torch.autocast(x.device.type, enabled=False):  # bitsandbytes' kernel, not aten's mm
            out = x @ w.t()
        del w
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:  # type: ignore[override]
        w = _dequantize(ctx.shape, grad.dtype, ctx.nested)
        gx = grad @ w
        del w
        return gx, None, None, None


class Fake4bitLinear(torch.nn.Module):
    """A frozen 4-bit ``nn.Linear`` (bitsandbytes ``Linear4bit``) for the simulator."""

    def __init__(
        self,
        base: torch.nn.Linear,
        *,
        keeps_input: bool = False,
        compute: torch.dtype | None = None,
        quant: QuantConfig,
    ) -> None:
        super().__init__()
        self.in_features, self.out_features = base.in_features, base.out_features
        self.keeps_input = keeps_input  # the bitsandbytes release keeps the input (_Dequant4bitMatmul)
        self.compute = compute  # bnb_4bit_compute_dtype (None: the input's)
        numel = base.weight.numel()
        self.numel = numel
        blocks = -(-numel // quant.blocksize)
        self.nested = blocks if quant.double_quant else 0  # the fp32 absmax dequantize_4bit rebuilds
        dev = base.weight.device
        f32, u8 = torch.float32, torch.uint8

        def buf(name: str, n: int, dtype: torch.dtype) -> None:
            self.register_buffer(name, torch.empty((n,), dtype=dtype, device=dev))
            self._names.append(name)

        # bitsandbytes 0.49.1 functional.py quantize_4bit: packed codes; QuantState absmax (fp32 per block,
        # or with compress_statistics uint8 from quantize_blockwise(blocksize=256) plus state2's fp32 absmax
        # and 256-entry code and the fp32 offset) and ``code = get_4bit_type(...)``, 16 fp32 entries
        self._names: list[str] = []
        buf("qweight", -(-numel // 2), u8)
        buf("absmax", blocks, u8 if quant.double_quant else f32)
        if quant.double_quant:
            buf("absmax2", -(-blocks // BNB_DQ_BLOCKSIZE), f32)
            buf("code2", BNB_DQ_CODE_ENTRIES, f32)
            buf("offset", 1, f32)
        buf("code", BNB_4BIT_CODE_ENTRIES, f32)
        self.bias = base.bias
        if self.bias is not None:
            self.bias.requires_grad_(False)

    def storages(self) -> list[torch.Tensor]:
        return [getattr(self, n) for n in self._names]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # bitsandbytes 0.43.3 / 0.50.2 nn/modules.py Linear4bit.forward: ``x.to(self.compute_dtype)``, the
        # 4-bit matmul (its own kernel: no autocast), then ``.to(inp_dtype)``: an fp32 input (a prepared
        # base's fp32 norms) gives an fp32 output, under autocast too
        inp = x.dtype
        out = _Dequant4bitMatmul.apply(
            x.to(self.compute or inp), (self.out_features, self.in_features), self.keeps_input, self.nested
        )
        if self.bias is not None:
            out = out + self.bias.to(out.dtype)
        # peft's bnb Linear4bit.forward clones the base output ("defensively", before adding the adapters')
        return out.to(inp).clone()


def prepare_adapters(model: torch.nn.Module, setup: TrainingSetup, lora: LoraSpec | None) -> QuantInfo:
    """Apply LoRA/DoRA (peft) to the meta model for ``lora``/``qlora`` as ``lora`` describes
    (:class:`peakmem.adapters.LoraConfig`; its defaults are peft's); for ``qlora`` swap the
    base Linears for 4-bit stand-ins."""
    info = QuantInfo(method=setup.method.value)
    if setup.method == Method.FULL:
        return info
    try:
        import peft
    except ImportError as err:  # pragma: no cover - peft is in the torch extra
        raise InputError(f"method={setup.method.value!r}: needs peft ({err})") from err
    spec = lora if lora is not None else LoraSpec()
    info.lora = spec
    targets: Any = (
        None if not spec.targets else (ALL_LINEAR if ALL_LINEAR in spec.targets else list(spec.targets))
    )
    alpha: Any = spec.alpha  # peft annotates lora_alpha int and accepts a float
    cfg = peft.LoraConfig(
        r=spec.rank, lora_alpha=alpha, lora_dropout=spec.dropout, target_modules=targets,
        target_parameters=list(spec.target_parameters) or None, use_dora=spec.dora, lora_bias=spec.lora_bias,
        modules_to_save=list(spec.modules_to_save) or None,
    )  # fmt: skip
    head = model.get_output_embeddings()  # type: ignore[operator]
    try:
        with torch.device("meta"):
            peft_model = peft.get_peft_model(model, cfg, autocast_adapter_dtype=spec.adapter_dtype == "fp32")
    except (ValueError, TypeError) as err:
        raise InputError(
            f"lora_targets={','.join(spec.targets)!r}: peft cannot apply LoRA here ({err})"
        ) from err
    # peft wraps the model; keep the transformers model (its forward and loss) with the adapters inside it.
    del peft_model
    if spec.adapter_dtype in ("bf16", "fp16"):
        dt = torch.bfloat16 if spec.adapter_dtype == "bf16" else torch.float16
        for name, p in model.named_parameters():
            if p.requires_grad and "lora_" in name:
                p.data = p.data.to(dt)
    elif spec.adapter_dtype == "base":
        adapters_to_base_dtype(model)
    if setup.method == Method.QLORA:
        keeps = base_keeps_input(setup)
        plan = precision_plan(setup.precision)
        compute = getattr(torch, plan.compute.torch_name)
        quant = quant_of(setup)
        assert quant is not None  # method qlora
        info.format = f"{quant.label}, blocksize {quant.blocksize}"
        for name, mod in list(model.named_modules()):
            if ".lora_" in f".{name}":  # the adapters themselves stay trainable 16/32-bit Linears
                continue
            for child_name, child in list(mod.named_children()):
                if type(child) is torch.nn.Linear and child is not head:
                    q = Fake4bitLinear(child, keeps_input=keeps, compute=compute, quant=quant)
                    setattr(mod, child_name, q)
                    if child_name == "base_layer":
                        # peft 0.21.2 tuners/lora/bnb.py Linear4bit.forward casts the input to the adapter's
                        # dtype only where autocast is off (lora.Linear, wrapped here, always does)
                        mod.cast_input_dtype_enabled = not plan.autocast
                    full = f"{name}.{child_name}" if name else child_name
                    info.weights.append((full, q))
                    info.params += q.numel
        prepare_float_weights(model, quant)
    return info


# trl 0.13.0 trainer/utils.py peft_module_casting_to_bf16: modules whose names hold one of these go back to
# bf16 when fp32 (after ``if isinstance(module, torch.nn.LayerNorm) or "norm" in name``: to fp32)
TRL_BF16_NAMES = ("lm_head", "embed_tokens", "wte", "wpe")
# axolotl loaders/utils.py get_linear_embedding_layers (@c1193823): the embedding / head modules
# _convert_embedding_modules_dtype puts back in the torch dtype, with every module whose name holds "norm"
AXOLOTL_FLOAT_NAMES = ("embed_tokens", "lm_head", "embed_in", "embed_out", "word_embeddings")


def prepare_float_weights(model: torch.nn.Module, quant: QuantConfig) -> None:
    """The quantized base's float (not 4-bit, not adapter) parameters as the libraries leave them, by module
    name as they work (the analytic rule, by component: peakmem.formulas.kbit_prep): loaded in
    ``quant.float_dtype`` (transformers' ``dtype``); peft 0.21.2 utils/other.py
    ``prepare_model_for_kbit_training`` casts every fp16/bf16 parameter that is not a ``Params4bit`` to fp32;
    then TRL's ``peft_module_casting_to_bf16`` or axolotl's ``_convert_embedding_modules_dtype`` cast some
    modules back (the names above)."""
    loaded = getattr(torch, parse_dtype(quant.float_dtype).torch_name)
    base = [(n, p) for n, p in model.named_parameters() if ".lora_" not in f".{n}" and p.is_floating_point()]
    for _, p in base:
        p.data = p.data.to(loaded if quant.kbit_prep == "none" else torch.float32)
    if quant.kbit_prep not in ("trl", "axolotl"):
        return
    names = TRL_BF16_NAMES if quant.kbit_prep == "trl" else AXOLOTL_FLOAT_NAMES
    back = torch.bfloat16 if quant.kbit_prep == "trl" else loaded
    for name, module in model.named_modules():
        if ".lora_" in f".{name}":
            continue
        norm = isinstance(module, torch.nn.LayerNorm) or AXOLOTL_NORM_NAME in name
        if (quant.kbit_prep == "axolotl" and norm) or any(x in name for x in names):
            for p in module.parameters(recurse=False):
                if p.is_floating_point() and (quant.kbit_prep == "axolotl" or p.dtype == torch.float32):
                    p.data = p.data.to(back)


def adapters_to_base_dtype(model: torch.nn.Module) -> None:
    """Each LoRA/DoRA parameter in its base layer's dtype, as peft leaves it with
    ``autocast_adapter_dtype=False`` (``adapter_dtype="base"``).

    peft 0.21.2 tuners/tuners_utils.py ``BaseTunerLayer._move_adapter_to_device_of_base_layer`` casts a new
    adapter to the base layer's floating dtype (bitsandbytes' 4-bit: its ``compute_dtype``), but skips an
    adapter whose parameters are on the meta device: built on the meta model, the adapters stay in torch's
    default dtype (fp32), which doubled the adapters' inputs and outputs a bf16 step saves (a tiny phi-2
    LoRA on everything: 3.7 MB saved per block where the real step keeps 2.1 MB).
    """
    for module in model.modules():
        weight = getattr(getattr(module, "base_layer", None), "weight", None)
        if weight is None or not weight.dtype.is_floating_point:
            continue
        for name, p in module.named_parameters():
            if "lora_" in name and p.dtype.is_floating_point and p.dtype != weight.dtype:
                p.data = p.data.to(weight.dtype)
