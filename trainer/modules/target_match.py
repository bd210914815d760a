"""Whether a history's events match the candidate ad: the target-match signal.

The candidate's declared category (sparse feature ``ad_creative_category``)
and each event's category (sequence feature ``seq_category``) are ids of one
vocabulary, so their equality says which events are about the candidate's
topic. :class:`TargetMatch` puts that bit on every event token.
"""

from __future__ import annotations

from typing import Final

import torch
from torch import nn

from features.registry import TIME_BUCKETS
from features.vocab import ACTIONS
from trainer.ops import segment_ids

# One vocabulary, features.vocab.CATEGORIES (0 = missing).
CANDIDATE_CATEGORY: Final = "ad_creative_category"
EVENT_CATEGORY: Final = "seq_category"


def matches_candidate(
    category: torch.Tensor, candidate: torch.Tensor, seg: torch.Tensor
) -> torch.Tensor:
    """Events (L,) whose category is their example's candidate's; 0 never matches.

    Example:
        >>> matches_candidate(torch.tensor([3, 0, 5]), torch.tensor([3, 0]),
        ...                   torch.tensor([0, 0, 1])).tolist()
        [True, False, False]
    """
    return (category == candidate[seg]) & (category > 0)


class TargetMatch(nn.Module):
    """Per event: "same category as the candidate ad?" x recency x action → (D,).

    Why: the target-aware attention must otherwise *learn* that an ad-side
    category embedding (sparse table) and an event-side one (sequence table)
    name the same thing, through random query/key maps, from a few hundred
    clicks; and its softmax forgets how *many* events matched. Recent same-topic
    activity is exactly what the generator's sequence term rewards (and what
    DIN-style models feed explicitly). This table gives every event token the
    match bit jointly with its time bucket and action, so "3 same-topic views in
    the last hour" is a sum of 3 embeddings, which the pyramid's strided mean
    pooling keeps as a count. Ids, not hashes, are compared: both features are
    vocabulary ids, untouched by table caps.

    With ``shared`` (on in every preset), a second table of two rows adds
    the match bit alone: one direction for every matching event, whatever
    its time and action, so the mean of a window's tokens holds the matched
    share along it. The joint rows each learn only from their own (time,
    action) cell, and a long-term interest in a topic is spread over all of
    them, so without the shared rows GEM captures less of it
    (``benchmarks/README.md``).

    Args:
        dim: token width ``D``.
        shared: add the match-bit-only embedding.

    Shapes: event categories, time buckets, actions (L,), the candidate's
    category (B,), offsets (B + 1,) → (L, D).

    Example:
        >>> match = TargetMatch(4)
        >>> match(torch.tensor([3, 5, 0]), torch.tensor([1, 2, 3]),
        ...       torch.tensor([4, 4, 4]), torch.tensor([3, 0]),
        ...       torch.tensor([0, 3, 3])).shape
        torch.Size([3, 4])
    """

    def __init__(self, dim: int, shared: bool = False) -> None:
        super().__init__()
        self.time_rows = TIME_BUCKETS + 1
        self.action_rows = len(ACTIONS) + 1
        rows = 2 * self.time_rows * self.action_rows
        self.table = nn.Embedding(rows, dim)
        # TorchRec's default table init (uniform ±sqrt(1 / rows)), like the others.
        nn.init.uniform_(self.table.weight, -(rows**-0.5), rows**-0.5)
        self.same = nn.Embedding(2, dim) if shared else None
        if self.same is not None:  # the joint rows' scale, not ±sqrt(1 / 2)
            nn.init.uniform_(self.same.weight, -(rows**-0.5), rows**-0.5)

    def forward(
        self,
        category: torch.Tensor,
        time_bucket: torch.Tensor,
        action: torch.Tensor,
        candidate: torch.Tensor,
        offsets: torch.Tensor,
    ) -> torch.Tensor:
        """The match embedding of every event."""
        seg = segment_ids(offsets, category.numel())
        same = matches_candidate(category, candidate, seg)
        index = (same.long() * self.time_rows + time_bucket) * self.action_rows
        out = self.table(index + action)
        return out if self.same is None else out + self.same(same.long())
