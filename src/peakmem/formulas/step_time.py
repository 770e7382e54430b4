"""Step time: a FLOPs-based model of one optimizer step, to rank the changes that make a job fit.

It is a ranking model, not a promise: the absolute seconds hang on an assumed model-FLOPs
utilisation (MFU) per GPU generation, stated in :data:`MFU_BY_ARCH` and echoed in every answer.

Terms (each a named function below):

* compute: ``6 x N x tokens`` FLOPs for forward + backward (Kaplan et al. 2020, arXiv 2001.08361
  §2.1, ``C ~ 6N`` per token), with ``N`` the matmul parameters active per token (MoE: routed
  experts only), plus the attention scores ``QK^T`` and ``AV``: ``4 x s x d_attn`` forward FLOPs per
  token and layer (Narayanan et al. 2021, arXiv 2104.04473 §5.1 eq. 3: ``72 B s l h^2 (1 + s/6h +
  V/12lh)`` counts the same terms). Causal masking halves them only where a kernel skips the masked
  blocks: SDPA's ``is_causal`` and flash-attn 2 (``window_size`` too) compute ``w - w^2 / 2s`` keys per
  query on average (the flash-attn benchmarks count ``4 b s^2 h d / 2`` forward FLOPs when causal:
  benchmarks/benchmark_flash_attention.py ``flops``); eager attention and SDPA given a mask tensor
  (transformers passes one for sliding windows) compute every score and mask afterwards;
* backward = 2 x forward (same eq. 3); LoRA/QLoRA skip the frozen weights' gradients, so the weight
  matmuls' backward is ~1 x their forward (Hu et al. 2021, arXiv 2106.09685 §4.2 report 25 % faster
  training for that reason), while the attention scores, which have no weights, still need 2 x
  (gradients of q, k and v); the adapters themselves cost ``6 x`` their parameters per token (``C ~ 6N``
  again: ``r (d_in + d_out)`` per adapted weight), ``2 x`` more when recomputed;
* recompute: full checkpointing runs each layer's forward again (eq. 3's 4th pass, the ``96`` instead
  of ``72``); selective checkpointing recomputes only the attention core (Korthikanti et al. 2022,
  arXiv 2205.05198 §5, Table 4);
* pipeline bubble: ``(p - 1) / (m v)`` of the ideal time (Narayanan et al. 2021 §2.2, eq. 1-2);
* communication: ring collectives move ``2 (n-1)/n`` (all-reduce) or ``(n-1)/n`` (all-gather,
  reduce-scatter) of the buffer per GPU (Thakur, Rabenseifner & Gropp 2005, "Optimization of
  collective communication operations in MPICH"; NCCL ``nccl-tests/doc/PERFORMANCE.md`` bus
  bandwidth). Data-parallel gradient traffic overlaps with backward (Li et al. 2020, "PyTorch
  Distributed", VLDB 13(12) §3.2.3); what does not fit under it is exposed. ZeRO-3/FSDP move
  1.5 x the DDP volume (Rajbhandari et al. 2020, arXiv 1910.02054 §7.2). Megatron TP does 2
  all-reduces of the layer's activations in forward and 2 in backward per layer (Shoeybi et al.
  2019, arXiv 1909.08053 §3, Fig. 4), 2 more when the layer is recomputed; they are not overlapped;
* context parallelism (ring attention, Megatron-Core / TransformerEngine): each rank keeps ``s / cp``
  tokens of every sequence; per layer the K, V chunks travel ``cp - 1`` hops in forward and K, V plus
  their gradients in backward (3 x), overlapped with the attention core (Liu et al. 2023, "Ring
  Attention", arXiv 2310.01889 §3); what exceeds the attention's own time is exposed. Gradients are
  reduced over ``dp x cp`` ranks;
* expert parallelism: per MoE layer the top-k token copies go out and come back by all-to-all in
  forward and again in backward (4 x; 6 x with the recomputed forward), ``(ep-1)/ep`` of them off-rank,
  not overlapped (Megatron-Core ``MoEAlltoAllTokenDispatcher``); expert gradients are reduced over
  ``dp x cp / ep`` ranks, the expert weights being split ``ep`` ways;
* dequantization (QLoRA): bitsandbytes' ``MatMul4Bit`` dequantizes every frozen 4-bit weight to the
  compute dtype before ``F.linear``, in forward and again in backward (and in the recomputed forward);
  LLM.int8 only in backward (bitsandbytes/autograd/_functions.py; see :mod:`peakmem.formulas.qlora`).
  Each pass reads the packed weight with its scales and writes the 16-bit copy, at the datasheet
  memory bandwidth: a lower bound (the 16-bit copy's read by the matmul is what LoRA's matmul reads);
* offload: ZeRO-Offload moves 16-bit gradients to the CPU and 16-bit parameters back once per step
  (Ren et al. 2021, arXiv 2101.06840 §4.1) over PCIe, and runs the optimizer on the CPU, bound by
  its memory bandwidth; parameter offload (ZeRO-Infinity) fetches the 16-bit parameters in every
  forward and backward. Transfers are not overlapped here (a pessimistic bound).

Pure and cheap: :func:`spec_flops` walks the tensors once per model; :func:`step_time` is
arithmetic, so a planner can score tens of thousands of layouts per second.
"""

