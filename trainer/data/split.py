"""``python -m trainer.data.split``: cut a feature-job output into time periods.

    python -m trainer.data.split --input out/build --train out/train \\
        --validation out/val --eval out/eval [--eval-days 1] [--validation-days 1] \\
        [--cut-day YYYY-MM-DD]

The last ``--eval-days`` UTC days of the examples are the eval period, the
``--validation-days`` before them the validation period (with
``--validation``), everything earlier trains: the three folders
``python -m trainer.fit`` reads, each in the feature job's layout (examples
by day, and the timelines they index into). Each period's examples are
exactly the input's of its days; a JSON summary on stdout counts them and
names each period's first and last day.

``--cut-day YYYY-MM-DD`` cuts as if the data ended ``--eval-days`` days
after that day: the eval period starts there, and the days after it are
left out (counted in the summary as ``left_out``, written nowhere). Cuts on
consecutive days give a rolling-origin evaluation: each model is trained
and chosen on what came before a cut and judged on the days after it.
Days are the UTC days that hold examples.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from features.cli import CommandError, CommandParser, run_command
from features.config_flags import iso_date, positive_int
from trainer.cli import feature_dir

MS_PER_DAY = 86_400_000
EPOCH_DAY = datetime.date(1970, 1, 1)
# What a folder written by this command holds (and the teacher outputs
# trainer.distill adds by default): such a folder is replaced, as teacher
# outputs of the examples it held would be stale; anything else is refused.
SPLIT_PARTS = frozenset({"examples", "timelines", "teacher_outputs"})


def build_parser() -> CommandParser:
    """The flags of ``python -m trainer.data.split``."""
    parser = CommandParser("trainer.data.split", __doc__.split("\n\n")[0])
    parser.add_argument(
        "--input",
        type=Path,
        required=True,
        metavar="DIR",
        help="feature-job output (what pipelines.build or pipelines.reference writes)",
    )
    parser.add_argument(
        "--train",
        type=Path,
        required=True,
        metavar="DIR",
        help="where the training period goes (replaced if it is a split folder)",
    )
    parser.add_argument(
        "--validation",
        type=Path,
        metavar="DIR",
        help="where the validation period goes (without it: train and eval only)",
    )
    parser.add_argument(
        "--eval",
        type=Path,
        required=True,
        metavar="DIR",
        help="where the eval period goes",
    )
    parser.add_argument(
        "--eval-days",
        type=positive_int,
        default=1,
        metavar="N",
        help="UTC days of the eval period (the last ones, unless --cut-day)",
    )
    parser.add_argument(
        "--cut-day",
        type=iso_date,
        metavar="YYYY-MM-DD",
        help="first UTC day of the eval period; later days are left out "
        "(default: the last --eval-days days are the eval period)",
    )
    parser.add_argument(
        "--validation-days",
        type=positive_int,
        default=1,
        metavar="N",
        help="UTC days before the eval period that are the validation period",
    )
    return parser


def check_targets(source: Path, targets: dict[str, Path]) -> None:
    """Refuse outputs that would overwrite the input, each other, or a folder
    that is not a split folder (the split replaces its targets)."""
    seen: dict[Path, str] = {}
    real_source = source.resolve()
    for flag, path in targets.items():
        real = path.resolve()
        if real == real_source or real_source in real.parents:
            raise CommandError(
                f"{flag} {path} is (inside) --input", "name a folder outside it"
            )
        if real in real_source.parents:
            raise CommandError(
                f"{flag} {path} holds --input", "name a folder outside it"
            )
        for other, other_flag in seen.items():
            if real == other or other in real.parents or real in other.parents:
                raise CommandError(
                    f"{flag} {path} overlaps {other_flag} {other}",
                    "give each period a folder of its own",
                )
        seen[real] = flag
        if path.is_file():
            raise CommandError(f"{flag} {path} is a file", "name a folder")
        if path.is_dir():
            extra = sorted(p.name for p in path.iterdir() if p.name not in SPLIT_PARTS)
            if extra:
                raise CommandError(
                    f"{flag} {path} holds more than a split folder ({extra[:3]})",
                    "name an empty or new folder (a split folder is replaced)",
                )


def period_cuts(
    days: Sequence[int],
    eval_days: int,
    validation_days: int | None,
    cut_day: int | None = None,
) -> list[int]:
    """The cuts (epoch ms, at UTC midnights) between the periods of the
    examples' ``days`` (sorted UTC day numbers, repeats allowed): train,
    (validation,) eval, and with ``cut_day`` a last cut after which the
    days are left out, where there are such days."""
    distinct = sorted(set(days))
    eval_start = len(distinct) - eval_days
    if cut_day is not None:
        eval_start = next(
            (i for i, day in enumerate(distinct) if day >= cut_day), len(distinct)
        )
        if len(distinct) - eval_start < eval_days:
            raise CommandError(
                f"--cut-day {_day(cut_day * MS_PER_DAY)}: "
                f"{len(distinct) - eval_start} UTC day(s) of --input from there, "
                f"--eval-days {eval_days}",
                "cut earlier, or ask for fewer --eval-days",
            )
    if eval_start - (validation_days or 0) < 1:
        periods = f"--eval-days {eval_days}"
        if validation_days is not None:
            periods += f" and --validation-days {validation_days}"
        if cut_day is None:
            where, hint = "", "ask for fewer days, or generate more"
        else:
            where, hint = " before --cut-day", "cut later, or ask for fewer days"
        raise CommandError(
            f"--input spans {len(distinct)} UTC day(s); {periods} leave no day "
            f"to train on{where}",
            hint,
        )
    cuts = [distinct[eval_start] * MS_PER_DAY]
    if validation_days is not None:
        cuts.insert(0, distinct[eval_start - validation_days] * MS_PER_DAY)
    eval_end = eval_start + eval_days
    if eval_end < len(distinct):
        cuts.append(distinct[eval_end] * MS_PER_DAY)
    return cuts


def _day(ms: int) -> str:
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC).date().isoformat()


def run(args: argparse.Namespace) -> int:
    """Check the folders, cut, write the periods, print the summary."""
    feature_dir("--input", args.input)
    targets = {"--train": args.train}
    if args.validation is not None:
        targets["--validation"] = args.validation
    targets["--eval"] = args.eval
    check_targets(args.input, targets)
    from trainer.data.feature_files import event_time_ms, read_examples, split_periods

    times = event_time_ms(read_examples(args.input))
    if times.size == 0:
        raise CommandError(f"--input {args.input}: no examples", "nothing to split")
    validation_days = args.validation_days if args.validation is not None else None
    cuts = period_cuts(
        sorted(set((times // MS_PER_DAY).tolist())),
        args.eval_days,
        validation_days,
        None if args.cut_day is None else (args.cut_day - EPOCH_DAY).days,
    )
    periods: dict[str, Path | None] = {
        flag.lstrip("-"): path for flag, path in targets.items()
    }
    if len(cuts) == len(periods):
        periods["left_out"] = None  # the days after a --cut-day's eval period
    counts = split_periods(args.input, cuts, list(periods.values()))
    bounds = [int(times.min()), *cuts, int(times.max()) + 1]
    summary = {
        name: {
            "dir": None if path is None else str(path),
            "examples": count,
            "first_day": _day(start),
            "last_day": _day(stop - 1),
        }
        for (name, path), count, start, stop in zip(
            periods.items(), counts, bounds[:-1], bounds[1:], strict=True
        )
    }
    if sum(counts) != times.size:
        raise RuntimeError(f"split {sum(counts)} of {times.size} examples")
    print(json.dumps(summary, indent=1))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m trainer.data.split`` (see the module docstring)."""
    return run_command(build_parser(), run, argv)


if __name__ == "__main__":
    sys.exit(main())
