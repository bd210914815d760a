"""``python -m trainer.distill``: train one vertical student per domain.

The flags and the run live in :mod:`trainer.commands.distill` (``--help``
lists them).
"""

from __future__ import annotations

import sys

from trainer.commands.distill import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
