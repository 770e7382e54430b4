"""Checkpoint sizes against peakmem's weight bytes (issue 30: "parameter bytes per tensor match the
checkpoints' safetensors index sizes within 1%").

For each model in ``benchmarks/safetensors_index.json`` (published sizes, each with where it was read),
prices the checkpoint as it ships, as ``peakmem infer MODEL`` does without ``--weights``: the format its
``config.json`` ``quantization_config`` names (:func:`peakmem.hf.quant.checkpoint_weights`), else the
config's ``torch_dtype`` (the dtype ``save_pretrained`` stored), and compares the bytes of
:func:`peakmem.formulas.weights.weight_rows` with the published size. Tensors a checkpoint stores that
peakmem deliberately does not price (DeepSeek-V3's MTP layer, Gemma 3's vision tower) are named in the
JSON (``not_priced``) and added here from their own rule, so the comparison still covers every byte.

Run: ``python benchmarks/safetensors_index.py`` (a Markdown table; exit 1 if a row is off by more than
the JSON's tolerance).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from peakmem.formulas.serving.speculative import mtp_draft_spec
from peakmem.formulas.weights import FLOAT_BYTES, weight_bytes
from peakmem.hf.deepseek import mtp_layers
from peakmem.hf.quant import checkpoint_weights
from peakmem.model import ModelSpec
from peakmem.resolve import resolve_config, resolve_model
from peakmem.weight_formats import Scheme, WeightFormat, parse_weight_format

DATA = Path(__file__).resolve().parent / "safetensors_index.json"
# config.json torch_dtype -> the float format save_pretrained stored the tensors in
TORCH_DTYPES = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}
DEFAULT_DTYPE = "bf16"  # transformers' default save dtype when a config names none (gpt-oss: mxfp4 + bf16)
# MXFP4 (gpt-oss): each quantized expert weight is stored as two tensors, *_blocks and *_scales
# (transformers integrations/mxfp4.py; the checkpoint's weight_map lists both).
MXFP4_TENSORS_PER_WEIGHT = 2


@dataclass(frozen=True, kw_only=True)
class Row:
    model: str
    weights: str  # the format priced
    tied: bool
    published: int
    value_is: str
    priced: int  # peakmem's bytes of the model transformers builds
    not_priced: int  # bytes the checkpoint stores that peakmem deliberately leaves out (the JSON names them)
    not_priced_what: str
    tensors: int | None  # the published weight_map count, when read
    counted: int  # peakmem's count of stored tensors

    @property
    def error(self) -> float:
        """(priced + not priced) / published - 1."""
        return (self.priced + self.not_priced) / self.published - 1

    @property
    def error_priced_only(self) -> float:
        return self.priced / self.published - 1


def load(path: Path = DATA) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def shipped_format(config: dict[str, Any], override: str | None = None) -> WeightFormat:
    """The format the checkpoint stores: ``override`` (a JSON ``weights``), else its quantization_config's,
    else its torch_dtype's."""
    if override:
        return parse_weight_format(override)
    ck = checkpoint_weights(config)
    if ck is not None and ck.weights:
        return parse_weight_format(ck.weights)
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
    dtype = config.get("torch_dtype") or config.get("dtype") or text.get("torch_dtype")
    return parse_weight_format(TORCH_DTYPES.get(str(dtype), DEFAULT_DTYPE))


def stored_tensors(spec: ModelSpec, fmt: WeightFormat) -> int:
    """The tensors a checkpoint of ``spec`` stores in ``fmt``: one per parameter tensor and occurrence
    (a fused 3-D expert parameter is one), two per MXFP4 expert weight (blocks and scales), and a tied
    head none of its own (``spec`` already lists no head then). Float and MXFP4 checkpoints only."""
    n = 0
    for t, count in spec.tensors():
        per = 1 if len(t.shape) >= 3 else t.copies
        if fmt.scheme is Scheme.MXFP4 and t.kind == "expert_weight":
            per *= MXFP4_TENSORS_PER_WEIGHT
        n += per * count
    return n


def _not_priced(entry: dict[str, Any], spec: ModelSpec, config: dict[str, Any], fmt: WeightFormat) -> int:
    """Bytes of what the JSON says the checkpoint stores and peakmem leaves out, each by its rule:
    ``mtp``: the MTP layers as peakmem prices a draft of them (:func:`mtp_draft_spec`) in the checkpoint's
    format plus their own embed_tokens and shared_head.head copies (the checkpoint stores both, bf16);
    else the entry's hand-derived ``bytes``."""
    total = 0
    for part in entry.get("not_priced", ()):
        if part.get("rule") == "mtp":
            layers = mtp_layers(config)
            copies = sum(t.numel for t in spec.outer if t.component in ("embeddings", "head"))
            total += (
                weight_bytes(mtp_draft_spec(spec, layers), fmt)
                + layers * copies * FLOAT_BYTES[fmt.float_dtype]
            )
        else:
            total += int(part["bytes"])
    return total


def row(entry: dict[str, Any]) -> Row:
    name, config = resolve_config(entry["model"])
    spec = resolve_model(entry["model"])
    fmt = shipped_format(config, entry.get("weights"))
    return Row(
        model=name, weights=fmt.name, tied=spec.tie_word_embeddings, published=int(entry["value"]),
        value_is=entry["value_is"], priced=weight_bytes(spec, fmt),
        not_priced=_not_priced(entry, spec, config, fmt),
        not_priced_what="; ".join(p["what"] for p in entry.get("not_priced", ())),
        tensors=entry.get("tensors"), counted=stored_tensors(spec, fmt),
    )  # fmt: skip


def rows(data: dict[str, Any] | None = None) -> list[Row]:
    return [row(e) for e in (data or load())["models"]]


def _table(found: list[Row]) -> str:
    head = (
        "| model | weights | tied | published (bytes) | is | peakmem | not priced | error | peakmem alone | "
        "tensors (index / peakmem) |\n|---|---|---|--:|---|--:|--:|--:|--:|---|"
    )
    lines = [head]
    for r in found:
        tensors = f"{r.tensors} / {r.counted}" if r.tensors is not None else ""
        extra = f"{r.not_priced:,} ({r.not_priced_what})" if r.not_priced else ""
        lines.append(
            f"| {r.model} | {r.weights} | {'yes' if r.tied else ''} | {r.published:,} | {r.value_is} | "
            f"{r.priced:,} | {extra} | {r.error:+.4%} | {r.error_priced_only:+.3%} | {tensors} |"
        )
    return "\n".join(lines)


def main() -> int:
    data = load()
    found = rows(data)
    print(_table(found))
    off = [r.model for r in found if abs(r.error) > data["tolerance"]]
    if off:
        print(f"\noff by more than {data['tolerance']:.0%}: {', '.join(off)}")
    return 1 if off else 0


if __name__ == "__main__":
    sys.exit(main())
