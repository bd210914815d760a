"""Model configuration: frozen dataclasses plus named presets.

A run's model is described completely by one :class:`ModelConfig`, built by a
preset function (:func:`tiny`, :func:`default`, :func:`large`); a variant is a
``dataclasses.replace`` of a preset, never a mutation. Table sizes are not
configured here: they come from :mod:`features.registry`, optionally capped by
:attr:`EmbeddingConfig.max_num_embeddings`.

- ``tiny``: unit tests, seconds on a CPU.
- ``default``: trains on a 2-core CPU in minutes (small dims, capped tables).
- ``large``: for a GPU (wide dims, full tables, fbgemm kernels).

Example:
    >>> cfg = tiny()
    >>> cfg.embedding.dim, cfg.interformer.num_layers
    (8, 1)
    >>> import dataclasses
    >>> dataclasses.replace(cfg, use_sequences=False).use_sequences
    False
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from trainer.ops.kernel import Kernel


@dataclass(frozen=True, kw_only=True)
class EmbeddingConfig:
    """Input adapter: tables, sequence token, dense tokens.

    Args:
        dim: the global embedding dimension ``D`` (every token has it).
        max_num_embeddings: cap on table rows; a table larger than the cap is
            built with ``cap`` rows and ids (already hashed into the registry's
            table size by the input path) are taken modulo ``cap`` inside the
            model's input adapter. ``None`` keeps the registry sizes.
        sequence_combine: how the ``S`` per-event embeddings become one token:
            ``"sum"`` or ``"concat"`` (concatenate then a linear map to ``D``).
        num_dense_tokens: tokens the dense-feature MLP produces.
        dense_hidden: hidden widths of the dense-feature MLP.
        max_seq_len: most recent events kept per history (longer ones are
            truncated, oldest dropped).
        target_match: add to every event token an embedding of (its category
            equals the candidate ad's, time bucket, action)
            (:class:`trainer.modules.target_match.TargetMatch`).
        target_match_shared: add the match bit's own embedding too, shared by
            every time bucket and action (on by default: GEM captures more
            of a user's long-term interest with it, ``benchmarks/README.md``).
    """

    dim: int
    max_num_embeddings: int | None = None
    sequence_combine: Literal["sum", "concat"] = "sum"
    num_dense_tokens: int = 1
    dense_hidden: tuple[int, ...] = (32,)
    max_seq_len: int = 4096
    target_match: bool = True
    target_match_shared: bool = True


@dataclass(frozen=True, kw_only=True)
class WukongConfig:
    """A Wukong interaction stack (Wukong §3, docs/model.md).

    Args:
        num_layers: stacked layers ``l``.
        num_fm_tokens: ``n_F``, embeddings each FMB emits.
        num_lc_tokens: ``n_L``, embeddings each LCB emits.
        fm_rank: ``k``, columns of the optimized FM's projection ``Y``.
        mlp_dims: hidden widths of the FMB MLP.
        cross_layer_attention: before layer ``i > 0``, let its input attend to
            the outputs of all earlier layers (our design, docs/model.md).
        attention_heads: heads of the cross-layer attention.
    """

    num_layers: int = 1
    num_fm_tokens: int = 4
    num_lc_tokens: int = 4
    fm_rank: int = 4
    mlp_dims: tuple[int, ...] = (32,)
    cross_layer_attention: bool = False
    attention_heads: int = 1


@dataclass(frozen=True, kw_only=True)
class PyramidConfig:
    """The pyramid-parallel long-sequence encoder (our design, docs/model.md).

    Args:
        enabled: run the encoder; when off, InterFormer gets the most recent
            ``InterFormerConfig.no_pyramid_max_len`` raw event tokens.
        num_levels: levels; level ``l`` sees ``ceil(T / ratio**l)`` tokens.
        ratio: contraction ``r`` between levels (strided mean pooling).
        window: causal local-attention window (tokens, incl. itself).
        num_heads: attention heads of every branch.
        num_seeds: PMA seed tokens per level.
    """

    enabled: bool = True
    num_levels: int = 2
    ratio: int = 4
    window: int = 8
    num_heads: int = 1
    num_seeds: int = 2


@dataclass(frozen=True, kw_only=True)
class InterFormerConfig:
    """InterFormer (Zeng et al., CIKM'25) around the Wukong interaction arch.

    Args:
        num_layers: interleaved layers ``L``.
        num_heads: heads of the Sequence-arch MHA and of PMA.
        num_cls: ``#CLS`` = non-sequence summary tokens ``n_sum``.
        num_pma: ``#PMA`` seeds of the sequence summary.
        num_recent: ``#recent`` most recent tokens in the sequence summary.
        interleave: bidirectional exchange (``int`` mode). ``False`` is the
            paper's ``sep`` ablation: no CLS prefix, no S_sum into the
            interaction arch, a plain FFN instead of the PFFN.
        no_pyramid_max_len: raw tokens InterFormer sees when the pyramid is off.
    """

    num_layers: int = 1
    num_heads: int = 1
    num_cls: int = 4
    num_pma: int = 2
    num_recent: int = 2
    interleave: bool = True
    no_pyramid_max_len: int = 64


@dataclass(frozen=True, kw_only=True)
class HeadsConfig:
    """PLE/CGC multi-domain heads (Tang et al., RecSys'20; docs/model.md).

    Args:
        num_shared_experts: experts every task's gate sees.
        num_specific_experts: experts per domain, seen only by its tasks.
        expert_dims: widths of each expert MLP (the last is the expert output).
        tower_dims: hidden widths of each (domain, objective) tower.
        domain_dim: width of the domain embedding the gates are conditioned on.
    """

    num_shared_experts: int = 2
    num_specific_experts: int = 1
    expert_dims: tuple[int, ...] = (32,)
    tower_dims: tuple[int, ...] = (16,)
    domain_dim: int = 4


@dataclass(frozen=True, kw_only=True)
class BaselineConfig:
    """DLRM / DCNv2 baselines.

    Args:
        dense_arch: DLRM bottom MLP widths (the last must equal the
            embedding dim) / DCNv2 dense projection.
        over_arch: hidden widths of the top MLP (the logits layer is added).
        cross_layers: DCNv2 cross layers.
        low_rank: DCNv2 low rank; ``None`` uses the full-rank ``CrossNet``.
    """

    dense_arch: tuple[int, ...] = (16, 8)
    over_arch: tuple[int, ...] = (32,)
    cross_layers: int = 2
    low_rank: int | None = 4


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """Everything a model built by :func:`trainer.models.registry.build_model` needs.

    Args:
        embedding: input adapter.
        wukong: the interaction stack (per InterFormer layer).
        pyramid: the long-sequence encoder.
        interformer: the interleaving trunk.
        heads: the multi-domain heads.
        baseline: DLRM / DCNv2 settings.
        use_sequences: ``False`` is the "without sequences" ablation.
        kernel: jagged-op implementation.
    """

    embedding: EmbeddingConfig
    wukong: WukongConfig = field(default_factory=WukongConfig)
    pyramid: PyramidConfig = field(default_factory=PyramidConfig)
    interformer: InterFormerConfig = field(default_factory=InterFormerConfig)
    heads: HeadsConfig = field(default_factory=HeadsConfig)
    baseline: BaselineConfig = field(default_factory=BaselineConfig)
    use_sequences: bool = True
    kernel: Kernel = Kernel.PYTORCH


def tiny() -> ModelConfig:
    """Unit-test preset: D=8, 1 layer, tables capped at 1,000 rows."""
    return ModelConfig(
        embedding=EmbeddingConfig(
            dim=8, max_num_embeddings=1_000, dense_hidden=(16,), max_seq_len=4096
        ),
        wukong=WukongConfig(
            num_layers=2,
            num_fm_tokens=4,
            num_lc_tokens=4,
            fm_rank=4,
            mlp_dims=(16,),
            cross_layer_attention=True,
        ),
        pyramid=PyramidConfig(num_levels=2, ratio=4, window=4, num_seeds=2),
        interformer=InterFormerConfig(num_layers=1, no_pyramid_max_len=32),
        heads=HeadsConfig(
            num_shared_experts=1, expert_dims=(16,), tower_dims=(8,), domain_dim=4
        ),
        baseline=BaselineConfig(dense_arch=(16, 8), over_arch=(16,), low_rank=2),
    )


def default() -> ModelConfig:
    """2-core CPU preset: D=32, 2 InterFormer layers, tables capped at 100,003,
    the newest 32 events of each history."""
    return ModelConfig(
        embedding=EmbeddingConfig(
            dim=32,
            max_num_embeddings=100_003,
            dense_hidden=(64,),
            num_dense_tokens=2,
            # GEM's cost grows with the history it reads: at 32 events one
            # epoch of MovieLens-1M takes minutes on 2 cores (the long
            # histories are the large preset's, for GPUs).
            max_seq_len=32,
        ),
        wukong=WukongConfig(
            num_layers=2,
            num_fm_tokens=8,
            num_lc_tokens=8,
            fm_rank=8,
            mlp_dims=(128,),
            cross_layer_attention=True,
            attention_heads=2,
        ),
        pyramid=PyramidConfig(num_levels=2, ratio=4, window=16, num_heads=2),
        interformer=InterFormerConfig(num_layers=2, num_heads=2, no_pyramid_max_len=64),
        heads=HeadsConfig(
            num_shared_experts=2,
            num_specific_experts=1,
            expert_dims=(64,),
            tower_dims=(32,),
            domain_dim=8,
        ),
        baseline=BaselineConfig(
            dense_arch=(64, 32), over_arch=(128, 64), cross_layers=3, low_rank=16
        ),
    )


def large() -> ModelConfig:
    """GPU preset: D=128, 3 InterFormer layers, full registry tables, fbgemm."""
    return ModelConfig(
        embedding=EmbeddingConfig(
            dim=128,
            max_num_embeddings=None,
            sequence_combine="concat",
            dense_hidden=(256,),
            num_dense_tokens=4,
            max_seq_len=4096,
        ),
        wukong=WukongConfig(
            num_layers=2,
            num_fm_tokens=16,
            num_lc_tokens=16,
            fm_rank=24,
            mlp_dims=(1024, 1024),
            cross_layer_attention=True,
            attention_heads=4,
        ),
        pyramid=PyramidConfig(
            num_levels=3, ratio=4, window=64, num_heads=4, num_seeds=4
        ),
        interformer=InterFormerConfig(
            num_layers=3, num_heads=4, no_pyramid_max_len=256
        ),
        heads=HeadsConfig(
            num_shared_experts=4,
            num_specific_experts=2,
            expert_dims=(512, 256),
            tower_dims=(128, 64),
            domain_dim=16,
        ),
        baseline=BaselineConfig(
            dense_arch=(512, 128), over_arch=(1024, 512), cross_layers=3, low_rank=64
        ),
        kernel=Kernel.FBGEMM,
    )


PRESETS = {"tiny": tiny, "default": default, "large": large}


def preset(name: str) -> ModelConfig:
    """The preset called ``name`` (``tiny``, ``default`` or ``large``).

    Example:
        >>> preset("default").embedding.dim
        32
    """
    try:
        return PRESETS[name]()
    except KeyError:
        raise ValueError(
            f"unknown preset {name!r}; choose from {sorted(PRESETS)}"
        ) from None


def config_to_dict(config: ModelConfig) -> dict[str, Any]:
    """``config`` as plain dicts, lists and strings: what a checkpoint loaded
    with ``torch.load(weights_only=True)`` can hold.

    Example:
        >>> config_to_dict(tiny())["embedding"]["dim"]
        8
    """
    raw = dataclasses.asdict(config)
    raw["kernel"] = str(config.kernel.value)
    return raw


# Fields a checkpoint's config may hold that no model here has: at these
# values they select nothing, so they are dropped on load.
INERT_FIELDS: Final[dict[str, dict[str, Any]]] = {
    "embedding": {"match_share": False},
    "pyramid": {"target_weights": "softmax", "recent_tokens": 0},
    "interformer": {
        "token_ffn": False,
        "quiet_pffn": False,
        "quiet_s_sum": False,
        "read_prefix": False,
    },
}


def config_from_dict(raw: dict[str, Any]) -> ModelConfig:
    """Inverse of :func:`config_to_dict` (lists back to tuples).

    A field of :data:`INERT_FIELDS` is dropped at its inert value and refused
    at any other.

    Example:
        >>> config_from_dict(config_to_dict(default())) == default()
        True
        >>> raw = config_to_dict(tiny())
        >>> raw["interformer"]["token_ffn"] = False
        >>> config_from_dict(raw) == tiny()
        True
    """

    def part(cls: Any, section: str) -> Any:
        values = dict(raw[section])
        for name, inert in INERT_FIELDS.get(section, {}).items():
            if name in values and values.pop(name) != inert:
                raise ValueError(
                    f"the checkpoint's model sets {section}.{name}, "
                    "which no model here has"
                )
        fixed = {k: tuple(v) if isinstance(v, list) else v for k, v in values.items()}
        return cls(**fixed)

    return ModelConfig(
        embedding=part(EmbeddingConfig, "embedding"),
        wukong=part(WukongConfig, "wukong"),
        pyramid=part(PyramidConfig, "pyramid"),
        interformer=part(InterFormerConfig, "interformer"),
        heads=part(HeadsConfig, "heads"),
        baseline=part(BaselineConfig, "baseline"),
        use_sequences=bool(raw["use_sequences"]),
        kernel=Kernel(raw["kernel"]),
    )


__all__ = [
    "BaselineConfig",
    "EmbeddingConfig",
    "HeadsConfig",
    "InterFormerConfig",
    "Kernel",
    "ModelConfig",
    "PyramidConfig",
    "WukongConfig",
    "config_from_dict",
    "config_to_dict",
    "default",
    "large",
    "preset",
    "tiny",
]