from __future__ import annotations

from dataclasses import dataclass

from peakmem.adapters import quant_of
from peakmem.device import Gpu
from peakmem.errors import InputError
from peakmem.formulas.activations.op_sac import op_saved_linears
from peakmem.formulas.qlora import quantized_params
from peakmem.formulas.weights import bnb_4bit_bytes
from peakmem.model import ModelSpec
from peakmem.training import (
    AttentionKernel,
    Checkpointing,
    KernelPolicy,
    Method,
    TrainingSetup,
    checkpointed_layers,
)

GBs = 1e9  # GB/s -> bytes/s
TFLOPs = 1e12

# --- assumed MFU per GPU generation ------------------------------------------------------------------
# Model FLOPs utilisation of well-tuned bf16 training: an ASSUMPTION, echoed in every answer.
MFU_BY_ARCH: dict[str, tuple[float, str]] = {
    "volta": (0.30, "Shoeybi et al. 2019 (Megatron-LM) §5.1: 39 TFLOPS/V100 = 30% of peak"),
    "turing": (0.30, "assumed as Volta (no published large-scale training report)"),
    "ampere": (
        0.50,
        "Narayanan et al. 2021 §5.1: 163 TFLOPS/A100 = 52% of peak (1T model, 3072 GPUs); "
        "MosaicML LLM Foundry benchmarks report 40-55% on A100",
    ),
    "ada": (0.40, "assumed: consumer/workstation cards, no published large-scale report"),
    "hopper": (0.40, "Dubey et al. 2024 (Llama 3) Table 4: 38-43% bf16 MFU on 8-16K H100"),
    "blackwell": (0.40, "assumed as Hopper (no published large-scale report yet)"),
    "cdna2": (0.30, "assumed (no published large-scale report; ROCm kernels less tuned)"),
    "cdna3": (0.30, "assumed (no published large-scale report; ROCm kernels less tuned)"),
    "apple": (0.20, "assumed (Metal/MPS training kernels; no published report)"),
}
DEFAULT_MFU = (0.35, "assumed (unknown GPU generation)")
# A plain memory size (``--gpu 24GB``) has no rates: the step-time model borrows this GPU's (the
# resolver looks it up in the catalog and hands it over as ``Gpu.rates_from``).
REFERENCE_GPU = "a100-80gb"

