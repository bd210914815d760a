"""``python -m pipelines.feast``: apply, materialize and read the feature store
(:mod:`.ops`).
"""

from pipelines.feast.ops import main

if __name__ == "__main__":
    raise SystemExit(main())
