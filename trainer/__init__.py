"""The GEM trainer: TorchRec model, continuous Kafka-fed training, distillation.

Stands on the contract in :mod:`features` (example schema, feature registry,
metrics) and never imports :mod:`pipelines`. The model and the trainer daemon
arrive with their own issues; this package is where they live.
"""
