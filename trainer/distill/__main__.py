"""``python -m trainer.distill``: train one vertical student per domain.

The flags and the run live in :mod:`trainer.distill.command` (``--help``
lists them).
"""

from __future__ import annotations

import sys

from trainer.distill.command import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
