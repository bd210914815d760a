"""The input adapter: TorchRec KJTs and dense counters → tokens.

Tables and their sizes come from :mod:`features.registry`; a preset may cap
them (:attr:`trainer.models.config.EmbeddingConfig.max_num_embeddings`). The input
path already hashes every id into ``[0, num_embeddings)`` of the registry's
table; when a table is capped, the adapter takes ``id % cap`` (a second, lossy
fold: more collisions, nothing else changes). Uncapped tables see the ids as
given.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final, NamedTuple

import torch
from torch import nn
from torchrec.modules.embedding_configs import (
    EmbeddingBagConfig,
    PoolingType,
)
from torchrec.modules.embedding_configs import (
    EmbeddingConfig as TableConfig,
)
from torchrec.modules.embedding_modules import (
    EmbeddingBagCollection,
    EmbeddingCollection,
)
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from features.registry import (
    DENSE_FEATURES,
    SEQUENCE_FEATURES,
    SPARSE_FEATURES,
    SequenceFeature,
    SparseFeature,
)
from trainer.models.config import EmbeddingConfig
from trainer.modules.mlp import mlp
from trainer.modules.target_match import (
    CANDIDATE_CATEGORY,
    EVENT_CATEGORY,
    TargetMatch,
)
from trainer.ops import (
    JaggedTokens,
    jagged_truncate_last,
)

# Sparse features that describe the candidate ad: their embeddings make the
# target (query) of target-aware attention.
TARGET_FEATURES: Final = (
    "ad_id",
    "advertiser_id",
    "campaign_id",
    "ad_format",
    "ad_objective",
    "ad_creative_category",
)


def capped_size(num_embeddings: int, cap: int | None) -> int:
    """Rows of a table of ``num_embeddings`` under ``cap``.

    Example:
        >>> capped_size(1_000_003, 1_000), capped_size(9, 1_000), capped_size(9, None)
        (1000, 9, 9)
    """
    return num_embeddings if cap is None else min(num_embeddings, cap)


def history_ids(kjt: KeyedJaggedTensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A sequence KJT's ids as (keys, L) and its offsets (B + 1,).

    Every sequence key has the same lengths and the KJT is key-major, so a
    view gives each key's ids without splitting the KJT.

    Example:
        >>> kjt = KeyedJaggedTensor.from_lengths_sync(
        ...     keys=["a", "b"], values=torch.tensor([1, 2, 3, 4, 5, 6]),
        ...     lengths=torch.tensor([2, 1, 2, 1]))
        >>> ids, offsets = history_ids(kjt)
        >>> ids.tolist(), offsets.tolist()
        ([[1, 2, 3], [4, 5, 6]], [0, 2, 3])
    """
    num_keys = len(kjt.keys())
    lengths = kjt.lengths().view(num_keys, -1)[0].long()
    offsets = torch.nn.functional.pad(torch.cumsum(lengths, 0), (1, 0))
    return kjt.values().view(num_keys, -1), offsets


class ModuloIds(nn.Module):
    """Fold each key's ids into its (capped) table: ``id % rows[key]``.

    Args:
        rows: table rows per key, in the KJT's key order.

    Shapes: a KJT in, the same KJT (keys, lengths) with folded values out.

    Example:
        >>> kjt = KeyedJaggedTensor.from_lengths_sync(
        ...     keys=["a", "b"], values=torch.tensor([7, 12, 5]),
        ...     lengths=torch.tensor([1, 1, 1, 0]))
        >>> ModuloIds([5, 10])(kjt).values().tolist()
        [2, 2, 5]
    """

    def __init__(self, rows: Sequence[int]) -> None:
        super().__init__()
        self.register_buffer("rows", torch.tensor(list(rows), dtype=torch.int64))

    def forward(self, kjt: KeyedJaggedTensor) -> KeyedJaggedTensor:
        """Fold the ids."""
        lengths = kjt.lengths()
        per_key = lengths.view(self.rows.numel(), -1).sum(1)
        values = kjt.values()
        modulus = torch.repeat_interleave(
            self.rows, per_key, output_size=values.numel()
        )
        return KeyedJaggedTensor(
            keys=kjt.keys(),
            values=values % modulus,
            lengths=lengths,
            stride=kjt.stride(),
        )


