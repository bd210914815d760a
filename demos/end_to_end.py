"""``make demo``: the main job, end to end, on the embedded defaults.

What it does:

1. generates a synthetic world (users, ads, content, events) with
   :mod:`pipelines.sources.synthetic` (what ``python -m pipelines.generate`` runs);
2. reports the Bayes-optimal NE / AUC of that data (the ceiling for models);
3. starts the embedded Kafka broker (or uses ``--kafka-bootstrap``), creates
   the raw-event topic, publishes every event plus a few malformed messages;
4. reads the topic back in a consumer group, validating every message, and
   checks that what came back is exactly what was sent: ``read = valid + dead
   letters``, the valid events equal the generated ones, one user's events in
   order;
5. runs the Beam feature job (:mod:`pipelines.build`, ``--runner=DirectRunner``,
   which hands it to Prism, Beam's local runner) on the
   generated files into ``<output>/features``: training examples, timelines,
   Feast feature tables, dead letters and a summary whose counts add up; it
   also publishes the examples with their timeline segments to Kafka;
6. registers the feature tables with Feast (``feature_repo/``, the embedded
   configuration unless ``GEM_FEAST_ENV=prod``), materializes them into the
   online store, reads a user back online, and checks sampled training
   examples against Feast's point-in-time features;
7. runs the trainer daemon (:mod:`trainer.training.daemon`, GEM, ``--preset``) on the
   examples topic until it is drained, and prints the progressive-validation
   NE / AUC / calibration per (domain, objective); then the click figure over
   every domain beside the base rate and the Bayes-optimal NE of the same
   examples, says plainly whether the model learnt (last-window click NE at
   most ``--max-click-ne``, whole-run click AUC at least
   ``--min-click-auc``), and draws it over training time against that
   ceiling (:mod:`demos.learning`); its final checkpoint is exported as
   the ``gem`` serving version (``--artifacts``);
8. knowledge transfer (:mod:`trainer.distill`): the daemon's GEM checkpoint
   is the teacher; its outputs are computed once per example, then one
   compact student per domain trains with the full transfer (auxiliary
   head, Student Adapter, teacher embeddings as input, shared id tables) and
   is scored on the last day next to the teacher; each student is exported
   for serving;
9. starts the scoring service (``python -m serving``) on GEM and one
   domain's student, scores candidate ads for that domain's most active
   user with each, prints the top ads with each request's latency, and
   stops the server.

The steps are :mod:`demos.event_steps` (1, 3, 4), :mod:`demos.feature_steps`
(5, 6), :mod:`demos.training_steps` (7, 8) and :mod:`demos.serving_steps`
(9). Every process it starts is stopped on the way out, also on Ctrl-C,
SIGTERM or an error. Exit code 0 only when every check holds.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys

from demos import event_steps, feature_steps, serving_steps, training_steps
from demos.demo_config import DemoConfig
from demos.interrupts import unwind_on_signals
from features.cli import CommandParser, run_command
from features.config_flags import add_config_flags, config_fields
from features.kafka import KafkaSettings, add_kafka_arguments
from pipelines.sources import bayes

TOTAL_STEPS = 9


def _step(number: int, title: str) -> None:
    print(f"\n[{number}/{TOTAL_STEPS}] {title}", flush=True)


def run(config: DemoConfig, settings: KafkaSettings) -> int:
    """Run the demo steps on the cluster ``settings`` name (an embedded broker
    when they name none); returns the process exit code."""
    from launchers.kafka_broker import kafka_cluster

    # Feast's materialization bars (tqdm, on stderr) would interleave with
    # this report, which prints each step's own count and time.
    os.environ.setdefault("TQDM_DISABLE", "1")
    output = config.output
    _step(1, f"Generating events into {output}/")
    data = event_steps.generate(config)

    _step(2, "Bayes-optimal quality of this data (the ceiling for any model)")
    ceiling = bayes.bayes_optimal_report(output)
    print(bayes.format_report(ceiling))

    where = "embedded broker" if settings.embedded else settings.bootstrap
    _step(3, f"Publishing events to Kafka ({where})")
    # The embedded broker's log directory is under the output, made anew:
    # this run's topics hold this run's events only.
    shutil.rmtree(output / "kafka", ignore_errors=True)
    with kafka_cluster(settings, home=output / "kafka") as cluster:
        print(f"  broker: {cluster.bootstrap}")
        sent, injected = event_steps.publish(cluster, data.events, config)

        _step(4, "Reading the topic back in a consumer group")
        checks = event_steps.read_back(cluster, data.events, sent, injected)

        _step(5, f"Building features with Beam into {output}/features/")
        # The feature job makes the examples topic, one partition per shard.
        counts, runner = feature_steps.build_features(cluster, config)
        checks.update(
            feature_steps.feature_job_checks(counts, runner, data.truth.num_rows)
        )

        _step(6, "Feast: apply, materialize, online and point-in-time reads")
        checks.update(feature_steps.feast_step(output / "features"))

        _step(
            7, f"Training GEM from {feature_steps.EXAMPLES_TOPIC} until it is drained"
        )
        checks.update(
            training_steps.train_step(
                cluster, config, ceiling, published=counts["examples"]
            )
        )

        _step(8, "Knowledge transfer: one student per domain from GEM")
        checks.update(training_steps.distill_step(output, config.max_seq_len))

        _step(9, "Serving: python -m serving on GEM and a student")
        checks.update(serving_steps.serve_step(output, data.events))
    print(
        "\n  broker stopped"
        if settings.embedded
        else "\n  (external cluster left running)"
    )

    print()
    for name, ok in checks.items():
        print(f"  {'ok  ' if ok else 'FAIL'} {name}")
    return 0 if all(checks.values()) else 1


def build_parser() -> CommandParser:
    """The demo's flags."""
    parser = CommandParser("demos.end_to_end", __doc__.split("\n\n")[0])
    # The demo's report is its stdout; library INFO lines would interleave.
    parser.set_defaults(log_level="warning")
    add_config_flags(parser, DemoConfig)
    add_kafka_arguments(parser)
    return parser


def _run_demo(args: argparse.Namespace) -> int:
    # Every `with` block (the broker!) unwinds on Ctrl-C and SIGTERM alike.
    unwind_on_signals()
    try:
        return run(
            DemoConfig(**config_fields(args, DemoConfig)),
            KafkaSettings.from_args(args),
        )
    except KeyboardInterrupt:
        print("\ninterrupted: every process the demo started has been stopped")
        return 130


def main(argv: list[str] | None = None) -> int:
    """Parse the flags and run the demo."""
    return run_command(build_parser(), _run_demo, argv)


if __name__ == "__main__":
    sys.exit(main())
