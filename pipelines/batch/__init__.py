"""The Beam feature job's stages (``python -m pipelines.build`` wires them).

One module per job, each stage a composite ``PTransform`` named for what it
produces (the flags, options, runner and file locations it shares with
the streaming job are :mod:`pipelines.beam`):

- :mod:`~pipelines.batch.job`: the batch job's pipeline (``run_batch``),
  its outputs cleared and its summary written through Beam's filesystems;
- :mod:`~pipelines.batch.tuning`: ``--worker-threads`` / ``--tune-allocator``
  resolved for the runner, and ``TunedDoFn``, the base of the DoFns that
  follow them;
- :mod:`~pipelines.batch.progress`: the terminal's bar of event files read;
- :mod:`~pipelines.batch.inputs`: ``ReadEvents``, ``ReadDimensions`` (and
  ``ReadDimension``) and the early input checks;
- :mod:`~pipelines.batch.outputs`: ``WriteExamples``, ``WriteTimelines``,
  ``WriteFeatureTables``, ``WriteDeadLetters`` and the writer-thread base of
  the DoFns that write files;
- :mod:`~pipelines.batch.validate`: ``ValidateEvents`` (dead letters as a
  tagged output);
- :mod:`~pipelines.batch.timelines`: ``DedupeEvents``, ``BuildTimelines``,
  ``WriteUserSequences``;
- :mod:`~pipelines.batch.counters`: ``CountEngagement`` (user counters per
  user shard; ad / advertiser counters through a second keyed aggregation);
- :mod:`~pipelines.batch.examples`: ``BuildExamples``, ``BuildProfiles``;
- :mod:`~pipelines.batch.kafka_io`: ``ReadKafkaEvents``, ``PublishExamples``;
- :mod:`~pipelines.batch.arrow`: the Arrow IPC coder and the shuffles'
  element types;
- :mod:`~pipelines.batch.parallel`: ``PooledDoFn``, the base of the DoFns
  whose per-shard work runs on a worker thread.

Elements are Arrow tables keyed by shard, processed whole by the numpy /
pyarrow kernels of :mod:`pipelines.core`; every shuffle carries Arrow IPC
bytes. The kernels release the GIL,
so a worker uses a second core: where the job runs in one local process the
heavy per-shard DoFns compute on a thread pool (``PooledDoFn``), and output
files are written on a writer thread, both finished within the bundle.
"""
