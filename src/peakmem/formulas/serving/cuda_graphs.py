"""CUDA graph capture memory of vLLM and SGLang, per engine and release: a term of its own.

What the engines capture: one graph per batch size (vLLM: per token count), largest first, all into ONE
private memory pool that the smaller graphs reuse (vLLM ``graph_capture`` / ``CUDAGraphWrapper.graph_pool``;
SGLang ``global_graph_memory_pool``):

* vLLM V0 (before 0.8; ``vllm/worker/model_runner.py`` ``_BATCH_SIZES_TO_CAPTURE = [1, 2, 4] + [8 * i for i
  in range(1, 33)]``, up to max_num_seqs padded to 8): FULL decode graphs, 35 at the default
  max_num_seqs 256.
* vLLM V1 0.8-0.10 (``VllmConfig._set_cudagraph_sizes``): PIECEWISE graphs (each layer's attention runs
  eagerly between them) for ``[1, 2, 4] + range(8, max + 1, 8)`` tokens, max 512 (0.8-0.9) or
  ``min(2 x max_num_seqs, 512)`` (0.10): 67 graphs.
* vLLM 0.11+: FULL_AND_PIECEWISE (``vllm/config/compilation.py``): PIECEWISE graphs for mixed batches and
  FULL graphs for uniform decode batches of up to ``max_num_seqs x (1 + num_speculative_tokens)`` tokens.
  From 0.12 the sizes are ``[1, 2, 4] + range(8, min(max + 1, 256), 8) + range(256, max + 1, 16)`` with
  ``max = min(max_num_seqs x (1 + K) x 2, 512)``, capped at max_num_batched_tokens (``vllm/config/vllm.py``
  ``_set_cudagraph_sizes``): "Profiling CUDA graph memory: PIECEWISE=51 (largest=512), FULL=35
  (largest=256)" at the defaults.
* SGLang: FULL decode graphs for bs in ``[1, 2, 4, 8, 12] + range(16, 257, 8) + range(272, 513, 16)`` up
  to cuda_graph_max_bs, which is appended when missing (the runner's log "Capture cuda graph bs [1, 2, 4,
  8, 12, 16, 24, ..., 496, 512]", sglang PR #11716; "[1, 2, 4, 8, 10]" at max bs 10, sglang PR #27537);
  cuda_graph_max_bs SGLang's for the GPU and tp unless given (``peakmem.sglang_defaults``; 160 with no GPU).
* SGLang with speculative decoding (formulas/serving/sglang_graphs.py): the target's graphs verify ``bs x
  num_draft_tokens`` tokens, at most 48 batch sizes (max_running_requests); a draft model adds its draft
  decode runner (``speculative_num_steps - 1`` forwards in one graph per batch size) and its draft-extend
  runner, into the same pool, with static buffers of their own; every runner's buffers and the attention
  backends' CUDA-graph state (page tables / kv indices sized by the served context) are allocated outside the
  pool and are in SGLang's "mem usage" (:attr:`GraphMemory.static_bytes`).

What they hold, as vLLM estimates it (``gpu_model_runner.py`` ``profile_cudagraph_memory``: the first
capture's memory, then the second one's for each further graph): the largest capture's working set (one
decoder layer's temporaries at the largest size: formulas/serving/forward.py), which the pool keeps
and every smaller graph reuses, plus :data:`PER_GRAPH_BYTES` for each graph.

Where the engine accounts for it (:class:`Accounting`):

* vLLM 0.20+: ``determine_available_memory`` (``vllm/v1/worker/gpu_worker.py``) subtracts that estimate
  from the KV budget: the KV pool shrinks and the device stays within gpu_memory_utilization x GPU. The
  switch, ``VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS`` in ``vllm/envs.py``, defaults to "0" in the 0.19.1
  wheel (which logs "In v0.19, CUDA graph memory profiling will be enabled by default") and "1" from the
  0.20.0 wheel on (read in 0.19.1, 0.20.0, 0.20.2, 0.21.0, 0.22.0), although 0.20.x already logs "(default
  since v0.21.0)"; before 0.20 the estimate is logged but not subtracted.
* vLLM 0.25-0.28 with Model Runner V2 (:func:`vllm_model_runner`): the V2 runner's
  ``profile_cudagraph_memory`` is a placeholder that returns 0 (``vllm/v1/worker/gpu/model_runner.py``,
  "It is TBD whether we keep this API or not", read in the 0.25.0, 0.25.1, 0.26.0, 0.27.1 and 0.28.0
  wheels), so ``determine_available_memory`` subtracts nothing, the KV pool takes the whole budget and the
  graphs come on top of it, as before 0.20 (vllm #49224: "Model Runner V2 (now default for dense models)
  skips CUDA graph memory reservation ... causing OOM during capture_model()"; PR #49233, its fix, was
  closed). From the 0.29.0 wheel on the V2 runner measures them (``v1/worker/gpu/cudagraph_utils.py``
  ``profile_cudagraph_memory``: every PIECEWISE, encoder and drafter graph captured, the FULL graphs
  extrapolated from the two largest as the V1 runner does) and they are in the budget again. Which runner
  runs: ``vllm/config/vllm.py`` ``VllmConfig.use_v2_model_runner`` (``VLLM_USE_V2_MODEL_RUNNER`` when set,
  else ``_is_default_v2_model_runner_model``): V2 for generative models that are neither hybrid /
  attention-free nor MoE (MoE architectures in ``DEFAULT_V2_MODEL_RUNNER_ARCHITECTURES`` excepted), unless
  a feature it lacks is on (``_get_v2_model_runner_unsupported_features``: here ngram and draft-model
  speculation); read in the 0.25.0 wheel already (PR #49233 says 0.25.1) through 0.28.0.
* Hybrid GDN / Mamba models stay on the V1 runner through 0.28. vllm #50780 reports their estimate grown
  by a transient linear in max_num_batched_tokens from 0.26.0 (KV pool -18-24 %), and #52872 a graph pool
  of 0.89 GiB at max_num_batched_tokens 8192 against 0.52 GiB at 2048-4096 (RTX 5090, a 64-layer hybrid).
  What the V1 estimate reads of max_num_batched_tokens: its first FULL capture runs attention at
  ``profile_seq_lens = min(max_model_len, max_num_batched_tokens // tokens)`` a sequence (0.25.1-0.27.1,
  ``profile_cudagraph_memory``, unchanged between those wheels on CUDA), and peakmem caps the capture
  sizes at it; which tensor carries #50780's transient was not found in the 0.25.1 -> 0.26.0 diffs read
  (gpu_model_runner.py, gdn_attn.py, mamba_attn.py, qwen_gdn_linear_attn.py), and neither thread's setup
  could be read whole, so it is not in the term.
* vLLM before 0.20 (V0 included): ``capture_model`` runs after the KV cache is allocated, so the graphs
  come on top of gpu_memory_utilization x GPU (vllm #7553: nvidia-smi 21,395 MiB with --enforce-eager,
  23,859 MiB with graphs).
* SGLang: mem_fraction_static holds the weights and the KV pool; the graphs use the reserve outside it
  (``model_runner.py`` ``profile_max_num_token``).

What vLLM's "Estimated CUDA graph memory" is and what "took" is (read in the vllm 0.20.0, 0.21.0 and 0.22.0
wheels, ``_version.py`` commits gb8160878f, gad7125a43, g0b3ba88f1; ``v1/worker/gpu_model_runner.py``
``profile_cudagraph_memory`` / ``capture_model`` / ``_warmup_and_capture``, ``v1/worker/gpu_worker.py``
``determine_available_memory`` / ``compile_or_warm_up_model``): both are drops in ``torch.cuda.mem_get_info``
free device memory, so both hold the pool's segments, the graphs' driver memory and whatever NCCL kernels
captured in them keep, and neither holds the eager warm-ups (each size runs ``cudagraph_num_of_warmups``
eager forwards, whose cached blocks the first piece's ``torch.cuda.graph`` ``empty_cache`` returns).

* the estimate (before the KV pool, a throw-away ``graph_pool_handle()``, a minimal profiling KV cache):
  per mode, sizes sorted largest first (``cudagraph_dispatcher.py`` ``get_capture_descs``), only the first
  TWO are warmed up and captured; ``estimate = max over modes(first capture) + sum over modes((n - 1) x
  max(second capture, 1 MiB))``; the graphs are then destroyed. The first FULL capture runs attention at
  ``min(max_model_len, max_num_batched_tokens // tokens)`` per sequence (``profile_seq_lens``).
* "took" (``capture_model``, after the KV pool): every size captured, PIECEWISE then FULL into the one
  global pool; the drop from before the first to after the last. vllm-worker logs both on one line:
  "CUDA graph pool memory: A GiB (actual), E GiB (estimated), difference: ...".

So the two differ only in how the n - 2 sizes vLLM does not profile cost: the estimate charges each the
second size's marginal; the capture pays what each actually adds to a pool that the larger sizes already
grew. This term models both as the same constant per graph (:data:`PER_GRAPH_BYTES`), i.e. the estimate's
own shape; what each further size really adds depends on the caching allocator's free lists and the driver,
not on anything in vLLM's source, so the term is one number for both. Published pairs show the estimate
above "took": club-3090 #178 / #356 (held out, Qwen3.6-27B TP 2, 5 PIECEWISE sizes) 1.35x / 1.38x; vllm
#50722 (a DFlash MoE, TP 4) 1.11x; vllm issue #45178 (B200, MiniMax-M2.5) a KV pool cut 3.1x, its root
cause given as this linear extrapolation; a fork's PR (local-inference-lab/vllm #511, six FULL graphs):
9.47 GiB extrapolated against 8.20 GiB profiled exactly. None of them is a fitting-set case, so nothing is
fitted to them, and only the band's +-10 % (:func:`graph_band`) stands for the gap.

What one more size keeps (read in vLLM 0.10.0 ``vllm/compilation/cuda_piecewise_backend.py``
``CUDAPiecewiseBackend.__call__``, 0.10.1 ``vllm/compilation/cuda_graph.py`` ``CUDAGraphWrapper.__call__``
with ``backends.py``'s ``CUDAGraphOptions(weak_ref_output=is_last_graph)``, and ``gpu_model_runner.py``
``capture_model`` / ``_capture_cudagraphs`` / ``_dummy_run``): each piece's ``entry.output`` is a weak
reference; the last piece's output is made one inside the capture and the other pieces' outputs live only
until the next piece has read them; sizes are captured largest first after one eager warm-up each, and each
size's first piece runs ``torch.cuda.graph``'s ``empty_cache``. No size keeps a static output in the pool, so
a further size costs its graphs' own driver memory and whatever segment the caching allocator has to add:
:data:`PER_GRAPH_BYTES`. vLLM PRs #22897 / #23184 log 24-28 MiB per PIECEWISE size above 272 tokens (#22897
serves Llama-3.1-8B); nothing vLLM keeps explains it. It is flat over 280-464 tokens, where one gate_up output
(tokens x 2 x 14336 x 2 B) would grow from 15.3 to 25.4 MiB, and it is PER_GRAPH_BYTES + one 20 MiB
kLargeBuffer segment, which c10/cuda/CUDACachingAllocator.cpp adds when a 1-10 MiB request finds no free
block; why the allocator needs one at each of those sizes depends on its free lists, not on anything in vLLM's
source, so it stays in the band (:func:`graph_band`), not in the term.

Why the per-graph cost is not written as a function of the model (brief h-graphscale, 2026-12-06; what was
read and replayed, so that nobody has to do it again). The logs differ by model: Qwen2.5-0.5B on vLLM 0.26
(vllm #50159, held out) costs at most ~2.3 MiB a size (its estimate, 206-215 MiB, less a first capture of at
least 24 MiB, over 50 PIECEWISE + 34 FULL sizes, each at least vLLM's 1 MiB floor), Qwen3-8B on 0.21 (F2) ~5.7
MiB and Llama-3.2-1B's V0 graphs (F1) ~5.7 MiB. Read for what a size keeps in the pool:
c10/cuda/CUDACachingAllocator.cpp (pytorch/pytorch @ 001074d2: Note [Interaction with CUDA graph capture],
"within the private pool, allocations are freed and reassigned as usual during capture"; ``free`` returns a
block with no cross-stream use to its pool at once; ``get_free_block`` serves any later request of the same
stream from it), aten/src/ATen/cuda/CUDAGraph.cpp (@ 00cbb1f8: ``capture_begin`` routes the capture stream to
the shared pool, ``capture_end`` instantiates with ``cudaGraphInstantiateWithFlags``), the vLLM 0.21.0 and
0.26.0 wheels' ``compilation/cuda_graph.py`` (the same file) and ``profile_cudagraph_memory`` (0.26 adds
encoder graphs; the same two samples a mode), and SGLang 0.5.5 ``cuda_graph_runner.py`` (sizes captured
largest first into the global pool; the kept output's logits are a view of the static
``next_token_logits_buffer``: ``logits_processor.py`` copies into it). No engine keeps a tensor in the pool
after a size's capture, so a smaller size finds its blocks free. Replayed through the caching-allocator model
(``benchmarks/cuda_graphs.py --pool``: each case's sizes, largest first, with a per-layer sequence of vLLM's
fused decoder, not Inductor's own buffers): after the first size's segments (24 MiB for Qwen2.5-0.5B, whose
sub-1 MiB hidden states take 2 MiB kSmallBuffer segments; 56 MiB for Qwen3-8B; 62 MiB for Llama-3.1-8B) the
other sizes add 0 to 4 MiB in all (the 4 MiB where a hidden state falls to the small pool at 128 tokens),
never a segment a size; V0 Llama-3.1-8B adds one 20 MiB segment once, at 248 tokens. Nor does the replay show
H2's step (vllm PR #23184: 26 MiB at 280 tokens, 6 MiB at 272). So the 2 MiB / 20 MiB segment classes shape
the first capture only, and what each further size costs lies outside the caching allocator: the instantiated
graphs' driver memory, which no open source states. It does not follow the model's size either: per decoder
layer and size the logs give ~0.36 MiB (F1, FULL), ~0.16 (F2), <= 0.10 (Qwen2.5-0.5B), ~0.21 (H4, PIECEWISE)
and ~0.40 (SGLang, Llama-3-8B, FULL); a per-layer constant fitted on F1 would put F2 at about +120 %, so it
fails the fitting set, and the per-graph number stays one constant, its spread in the band.

What a V0 graph keeps (read in the vllm 0.6.5 and 0.7.3 wheels, ``vllm/worker/model_runner.py``
``GPUModelRunnerBase.capture_model`` and ``CUDAGraphRunner.capture``; the vllm #14286 log's line numbers
1437 / 1565 sit 3 lines after 0.7.3's 1434 / 1562, a 0.7.4 development build): "took" is the drop in
``torch.cuda.mem_get_info`` free memory over the whole loop, so it counts the pool's segments, the attention
state's buffers and the graphs' driver memory alike. The dummy ``input_tokens`` / ``input_positions`` and
``CommonAttentionState.graph_capture``'s slot mapping, sequence lengths and block table
(``attention/backends/utils.py``; max batch x max_seq_len_to_capture / block_size int32, 512 KiB at 8192)
are allocated once at the largest batch and every graph holds a slice of them; each graph's output is made a
weak reference inside the capture (``weak_ref_tensor``, then ``del`` and ``gc.collect``), so it keeps nothing
in the shared pool; its two eager warm-ups run outside the pool and ``torch.cuda.graph``'s ``empty_cache``
returns them. A further V0 graph therefore costs its own driver memory (cudaGraphExec) and nothing vLLM
allocates. Quantized linears change the working set only: compressed-tensors W8A16 / W4A16 and GPTQ / AWQ run
Marlin below compute capability 9.0 (``kernels/mixed_precision/__init__.py`` tries Machete first, which needs
90), and ``gptq_marlin_gemm`` (csrc/quantization/gptq_marlin/gptq_marlin.cu) allocates per call the output,
an ``a_tmp`` copy of the input and, for its global reduce, an fp32 ``c_tmp`` of N x the tokens rounded up to
16 (above 64: to 64, at most 1024; ``determine_reduce_max_m``): 28 MiB for Llama-3.1-8B's gate_up at 256
tokens, a temporary in the pool that every smaller graph reuses, not a per-graph cost. The driver's own
share differs by release: vllm #5517 measured one job's graphs at 3.8086 GiB on CUDA 12.2 / 12.3 drivers and
1.1367 GiB on 12.4 (:data:`OLD_DRIVER_RATIO`), and both logs here that were taken on a 535 (CUDA 12.2)
driver are far above the term (vllm #14286: RTX 4090, 535.183.06, 27 MiB a graph where F1 gives 6; H3,
#7553: 535.54.03); peakmem has no input for the driver, so the term is the 12.4+ drivers'.

Tensor parallelism inside the graphs: each captured forward holds the layers' all-reduces (vLLM
``model_executor/layers/linear.py`` ``RowParallelLinear.forward``: o_proj and down_proj, 2 a layer;
``vocab_parallel_embedding.py`` ``VocabParallelEmbedding.forward``: 1), counted by
:attr:`GraphMemory.captured_allreduces`. vLLM's custom all-reduce runs them on buffers it registered once
(``custom_all_reduce.py`` ``register_graph_buffers``), but it is off on more than two PCIe-only GPUs or
without P2P (0.5.4 ``CustomAllreduce.__init__``); NCCL kernels are then captured (``parallel_state.py``
``GroupCoordinator.graph_capture`` turns pynccl on), and NCCL keeps, for each kernel captured in a graph, a
persistent plan whose work array (nWork x NCCL_WORK_SIZE = 512 B) it cudaMallocs (vLLM sets
NCCL_CUMEM_ENABLE=0, ``worker/worker_base.py`` ``init_worker``, nccl issue #1234) until the graph is destroyed
(NCCL 2.20.5 ``src/enqueue.cc`` ``uploadWork``, ``persistentDestructor``). What that costs on the device is
the CUDA driver's, not NCCL's few KiB: vllm issue #5517 tabulates 3.81 (CUDA 12.2 and 12.3 drivers) against
1.14 (12.4) for the same job on A10G and L4.

Hybrid models with a speculative draft at TP > 1 (the club-3090 cases of benchmarks/cuda_graph_logs.json:
Qwen3.6-27B, 48 Gated-DeltaNet + 16 attention layers, MTP K=3, PIECEWISE, TP 2 and 4, where the term was
3-4x low). Read in vLLM (stored main, commit 000fc94b; the logs' builds, 0.20.x to 0.22.x by their line
numbers, have the same structure):

* ``gpu_model_runner.py`` ``profile_cudagraph_memory``: per mode, the first two sizes are warmed up and
  captured into a throw-away pool, ``mem_samples`` = the drop in free device memory over each
  (``torch.cuda.mem_get_info`` in 0.20-0.22, ``torch.accelerator.get_memory_info`` later); the estimate
  is ``max(first capture) + sum((n - 1) x second capture)``. It measures free device memory, so it sees
  everything a capture adds: the pool's segments, the graphs' driver memory and whatever a collective
  captured inside them keeps (``capture_model``'s "took" is the same drop over every size: see above).
* ``_dummy_run``: when it captures a PIECEWISE size and a drafter exists (eagle, eagle3, mtp, draft model),
  it calls ``drafter.dummy_run(num_tokens, use_cudagraphs=True, is_graph_capturing=True)``;
  ``spec_decode/llm_base_proposer.py`` ``dummy_run`` runs ONE drafter forward while capturing
  (``only_one_forward_pass = is_graph_capturing``), dispatched to the drafter's own PIECEWISE graph of that
  size. So each PIECEWISE size also captures the drafter's forward, and its all-reduces
  (:attr:`GraphMemory.draft_allreduces_per_graph`); FULL sizes do not (``use_cudagraphs`` is False there).
* ``vllm/compilation`` piecewise backend: one CUDA graph per piece between splitting ops; the GDN op is one,
  so the hybrid's size is 65 graphs where Qwen3-8B's is 37. Not what is missing: the fitting set's Qwen3-8B
  (F2) costs ~6 MiB a PIECEWISE size for 37 pieces; to explain the club-3090 sizes' ~23 MiB the 28 more
  pieces would need ~0.6 MiB each, which would make F2's sizes ~22 MiB and its estimate 3x what it logged.
* the club-3090 composes run ``--disable-custom-all-reduce`` with ``NCCL_P2P_DISABLE=1`` (noonghunna/club-3090
  models/qwen3.6-27b/vllm/compose/dual/docker-compose.yml @ d7804107, multi4 @ e6e33ab3; and vLLM's
  ``custom_all_reduce.py`` turns it off by itself on more than two PCIe-only GPUs), so every all-reduce is a
  NCCL kernel captured in the graph: 2 x 64 + 1 = 129 a size, + 3 for the MTP layer. NCCL 2.29's
  ``enqueue.cc`` (NVIDIA/nccl @ 5067397c) keeps a captured launch's work in its kernel arguments when it fits
  (``finishPlan``: Fifo / Persistent promoted to Args), so what a captured all-reduce keeps on the device is
  the driver's memory for the launch in the graph: :data:`NCCL_ALLREDUCE_GRAPH_BYTES`, fitted on those two
  cases (its comment shows the arithmetic), and 3.35x that on CUDA 12.2 / 12.3 drivers (vllm #5517).

Whether NCCL is captured is decided by :func:`custom_all_reduce_off`: the user's
``--disable-custom-all-reduce`` (vLLM / SGLang), else the engine's own test of the GPUs (vLLM
``custom_all_reduce.py`` ``CustomAllreduce.__init__``, 0.5.4 to the stored main: world sizes 2, 4, 6 and 8
only; more than two GPUs must be fully NVLink-connected; two need peer-to-peer access) on the interconnect
(:data:`peakmem.device.INTERCONNECTS`: ``--interconnect``, else the catalog GPU's). Captured: the term holds
them at :data:`NCCL_ALLREDUCE_GRAPH_BYTES` and the band's high end adds the old drivers' excess; not captured:
neither; not known (a plain memory size, GPUs of different kinds, V100, and no ``--interconnect``): the term
holds none and the band's high end holds them all at the old drivers' cost.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from peakmem.formulas.recurrent_state import has_recurrent_state
from peakmem.formulas.serving.forward import layer_transient_bytes
from peakmem.formulas.serving.sglang_graphs import SglangCapture, sglang_capture
from peakmem.inference import CudagraphMode, Engine, InferenceSetup, ModelRunner
from peakmem.model import ModelSpec
from peakmem.units import KiB, MiB

# Fitted on the fitting set of benchmarks/cuda_graph_logs.json (Llama-3.2-1B, vLLM V0, 35 FULL graphs:
# "took 0.21 GiB"; Qwen3-8B, vLLM 0.21+, 51 PIECEWISE + 35 FULL: "Estimated CUDA graph memory: 0.52 GiB"),
# which give 5.7 MiB a graph each once the shared working set is taken out (the logs' 0.01 GiB rounding is
# 0.1-0.3 MiB a graph); 6 MiB = 3 x the caching allocator's 2 MiB small-block segment (kSmallBuffer,
# c10/cuda/CUDACachingAllocator.cpp), what vLLM PR #23184 logs per capture size at <= 272 tokens (held
# out). The graph's own driver memory (cudaGraphExec) and its static outputs are in it; it does not grow
# with the model here (16 and 36 layers give the same).
PER_GRAPH_BYTES = 6 * MiB
# The band (formulas/band.py cuda_graphs_term): the fitting set's residuals are +4 and +5 %, so +-10 % of the
# term; above 272 tokens vLLM 0.10's PIECEWISE captures were logged at 24-28 MiB each (PR #22897, #23184):
# one more 20 MiB segment (kLargeBuffer) a graph as the high end. That term was read off the held-out logs
# themselves (H2), not derived from source: the module docstring says what vLLM's source does and does not
# explain.
BAND_FRACTION = 0.10
LARGE_PIECEWISE_TOKENS = 272
LARGE_SEGMENT_BYTES = 20 * MiB

# NCCL all-reduces captured in the graphs (custom all-reduce off): the device memory each keeps until its
# graph is destroyed, on CUDA 12.4+ drivers. Fitted on the fitting set's two TP > 1 cases (club3090-91, TP 2:
# 5 sizes x (129 + 3) = 660 all-reduces; club3090-pr44, TP 4: 7 x 132 = 924), each log less the rest of the
# term (benchmarks/cuda_graphs.py --fit; 0.11 GiB = 112.6 MiB, 0.17 GiB = 174.1 MiB, the rest 31.1 and
# 43.9 MiB): (112.6 - 31.1) / 660 = 0.124 MiB and (174.1 - 43.9) / 924 = 0.141 MiB; their mean 0.132 MiB =
# 135 KiB. The driver's, not NCCL's (the work is in the kernel arguments), so it changes with the driver:
# vllm #5517 measured one job's graphs at 3.8086 GiB on CUDA 12.2 and 12.3 drivers and 1.1367 GiB on 12.4
# (A10G and L4): the band's high end (OLD_DRIVER_RATIO).
NCCL_ALLREDUCE_GRAPH_BYTES = 135 * KiB
OLD_DRIVER_RATIO = (38086, 11367)  # vllm #5517: 3.8086 / 1.1367 GiB, as a fraction

# vLLM custom_all_reduce.py _SUPPORTED_WORLD_SIZES (0.5.4 .. stored main): the only world sizes it runs on
CUSTOM_ALLREDUCE_WORLD_SIZES = (2, 4, 6, 8)

# vLLM's proposers that run a drafter forward inside each PIECEWISE capture (gpu_model_runner.py _dummy_run:
# speculative_config.use_eagle() (eagle, eagle3, mtp) or uses_draft_model()); ngram runs no model
DRAFTER_CAPTURE_METHODS = ("draft_model", "eagle", "eagle3", "mtp")

# vLLM's capture cap 512 (config/vllm.py), V0's largest 256 (max_num_seqs: peakmem.vllm_defaults)
VLLM_CAPTURE_CAP = 512
VLLM_V0_CAPTURE_CAP = 256
V1_RELEASE = (0, 8)  # the V1 engine is the default (vLLM 0.8.0)
CAP_FROM_SEQS_RELEASE = (0, 10)  # max capture size min(2 x max_num_seqs, 512)
FULL_AND_PIECEWISE_RELEASE = (0, 11)  # cudagraph_mode default FULL_AND_PIECEWISE
# sizes step 16 above 256: 0.11.0 logs PIECEWISE 0/67 (vllm PR #27521), the 0.11.1 development line 51 + 35
# (PR #29335, 0.11.1rc7.dev487); releases are read as major.minor, so 0.11 keeps 67 and 0.12 has 51
SPARSE_SIZES_RELEASE = (0, 12)
# VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS defaults to "1" (vllm/envs.py): "0" in 0.19.1, "1" from 0.20.0
BUDGETED_RELEASE = (0, 20)
# Model Runner V2 (module docstring): the default for dense generative models from 0.25 (vllm/config/vllm.py
# _is_default_v2_model_runner_model, read in the 0.25.0 wheel); its profile_cudagraph_memory returns 0
# through 0.28.0 and measures the graphs from 0.29.0 (v1/worker/gpu/cudagraph_utils.py)
MRV2_DEFAULT_RELEASE = (0, 25)
MRV2_ESTIMATE_RELEASE = (0, 29)
# MoE architectures that default to V2 all the same (vllm/config/vllm.py
# DEFAULT_V2_MODEL_RUNNER_ARCHITECTURES), each with the first release whose wheel lists it (0.25.0, 0.26.0
# and 0.28.0 read)
MRV2_MOE_ARCHITECTURES = {
    "DeepseekV2ForCausalLM": (0, 25), "Qwen2MoeForCausalLM": (0, 25), "GraniteMoeForCausalLM": (0, 25),
    "InklingForCausalLM": (0, 26), "InklingForConditionalGeneration": (0, 26),
    "KimiK3ForConditionalGeneration": (0, 26), "LongcatFlashNgramForCausalLM": (0, 26),
    "DeepseekV4ForCausalLM": (0, 28),
}  # fmt: skip
# speculative methods the V2 runner lacks (_get_v2_model_runner_unsupported_features: it runs eagle, eagle3,
# mtp, dflash and dspark): vLLM falls back to V1 with them
MRV2_UNSUPPORTED_DRAFTS = ("ngram", "draft_model")

# Tensor-parallel all-reduces in one forward of a dense decoder (vLLM linear.py RowParallelLinear: o_proj and
# down_proj; vocab_parallel_embedding.py VocabParallelEmbedding: the embedding's, on the first stage)
ALLREDUCES_PER_LAYER = 2
EMBEDDING_ALLREDUCES = 1


class Accounting(str, Enum):
    """Where the engine counts the graphs' memory."""

    KV_BUDGET = "kv_budget"  # subtracted before the KV pool is sized (vLLM 0.20+)
    # captured after the pool: above gpu_memory_utilization x GPU (vLLM < 0.20; Model Runner V2 0.25-0.28)
    ON_TOP = "on_top"
    OUTSIDE_FRACTION = "outside_fraction"  # in the reserve outside mem_fraction_static (SGLang)


