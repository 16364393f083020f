"""Layers shared by AF2 and AF3: the families in :mod:`fold_model.af2` and :mod:`fold_model.af3`
compose these (neither family imports the other).

* ``primitives``: Linear (AF2 inits), LayerNorm, gated / global attention, the pair bias,
  shared dropout and its residual, row chunking;
* ``msa_attention``: MSA row attention with pair bias, column, global column;
* ``triangle_attention``: around the starting / ending node (the ``triangle_attention`` op);
* ``triangle_multiplication``: the multiplicative update, outgoing / incoming;
* ``outer_product_mean``: the MSA's update of the pair;
* ``pair_stack``: the five pair updates of a block (both families' order);
* ``transitions``: AF2's ReLU transition, AF3's SwiGLU transition;
* ``stack``: :class:`BlockStack`, the one stack runner (chunking, DAP, checkpointing).
"""

from __future__ import annotations

from fold_model.layers.msa_attention import (
    MSAColumnAttention,
    MSAColumnGlobalAttention,
    MSARowAttentionWithPairBias,
)
from fold_model.layers.outer_product_mean import OuterProductMean
from fold_model.layers.pair_stack import pair_stack
from fold_model.layers.primitives import (
    Attention,
    GlobalAttention,
    InitName,
    LayerNorm,
    Linear,
    add_residual,
    chunked_rows,
    dropout_residual,
    fork_pair_bias,
    in_place_residuals,
    pair_bias,
    shared_dropout_mask,
    skip_weight_init,
    stack_as_made,
)
from fold_model.layers.stack import BlockStack
from fold_model.layers.transitions import (
    MSATransition,
    PairTransition,
    SwiGLUTransition,
    Transition,
)
from fold_model.layers.triangle_attention import (
    TriangleAttention,
    TriangleAttentionEndingNode,
    TriangleAttentionStartingNode,
)
from fold_model.layers.triangle_multiplication import (
    TriangleMultiplication,
    TriangleMultiplicationIncoming,
    TriangleMultiplicationOutgoing,
)

__all__ = [
    "Attention",
    "BlockStack",
    "GlobalAttention",
    "InitName",
    "LayerNorm",
    "Linear",
    "MSAColumnAttention",
    "MSAColumnGlobalAttention",
    "MSARowAttentionWithPairBias",
    "MSATransition",
    "OuterProductMean",
    "PairTransition",
    "SwiGLUTransition",
    "Transition",
    "TriangleAttention",
    "TriangleAttentionEndingNode",
    "TriangleAttentionStartingNode",
    "TriangleMultiplication",
    "TriangleMultiplicationIncoming",
    "TriangleMultiplicationOutgoing",
    "add_residual",
    "chunked_rows",
    "dropout_residual",
    "in_place_residuals",
    "skip_weight_init",
    "fork_pair_bias",
    "pair_bias",
    "pair_stack",
    "shared_dropout_mask",
    "stack_as_made",
]
