"""Pure formulas, one concept per module, each citing the source whose behaviour it models.

Training: :mod:`model_states` (weights, gradients, master weights), :mod:`optimizer` (states and
step temporaries), :mod:`activations` (what autograd saves per layer), :mod:`loss` (logits and
cross-entropy), :mod:`timeline` (phases and the peak), :mod:`allocator` (allocated -> reserved),
:mod:`overhead` (CUDA context, workspaces), :mod:`profiles` (framework behaviour).
"""
