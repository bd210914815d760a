"""``python -m serving``: the scoring service (see :mod:`serving.app`)."""

from __future__ import annotations

import argparse
import logging
from collections.abc import Sequence
from pathlib import Path

from features.cli import CommandError, CommandParser, run_command

DESCRIPTION = """Score ad requests over HTTP + JSON (POST /score; the schema at
/openapi.json) with the models exported under --artifacts (by trainer.fit,
trainer.distill, trainer.export), from Feast's online store. Each model folder's
`current` pointer is polled and a new version swapped in live; --pin serves
one version. Prometheus metrics at /metrics."""


def build_parser() -> CommandParser:
    """The flags of ``python -m serving``."""
    parser = CommandParser("serving", DESCRIPTION)
    parser.add_argument("--artifacts", type=Path, required=True, help="artifacts root")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", type=int, default=8080, help="port (0: any free)")
    parser.add_argument(
        "--feast-env",
        choices=("local", "prod"),
        default="local",
        help="local: SQLite online store; prod: Redis and the SQL registry",
    )
    parser.add_argument(
        "--feast-state-dir",
        type=Path,
        default=None,
        help="local: the folder of registry.db and online_store.db "
        "(the state folder python -m pipelines.feast wrote)",
    )
    parser.add_argument("--feast-project", default=None, help="Feast project")
    parser.add_argument("--feast-redis", default=None, help="prod: Redis host:port")
    parser.add_argument(
        "--feast-registry-url", default=None, help="prod: the SQL registry's URL"
    )
    parser.add_argument(
        "--max-candidates", type=int, default=500, help="candidates per request"
    )
    parser.add_argument(
        "--pin",
        action="append",
        default=[],
        metavar="MODEL=VERSION",
        help="serve this version of a model folder (repeatable)",
    )
    parser.add_argument(
        "--poll-seconds", type=float, default=1.0, help="pointer poll interval"
    )
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    return parser


def run(args: argparse.Namespace) -> int:
    """Load the models, open the store, serve until interrupted."""
    pins = {}
    for pin in args.pin:
        model, _, version = pin.partition("=")
        if not version:
            raise CommandError(f"--pin {pin}: expected MODEL=VERSION")
        pins[model] = version
    if not args.artifacts.is_dir():
        raise CommandError(f"--artifacts {args.artifacts}: no such folder")
    import torch
    import uvicorn

    from serving.app import create_app
    from serving.models import Models
    from serving.online import FeastSettings, OnlineFeatures

    torch.set_num_threads(args.threads)
    logging.basicConfig(
        level=logging.INFO, format="%(levelname)s %(name)s: %(message)s"
    )
    models = Models(args.artifacts, pins, args.poll_seconds)
    online = OnlineFeatures(
        FeastSettings(
            env=args.feast_env,
            state_dir=args.feast_state_dir,
            project=args.feast_project,
            redis=args.feast_redis,
            registry_url=args.feast_registry_url,
        )
    )
    models.start()
    try:
        uvicorn.run(
            create_app(models, online, max_candidates=args.max_candidates),
            host=args.host,
            port=args.port,
            log_level="warning",
        )
    finally:
        models.stop()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m serving`` (see :data:`DESCRIPTION`)."""
    return run_command(build_parser(), run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