# --- links ---------------------------------------------------------------------------------------------
# PCIe x16, per direction, theoretical (PCI-SIG): gen3 15.75 GB/s, gen4 31.5 GB/s, gen5 63 GB/s.
PCIE_GBPS_BY_ARCH: dict[str, tuple[float, str]] = {
    "volta": (15.75, "PCIe 3.0 x16"), "turing": (15.75, "PCIe 3.0 x16"),
    "ampere": (31.5, "PCIe 4.0 x16"), "ada": (31.5, "PCIe 4.0 x16"), "cdna2": (31.5, "PCIe 4.0 x16"),
    "hopper": (63.0, "PCIe 5.0 x16"), "blackwell": (63.0, "PCIe 5.0 x16"), "cdna3": (63.0, "PCIe 5.0 x16"),
}  # fmt: skip
DEFAULT_PCIE = (31.5, "PCIe 4.0 x16 (assumed)")
# GPU-to-GPU inside a node, per GPU and direction (half the bidirectional datasheet figure).
NVLINK_GBPS: dict[str, tuple[float, str]] = {
    "v100-16gb": (150.0, "NVLink 2: 300 GB/s bidirectional (V100 SXM2 datasheet)"),
    "v100-32gb": (150.0, "NVLink 2: 300 GB/s bidirectional (V100 SXM2 datasheet)"),
    "a100-40gb": (300.0, "NVLink 3: 600 GB/s bidirectional (A100 datasheet)"),
    "a100-80gb": (300.0, "NVLink 3: 600 GB/s bidirectional (A100 datasheet)"),
    "h100-sxm": (450.0, "NVLink 4: 900 GB/s bidirectional (H100 datasheet)"),
    "h200": (450.0, "NVLink 4: 900 GB/s bidirectional (H200 datasheet)"),
    "h20": (450.0, "NVLink 4: 900 GB/s bidirectional (H20 product brief)"),
    "gh200": (450.0, "NVLink 4: 900 GB/s bidirectional (GH200 datasheet)"),
    "b200": (900.0, "NVLink 5: 1.8 TB/s bidirectional (B200 datasheet)"),
    "mi300x": (448.0, "Infinity Fabric: 7 links x 128 GB/s bidirectional (MI300X datasheet)"),
    "mi325x": (448.0, "Infinity Fabric: 7 links x 128 GB/s bidirectional (MI325X datasheet)"),
}
# Between nodes, per GPU and direction: one 400 Gb/s NDR InfiniBand NIC per GPU (DGX H100/B200:
# 8 x ConnectX-7), 200 Gb/s HDR per GPU on DGX A100 (8 x ConnectX-6). Others: assumed HDR.
INTER_NODE_GBPS_BY_ARCH: dict[str, tuple[float, str]] = {
    "hopper": (50.0, "InfiniBand NDR 400 Gb/s per GPU (DGX H100)"),
    "blackwell": (50.0, "InfiniBand NDR 400 Gb/s per GPU (DGX B200)"),
    "ampere": (25.0, "InfiniBand HDR 200 Gb/s per GPU (DGX A100)"),
}
DEFAULT_INTER_NODE = (25.0, "InfiniBand HDR 200 Gb/s per GPU (assumed)")
# Host memory bandwidth the CPU optimizer step is bound by (ZeRO-Offload CPU-Adam): an ASSUMPTION,
# ~ one socket of 8-channel DDR4-3200 (204.8 GB/s theoretical) at ~50 % efficiency.
CPU_OPTIMIZER_GBPS = 100.0
# Bytes the CPU Adam step touches per parameter: read fp32 grad, m, v, master (16), write m, v,
# master (12), write the 16-bit parameter for the copy back (2) (deepspeed/ops/adam/cpu_adam.py).
CPU_ADAM_BYTES_PER_PARAM = 30
HALF_BYTES = 2  # 16-bit gradients / parameters on the wire (bf16/fp16)
# Share of compute a data-parallel collective can hide under: DDP/ZeRO-1/2 reduce during backward
# (2/3 of forward+backward FLOPs); ZeRO-3/FSDP also prefetch parameters during forward.
DP_OVERLAP_BACKWARD = 2 / 3
DP_OVERLAP_SHARDED = 1.0


@dataclass(frozen=True, kw_only=True)
class Rates:
    """What the step-time model assumes about one GPU and its links."""

    gpu: str
    tflops: float  # dense 16-bit tensor peak
    mfu: float
    mfu_source: str
    pcie_gbps: float
    pcie_source: str
    hbm_gbps: float  # device memory bandwidth (datasheet): QLoRA's dequantization
    intra_node_gbps: float  # NVLink / Infinity Fabric, or PCIe when the card has neither
    intra_node_source: str
    inter_node_gbps: float
    inter_node_source: str
    borrowed_from: str = ""  # a plain size borrows the reference GPU's rates

    def notes(self) -> tuple[str, ...]:
        out = [
            f"step time: MFU {self.mfu:.0%} of {self.tflops:g} TFLOPS dense bf16 ({self.gpu}) is an "
            f"ASSUMPTION ({self.mfu_source})",
            f"links: host {self.pcie_gbps:g} GB/s ({self.pcie_source}); GPU-GPU in a node "
            f"{self.intra_node_gbps:g} GB/s ({self.intra_node_source}); across nodes "
            f"{self.inter_node_gbps:g} GB/s ({self.inter_node_source})",
        ]
        if self.borrowed_from:
            out.append(f"a plain memory size has no rates: {self.borrowed_from}'s are used for step time")
        return tuple(out)


