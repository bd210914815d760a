"""The batch every GEM model consumes, in TorchRec's types.

Produced by the input path (:mod:`trainer.data.inputs`, from Arrow examples plus
timelines) and consumed by the models; neither side knows the other's
internals. Layouts, with ``B`` examples, ``F`` sparse features, ``S`` sequence
features and ``L[i]`` the history length of example ``i``::

    sparse    KeyedJaggedTensor, keys = SPARSE_FEATURE_NAMES (registry order),
              exactly one id per (feature, example): lengths all 1, values in
              [0, num_embeddings) of that feature's table (already hashed).
    sequence  KeyedJaggedTensor, keys = SEQUENCE_FEATURE_NAMES; every key has
              the same lengths L (one history per example, oldest event first;
              L[i] may be 0), values already hashed into their tables.
    dense     (B, len(DENSE_FEATURES)) float32, log1p of the counters.
    labels    (B, len(TRAINING_OBJECTIVES)) float32 in {0, 1}.
    domain    (B,) int64, index into vocab.DOMAINS (0-based).

The KJT for sequences, e.g. B = 3 with lengths [2, 0, 1]::

    #              0        1     2   <-- example
    # "seq_action" [a0, a1] []    [a2]
    # "seq_domain" [d0, d1] []    [d2]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor
from torchrec.streamable import Pipelineable

from features.registry import SEQUENCE_FEATURES, SPARSE_FEATURES

SPARSE_FEATURE_NAMES: Final = tuple(f.name for f in SPARSE_FEATURES)
SEQUENCE_FEATURE_NAMES: Final = tuple(f.name for f in SEQUENCE_FEATURES)


@dataclass
class Batch(Pipelineable):
    """One training batch (see the module docstring for layouts)."""

    sparse: KeyedJaggedTensor
    sequence: KeyedJaggedTensor
    dense: torch.Tensor
    labels: torch.Tensor
    domain: torch.Tensor

    @property
    def size(self) -> int:
        """Number of examples B."""
        return int(self.dense.shape[0])

    def to(self, device: torch.device, non_blocking: bool = False) -> Batch:
        """A copy on ``device`` (use as ``batch = batch.to(device)``)."""
        return Batch(
            sparse=self.sparse.to(device=device, non_blocking=non_blocking),
            sequence=self.sequence.to(device=device, non_blocking=non_blocking),
            dense=self.dense.to(device=device, non_blocking=non_blocking),
            labels=self.labels.to(device=device, non_blocking=non_blocking),
            domain=self.domain.to(device=device, non_blocking=non_blocking),
        )

    def record_stream(self, stream: torch.Stream) -> None:
        """Mark every tensor as used by ``stream`` (CUDA pipelining)."""
        self.sparse.record_stream(stream)
        self.sequence.record_stream(stream)
        for tensor in (self.dense, self.labels, self.domain):
            tensor.record_stream(stream)

    def pin_memory(self) -> Batch:
        """A copy in pinned host memory, for non-blocking copies to a GPU."""
        return Batch(
            sparse=self.sparse.pin_memory(),
            sequence=self.sequence.pin_memory(),
            dense=self.dense.pin_memory(),
            labels=self.labels.pin_memory(),
            domain=self.domain.pin_memory(),
        )
