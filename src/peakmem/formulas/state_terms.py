"""What one rank's model states and model loading come to, in the terms DeepSpeed's own estimator uses
(``estimate_zero2/zero3_model_states_mem_needs``): a side-by-side check of :mod:`.sharding`'s rows
(benchmarks/peers.py) and the CPU RAM a rank needs to load the model (``ranks.py``)."""

from __future__ import annotations

from dataclasses import dataclass

from peakmem.model import ModelSpec
from peakmem.parallel import FsdpMode, Parallelism
from peakmem.training import TrainingSetup

from .model_parallel import StageParams
from .model_states import precision_plan
from .sharding import rank_states
from .technique import technique


def load_bytes_per_rank(spec: ModelSpec, setup: TrainingSetup, par: Parallelism, sp: StageParams) -> int:
    """CPU RAM one rank uses to load the model before the engine shards or moves it.

    Each rank materialises its (TP/PP-local) model in the dtype it is built in (fp32 for
    mixed/amp precision, as DeepSpeed's estimator assumes: ``4 * num_gpus_per_node`` bytes/param);
    with ``zero_init`` (deepspeed.zero.Init, FSDP ``cpu_ram_efficient_loading``) under ZeRO-3/FSDP
    only one layer at a time is materialised (the estimator's ``largest_layer_params * 4``)."""
    plan = precision_plan(setup.precision)
    dt = plan.master or plan.weight
    sharded_init = par.zero_stage == 3 or par.fsdp is not FsdpMode.NONE
    if par.zero_init and sharded_init:
        return dt.nbytes(max(sp.largest_tensor, sp.largest_unit))
    return dt.nbytes(sp.numel)


@dataclass(frozen=True, kw_only=True)
class ModelStateTerms:
    """Per-GPU and per-node-CPU model-state bytes in the terms DeepSpeed's estimator uses
    (``estimate_zero2/zero3_model_states_mem_needs`` in stage_1_and_2.py / stage3.py): parameters,
    gradients, master weights, optimizer states and fp32 gradients, plus (stage 3) the largest
    module's gathered parameters and gradients. No activations, buckets or context."""

    gpu: dict[str, int]
    cpu_per_node: dict[str, int]

    @property
    def gpu_bytes(self) -> int:
        return sum(self.gpu.values())

    @property
    def cpu_bytes(self) -> int:
        """CPU RAM per node: the larger of the pinned offload and the model-loading peak."""
        pinned = sum(v for k, v in self.cpu_per_node.items() if k != "model loading")
        return max(pinned, self.cpu_per_node.get("model loading", 0))


def zero_model_state_terms(spec: ModelSpec, setup: TrainingSetup, par: Parallelism) -> ModelStateTerms:
    """peakmem's ZeRO model states for one rank (pp=tp=1), itemised for a side-by-side check."""
    from .model_parallel import stage_params

    tech = technique(spec, setup)
    sp = stage_params(tech.spec, par, 0)
    st = rank_states(tech, setup, par, sp)
    gpu: dict[str, int] = {}
    for r in st.rows:
        gpu[r.tensor] = gpu.get(r.tensor, 0) + r.bytes
    for i in (*st.resident, *st.step_grads, *st.step):
        if i.key == "zero.ipg" or i.key.startswith(("optimizer.", "zero3.reduce")):
            continue  # buckets, reduce copies, optimizer temporaries: not model states in the estimator
        gpu[i.path] = gpu.get(i.path, 0) + i.bytes
    if par.zero_stage == 3:
        gpu["largest module gathered (16-bit params + grads)"] = tech.weight.nbytes(sp.largest_tensor) + (
            tech.grad.nbytes(sp.largest_tensor)
        )
    per_node = par.ranks_per_node
    cpu = {f"{i.path} x{per_node} ranks": i.bytes * per_node for i in st.cpu}
    cpu["model loading"] = load_bytes_per_rank(spec, setup, par, sp) * per_node
    return ModelStateTerms(gpu=gpu, cpu_per_node=cpu)
