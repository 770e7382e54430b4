"""EAGLE and EAGLE-3 draft heads as vLLM V1 builds them (``--draft HEAD --draft-method eagle|eagle3``).

Read at vllm-project/vllm commits 00da92319af4b2ad2cde8525b7b609c779bdc52f
(vllm/model_executor/models/llama_eagle.py) and 00bd1493b3e82d6c13c68ee8a0e1c5a96707e190
(vllm/model_executor/models/llama_eagle3.py), and the proposer's ``_maybe_share_embeddings`` /
``_maybe_share_lm_head`` (vllm/v1/spec_decode/llm_base_proposer.py, formerly eagle.py
``EagleProposer.load_model``):

* **EAGLE** (``EagleLlamaForCausalLM``): ``num_hidden_layers`` Llama decoder layers, the first without
  its ``input_layernorm`` (``disable_input_layernorm``: "Skip the input_layernorm", after SafeAILab
  EAGLE cnets.py), and ``fc = nn.Linear(2h, h, bias=False)`` over [token embedding, target hidden
  state]; no final norm (``hidden_states + residual``). No ``lm_head`` of its own: the proposer
  shares the target's ("Sharing target model lm_head weights"). ``embed_tokens`` is skipped at load
  when pipeline parallelism is 1 ("draft will share embed with target").
* **EAGLE-3** (``Eagle3LlamaForCausalLM``): the first layer's ``qkv_proj`` reads ``2h`` (embeddings and
  hidden state concatenated) and it adds a ``hidden_norm`` (h); later layers are plain Llama layers;
  ``fc = ReplicatedLinear(3 x target_hidden_size, h, bias=False)`` fuses three of the target's hidden
  states (``use_aux_hidden_state``, default on); a final ``norm``; its own
  ``lm_head = ParallelLMHead(draft_vocab_size, h)`` ("Keeping separate lm_head weights") and
  ``draft_id_to_target_id`` (``d2t``), an int64 parameter of ``draft_vocab_size`` entries
  (formulas/serving/speculative.py counts it; ``t2d`` is skipped at load). ``embed_tokens``
  is shared with the target when the checkpoint has none or holds the target's (the proposer
  compares them); a checkpoint with a distinct embedding keeps its own: not modelled.

Both heads' attention layers cache K and V in the target's pool (speculative.py). Their ``fc`` is
counted as split under tensor parallelism; vLLM replicates it (``nn.Linear`` / ``ReplicatedLinear``):
with tp > 1 it is under-counted by (1 - 1/tp) of its weights, as ``eh_proj`` of MTP.
"""

from __future__ import annotations

from dataclasses import replace

from peakmem.errors import InputError
from peakmem.model import LayerGroup, ModelSpec, Tensor, linear, norm

EAGLE = "eagle"
EAGLE3 = "eagle3"
EAGLE_METHODS = (EAGLE, EAGLE3)
# EAGLE-3's fc reads this many of the target's hidden states (llama_eagle3.py: ``target_hidden_size * 3``)
EAGLE3_AUX_HIDDEN_STATES = 3
# Architecture names of EAGLE checkpoints -> the method (vllm/model_executor/models/registry.py
# _SPECULATIVE_DECODING_MODELS maps "EagleLlamaForCausalLM" to llama_eagle and "Eagle3LlamaForCausalLM"
# and "LlamaForCausalLMEagle3" (the EAGLE authors' EAGLE-3 checkpoints) to llama_eagle3). EAGLE-1
# checkpoints name "LlamaForCausalLM": give --draft-method eagle.
ARCHITECTURE_METHODS = {
    "EagleLlamaForCausalLM": EAGLE,
    "Eagle3LlamaForCausalLM": EAGLE3,
    "LlamaForCausalLMEagle3": EAGLE3,
}
_QKV = ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight")


def method_of(architectures: object) -> str:
    """The EAGLE method a config.json's ``architectures`` names ("" for none)."""
    if not isinstance(architectures, list):
        return ""
    return next((ARCHITECTURE_METHODS[a] for a in architectures if a in ARCHITECTURE_METHODS), "")


def _first_layer(tensors: tuple[Tensor, ...], method: str, h: int) -> tuple[Tensor, ...]:
    if method == EAGLE:
        return tuple(t for t in tensors if t.name != "input_layernorm.weight")
    widened = tuple(replace(t, shape=(t.shape[0], 2 * h)) if t.name in _QKV else t for t in tensors)
    return (*widened, *norm("hidden_norm", h, False))


def eagle_draft_spec(head: ModelSpec, method: str, *, target_hidden: int, draft_vocab: int) -> ModelSpec:
    """The EAGLE / EAGLE-3 head whose checkpoint config gave ``head`` (a Llama spec), as vLLM builds
    it: embeddings shared with the target, ``fc`` and the first layer's changes added; EAGLE-3 with
    its ``draft_vocab``-row ``lm_head`` and final norm, EAGLE with the target's head."""
    if method not in EAGLE_METHODS:
        raise InputError(f"draft_method={method!r}: one of {', '.join(EAGLE_METHODS)}")
    if len(head.groups) != 1 or head.groups[0].layer.derived is not None:
        raise InputError(f"draft={head.name!r}: an EAGLE head is a stack of Llama decoder layers")
    h, group = head.hidden_size, head.groups[0]
    first = replace(group.layer, tensors=_first_layer(group.layer.tensors, method, h))
    groups: tuple[LayerGroup, ...] = (LayerGroup(count=1, layer=first),)
    if group.count > 1:
        groups += (LayerGroup(count=group.count - 1, layer=group.layer),)
    if method == EAGLE:
        outer = linear("model.fc", 2 * h, h, False, "other")
    else:
        fc = linear("model.fc", EAGLE3_AUX_HIDDEN_STATES * target_hidden, h, False, "other")
        outer = (*fc, *norm("model.norm", h, False), *linear("lm_head", h, draft_vocab, False, "head"))
    name = f"{head.name} ({method})"
    return replace(head, name=name, groups=groups, outer=outer, tie_word_embeddings=False)
