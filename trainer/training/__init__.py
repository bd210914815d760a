"""The pieces the training commands share: the step, the optimizer, checkpoints, the
fit and daemon loops.
"""
