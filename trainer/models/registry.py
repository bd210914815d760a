"""``build_model(name, preset)``: GEM, its ablations and the baselines by name.

=====================  ==================================================
name                   model
=====================  ==================================================
``gem``                :class:`~trainer.models.gem.GEM`, all parts on
``gem_no_seq``         GEM with ``use_sequences=False``
``gem_no_interleave``  GEM with ``interformer.interleave=False`` ("sep")
``gem_no_pyramid``     GEM with ``pyramid.enabled=False``
``dlrm``               :class:`~trainer.models.dlrm.DLRMBaseline`
``dcnv2``              :class:`~trainer.models.dcnv2.DCNv2`
=====================  ==================================================

Example:
    >>> model = build_model("gem_no_seq", "tiny")
    >>> model.inputs.sequence is None
    True
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Final

from torch import nn

from trainer.models.config import ModelConfig
from trainer.models.config import preset as preset_config
from trainer.models.dcnv2 import DCNv2
from trainer.models.dlrm import DLRMBaseline
from trainer.models.gem import GEM


def _no_seq(c: ModelConfig) -> ModelConfig:
    return dataclasses.replace(c, use_sequences=False)


def _no_interleave(c: ModelConfig) -> ModelConfig:
    return dataclasses.replace(
        c, interformer=dataclasses.replace(c.interformer, interleave=False)
    )


def _no_pyramid(c: ModelConfig) -> ModelConfig:
    return dataclasses.replace(c, pyramid=dataclasses.replace(c.pyramid, enabled=False))


_MODELS: Final[
    dict[
        str,
        tuple[Callable[[ModelConfig], nn.Module], Callable[[ModelConfig], ModelConfig]],
    ]
] = {
    "gem": (GEM, lambda c: c),
    "gem_no_seq": (GEM, _no_seq),
    "gem_no_interleave": (GEM, _no_interleave),
    "gem_no_pyramid": (GEM, _no_pyramid),
    "dlrm": (DLRMBaseline, lambda c: c),
    "dcnv2": (DCNv2, lambda c: c),
}

MODEL_NAMES: Final = tuple(_MODELS)


def model_config(name: str, preset: str | ModelConfig = "tiny") -> ModelConfig:
    """The complete config ``name`` runs with (the preset plus its ablation flags).

    Example:
        >>> model_config("gem_no_pyramid", "tiny").pyramid.enabled
        False
    """
    if name not in _MODELS:
        raise ValueError(f"unknown model {name!r}; choose from {MODEL_NAMES}")
    base = preset_config(preset) if isinstance(preset, str) else preset
    return _MODELS[name][1](base)


def build_model(name: str, preset: str | ModelConfig = "tiny") -> nn.Module:
    """Build model ``name`` (see the table above) from a preset name or config.

    Every model maps a :class:`trainer.data.batch.Batch` to logits
    (B, NUM_DOMAINS, NUM_OBJECTIVES); wrap it in
    :class:`trainer.models.loss_wrapper.GEMTrain` to train.
    """
    config = model_config(name, preset)
    return _MODELS[name][0](config)