def fold_ids(
    features: Sequence[SparseFeature | SequenceFeature], cap: int | None
) -> ModuloIds | None:
    """The :class:`ModuloIds` that folds ``features``' ids into their tables
    under ``cap``; None when ``cap`` shrinks none of them.

    Example:
        >>> fold_ids(SPARSE_FEATURES, None) is None
        True
    """
    rows = [capped_size(f.num_embeddings, cap) for f in features]
    capped = any(r < f.num_embeddings for r, f in zip(rows, features, strict=True))
    return ModuloIds(rows) if capped else None


def _bag_tables(
    features: Sequence[SparseFeature | SequenceFeature],
    dim: int,
    cap: int | None,
    pooling: PoolingType,
) -> list[EmbeddingBagConfig]:
    return [
        EmbeddingBagConfig(
            name=f"t_{f.name}",
            embedding_dim=dim,
            num_embeddings=capped_size(f.num_embeddings, cap),
            feature_names=[f.name],
            pooling=pooling,
        )
        for f in features
    ]


def sparse_tables(dim: int, cap: int | None) -> list[EmbeddingBagConfig]:
    """One pooled table per registry sparse feature (sum pooling)."""
    return _bag_tables(SPARSE_FEATURES, dim, cap, PoolingType.SUM)


class SparseEmbeddings(nn.Module):
    """Non-sequential ids → one token per feature.

    Args:
        config: dim and cap.

    Shapes: KJT (keys = registry sparse features, one id each) → (B, F, D).

    Example:
        >>> from trainer.models.config import tiny
        >>> module = SparseEmbeddings(tiny().embedding)
        >>> kjt = KeyedJaggedTensor.from_lengths_sync(
        ...     keys=[f.name for f in SPARSE_FEATURES],
        ...     values=torch.zeros(2 * len(SPARSE_FEATURES), dtype=torch.long),
        ...     lengths=torch.ones(2 * len(SPARSE_FEATURES), dtype=torch.long))
        >>> module(kjt).shape
        torch.Size([2, 14, 8])
    """

    def __init__(self, config: EmbeddingConfig) -> None:
        super().__init__()
        cap = config.max_num_embeddings
        self.dim = config.dim
        self.num_features = len(SPARSE_FEATURES)
        self.names = [f.name for f in SPARSE_FEATURES]
        self.ebc = EmbeddingBagCollection(tables=sparse_tables(config.dim, cap))
        self.modulo = fold_ids(SPARSE_FEATURES, cap)

    def forward(self, kjt: KeyedJaggedTensor) -> torch.Tensor:
        """Embed and pool: (B, F, D)."""
        if self.modulo is not None:
            kjt = self.modulo(kjt)
        embedded = self.ebc(kjt)
        if embedded.keys() == self.names:
            pooled = embedded.values()  # (B, F * D), registry order
        else:  # a TorchRec-sharded EBC groups its output keys by sharding type
            pooled = torch.cat([embedded[name] for name in self.names], dim=1)
        return pooled.view(-1, self.num_features, self.dim)