def rates_for(gpu: Gpu) -> Rates:
    """The rates of ``gpu``; a plain size (no TFLOPS or bandwidth) borrows those of its ``rates_from``
    (:data:`REFERENCE_GPU` for :func:`peakmem.resolve.gpu_of_size`)."""
    borrowed = ""
    if not gpu.has_rates:
        ref = gpu.rates_from
        if ref is None or not ref.has_rates:
            raise InputError(
                f"gpu={gpu.name!r} states no TFLOPS or bandwidth and borrows no GPU's rates "
                f"(rates_from); a plain size borrows {REFERENCE_GPU}'s (peakmem.resolve.gpu_of_size)"
            )
        borrowed, gpu = ref.display_name, ref
    assert gpu.bf16_tflops is not None and gpu.bandwidth_gbps is not None
    mfu, mfu_src = MFU_BY_ARCH.get(gpu.architecture, DEFAULT_MFU)
    pcie, pcie_src = PCIE_GBPS_BY_ARCH.get(gpu.architecture, DEFAULT_PCIE)
    intra, intra_src = NVLINK_GBPS.get(gpu.name, (pcie, f"{pcie_src} peer-to-peer (no NVLink)"))
    inter, inter_src = INTER_NODE_GBPS_BY_ARCH.get(gpu.architecture, DEFAULT_INTER_NODE)
    return Rates(
        gpu=gpu.display_name, tflops=gpu.bf16_tflops, mfu=mfu, mfu_source=mfu_src, pcie_gbps=pcie,
        pcie_source=pcie_src, hbm_gbps=gpu.bandwidth_gbps, intra_node_gbps=intra,
        intra_node_source=intra_src, inter_node_gbps=inter, inter_node_source=inter_src,
        borrowed_from=borrowed,
    )  # fmt: skip


# --- FLOPs ----------------------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class SpecFlops:
    """Per-model FLOP coefficients, computed once (:func:`spec_flops`)."""

    matmul_params: int  # active parameters used in a matmul per token (embeddings lookups excluded)
    layer_matmul_params: int  # the part inside the transformer layers (what checkpointing recomputes)
    attention: tuple[tuple[int, int, int | None], ...]  # (layers, q_width + v_width, sliding window)
    hidden_size: int
    num_layers: int
    quantized_params: int = 0  # weights QLoRA's bitsandbytes base stores quantized (qlora.is_quantized)
    causal: bool = True  # a decoder: each query attends to the keys before it
    kv_elems: int = 0  # K and V elements per token over all layers (ring attention's traffic)
    moe_copies: int = 0  # routed copies of a token over all MoE layers (sum of top-k): all-to-all traffic
    expert_params: int = 0  # expert weights (split over ep ranks)
    kernels: tuple[str, ...] = ("eager", "sdpa", "flash")  # transformers' for this architecture
    # of layer_matmul_params: the Linears whose outputs op-level selective checkpointing keeps
    # (peakmem.formulas.activations.op_sac.op_saved_linears), not recomputed under ``op``
    op_saved_params: int = 0

    def attention_flops_per_token(self, seq_len: int, kernel: AttentionKernel) -> float:
        """Forward ``QK^T`` + ``AV`` FLOPs per token over all layers: ``2 x span x (d_q + d_v)`` each,
        ``span`` the keys whose scores ``kernel`` computes per query (:meth:`span`)."""
        return sum(count * 2.0 * self.span(seq_len, window, kernel) * width
                   for count, width, window in self.attention)  # fmt: skip

    def span(self, seq_len: int, window: int | None, kernel: AttentionKernel) -> float:
        """Keys per query, on average, whose scores are computed: a kernel that skips masked blocks
        computes ``min(i + 1, w)`` for query ``i`` (``w - w^2 / 2s`` on average; ``s / 2`` when causal
        without a window); eager attention, SDPA given a mask tensor (a sliding window) and encoders
        compute all ``s``."""
        w = seq_len if window is None else min(window, seq_len)
        skips = kernel is AttentionKernel.FLASH or (kernel is AttentionKernel.SDPA and w == seq_len)
        if not self.causal or not skips:
            return float(seq_len)
        return w - w * w / (2.0 * seq_len)

    def kernel(self, setup: TrainingSetup) -> AttentionKernel:
        """The kernel that runs: the one asked for, or eager where transformers has none (BLOOM, Gemma 2)."""
        return setup.attention if setup.attention.value in self.kernels else AttentionKernel.EAGER


_LOOKUP_COMPONENTS = ("embeddings", "positions")


def _op_saved_params(spec: ModelSpec) -> int:
    """Weights of the Linears whose outputs op-level selective checkpointing keeps, over all layers."""
    total = 0
    for g in spec.groups:
        if g.layer.derived is not None:
            continue
        kept = {f"{name}.weight" for name in op_saved_linears(g.layer)}
        total += g.count * sum(t.numel for t in g.layer.tensors if t.name in kept)
    return total


