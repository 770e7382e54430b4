"""FSDP1's root unit in backward: its parameters' gradients wait for each other, then one flat gradient.

FSDP1 (torch 2.13 torch/distributed/fsdp; the same code paths in v2.3.0, Lightning 2.3's era) runs a
unit's forward on ``Tensor`` views of its unsharded ``FlatParameter``: ``_flat_param.py``
``pre_unshard``/``_use_unsharded_views(as_params=False)`` set every original parameter to
``torch.split(flat_param, numels)[i].view(shape)`` (``_get_unflat_views_unaligned``; with
``use_orig_params`` ``_get_unflat_views_aligned``, also ``torch.split``). Autograd therefore reaches the
``FlatParameter`` through one ``SplitWithSizesBackward`` node, which runs only once every view's
gradient has arrived, keeping them in its ``InputBuffer`` until then, and then ``torch.cat``s them into a
new gradient of the whole flat parameter that ``AccumulateGrad`` takes (or adds in place into the
unsharded ``.grad`` kept by ``no_sync``). FSDP1's post-backward hook sits on that ``AccumulateGrad``
(``_runtime_utils.py`` ``_register_post_backward_hook``), so the reduce-scatter comes after the ``cat``.

For a layer unit that wait is inside the layer's own backward. For the root unit (embeddings, final
norm, LM head: everything an auto-wrap policy leaves outside the wrapped blocks), it spans the whole
backward: the head's and the final norm's gradients, written at its start, are held as written (not as
a shard) until the embedding's backward writes the last one at the end; there all of them and their
``cat`` are alive at once, twice the root's gradient bytes. (The root's unsharded parameters, kept from
forward to backward by ``_post_forward_reshard``'s ``not state._is_root``, are counted with the gathered
units: :func:`peakmem.formulas.sharding.rank_states`.)

Measured with torch's fake process group on CPU (FSDP1 FULL_SHARD over 4 ranks, rank 0, tiny Llama:
hidden 128, 2 layers, untied head, vocabulary 32,000 so that the root dominates; fp32, 2 x 64 tokens):
the backward peak is the ``cat`` with the head's ``mm`` and the embedding's ``embedding_dense_backward``
outputs alive beside it; without this term the estimate read -6.6 % (no_sync, 2 micro-batches) and
-9.5 % (one micro-batch) there. A tied embedding shares one view, so its two contributions are summed
first (:func:`peakmem.estimate._outer_grad_split`), an instant the ``cat`` does not exceed.
"""

from __future__ import annotations

from collections.abc import Iterable

from peakmem.breakdown import MemoryItem
from peakmem.parallel import FsdpMode, Parallelism

SRC_FSDP1_ROOT = (
    "torch fsdp _flat_param.py _get_unflat_views (torch.split views of the FlatParameter): autograd holds "
    "each root parameter's gradient until the last arrives, then torch.cat's the flat gradient; "
    "_runtime_utils.py _register_post_backward_hook (on its AccumulateGrad)"
)


def holds_root_grads(par: Parallelism) -> bool:
    """Whether the root unit's gradients stay whole, as written, from the head's backward to the end of
    backward under FSDP1 (every sharding mode: the views are there whatever the strategy), without PP."""
    return par.fsdp is not FsdpMode.NONE and par.fsdp_version == 1 and par.pp == 1


def flat_grad_extra(flat: int, alive: int) -> int:
    """What the ``cat`` of the root's flat gradient (``flat`` bytes: every root parameter's gradient in
    the dtype the unit ran in) adds at the end of backward beyond the ``alive`` bytes of root gradients
    the tail already holds (the held head and final-norm gradients, the embedding's, a tied sum): at
    the ``cat`` its inputs and its output are alive, ``2 x flat``."""
    return max(0, 2 * flat - alive)


# the gathered items (peakmem.formulas.sharding) that FSDP1 has freed by the end of backward
RESHARDED_KEYS = ("fsdp.units", "fsdp.reduce_scatter")


def resharded_at_tail(par: Parallelism, gathered: Iterable[MemoryItem], tail: int) -> int:
    """The bytes of ``gathered`` (a rank's unsharded parameters and gradients in flight in backward) that
    are gone by the root's ``cat`` at the end of backward, when the root's flat gradient is counted
    there: every layer unit's post-backward has run, resharding it under FULL_SHARD / HYBRID_SHARD
    (_runtime_utils.py ``_should_free_in_backward``: ``RESHARD_AFTER_FORWARD_HANDLE_STRATEGIES``) and
    reduce-scattering or keeping (``no_sync``) its gradient, so only the root is unsharded (the
    parallel oracle's parameters there: the shards and the root). Credited up to ``tail``, the bytes the
    end of backward adds: the instant never reads below the backward's base, which it cannot be the peak
    under."""
    if par.fsdp not in (FsdpMode.FULL_SHARD, FsdpMode.HYBRID_SHARD):
        return 0
    return min(tail, sum(i.bytes for i in gathered if i.key in RESHARDED_KEYS))
