"""What both Beam jobs of ``python -m pipelines.build`` (batch and
``--streaming``) share:

- :mod:`~pipelines.beam.flags`: the job's own flags (no Beam import: the
  command line checks them before Beam loads);
  :mod:`~pipelines.beam.beam_flags`: the table of Beam's own options, cached
  per Beam version, for the same check;
- :mod:`~pipelines.beam.options`: ``GemBuildOptions`` (those flags as Beam
  pipeline options) and the Kafka settings they name;
- :mod:`~pipelines.beam.runner`: which runner runs the job, the Prism binary
  Beam's local runner needs, and the job's counters once it is done;
- :mod:`~pipelines.beam.files`: input and output locations on any Beam
  filesystem, and the dimension tables both jobs read;
- :mod:`~pipelines.beam.kafka_send`: ``KafkaSendFn``, the base of the DoFns
  that send to a Kafka topic.
"""