def spec_flops(spec: ModelSpec) -> SpecFlops:
    """Matmul parameters per token: active parameters less lookups and norms; a tied head still
    multiplies by the embedding matrix (``vocab x hidden``)."""
    lookup = norms = 0
    for t, n in spec.tensors():
        if t.component in _LOOKUP_COMPONENTS:
            lookup += t.numel * n
        elif t.kind == "norm":
            norms += t.numel * n
    matmul = spec.active_params - lookup - norms
    outer_matmul = sum(
        t.numel for t in spec.outer if t.component not in _LOOKUP_COMPONENTS and t.kind != "norm"
    )
    if spec.tie_word_embeddings:
        matmul += spec.vocab_size * spec.head_in_features
        outer_matmul += spec.vocab_size * spec.head_in_features
    attention = tuple(
        (g.count, g.layer.attention.num_heads * (g.layer.attention.head_dim + g.layer.attention.v_head_dim),
         g.layer.attention.sliding_window)
        for g in spec.groups
    )  # fmt: skip
    return SpecFlops(
        matmul_params=matmul, layer_matmul_params=max(0, matmul - outer_matmul), attention=attention,
        hidden_size=spec.hidden_size, num_layers=spec.num_layers, quantized_params=quantized_params(spec),
        causal=spec.task == "causal-lm", kernels=spec.attention_kernels,
        op_saved_params=_op_saved_params(spec),
        kv_elems=sum(g.count * g.layer.attention.num_kv_heads
                     * (g.layer.attention.head_dim + g.layer.attention.v_head_dim) for g in spec.groups),
        moe_copies=sum(g.count * g.layer.mlp.experts_per_token for g in spec.groups if g.layer.mlp.is_moe),
        expert_params=sum(t.numel * n for t, n in spec.tensors() if t.kind == "expert_weight"),
    )  # fmt: skip


def weight_backward_factor(setup: TrainingSetup) -> float:
    """Backward FLOPs of the weight matmuls as a multiple of their forward: 2 (input and weight
    gradients), 1 for adapters (frozen weights need no weight gradient)."""
    return 1.0 if setup.method in (Method.LORA, Method.QLORA) else 2.0


ATTENTION_BACKWARD_FACTOR = 2.0  # dQ, dK, dV: two matmuls per forward one (Narayanan et al. 2021 eq. 3)


ADAPTER_FLOPS_PER_PARAM = 6.0  # forward 2, backward 4 (input and weight gradients): Kaplan's C ~ 6N


def forward_backward_flops_per_token(
    sf: SpecFlops, setup: TrainingSetup, *, adapter_params: int = 0
) -> float:
    """Forward and backward FLOPs per token (no recompute); ``adapter_params``: LoRA's trainable
    parameters (0 for full fine-tuning, whose weights ``sf.matmul_params`` counts)."""
    matmul = 2.0 * sf.matmul_params
    attention = sf.attention_flops_per_token(setup.seq_len, sf.kernel(setup))
    return (matmul * (1.0 + weight_backward_factor(setup)) + attention * (1.0 + ATTENTION_BACKWARD_FACTOR)
            + ADAPTER_FLOPS_PER_PARAM * adapter_params)  # fmt: skip


def recompute_flops_per_token(sf: SpecFlops, setup: TrainingSetup, *, adapter_params: int = 0) -> float:
    """Extra forward FLOPs checkpointing spends: every layer with its adapters (full; every N-th
    layer's share of them under ``every-N``, peakmem.training.checkpointed_layers), the attention
    core (selective)."""
    attention = sf.attention_flops_per_token(setup.seq_len, sf.kernel(setup))
    if setup.checkpointing is Checkpointing.FULL:
        full = 2.0 * sf.layer_matmul_params + attention + 2.0 * adapter_params
        if setup.checkpoint_every == 1:
            return full
        wrapped = checkpointed_layers(sf.num_layers, setup.checkpoint_every, setup.framework)
        return full * sum(wrapped) / sf.num_layers
    if setup.checkpointing is Checkpointing.SELECTIVE:
        return attention
    if setup.checkpointing is Checkpointing.OP:  # the matmuls not kept; attention unless SDPA's is kept
        kept = setup.kernel_policy is KernelPolicy.CUDA and sf.kernel(setup) is AttentionKernel.SDPA
        return 2.0 * (sf.layer_matmul_params - sf.op_saved_params) + (0.0 if kept else attention)
    return 0.0


