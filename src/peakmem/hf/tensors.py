"""The tensor builders every family shares (embeddings, Conv1D, heads, rotary buffers, gated MLPs, fused
experts) and :func:`_spec`, which assembles a family's layers and outer tensors into a ModelSpec."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from peakmem.hf.reader import _Reader
from peakmem.model import Component, Layer, LayerGroup, ModelSpec, NormKind, PositionKind, Tensor, linear


def _embedding(path: str, rows: int, dim: int, component: Component = "embeddings") -> Tensor:
    module = path.rsplit(".", 1)[-1]
    return Tensor(
        name=f"{path}.weight", module=module, shape=(rows, dim), component=component, kind="embedding"
    )


def _conv1d(path: str, nx: int, nf: int, component: Component) -> tuple[Tensor, ...]:
    """GPT-2's ``Conv1D(nf, nx)``: a Linear whose weight is stored transposed, ``(in, out)``.

    The weight is recorded as a ``linear_weight`` with the shape as stored (transformers/pytorch_utils.py,
    ``Conv1D.weight = nn.Parameter(torch.empty(nx, nf))``); numel is what matters for counts.
    """
    module = path.rsplit(".", 1)[-1]
    return (
        Tensor(
            name=f"{path}.weight", module=module, shape=(nx, nf), component=component, kind="linear_weight"
        ),
        Tensor(name=f"{path}.bias", module=module, shape=(nf,), component=component, kind="linear_bias"),
    )


def _head(vocab: int, dim: int, tied: bool, path: str = "lm_head") -> tuple[Tensor, ...]:
    """The LM head; a tied head shares the embedding, which ``model.parameters()`` yields once."""
    return () if tied else linear(path, dim, vocab, False, "head")


def _rope_buffers(prefix: str, rotary_dim: int, names: Sequence[str] = ("",)) -> tuple[Tensor, ...]:
    """``inv_freq`` and ``original_inv_freq`` (``torch.arange(0, dim, 2)`` long) of a rotary module.

    transformers 5.x keeps both as non-persistent buffers (e.g. ``LlamaRotaryEmbedding``).
    """
    n = (rotary_dim + 1) // 2
    out: list[Tensor] = []
    for name in names:
        for buf in (f"{name}inv_freq", f"{name}original_inv_freq"):
            out.append(
                Tensor(
                    name=f"{prefix}.{buf}",
                    module="rotary_emb",
                    shape=(n,),
                    component="positions",
                    kind="other",
                )
            )
    return tuple(out)


def _groups(layers: Sequence[Layer]) -> tuple[LayerGroup, ...]:
    """One group per run of identical consecutive layers, in order."""
    out: list[LayerGroup] = []
    for layer in layers:
        if out and out[-1].layer == layer:
            out[-1] = LayerGroup(count=out[-1].count + 1, layer=layer)
        else:
            out.append(LayerGroup(count=1, layer=layer))
    return tuple(out)


def _gated_mlp(path: str, hidden: int, width: int, bias: bool, component: Component) -> tuple[Tensor, ...]:
    return (
        *linear(f"{path}.gate_proj", hidden, width, bias, component),
        *linear(f"{path}.up_proj", hidden, width, bias, component),
        *linear(f"{path}.down_proj", width, hidden, bias, component),
    )


def _fused_experts(path: str, experts: int, hidden: int, width: int) -> tuple[Tensor, ...]:
    """transformers 5.x stores a layer's experts as two fused 3-D parameters, not one Linear per expert.

    ``gate_up_proj`` is ``(E, 2*I, H)`` and ``down_proj`` ``(E, H, I)`` (e.g. ``MixtralExperts``,
    ``DeepseekV3Experts``); the owning module is ``experts``, so LoRA reaches them through peft's
    ``target_parameters`` (by these names), not ``target_modules``.
    """
    return (
        Tensor(
            name=f"{path}.gate_up_proj",
            module="experts",
            shape=(experts, 2 * width, hidden),
            component="experts",
            kind="expert_weight",
        ),
        Tensor(
            name=f"{path}.down_proj",
            module="experts",
            shape=(experts, hidden, width),
            component="experts",
            kind="expert_weight",
        ),
    )


@dataclass(frozen=True)
class _Dropout:
    attention: float = 0.0
    hidden: float = 0.0
    embedding: float = 0.0


# Kernels a model class supports in transformers 5.23 (`_supports_sdpa`, `_supports_flash_attn` in
# models/<family>/modeling_<family>.py); families not listed support all three.
ATTENTION_KERNELS: dict[str, tuple[str, ...]] = {
    "bloom": ("eager",),  # BloomPreTrainedModel: neither flag set (ALiBi in a custom baddbmm)
    "gemma2": ("eager", "flash"),  # Gemma2PreTrainedModel._supports_sdpa = False: no logit softcapping
}


def _spec(
    r: _Reader,
    *,
    name: str | None,
    architecture: str,
    vocab: int,
    hidden: int,
    max_pos: int,
    position: PositionKind,
    norm_kind: NormKind,
    layers: Sequence[Layer],
    outer: Sequence[Tensor],
    tied: bool,
    dropout: _Dropout,
    buffers: Sequence[Tensor] = (),
    task: Literal["causal-lm", "sequence-classification"] = "causal-lm",
    num_labels: int = 0,
) -> ModelSpec:
    raw_name = r.raw.get("_name_or_path")
    default_name = raw_name if isinstance(raw_name, str) and raw_name else r.model_type
    return ModelSpec(
        name=name or default_name,
        model_type=r.model_type,
        architecture=architecture,
        task=task,
        vocab_size=vocab,
        hidden_size=hidden,
        max_position_embeddings=max_pos,
        position=position,
        norm=norm_kind,
        groups=_groups(layers),
        outer=tuple(outer),
        tie_word_embeddings=tied,
        num_labels=num_labels,
        attention_dropout=dropout.attention,
        hidden_dropout=dropout.hidden,
        embedding_dropout=dropout.embedding,
        attention_kernels=ATTENTION_KERNELS.get(r.model_type, ("eager", "sdpa", "flash")),
        buffers=tuple(buffers),
        notes=tuple(r.notes),
    )
