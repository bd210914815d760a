"""Progressive validation's cost per training step: scoring each batch with a
second, eval-mode forward against reading the scores off the step's own
forward (what the trainer daemon does).

Both loops train a fresh copy of the same model (same seed) on the same
batches in the same process, alternating in rounds, so the ratio holds on a
noisy machine; both feed the same
:class:`~trainer.metrics.progressive.ProgressiveMetrics`::

    python -m benchmarks.bench_progressive --preset default --steps 40 --threads 2
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from benchmarks.bench_optimizer import speedup_report, step_timing_parser
from benchmarks.generated import example_chunks, generated_reference
from pipelines.sources.synthetic import GeneratorConfig
from trainer.data.batch import Batch
from trainer.data.inputs import make_batch
from trainer.metrics.progressive import ProgressiveMetrics
from trainer.models.loss_wrapper import GEMTrain
from trainer.models.registry import build_model
from trainer.training.optimizers import adam
from trainer.training.step import eval_step, scored, train_step


def batches(count: int, size: int, max_seq_len: int) -> list[Batch]:
    """``count`` batches of ``size`` generated examples each."""
    ref = generated_reference(GeneratorConfig(users=600, ads=80, days=3, seed=3))
    return [
        make_batch(chunk, segments, max_seq_len=max_seq_len)
        for chunk, segments in example_chunks(ref, count, size, max_seq_len)
    ]


def two_forwards(model: GEMTrain, opt: torch.optim.Optimizer, b: Batch) -> object:
    """Score in eval mode, then train."""
    scores = eval_step(model, b)
    train_step(model, b, opt)
    return scores


def one_forward(model: GEMTrain, opt: torch.optim.Optimizer, b: Batch) -> object:
    """Train; the scores are the step's forward's."""
    return scored(train_step(model, b, opt).logits, b)


def step_seconds(
    loop: Callable[[GEMTrain, torch.optim.Optimizer, Batch], object],
    model: GEMTrain,
    optimizer: torch.optim.Optimizer,
    metrics: ProgressiveMetrics,
    work: list[Batch],
) -> list[float]:
    times = []
    for b in work:
        started = time.perf_counter()
        metrics.update(loop(model, optimizer, b))  # type: ignore[arg-type]
        times.append(time.perf_counter() - started)
    return times


def main(argv: list[str] | None = None) -> dict[str, object]:
    """Run the comparison and print one JSON line."""
    parser = step_timing_parser("python -m benchmarks.bench_progressive", steps=40)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--max-seq-len", type=int, default=32)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    work = batches(args.steps + 2, args.batch_size, args.max_seq_len)
    runs = {}
    for name in ("two_forwards", "one_forward"):
        torch.manual_seed(0)
        model = GEMTrain(build_model(args.model, args.preset))
        runs[name] = (model, adam(model.parameters(), lr=1e-3), ProgressiveMetrics())
    loops = {"two_forwards": two_forwards, "one_forward": one_forward}
    times: dict[str, list[float]] = {name: [] for name in loops}
    for name, loop in loops.items():  # warm-up: first steps allocate
        step_seconds(loop, *runs[name], work[:2])
    rounds = 4
    per_round = args.steps // rounds
    for r in range(rounds):  # alternate, so drift hits both alike
        chunk = work[2 + r * per_round : 2 + (r + 1) * per_round]
        for name, loop in loops.items():
            times[name] += step_seconds(loop, *runs[name], chunk)
    return speedup_report(
        args,
        {"batch": f"{args.batch_size} examples, histories up to {args.max_seq_len}"},
        ("eval_forward_then_step_s", times["two_forwards"]),
        ("step_scores_s", times["one_forward"]),
    )


if __name__ == "__main__":
    main()