def training_flops_per_token(sf: SpecFlops, setup: TrainingSetup, *, adapter_params: int = 0) -> float:
    """Forward + backward + recompute FLOPs per trained token."""
    return (forward_backward_flops_per_token(sf, setup, adapter_params=adapter_params)
            + recompute_flops_per_token(sf, setup, adapter_params=adapter_params))  # fmt: skip


DEQUANT_WRITE_BYTES = 2  # the dequantized copy, in the 16-bit compute dtype


def dequant_passes(setup: TrainingSetup) -> int:
    """Dequantizations of each frozen weight per micro-batch: 4-bit in forward, backward and the
    recomputed forward (full checkpointing); LLM.int8 in backward only (its forward is an int8 matmul)."""
    quant = quant_of(setup)
    if quant is None:
        return 0
    if not quant.is_4bit:
        return 1
    return 3 if setup.checkpointing is Checkpointing.FULL else 2


def dequant_bytes(sf: SpecFlops, setup: TrainingSetup) -> int:
    """HBM bytes one dequantization pass over the quantized weights moves: the packed weights and
    their scales read (``bnb_4bit_bytes`` over all of them as one tensor: per-tensor block rounding and
    codes, < 0.1 %, left out; int8: 1 B per weight, the per-row scales left out), the 16-bit copy written."""
    quant = quant_of(setup)
    if quant is None:
        return 0
    q = sf.quantized_params
    packed = q  # int8
    if quant.is_4bit:
        packed = bnb_4bit_bytes(q, blocksize=quant.blocksize, double_quant=quant.double_quant)
    return packed + q * DEQUANT_WRITE_BYTES


# --- collectives ------------------------------------------------------------------------------------
def all_reduce_s(nbytes: float, n: int, gbps: float) -> float:
    """Ring all-reduce: each GPU sends and receives ``2 (n-1)/n`` of the buffer."""
    return 0.0 if n <= 1 else 2.0 * (n - 1) / n * nbytes / (gbps * GBs)


def all_gather_s(nbytes: float, n: int, gbps: float) -> float:
    """Ring all-gather (or reduce-scatter) of a ``nbytes`` full buffer: ``(n-1)/n`` of it per GPU."""
    return 0.0 if n <= 1 else (n - 1) / n * nbytes / (gbps * GBs)


reduce_scatter_s = all_gather_s


# --- the step -------------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class Layout:
    """What the time model needs of a layout (a subset of :class:`~peakmem.parallel.Parallelism`)."""

    gpus: int = 1
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    virtual_stages: int = 1
    gpus_per_node: int = 8
    engine: str = "none"  # none | ddp | zero-1 | zero-2 | zero-3 | fsdp-full | fsdp-grad-op
    offload_optimizer: bool = False
    offload_params: bool = False

    @property
    def dp(self) -> int:
        return self.gpus // (self.tp * self.pp * self.cp)


@dataclass(frozen=True, kw_only=True)
class StepTime:
    """Seconds of one optimizer step (``micro_batch x grad_accum`` sequences per data-parallel rank)."""

    compute_s: float  # forward + backward at the assumed MFU
    recompute_s: float  # checkpointing's extra forward
    bubble_s: float  # pipeline fill and drain
    tp_comm_s: float
    dp_comm_s: float  # exposed (not hidden under backward)
    pp_comm_s: float
    offload_s: float  # PCIe traffic + CPU optimizer step
    dequant_s: float = 0.0  # QLoRA: frozen weights dequantized in each pass (memory-bound)
    cp_comm_s: float = 0.0  # ring attention's K/V traffic not hidden under the attention core
    ep_comm_s: float = 0.0  # expert-parallel all-to-alls
    gpus: int
    tokens: int  # tokens per optimizer step, all ranks together

    @property
    def total_s(self) -> float:
        return (self.compute_s + self.recompute_s + self.bubble_s + self.tp_comm_s + self.dp_comm_s
                + self.pp_comm_s + self.cp_comm_s + self.ep_comm_s + self.offload_s
                + self.dequant_s)  # fmt: skip

    def overheads(self) -> tuple[tuple[str, float], ...]:
        """The seconds beyond forward and backward compute, by term, largest first (zero terms left out):
        what a change's cost is made of."""
        terms = (("recompute", self.recompute_s), ("pipeline bubble", self.bubble_s),
                 ("tensor-parallel comm", self.tp_comm_s), ("data-parallel comm", self.dp_comm_s),
                 ("pipeline comm", self.pp_comm_s), ("ring attention comm", self.cp_comm_s),
                 ("expert all-to-all", self.ep_comm_s), ("offload", self.offload_s),
                 ("dequantization", self.dequant_s))  # fmt: skip
        return tuple(sorted(((n, t) for n, t in terms if t > 0), key=lambda nt: -nt[1]))

    @property
    def gpu_seconds(self) -> float:
        """GPU time per step: what the step costs."""
        return self.total_s * self.gpus

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.total_s if self.total_s > 0 else 0.0


