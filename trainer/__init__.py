"""The GEM trainer: TorchRec model, continuous Kafka-fed training, distillation.

Stands on the contract in :mod:`features` (example schema, feature registry,
metrics) and never imports :mod:`pipelines`. Its commands (``python -m
trainer.split``, ``trainer.fit``, ``trainer.daemon``, ``trainer.distill``...)
parse their flags in :mod:`trainer.commands` before torch loads; this
package's ``__init__`` imports nothing, so that stays true.
"""
