"""How a serving engine lays one model out over GPUs: tensor, pipeline, data and expert parallelism, and
SGLang's DP attention. What one rank holds follows from it (formulas/serving/context.py shards the weights
and KV, formulas/serving/pipeline.py splits the layers).

vLLM (``vllm serve --tensor-parallel-size T --pipeline-parallel-size P --data-parallel-size D
[--enable-expert-parallel]``, vllm/config/parallel.py ``ParallelConfig``; world size T x P x D):

* attention, dense MLPs, embeddings and the LM head are split T ways inside each of the D data-parallel
  ranks (each DP rank is an engine of its own with its own KV cache and its own requests);
* MoE experts are split over all D x T GPUs of a stage whether or not expert parallelism is on:
  ``FusedMoEParallelConfig.make`` (vllm/model_executor/layers/fused_moe/config.py) flattens TP across
  DP (``tp_size = dp_size_ * tp_size_``); with ``enable_expert_parallel`` the experts are placed whole,
  ``ep_size = tp_size`` = D x T (``determine_expert_map``: an even split), else each expert is
  tensor-sliced D x T ways. The bytes per rank are the same; ``ep`` here is 1 or D x T.

SGLang (``--tp-size T --pp-size P --dp-size D [--enable-dp-attention] [--ep-size E]``,
python/sglang/srt/server_args.py):

* without DP attention, ``--dp-size D`` starts D copies of a T x P-GPU engine (the data-parallel
  controller), each holding the whole model over its T GPUs: D x T x P GPUs;
* with ``--enable-dp-attention`` the D attention-DP ranks live inside the T GPUs of one engine
  (python/sglang/srt/layers/dp_attention.py ``compute_dp_attention_world_info``:
  ``attn_tp_size = tp_size // dp_size``): attention weights and KV heads are split T / D ways and each
  DP rank's KV pool holds only its own requests; the token embedding is replicated
  (``VocabParallelEmbedding(..., enable_tp=not is_dp_attention_enabled())`` in the model files), the LM
  head stays vocab-parallel over all T (``enable_dp_lm_head`` off) and dense MLPs over all T
  (``moe_dense_tp_size`` unset); T x P GPUs;
* MoE experts: ``moe_tp_size = tp_size // moe_ep_size`` (python/sglang/srt/distributed/parallel_state.py
  ``initialize_model_parallel``): E ranks own whole experts, each expert sliced T / E ways, so a rank
  holds 1 / T of the experts' bytes whatever E; E must divide T.

``batch`` is the deployment's concurrent sequences: the D data-parallel ranks (both engines) each hold
``ceil(batch / D)`` of them.
"""

from __future__ import annotations

from dataclasses import dataclass

from peakmem.errors import require
from peakmem.validate import MAX_GPUS, check_bool, check_int

# The engines that take pp / dp / ep (vLLM and SGLang ``serve``); transformers and llama.cpp have no data
# or expert parallelism of their own.
PARALLEL_ENGINES = ("vllm", "sglang")


@dataclass(frozen=True, kw_only=True)
class ServingLayout:
    """The parallel layout of one serving deployment; ``engine`` is the engine's name ("vllm", ...)."""

    engine: str
    tp: int = 1
    pp: int = 1
    dp: int = 1
    ep: int = 1
    dp_attention: bool = False

    def __post_init__(self) -> None:
        for name in ("tp", "pp", "dp", "ep"):
            check_int(name, getattr(self, name), maximum=MAX_GPUS, what="GPUs; no cluster has more")
            require(getattr(self, name) >= 1, name, getattr(self, name), "must be at least 1")
        check_bool("dp_attention", self.dp_attention)
        if not self.parallel:
            return
        for name in ("pp", "dp", "ep"):
            value = getattr(self, name)
            require(value == 1 or self.engine in PARALLEL_ENGINES, name, value,
                    f"engine={self.engine} has no {name} of its own; use vllm or sglang")  # fmt: skip
        require(not self.dp_attention or self.engine == "sglang", "dp_attention", self.dp_attention,
                f"DP attention is SGLang's (--enable-dp-attention), not engine={self.engine}'s")  # fmt: skip
        if self.engine == "vllm":
            require(self.ep in (1, self.tp * self.dp), "ep", self.ep,
                    f"vLLM's expert-parallel group is tp x dp = {self.tp * self.dp} "
                    "(--enable-expert-parallel); give 1 or that")  # fmt: skip
        if self.engine == "sglang":
            require(self.tp % self.ep == 0, "ep", self.ep,
                    f"SGLang needs ep to divide tp={self.tp} (moe_tp_size = tp // ep)")  # fmt: skip
            if self.dp_attention:
                # python/sglang/srt/server_args.py: the dp attention groups split the tp GPUs
                require(self.tp % self.dp == 0, "dp", self.dp,
                        f"DP attention splits tp={self.tp} GPUs in dp groups: dp must divide tp")  # fmt: skip

    @property
    def parallel(self) -> bool:
        """Anything beyond tensor parallelism (pp, dp, ep or DP attention)."""
        return self.pp > 1 or self.dp > 1 or self.ep > 1 or self.dp_attention

    @property
    def gpus(self) -> int:
        """GPUs of the whole deployment."""
        if self.dp_attention:
            return self.tp * self.pp
        return self.tp * self.pp * self.dp

    @property
    def attention_tp(self) -> int:
        """Ways the attention weights and KV heads are split on a rank (SGLang DP attention: tp // dp)."""
        return self.tp // self.dp if self.dp_attention else self.tp

    @property
    def embedding_tp(self) -> int:
        """Ways the token embedding is split (SGLang DP attention replicates it)."""
        return 1 if self.dp_attention else self.tp

    @property
    def expert_ways(self) -> int:
        """Ways the MoE experts' bytes are split (vLLM: tp x dp, flattened; SGLang: tp)."""
        return self.tp * self.dp if self.engine == "vllm" else self.tp

    def rank_batch(self, batch: int) -> int:
        """Sequences one data-parallel rank holds of the deployment's ``batch`` (the most loaded one)."""
        return -(-batch // self.dp)

    def describe(self) -> str:
        parts = [f"tp {self.tp}"]
        if self.pp > 1:
            parts.append(f"pp {self.pp}")
        if self.dp > 1:
            parts.append(f"dp {self.dp}" + (" (DP attention)" if self.dp_attention else ""))
        elif self.dp_attention:
            parts.append("DP attention")
        if self.ep > 1:
            parts.append(f"ep {self.ep}")
        return ", ".join(parts)