class SequenceEmbeddings(nn.Module):
    """Sequence KJT → one jagged token per event (unpooled ``EmbeddingCollection``).

    The ``S`` per-event embeddings are summed (``sequence_combine="sum"``) or
    concatenated and mapped to ``D`` by a linear layer (``"concat"``). Only the
    ``max_seq_len`` newest events are kept.

    Args:
        config: dim, cap, combine mode and ``max_seq_len``.

    Shapes: KJT (keys = registry sequence features, equal lengths ``L[b]``)
    → :class:`JaggedTokens` with values (sum_b min(L[b], max_seq_len), D).

    Example:
        >>> from trainer.models.config import tiny
        >>> module = SequenceEmbeddings(tiny().embedding)
        >>> s = len(SEQUENCE_FEATURES)
        >>> kjt = KeyedJaggedTensor.from_lengths_sync(
        ...     keys=[f.name for f in SEQUENCE_FEATURES],
        ...     values=torch.zeros(3 * s, dtype=torch.long),
        ...     lengths=torch.tensor([2, 0, 1] * s))
        >>> out = module(kjt)
        >>> out.values.shape, out.offsets.tolist()
        (torch.Size([3, 8]), [0, 2, 2, 3])
    """

    def __init__(self, config: EmbeddingConfig) -> None:
        super().__init__()
        cap = config.max_num_embeddings
        self.max_seq_len = config.max_seq_len
        self.names = [f.name for f in SEQUENCE_FEATURES]
        self.match = (
            TargetMatch(config.dim, config.target_match_shared)
            if config.target_match
            else None
        )
        self.ec = EmbeddingCollection(
            tables=[
                TableConfig(
                    name=f"t_{f.name}",
                    embedding_dim=config.dim,
                    num_embeddings=capped_size(f.num_embeddings, cap),
                    feature_names=[f.name],
                )
                for f in SEQUENCE_FEATURES
            ]
        )
        self.modulo = fold_ids(SEQUENCE_FEATURES, cap)
        self.concat = (
            nn.Linear(len(self.names) * config.dim, config.dim)
            if config.sequence_combine == "concat"
            else None
        )

    def forward(
        self, kjt: KeyedJaggedTensor, candidate_category: torch.Tensor | None = None
    ) -> JaggedTokens:
        """Embed, combine per event, keep the newest ``max_seq_len``.

        ``candidate_category`` (B,) adds the :class:`TargetMatch` embedding
        (when the config enables it).
        """
        if self.modulo is not None:
            kjt = self.modulo(kjt)
        ids, offsets = history_ids(kjt)
        per_feature = self.ec(kjt)
        embeddings = [per_feature[name].values() for name in self.names]
        if self.concat is not None:
            values = self.concat(torch.cat(embeddings, dim=-1))
        else:
            values = torch.stack(embeddings, dim=0).sum(0)
        if self.match is not None and candidate_category is not None:
            values = values + self.match(
                ids[self.names.index(EVENT_CATEGORY)],
                ids[self.names.index("seq_time_bucket")],
                ids[self.names.index("seq_action")],
                candidate_category,
                offsets,
            )
        values, offsets = jagged_truncate_last(values, offsets, self.max_seq_len)
        return JaggedTokens(values, offsets, self.max_seq_len)


class DenseTokens(nn.Module):
    """Dense counters → ``num_dense_tokens`` tokens through an MLP.

    Args:
        config: dim, hidden widths, token count.

    Shapes: (B, len(DENSE_FEATURES)) → (B, num_dense_tokens, D).

    Example:
        >>> from trainer.models.config import tiny
        >>> DenseTokens(tiny().embedding)(torch.zeros(2, len(DENSE_FEATURES))).shape
        torch.Size([2, 1, 8])
    """

    def __init__(self, config: EmbeddingConfig) -> None:
        super().__init__()
        self.tokens = config.num_dense_tokens
        self.dim = config.dim
        self.mlp = mlp(
            len(DENSE_FEATURES),
            (*config.dense_hidden, config.num_dense_tokens * config.dim),
            last_activation=False,
        )

    def forward(self, dense: torch.Tensor) -> torch.Tensor:
        """Project: (B, tokens, D)."""
        return self.mlp(dense).view(-1, self.tokens, self.dim)


class InputTokens(NamedTuple):
    """What :class:`InputAdapter` produces.

    ``tokens`` (B, n, D) non-sequence tokens [dense ∥ sparse]; ``target``
    (B, D) candidate-ad embedding or None; ``sequence`` jagged event tokens or
    None.
    """

    tokens: torch.Tensor
    target: torch.Tensor | None
    sequence: JaggedTokens | None


