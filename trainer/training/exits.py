"""The exit statuses of the training daemons (``python -m trainer.daemon``,
``python -m trainer.distill.daemon``), one per way a run is refused or
fails, so a supervisor can tell them apart; both daemons' ``--help`` lists
them (:data:`EXIT_HELP`). Importable without torch.
"""

from __future__ import annotations

from typing import Final

from features.cli import EXIT_USAGE

EXIT_CHECKPOINT_WRITE: Final = 3
EXIT_NO_CHECKPOINT: Final = 4
EXIT_LOCKED: Final = 5
EXIT_OFFSET_GAP: Final = 6
EXIT_TOPIC_CHANGED: Final = 7

EXIT_HELP: Final = (
    f"Exit status: {EXIT_USAGE} bad flags or input; {EXIT_CHECKPOINT_WRITE} the "
    "final checkpoint could not be written (trainer); "
    f"{EXIT_NO_CHECKPOINT} checkpoints of which none verifies (see "
    f"--start-fresh), or of another run; {EXIT_LOCKED} --checkpoint-dir is held "
    f"by another process; {EXIT_OFFSET_GAP} records were removed from a topic "
    f"before they were trained (--on-offset-gap stop); {EXIT_TOPIC_CHANGED} a "
    "topic was recreated or truncated since the checkpoint. Each prints one "
    "line saying what to do."
)


def refusal_status(error: BaseException) -> int | None:
    """The exit status of a refused or stopped run, None for other errors."""
    from features.directory_lock import DirectoryLockedError
    from trainer.data.offset_check import OffsetGapError, TopicChangedError
    from trainer.training.checkpoint import NoUsableCheckpointError

    statuses: dict[type[BaseException], int] = {
        NoUsableCheckpointError: EXIT_NO_CHECKPOINT,
        DirectoryLockedError: EXIT_LOCKED,
        OffsetGapError: EXIT_OFFSET_GAP,
        TopicChangedError: EXIT_TOPIC_CHANGED,
    }
    for kind, status in statuses.items():
        if isinstance(error, kind):
            return status
    return None


def refusal_line(error: BaseException) -> str:
    """The one line of a refused run."""
    from trainer.training.checkpoint import NoUsableCheckpointError

    if isinstance(error, NoUsableCheckpointError):
        return f"refusing to start: {error}"
    return str(error)