def _group_bandwidth(span: int, layout: Layout, rates: Rates) -> float:
    """A group whose ranks lie within ``span`` consecutive GPUs (Megatron's order tp-cp-ep-dp-pp, tp
    innermost) talks over NVLink while ``span`` fits in a node, else over the inter-node link."""
    return rates.intra_node_gbps if span <= layout.gpus_per_node else rates.inter_node_gbps


def _dp_bandwidth(layout: Layout, rates: Rates) -> float:
    """Gradients are reduced over dp x cp ranks, spanning tp x cp x dp GPUs."""
    return _group_bandwidth(layout.tp * layout.cp * layout.dp, layout, rates)


def _pp_bandwidth(layout: Layout, rates: Rates) -> float:
    return rates.intra_node_gbps if layout.gpus <= layout.gpus_per_node else rates.inter_node_gbps


def step_time(
    sf: SpecFlops, setup: TrainingSetup, rates: Rates, layout: Layout, *, trainable_params: int, params: int
) -> StepTime:
    """One optimizer step of ``setup`` under ``layout`` on GPUs with ``rates``.

    ``params`` / ``trainable_params``: the model's totals (the data moved by DP and offload)."""
    flops_rate = rates.tflops * TFLOPs * rates.mfu
    cp = layout.cp
    mb_tokens = setup.micro_batch * setup.seq_len
    rank_tokens = mb_tokens * setup.grad_accum
    model_par = layout.tp * layout.pp  # the weights' split (cp and dp ranks hold copies)
    work_par = model_par * cp  # the split of a micro-batch's work
    adapters = trainable_params if setup.method in (Method.LORA, Method.QLORA) else 0
    compute = forward_backward_flops_per_token(sf, setup, adapter_params=adapters) * rank_tokens / work_par
    recompute = recompute_flops_per_token(sf, setup, adapter_params=adapters) * rank_tokens / work_par
    compute, recompute = compute / flops_rate, recompute / flops_rate
    m = setup.grad_accum
    bubble = (compute + recompute) * (layout.pp - 1) / (m * layout.virtual_stages) if layout.pp > 1 else 0.0

    # Megatron TP: 2 all-reduces of (tokens x hidden) 16-bit activations per layer in forward, 2 in
    # backward, 2 more when the layer's forward is recomputed.
    tp_comm = 0.0
    if layout.tp > 1:
        per_layer = 4 + (2 if setup.checkpointing is Checkpointing.FULL else 0)
        layers = -(-sf.num_layers // layout.pp)
        act_bytes = mb_tokens / cp * sf.hidden_size * HALF_BYTES
        tp_comm = per_layer * layers * m * all_reduce_s(act_bytes, layout.tp, rates.intra_node_gbps)

    full = setup.checkpointing is Checkpointing.FULL
    cp_comm = _cp_comm_s(sf, setup, rates, layout, flops_rate) if cp > 1 else 0.0
    ep_comm = 0.0
    if layout.ep > 1 and sf.moe_copies:
        # per micro-batch: dispatch + combine in forward and in backward (and the recomputed forward)
        copies = mb_tokens / cp * sf.moe_copies / layout.pp * sf.hidden_size * HALF_BYTES
        bw = _group_bandwidth(layout.tp * cp * layout.ep, layout, rates)
        ep_comm = m * (6 if full else 4) * (layout.ep - 1) / layout.ep * copies / (bw * GBs)

    # Data parallel: 16-bit gradients of the rank's share of the trainable parameters (expert weights
    # split ep ways more), reduced over dp x cp ranks.
    dp_comm = 0.0
    dp = layout.dp * cp
    expert_share = sf.expert_params / params if params else 0.0
    local_share = (1.0 - expert_share) / model_par + expert_share / (model_par * layout.ep)
    if dp > 1 and layout.engine != "none":
        bw = _dp_bandwidth(layout, rates)
        grad_bytes = trainable_params * local_share * HALF_BYTES
        param_bytes = params * local_share * HALF_BYTES
        if layout.engine in ("zero-3", "fsdp-full"):
            # per micro-batch: parameters gathered for forward and again for backward, grads
            # reduce-scattered; prefetching hides them under forward and backward
            raw = m * (2 * all_gather_s(param_bytes, dp, bw) + reduce_scatter_s(grad_bytes, dp, bw))
            hidden = DP_OVERLAP_SHARDED * (compute + recompute)
        elif layout.engine in ("zero-2", "fsdp-grad-op"):
            # gradients reduce-scattered in every micro-batch's backward; 16-bit parameters gathered
            # after the step
            raw = m * reduce_scatter_s(grad_bytes, dp, bw) + all_gather_s(param_bytes, dp, bw)
            hidden = DP_OVERLAP_BACKWARD * (compute + recompute)
        else:  # ddp / zero-1: one all-reduce in the last micro-batch's backward (no_sync before it)
            raw = all_reduce_s(grad_bytes, dp, bw)
            hidden = DP_OVERLAP_BACKWARD * (compute + recompute) / m
        dp_comm = max(0.0, raw - hidden)

    # Pipeline: each stage boundary sends a micro-batch's activations forward and its gradient back.
    pp_comm = 0.0
    if layout.pp > 1:
        p2p_bytes = mb_tokens * sf.hidden_size * HALF_BYTES / layout.tp
        pp_comm = 2 * m * p2p_bytes / (_pp_bandwidth(layout, rates) * GBs)

    offload: float = 0.0
    shard = max(1, dp) if layout.engine in ("zero-1", "zero-2", "zero-3", "fsdp-full", "fsdp-grad-op") else 1
    local_trainable = trainable_params * local_share / shard
    if layout.offload_optimizer:
        pcie = 2 * local_trainable * HALF_BYTES / (rates.pcie_gbps * GBs)  # grads down, params up
        cpu = local_trainable * CPU_ADAM_BYTES_PER_PARAM / (CPU_OPTIMIZER_GBPS * GBs)
        offload += pcie + cpu
    if layout.offload_params:
        local_params = params * local_share / shard
        offload += m * 2 * local_params * HALF_BYTES / (rates.pcie_gbps * GBs)  # fetched for fwd and bwd

    # QLoRA: each micro-batch dequantizes the rank's share of the frozen weights in every pass
    dequant = m * dequant_passes(setup) * dequant_bytes(sf, setup) / model_par / (rates.hbm_gbps * GBs)

    return StepTime(
        compute_s=compute, recompute_s=recompute, bubble_s=bubble, tp_comm_s=tp_comm, dp_comm_s=dp_comm,
        pp_comm_s=pp_comm, offload_s=offload, dequant_s=dequant, cp_comm_s=cp_comm, ep_comm_s=ep_comm,
        gpus=layout.gpus, tokens=rank_tokens * max(1, layout.dp),
    )  # fmt: skip


def _cp_comm_s(sf: SpecFlops, setup: TrainingSetup, rates: Rates, layout: Layout, flops_rate: float) -> float:
    """Ring attention's exposed time per step: K, V chunks over ``cp - 1`` hops in forward, K, V and
    their gradients in backward (and the recomputed forward's hops under checkpointing), less the
    attention core's own time, under which the hops run."""
    cp = layout.cp
    kernel = sf.kernel(setup)
    local_tokens = setup.micro_batch * setup.seq_len / cp
    chunk = local_tokens * sf.kv_elems / layout.tp / layout.pp * HALF_BYTES  # this stage's layers
    recomputed = setup.checkpointing is not Checkpointing.NONE
    hops = (cp - 1) * (3 + (1 if recomputed else 0))
    raw = setup.grad_accum * hops * chunk / (_group_bandwidth(layout.tp * cp, layout, rates) * GBs)
    passes = 1.0 + ATTENTION_BACKWARD_FACTOR + (1.0 if recomputed else 0.0)
    attention = sf.attention_flops_per_token(setup.seq_len, kernel) * passes
    hidden = attention * setup.micro_batch * setup.seq_len * setup.grad_accum / (layout.tp * layout.pp * cp)
    return max(0.0, raw - hidden / flops_rate)


__all__ = [
    "MFU_BY_ARCH", "Layout", "Rates", "SpecFlops", "StepTime", "all_gather_s", "all_reduce_s",
    "dequant_bytes", "dequant_passes", "rates_for", "reduce_scatter_s", "spec_flops", "step_time",
    "training_flops_per_token",
]  # fmt: skip
