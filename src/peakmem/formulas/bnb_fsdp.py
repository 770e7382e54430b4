"""A bitsandbytes-quantized base under FSDP: the packed weights are sharded, their quantization states not.

transformers' QLoRA under FSDP loads ``BitsAndBytesConfig(bnb_4bit_quant_storage=<the float dtype>)``
(fms-acceleration@876e2ed plugins/accelerated-peft framework_plugin_bnb.py; transformers 4.48.1 trainer.py
``_fsdp_qlora_plugin_updates``) so that FSDP can flatten ``Params4bit`` with the float parameters. What FSDP
flattens, shards and all-gathers is each parameter's data: the packed 4-bit values. The ``QuantState``
(absmax; with double quantization the nested absmax, codes and offset) is a Python attribute of the
``Params4bit`` and of its ``Linear4bit`` (bitsandbytes 0.43.3 nn/modules.py ``Params4bit._quantize``:
``self.module.quant_state = quant_state``), which FSDP does not see: every rank keeps all of them, and
``fix_4bit_weight_quant_state_from_module`` hands them back to the gathered weight in forward ("the quant
state got lost when the parameter got converted. This happens for example for fsdp"). LLM.int8's ``SCB``
is an attribute of ``Int8Params`` the same way. Bytes: :func:`peakmem.formulas.qlora.quant_state_bytes`.
"""

from __future__ import annotations

from peakmem.breakdown import Category, PerParamRow

from .technique import Technique

SRC_BNB_FSDP = (
    "bitsandbytes 0.43.3 nn/modules.py: Params4bit.quant_state / Linear4bit.quant_state are attributes, not "
    "parameter data (fix_4bit_weight_quant_state_from_module: 'This happens for example for fsdp'): FSDP "
    "shards and gathers the packed weights only; every rank keeps every quantization state"
)


def state_share(tech: Technique, layer_numel: int) -> int:
    """The quantization-state bytes of ``layer_numel`` of the base elements inside the layers
    (``tech.frozen_state_bytes`` spread as ``sharding._frozen_bytes`` spreads the frozen bytes: by
    elements)."""
    layer_total = tech.params - tech.root_numel
    return -(-tech.frozen_state_bytes * layer_numel // layer_total) if layer_total else 0


def state_rows(tech: Technique, state_bytes: int) -> tuple[PerParamRow, ...]:
    """The rank's quantization states as a row of their own. Under FSDP's parameter offload they are
    counted with the offloaded shards: where a job keeps them then (FSDP's ``CPUOffload`` moves the flat
    shards only; ``Params4bit.to`` moves its ``quant_state`` with its data) was not read."""
    if not state_bytes:
        return ()
    return (PerParamRow(tensor="bitsandbytes quantization states (whole on every rank)", dtype="uint8+fp32",
                        bytes_per_param=state_bytes / tech.params if tech.params else 0.0, bytes=state_bytes,
                        params=0, category=Category.PARAMETERS, source=SRC_BNB_FSDP),)  # fmt: skip


def gathered_unit(unit_bytes: int, state_bytes: int) -> int:
    """A unit's all-gathered frozen bytes: its stored bytes without the quantization states, which are
    never gathered (each rank already holds them)."""
    return unit_bytes - state_bytes
