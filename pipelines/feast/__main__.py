"""``python -m pipelines.feast``: validate, apply and materialize the feature
store (:mod:`.command`).
"""

from pipelines.feast.command import main

if __name__ == "__main__":
    raise SystemExit(main())
