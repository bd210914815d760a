"""Pure-PyTorch reference implementations of the jagged ops (the oracles).

Nothing here pads a batch to its longest sequence except
:func:`~trainer.ops.pytorch.pt_attention.pytorch_jagged_self_attention`, which
pads *inside* the op (documented there).
"""