class InputAdapter(nn.Module):
    """All inputs of a :class:`trainer.data.batch.Batch` → tokens.

    Args:
        config: the embedding config.
        use_sequences: embed the sequence KJT (``False`` skips it).
        use_target: build the candidate-ad target embedding (only the pyramid
            encoder's target-aware attention needs it).

    Shapes: ``tokens`` (B, num_dense_tokens + F, D), ``target`` (B, D) or
    None, ``sequence`` (L, D) jagged or None.

    Example:
        >>> from trainer.models.config import tiny
        >>> adapter = InputAdapter(tiny().embedding, use_sequences=False)
        >>> adapter.num_tokens
        15
    """

    def __init__(
        self,
        config: EmbeddingConfig,
        use_sequences: bool = True,
        use_target: bool = True,
    ) -> None:
        super().__init__()
        self.sparse = SparseEmbeddings(config)
        self.dense = DenseTokens(config)
        self.sequence = SequenceEmbeddings(config) if use_sequences else None
        names = [f.name for f in SPARSE_FEATURES]
        self.target_index = [names.index(n) for n in TARGET_FEATURES]
        self.category_index = names.index(CANDIDATE_CATEGORY)
        self.target = (
            nn.Linear(len(TARGET_FEATURES) * config.dim, config.dim)
            if use_target
            else None
        )
        self.num_tokens = config.num_dense_tokens + len(SPARSE_FEATURES)

    def forward(
        self,
        sparse: KeyedJaggedTensor,
        dense: torch.Tensor,
        sequence: KeyedJaggedTensor | None = None,
    ) -> InputTokens:
        """Embed everything."""
        sparse_tokens = self.sparse(sparse)  # (B, F, D)
        tokens = torch.cat([self.dense(dense), sparse_tokens], dim=1)
        target = None
        if self.target is not None:
            target = self.target(sparse_tokens[:, self.target_index].flatten(1))
        seq = None
        if self.sequence is not None and sequence is not None:
            candidate = sparse.values().view(len(SPARSE_FEATURES), -1)[
                self.category_index
            ]  # key-major, one id per example
            seq = self.sequence(sequence, candidate)
        return InputTokens(tokens, target, seq)


def pooled_tables(dim: int, cap: int | None) -> list[EmbeddingBagConfig]:
    """Baseline tables: registry sparse features (sum) + sequence features (mean).

    Mean pooling turns each sequence feature into one vector of the whole
    history (an empty history pools to zeros).

    Example:
        >>> len(pooled_tables(8, 1000)) == len(SPARSE_FEATURES) + len(SEQUENCE_FEATURES)
        True
    """
    return sparse_tables(dim, cap) + _bag_tables(
        SEQUENCE_FEATURES, dim, cap, PoolingType.MEAN
    )


class MergedIds(nn.Module):
    """Sparse KJT + sequence KJT → one KJT for :func:`pooled_tables`, ids folded.

    Args:
        config: the embedding config (its cap).

    Shapes: KJTs with F and S keys over B examples → one KJT with F + S keys.

    Example:
        >>> from trainer.models.config import tiny
        >>> merge = MergedIds(tiny().embedding)
        >>> sparse = KeyedJaggedTensor.from_lengths_sync(
        ...     keys=[f.name for f in SPARSE_FEATURES],
        ...     values=torch.full((len(SPARSE_FEATURES),), 5_000),
        ...     lengths=torch.ones(len(SPARSE_FEATURES), dtype=torch.long))
        >>> seq = KeyedJaggedTensor.from_lengths_sync(
        ...     keys=[f.name for f in SEQUENCE_FEATURES],
        ...     values=torch.zeros(0, dtype=torch.long),
        ...     lengths=torch.zeros(len(SEQUENCE_FEATURES), dtype=torch.long))
        >>> merged = merge(sparse, seq)
        >>> len(merged.keys()), merged.values()[0].item()
        (20, 0)
    """

    def __init__(self, config: EmbeddingConfig) -> None:
        super().__init__()
        features = [*SPARSE_FEATURES, *SEQUENCE_FEATURES]
        self.modulo = fold_ids(features, config.max_num_embeddings)

    def forward(
        self, sparse: KeyedJaggedTensor, sequence: KeyedJaggedTensor
    ) -> KeyedJaggedTensor:
        """Concatenate the keys and fold the ids."""
        merged = KeyedJaggedTensor.concat([sparse, sequence])
        return self.modulo(merged) if self.modulo is not None else merged
