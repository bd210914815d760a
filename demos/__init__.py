"""The demos: the only code that starts both wings, the feature jobs and the trainer.

- ``python -m demos.end_to_end`` (``make demo``): the batch chain end to end,
  its flags in :mod:`demos.demo_config`, its steps in :mod:`demos.event_steps`,
  :mod:`demos.feature_steps` and :mod:`demos.training_steps`;
- ``python -m demos.streaming`` (``make demo-stream``): the streaming job, Feast and
  the trainer together, its parts in :mod:`demos.stream`.
"""