@dataclass(frozen=True, kw_only=True)
class CaptureSet:
    """One mode's graphs: FULL or PIECEWISE, one per size (tokens; SGLang: sequences, each of
    ``tokens_per_size`` tokens), or SGLang's draft runners' DRAFT / DRAFT_EXTEND graphs, each holding
    ``draft_forwards`` forwards of the draft model (0: the target's graphs)."""

    mode: str
    sizes: tuple[int, ...]
    tokens_per_size: int = 1
    draft_forwards: int = 0

    def __post_init__(self) -> None:
        if not self.sizes or self.tokens_per_size < 1 or self.draft_forwards < 0:
            raise ValueError(f"CaptureSet({self.mode}): sizes {self.sizes!r}, tokens_per_size "
                             f"{self.tokens_per_size}, draft_forwards {self.draft_forwards}")  # fmt: skip

    @property
    def largest_tokens(self) -> int:
        return max(self.sizes) * self.tokens_per_size


@dataclass(frozen=True, kw_only=True)
class GraphMemory:
    """The captured graphs of one rank and the bytes they hold."""

    sets: tuple[CaptureSet, ...]
    shared_bytes: int  # the largest capture's working set, kept in the pool every graph reuses
    per_graph_bytes: int
    accounting: Accounting
    release: str  # e.g. "vllm 0.27"
    runner: str = ""  # vLLM V1 engine's model runner, "v1" or "v2" ("" for V0 and SGLang)
    allreduces_per_graph: int = 0  # tensor-parallel all-reduces captured in each graph (none without TP)
    # vLLM's drafter forward captured with each PIECEWISE size (speculative decoding) and its all-reduces
    draft_captures: int = 0
    draft_allreduces_per_graph: int = 0
    nccl_captured: bool = False  # custom all-reduce off (custom_all_reduce_off): NCCL in the graphs
    nccl_unknown: bool = False  # whether custom all-reduce runs is not known (the band holds NCCL's cost)
    static_bytes: int = 0  # SGLang's runners' buffers and attention-backend state, allocated outside the pool
    static_detail: str = ""  # what static_bytes holds, for the note

    def __post_init__(self) -> None:
        for name in ("shared_bytes", "per_graph_bytes", "allreduces_per_graph", "draft_captures",
                     "draft_allreduces_per_graph", "static_bytes"):  # fmt: skip
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"GraphMemory.{name}={value!r}: a count or size >= 0")

    @property
    def graphs(self) -> int:
        return sum(len(s.sizes) for s in self.sets)

    @property
    def target_graphs(self) -> int:
        """The graphs of the target's forward (all but SGLang's draft runners')."""
        return sum(len(s.sizes) for s in self.sets if not s.draft_forwards)

    @property
    def draft_forwards(self) -> int:
        """The draft-model forwards captured: vLLM's drafter with each PIECEWISE size, SGLang's draft
        runners' forwards in each of their graphs."""
        return self.draft_captures + sum(len(s.sizes) * s.draft_forwards for s in self.sets)

    @property
    def captured_allreduces(self) -> int:
        """The tensor-parallel all-reduces captured in all the graphs of the rank: the target's in each of
        its graphs, the draft's (``draft_allreduces_per_graph`` a forward) in each draft forward captured."""
        target = self.allreduces_per_graph * self.target_graphs
        return target + self.draft_allreduces_per_graph * self.draft_forwards

    @property
    def nccl_bytes(self) -> int:
        """What the captured NCCL all-reduces keep when custom all-reduce is off (CUDA 12.4+ drivers)."""
        return self.captured_allreduces * NCCL_ALLREDUCE_GRAPH_BYTES if self.nccl_captured else 0

    @property
    def largest(self) -> int:
        """The largest capture's tokens."""
        return max(s.largest_tokens for s in self.sets)

    @property
    def bytes(self) -> int:
        return self.shared_bytes + self.per_graph_bytes * self.graphs + self.nccl_bytes + self.static_bytes

    @property
    def large_piecewise_graphs(self) -> int:
        """PIECEWISE graphs above :data:`LARGE_PIECEWISE_TOKENS` (the band's high end)."""
        return sum(
            1 for s in self.sets if s.mode == "PIECEWISE" for n in s.sizes if n > LARGE_PIECEWISE_TOKENS
        )

    def describe(self) -> str:
        def one(s: CaptureSet) -> str:
            tokens = f" x {s.tokens_per_size} tokens" if s.tokens_per_size > 1 else ""
            forwards = f", {s.draft_forwards} draft forwards each" if s.draft_forwards > 1 else ""
            return f"{s.mode}={len(s.sizes)} (largest={max(s.sizes)}{tokens}{forwards})"

        return f"{self.release}: {' + '.join(one(s) for s in self.sets)}"


