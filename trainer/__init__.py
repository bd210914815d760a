"""The GEM trainer: TorchRec model, continuous Kafka-fed training, distillation.

Stands on the contract in :mod:`features` (example schema, feature registry,
metrics) and never imports :mod:`pipelines`. Its commands (``python -m
trainer.fit``, ``trainer.daemon``, ``trainer.distill``, ``trainer.data.split``...)
parse their flags before torch loads; this package's ``__init__`` imports
nothing, so that stays true.
"""
