"""The parts of the streaming demo (``python -m demos.streaming``).

- :mod:`demos.stream.config`: its sizes (and their flags), topics and time limits;
- :mod:`demos.stream.processes`: the child processes, the publisher and the
  broker outage;
- :mod:`demos.stream.run`: one run, from the generated world to the report;
- :mod:`demos.stream.freshness` and :mod:`demos.stream.report`: what the run
  measured;
- :mod:`demos.stream.screen` and :mod:`demos.stream.plot`: the screen and the PNG.
"""