def v1_capture_sizes(release: tuple[int, int], cap: int) -> tuple[int, ...]:
    """vLLM V1's capture sizes up to ``cap`` tokens (step 8; from 0.12 step 16 above 256)."""
    small = [n for n in (1, 2, 4) if n <= cap]
    if release < SPARSE_SIZES_RELEASE:
        return tuple(small + list(range(8, cap + 1, 8)))
    return tuple(small + list(range(8, min(cap + 1, 256), 8)) + list(range(256, cap + 1, 16)))


def v0_capture_sizes(max_num_seqs: int) -> tuple[int, ...]:
    """vLLM V0's decode batch sizes: [1, 2, 4] + multiples of 8 up to max_num_seqs padded to 8 (<= 256)."""
    cap = min(-(-max_num_seqs // 8) * 8 if max_num_seqs > 4 else max_num_seqs, VLLM_V0_CAPTURE_CAP)
    return tuple(n for n in (1, 2, 4, *range(8, VLLM_V0_CAPTURE_CAP + 1, 8)) if n <= max(cap, 1))


def vllm_capture_sets(
    release: tuple[int, int], mode: CudagraphMode, *, max_num_seqs: int, max_tokens: int, spec_tokens: int
) -> tuple[CaptureSet, ...]:
    """The graphs vLLM ``release`` captures (``mode`` AUTO: the release's default)."""
    if mode is CudagraphMode.NONE:
        return ()
    if release < V1_RELEASE:
        return (CaptureSet(mode="FULL", sizes=v0_capture_sizes(max_num_seqs)),)
    if mode is CudagraphMode.AUTO:
        both = release >= FULL_AND_PIECEWISE_RELEASE
        mode = CudagraphMode.FULL_AND_PIECEWISE if both else CudagraphMode.PIECEWISE
    decode_tokens = max_num_seqs * (1 + spec_tokens)
    cap = VLLM_CAPTURE_CAP if release < CAP_FROM_SEQS_RELEASE else min(2 * decode_tokens, VLLM_CAPTURE_CAP)
    sizes = v1_capture_sizes(release, max(1, min(cap, max_tokens)))
    decode = tuple(n for n in sizes if n <= decode_tokens) or sizes[:1]
    if mode is CudagraphMode.PIECEWISE:
        return (CaptureSet(mode="PIECEWISE", sizes=sizes),)
    if mode is CudagraphMode.FULL:
        return (CaptureSet(mode="FULL", sizes=sizes),)
    if mode is CudagraphMode.FULL_DECODE_ONLY:
        return (CaptureSet(mode="FULL", sizes=decode),)
    return (CaptureSet(mode="PIECEWISE", sizes=sizes), CaptureSet(mode="FULL", sizes=decode))


def graph_memory(
    spec: ModelSpec,
    setup: InferenceSetup,
    *,
    act_bytes: int,
    max_tokens: int,
    spec_tokens: int = 0,
    max_num_seqs: int | None = None,
) -> GraphMemory | None:
    """The CUDA graphs ``setup``'s engine captures on one rank holding ``spec``; None without graphs
    (enforce_eager / --disable-cuda-graph, cudagraph_mode none, engines that capture none). vLLM's
    ``max_num_seqs``: None: ``setup.vllm_batch()``'s (peakmem.vllm_defaults)."""
    if setup.enforce_eager or setup.engine not in (Engine.VLLM, Engine.SGLANG):
        return None
    release = setup.version
    name = f"{setup.engine.value} {release[0]}.{release[1]}"
    if setup.engine is Engine.VLLM:
        seqs = max_num_seqs if max_num_seqs is not None else setup.vllm_batch().max_num_seqs
        sets = vllm_capture_sets(release, setup.cudagraph_mode, max_num_seqs=seqs, max_tokens=max_tokens,
                                 spec_tokens=spec_tokens)  # fmt: skip
        runner = vllm_model_runner(spec, setup)
        accounting = vllm_accounting(release, runner)
        static, static_detail = 0, ""
    else:
        sglang = sglang_capture(spec, setup, act_bytes=act_bytes)
        sets, static = sglang_sets(sglang), sglang.outside_pool_bytes
        accounting, static_detail, runner = Accounting.OUTSIDE_FRACTION, sglang.describe(), ""
    if not sets:
        return None
    draft_spec = setup.draft.spec if setup.draft is not None else None
    # the largest capture's working set, of the target's graphs or the draft's, kept in the one shared pool
    shared = max(
        layer_transient_bytes(draft_spec if s.draft_forwards and draft_spec else spec, s.largest_tokens,
                              act_bytes, setup.tp, fused=True)
        for s in sets
    )  # fmt: skip
    allreduces = allreduces_per_forward(spec, tp=setup.tp, pp=setup.pp)
    draft_captures, draft_allreduces = drafter_captures(setup, sets)
    off = custom_all_reduce_off(setup)
    return GraphMemory(sets=sets, shared_bytes=shared, per_graph_bytes=PER_GRAPH_BYTES, accounting=accounting,
                       release=name, runner=runner, allreduces_per_graph=allreduces,
                       draft_captures=draft_captures,
                       draft_allreduces_per_graph=draft_allreduces, nccl_captured=off is True,
                       nccl_unknown=off is None, static_bytes=static,
                       static_detail=static_detail)  # fmt: skip


def vllm_model_runner(spec: ModelSpec, setup: InferenceSetup) -> str:
    """The model runner vLLM ``setup.version`` runs ``spec`` with: "v1" or "v2" ("" for V0, before 0.8).
    ``--model-runner`` (VLLM_USE_V2_MODEL_RUNNER) when given; else V2 from :data:`MRV2_DEFAULT_RELEASE` for a
    model with no recurrent-state layer (vLLM's is_hybrid / is_attention_free) that is not MoE (unless its
    architecture is in :data:`MRV2_MOE_ARCHITECTURES` by then), without a draft V2 lacks."""
    if setup.version < V1_RELEASE:
        return ""
    if setup.model_runner is not ModelRunner.AUTO:
        return str(setup.model_runner.value)
    draft = setup.draft
    if setup.version < MRV2_DEFAULT_RELEASE or has_recurrent_state(spec):
        return "v1"
    if draft is not None and draft.method in MRV2_UNSUPPORTED_DRAFTS:
        return "v1"
    listed = MRV2_MOE_ARCHITECTURES.get(spec.architecture)
    return "v1" if spec.is_moe and (listed is None or setup.version < listed) else "v2"


def vllm_accounting(release: tuple[int, int], runner: str) -> Accounting:
    """Where vLLM ``release`` counts the graphs of ``runner``: in the KV budget from
    :data:`BUDGETED_RELEASE`, except Model Runner V2 before :data:`MRV2_ESTIMATE_RELEASE` (its estimate is
    0: captured on top of the pool)."""
    if release < BUDGETED_RELEASE or (runner == "v2" and release < MRV2_ESTIMATE_RELEASE):
        return Accounting.ON_TOP
    return Accounting.KV_BUDGET


def sglang_sets(c: SglangCapture) -> tuple[CaptureSet, ...]:
    """SGLang's runners as capture sets: the target's FULL graphs (verifying ``verify_tokens`` a sequence
    with speculative decoding), the draft decode runner's DRAFT graphs and the draft-extend runner's
    DRAFT_EXTEND graphs, all at the same batch sizes (formulas/serving/sglang_graphs.py)."""
    sets = [CaptureSet(mode="FULL", sizes=c.capture_bs, tokens_per_size=c.verify_tokens)]
    if c.draft_forwards:
        sets.append(CaptureSet(mode="DRAFT", sizes=c.capture_bs, tokens_per_size=c.draft_tokens,
                               draft_forwards=c.draft_forwards))  # fmt: skip
    if c.extend_tokens:
        sets.append(CaptureSet(mode="DRAFT_EXTEND", sizes=c.capture_bs, tokens_per_size=c.extend_tokens,
                               draft_forwards=1))  # fmt: skip
    return tuple(sets)


def custom_all_reduce_off(setup: InferenceSetup) -> bool | None:
    """Whether the engine runs its tensor-parallel all-reduces through NCCL, so that the graphs capture them
    (None: not known). False without tensor parallelism; True with --disable-custom-all-reduce; else vLLM's
    ``CustomAllreduce.__init__`` tests (SGLang ports it): a world size outside
    :data:`CUSTOM_ALLREDUCE_WORLD_SIZES`; more than two GPUs not fully connected ("not supported on more than
    two PCIe-only GPUs"); two without peer-to-peer access ("your platform lacks GPU P2P capability")."""
    if setup.tp == 1:
        return False
    if setup.disable_custom_all_reduce or setup.tp not in CUSTOM_ALLREDUCE_WORLD_SIZES:
        return True
    link = setup.interconnect
    if link in ("nvlink", "xgmi"):
        return False
    if link == "pcie":
        return setup.tp > 2
    if link == "pcie-no-p2p":
        return True
    return None


def drafter_captures(setup: InferenceSetup, sets: tuple[CaptureSet, ...]) -> tuple[int, int]:
    """vLLM V1's drafter forwards captured with the target's PIECEWISE sizes (one each: llm_base_proposer.py
    ``dummy_run``) and the all-reduces one drafter forward runs (the drafter's layers and embedding, at the
    target's TP, on the last pipeline stage); (0, 0) without a drafter model. SGLang: no forward with the
    target's graphs (its draft runners' graphs are sets of their own), the all-reduces of one forward of the
    draft (its worker runs at the target's TP)."""
    draft = setup.draft
    if draft is None or draft.spec is None:
        return 0, 0
    if setup.engine is Engine.SGLANG:
        forwards = any(s.draft_forwards for s in sets)
        return 0, allreduces_per_forward(draft.spec, tp=setup.tp) if forwards else 0
    if setup.engine is not Engine.VLLM or setup.version < V1_RELEASE:
        return 0, 0
    if draft.method not in DRAFTER_CAPTURE_METHODS:
        return 0, 0
    captures = sum(len(s.sizes) for s in sets if s.mode == "PIECEWISE")
    return captures, allreduces_per_forward(draft.spec, tp=setup.tp)


def allreduces_per_forward(spec: ModelSpec, *, tp: int, pp: int = 1) -> int:
    """The tensor-parallel all-reduces one forward runs on the most loaded rank: 2 a layer on the first
    pipeline stage's ``ceil(layers / pp)`` layers + the embedding's; none without tensor parallelism. The
    layers are the language model's (a vision-language model's tower runs outside the decoder's graphs:
    ``profile_cudagraph_memory`` captures encoder graphs only with ``cudagraph_mm_encoder``)."""
    if tp == 1:
        return 0
    layers = sum(g.count for g in spec.language_groups)
    return ALLREDUCES_PER_LAYER * -(-layers // pp) + EMBEDDING_ALLREDUCES


def graph_band(g: GraphMemory | None) -> tuple[int, int]:
    """The band of the term, relative to it: (low, high) bytes (formulas/band.py cuda_graphs_term)."""
    if g is None:
        return 0, 0
    spread = int(g.bytes * BAND_FRACTION)
    high = spread + LARGE_SEGMENT_BYTES * g.large_piecewise_graphs
    # NCCL captured on a CUDA 12.2 / 12.3 driver: OLD_DRIVER_RATIO x the 12.4+ cost of each all-reduce, where
    # the graphs capture NCCL or it is not known whether they do
    if not (g.nccl_captured or g.nccl_unknown):
        return -spread, high
    num, den = OLD_DRIVER_RATIO
    old_driver = g.captured_allreduces * NCCL_ALLREDUCE_GRAPH_BYTES * num // den
    return -spread, high + old_driver - g.nccl_bytes


def graph_note(g: GraphMemory) -> str:
    """The assumption line of the term."""
    where = {
        Accounting.KV_BUDGET: "vLLM subtracts its estimate from the KV budget before sizing the pool (0.20+)",
        Accounting.ON_TOP: (
            "Model Runner V2 reserves nothing for them before 0.29 (its profile_cudagraph_memory returns 0; "
            "vllm #49224): captured after the KV pool, on top of gpu_memory_utilization x GPU"
            if g.runner == "v2"
            else "captured after the KV pool: on top of gpu_memory_utilization x GPU (before 0.20)"
        ),
        Accounting.OUTSIDE_FRACTION: "outside mem_fraction_static (SGLang's reserve for activations, graphs)",
    }[g.accounting]
    drafted = (
        f" + {g.draft_allreduces_per_graph} in each of the drafter's {g.draft_forwards} captures"
        if g.draft_forwards and g.draft_allreduces_per_graph
        else ""
    )
    per_unit = f"{NCCL_ALLREDUCE_GRAPH_BYTES // KiB} KiB"
    old = f"{OLD_DRIVER_RATIO[0] / OLD_DRIVER_RATIO[1]:.2f}x"
    if g.nccl_captured:
        nccl = (
            "custom all-reduce off (--disable-custom-all-reduce, more than two GPUs not all NVLinked, or no "
            f"P2P): NCCL keeps {per_unit} each until the graph is destroyed ({g.nccl_bytes} B, CUDA 12.4+ "
            f"drivers; {old} on 12.2 / 12.3: vllm #5517, in the band)"
        )
    elif g.nccl_unknown:
        nccl = (
            "whether custom all-reduce runs depends on the GPUs' links (give --interconnect, or name a "
            "catalog GPU that states them): where it is off "
            f"NCCL keeps {per_unit} each on CUDA 12.4+ drivers, {old} on 12.2 (vllm #5517): in the band only"
        )
    else:
        nccl = "custom all-reduce runs them on buffers registered once (NVLink, or two GPUs with P2P)"
    collectives = (
        f"; {g.captured_allreduces} tensor-parallel all-reduces captured ({g.allreduces_per_graph} a graph"
        f"{drafted}): {nccl}"
        if g.captured_allreduces
        else ""
    )
    static = (
        f"; {g.static_detail}"
        if g.static_detail
        else (f"; static buffers {g.static_bytes} B" if g.static_bytes else "")
    )
    return (
        f"CUDA graphs ({g.describe()}): the largest capture's working set {g.shared_bytes} B shared by all, "
        f"+ {g.per_graph_bytes // MiB} MiB a graph (fitted: benchmarks/cuda_graph_logs.json){static}; {where}"
        f"{collectives}"
    )
