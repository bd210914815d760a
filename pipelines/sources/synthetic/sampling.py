"""Vectorized sampling helpers shared by the generator's modules.

The generator draws millions of categorical values whose distribution differs
row by row (a topic from *this* user's interests, an ad from *this* domain's
and topic's catalogue). A Python loop per draw would dominate the run;
instead every such draw goes through :class:`SegmentSampler`, which lays all the
per-group CDFs end to end and answers a whole batch with one
``np.searchsorted``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]


def zipf_weights(n: int, exponent: float, rng: np.random.Generator) -> FloatArray:
    """Zipf weights ``1 / rank**exponent`` over ``n`` items, ranks shuffled.

    Shuffling the ranks keeps popularity independent of the id order, so
    "item 0 is the most popular" never sneaks into a model as a feature.

    Args:
        n: number of items.
        exponent: Zipf exponent (1.0 is the classic long tail).
        rng: the generator's random stream.

    Returns:
        Weights summing to 1, shape ``(n,)``.
    """
    ranks = rng.permutation(n) + 1
    weights: FloatArray = ranks.astype(np.float64) ** -exponent
    weights /= weights.sum()
    return weights


def categorical(
    probabilities: npt.ArrayLike, size: int, rng: np.random.Generator
) -> IntArray:
    """``size`` draws from one fixed categorical distribution.

    Args:
        probabilities: weights (normalized here).
        size: number of draws.
        rng: the random stream.

    Returns:
        Indices into ``probabilities``, int64.
    """
    cdf = np.cumsum(np.asarray(probabilities, dtype=np.float64))
    cdf /= cdf[-1]
    picks = np.searchsorted(cdf, rng.random(size), side="right")
    return np.minimum(picks, cdf.size - 1).astype(np.int64)


@dataclass(frozen=True)
class SegmentSampler:
    """Draws an item from one of many weighted groups, a whole batch at once.

    Group ``g``'s CDF occupies the interval ``(g, g + 1]`` of one concatenated
    array, so a draw for group ``g`` is ``searchsorted(cdf, g + U(0, 1))``.
    A draw for an empty group would silently land in the next group, so
    callers check :attr:`nonempty` and redirect such draws first.

    Attributes:
        cdf: concatenated per-group CDFs, float64, non-decreasing.
        items: the item at each CDF position.
        nonempty: per group, whether it has any item of positive weight.
    """

    cdf: FloatArray
    items: IntArray
    nonempty: npt.NDArray[np.bool_]

    @classmethod
    def build(
        cls,
        group_of_item: npt.ArrayLike,
        weights: npt.ArrayLike,
        groups: int,
        item_ids: npt.ArrayLike | None = None,
    ) -> SegmentSampler:
        """Sampler where each item (or each copy of an item) is in one group.

        Args:
            group_of_item: group index of each entry, shape ``(n,)``.
            weights: non-negative weight of each entry within its group.
            groups: number of groups (some may be empty).
            item_ids: the item each entry stands for; defaults to its position
                (pass ids when an item appears in several groups).

        Returns:
            The sampler.
        """
        group_of_item = np.asarray(group_of_item, dtype=np.int64)
        weights = np.asarray(weights, dtype=np.float64)
        ids = (
            np.arange(group_of_item.size, dtype=np.int64)
            if item_ids is None
            else np.asarray(item_ids, dtype=np.int64)
        )
        keep = weights > 0
        ids, group_of_item, weights = ids[keep], group_of_item[keep], weights[keep]
        order = np.argsort(group_of_item, kind="stable")
        groups_sorted, ids, w = group_of_item[order], ids[order], weights[order]
        starts = np.searchsorted(groups_sorted, np.arange(groups + 1))
        size = np.diff(starts)
        nonempty = size > 0
        cum = np.cumsum(w)
        # Cumulative sums within each group: subtract the total before it.
        before = np.concatenate([[0.0], cum])[starts[:-1]]
        ends = starts[1:] - 1
        totals = np.where(nonempty, cum[np.maximum(ends, 0)] - before, 1.0)
        local = (cum - np.repeat(before, size)) / np.repeat(totals, size)
        local[ends[nonempty]] = 1.0  # exact right end: no draw falls past a group
        cdf = local + groups_sorted.astype(np.float64)
        return cls(cdf=cdf, items=ids, nonempty=nonempty)

    @classmethod
    def from_matrix(cls, weights: npt.ArrayLike) -> SegmentSampler:
        """Sampler over the columns of a ``(groups, k)`` weight matrix.

        Row ``g`` is group ``g``'s distribution over items ``0..k-1`` (e.g. a
        user's interest vector over topics). Every row must have a positive sum.
        """
        matrix = np.asarray(weights, dtype=np.float64)
        groups, k = matrix.shape
        cum = np.cumsum(matrix, axis=1)
        cum /= cum[:, -1:]
        cum[:, -1] = 1.0
        cdf = (cum + np.arange(groups, dtype=np.float64)[:, None]).ravel()
        items = np.tile(np.arange(k, dtype=np.int64), groups)
        return cls(cdf=cdf, items=items, nonempty=np.ones(groups, dtype=bool))

    def sample(self, group: npt.ArrayLike, rng: np.random.Generator) -> IntArray:
        """One item per entry of ``group`` (each from its own group).

        Args:
            group: group index per draw (groups must be non-empty).
            rng: the random stream.

        Returns:
            Item ids, int64, same shape as ``group``.
        """
        group = np.asarray(group, dtype=np.int64)
        u = group + rng.random(group.size)
        pos = np.searchsorted(self.cdf, u, side="right")
        return self.items[np.minimum(pos, self.items.size - 1)]
