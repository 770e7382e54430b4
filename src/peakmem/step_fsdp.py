"""FSDP2's terms in a rank's step timeline (:mod:`peakmem.estimate`): what a layer unit adds to its
backward, and the items that show FSDP2's unsharded bytes at the backward peak
(peakmem.formulas.fsdp2 models the bytes)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from peakmem.breakdown import Category, MemoryItem
from peakmem.formulas.fsdp1_root import SRC_FSDP1_ROOT
from peakmem.formulas.fsdp2 import SRC_FSDP_GATHER, SRC_FSDP_ROOT_RS, SRC_FSDP_RS
from peakmem.formulas.model_parallel import StageParams
from peakmem.formulas.sharding import RankStates
from peakmem.formulas.timeline import GroupCost


def layer_extra(rs: RankStates, layers_done: int, layers: int) -> int:
    """FSDP2: what a layer unit adds to its backward when ``layers_done`` of the ``layers`` have run
    theirs: the first unit backward reaches (the last layer) has no earlier reduce-scatter input, the
    last one it reaches (the first layer) nothing to prefetch, a single layer neither
    (peakmem.formulas.fsdp2.in_layer)."""
    mid, first = rs.layer_backward_extra, rs.layer_backward_first_extra
    last = rs.layer_backward_last_extra or mid
    if layers == 1:
        return first + last - mid
    return first if layers_done == 0 else last if layers_done == layers - 1 else mid


def backward_groups(groups: tuple[GroupCost, ...], rs: RankStates) -> tuple[GroupCost, ...]:
    """FSDP2: each layer unit's own unsharded bytes added to its backward transient (:func:`layer_extra`);
    the first and the last layer backward reaches become groups of their own."""
    if not rs.layer_backward_extra or not groups:
        return groups
    layers = sum(g.count for g in groups)
    out: list[GroupCost] = []
    start = 0  # layers before this group in forward order
    for g in groups:
        # runs of layers with the same extra (forward order: layer i is reached after layers - 1 - i)
        pieces: list[tuple[int, int]] = []
        for i in range(start, start + g.count):
            extra = layer_extra(rs, layers - 1 - i, layers)
            if pieces and pieces[-1][1] == extra:
                pieces[-1] = (pieces[-1][0] + 1, extra)
            else:
                pieces.append((1, extra))
        out.extend(replace(g, count=c, backward_transient=g.backward_transient + e) for c, e in pieces)
        start += g.count
    return tuple(out)


def root_items(
    items: list[MemoryItem], root_held: int, version: int = 2, cat: int = 0, credit: int = 0
) -> list[MemoryItem]:
    """The backward peak's items under FSDP without PP: the root unit's whole gradients, held from the
    head's backward to the end (inside the timeline's ``held``), shown apart from a tied embedding's
    hold (peakmem.formulas.fsdp2.root_backward; FSDP1: peakmem.formulas.fsdp1_root); at the end of
    backward under FSDP1 the ``cat`` of the root's flat gradient shown apart from the temporaries, to
    which the ``credit`` of the resharded layer units (dropped from the gathered items) returns."""
    out = list(items)
    if cat:
        out = [
            replace(i, bytes=i.bytes - cat + credit) if i.key == "backward.temporaries" else i for i in out
        ]
        out.append(MemoryItem(path="FSDP1 root unit's flat gradient (torch.cat of its parameters' gradients)",
                              category=Category.TEMPORARIES, bytes=cat, source=SRC_FSDP1_ROOT,
                              key="fsdp1.root_cat"))  # fmt: skip
    if not root_held or not any(i.key == "backward.tied_hold" for i in out):
        return out
    out = [
        replace(i, bytes=i.bytes - root_held) if i.key == "backward.tied_hold" else i
        for i in out
        if i.key != "backward.tied_hold" or i.bytes > root_held
    ]
    src, until = (SRC_FSDP_ROOT_RS, "its post-backward") if version == 2 else (SRC_FSDP1_ROOT, "the cat")
    out.append(MemoryItem(path=f"FSDP{version} root unit's gradients (head, final norm), whole until {until} "
                               "at the end of backward", category=Category.GRADIENTS,
                          bytes=root_held, source=src, key="fsdp.root_grads"))  # fmt: skip
    return out


def backward_items(items: list[MemoryItem], extra: int, shown: MemoryItem | None = None) -> list[MemoryItem]:
    """The backward peak inside a layer under FSDP2: the layer unit's unsharded bytes (parameters or
    reduce-scatter input, and the next unit's prefetched all-gather) shown apart from the gradients
    in flight they were added to (peakmem.formulas.fsdp2.in_layer); ``shown`` names another engine's
    layer extra (ZeRO-3's gradient reduce, peakmem.formulas.zero3)."""
    out = [replace(i, bytes=i.bytes - extra) if i.key == "backward.temporaries" else i for i in items]
    if shown is not None:
        out.append(replace(shown, bytes=extra))
        return out
    out.append(MemoryItem(path="FSDP2 running unit: its unsharded parameters (or reduce-scatter input) and "
                               "the next unit's prefetched all-gather", category=Category.PARAMETERS,
                          bytes=extra, source=SRC_FSDP_GATHER, key="fsdp.units"))  # fmt: skip
    return out


def first_unshard_items(rs: RankStates) -> list[MemoryItem]:
    """The forward instant of the first layer unit's copy-out (peakmem.formulas.fsdp2
    .root_unshards): the root's parameters and all-gather output, the unit's output and
    parameters."""
    return [MemoryItem(path="FSDP2 first unshards: the root's parameters and all-gather output, the first "
                            "layer unit's all-gather output and parameters", category=Category.PARAMETERS,
                       bytes=rs.first_unshard, source=SRC_FSDP_GATHER, key="fsdp.first_unshard")]  # fmt: skip


def pp_first_forward(rs: RankStates, sp: StageParams) -> tuple[int, int]:
    """FSDP2 under PP: (what a layer unit adds while its forward runs, at its unshard) in the step's
    first micro-batch, beyond the stage's units counted unsharded from forward to backward
    (peakmem.formulas.fsdp2.in_layer: ``reshard_after_forward=False``). That forward unshards every
    unit as without PP (_fsdp_param_group.py ``wait_for_unshard`` keeps a unit's all-gather output
    until the next unit's copy-out): its output next to its running layer (one unit), its output and
    the previous one at its unshard (two). The later micro-batches find the units unsharded. The unit
    is the stage's largest, its share of the units' gathered bytes (measured with the parallel oracle
    under full checkpointing: pp2 x fsdp2 first stage forward -11.4% without it)."""
    units = next((i.bytes for i in rs.gathered_forward if i.key == "fsdp.units"), 0)
    layers = sum(c * n for c, n in sp.layer_units)
    unit = units * sp.largest_unit // layers if layers else 0
    return unit, 2 * unit


def pp_reduce_items(rs: RankStates) -> list[MemoryItem]:
    """The reduce-scatters after the last micro-batch's backward under PP (peakmem.formulas.fsdp2
    .pp_reduce)."""
    path = "FSDP2 under PP: a unit's reduce-scatter input and output after the last micro-batch's backward"
    nbytes, cat = rs.reduce_after_backward, Category.GRADIENTS
    return [MemoryItem(path=path, category=cat, bytes=nbytes, source=SRC_FSDP_RS, key="fsdp.reduce_scatter")]


@dataclass(frozen=True, kw_only=True)
class NoGradForward:
    """A sharded model's unsharded bytes in a no-grad forward (a reference, teacher or old-policy pass,
    ``generate``) on one rank, from the same :class:`RankStates` terms as its training forward (the
    ZeRO-3 / FSDP working set ``gathered``; FSDP2's per-unit extras, formulas/fsdp2.py), without the
    saved activations a training forward keeps."""

    gathered: tuple[MemoryItem, ...] = ()  # alive throughout: the root unit and the output kept between units
    running: int = 0  # a layer unit's parameters while its layer runs
    unshard: int = 0  # a unit's all-gather output and parameters at its unshard, before its layer runs
    start: int = 0  # the first unit's unshard next to the root's all-gather output, beyond ``gathered``

    def extra(self, layer: int, head: int, residual: int) -> int:
        """What the unshards add beyond ``gathered`` to a no-grad forward whose temporaries peak at
        ``max(layer, head)`` (one layer's with the residual stream, or the head's): the training
        forward's instants (estimate: a unit's unshard before its layer saves anything, the layer
        running with its parameters, the first unit next to the root's output) with ``residual`` bytes
        of hidden states alive at each unshard."""
        unshards = max(self.unshard, self.start) + residual
        return max(layer + self.running, unshards, head) - max(layer, head)


def no_grad_forward(rs: RankStates) -> NoGradForward:
    """The no-grad forward terms of a rank whose engine buffers are ``rs``."""
    start = max(0, rs.first_unshard - sum(i.bytes for i in rs.gathered_forward))
    gathered, running, unshard = rs.gathered_forward, rs.layer_forward_extra, rs.layer_unshard_extra
    return NoGradForward(gathered=gathered, running=running, unshard=unshard, start=start)
