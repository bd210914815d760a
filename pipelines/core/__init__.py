"""Arrow and numpy kernels of the feature job, with no Beam: the Beam stages, the
streaming job and the single-process reference all stand on them.

- :mod:`~pipelines.core.columns`, :mod:`~pipelines.core.ordering`,
  :mod:`~pipelines.core.shards`: columns as numpy, row orders, shards;
- :mod:`~pipelines.core.event_copies`: which copy of an ``event_id`` wins;
- :mod:`~pipelines.core.timelines`, :mod:`~pipelines.core.examples`,
  :mod:`~pipelines.core.counters` (on :mod:`~pipelines.core.window_counter`),
  :mod:`~pipelines.core.asof`: the job's outputs, computed over whole shards;
- :mod:`~pipelines.core.event_files`, :mod:`~pipelines.core.output_files`:
  which input files are events, and how outputs are written;
- :mod:`~pipelines.core.reference`: the whole job in one process (the
  oracle the Beam jobs are tested against).
"""
