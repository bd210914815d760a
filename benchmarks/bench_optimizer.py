"""The dense optimizer's step: fused Adam against torch's per-tensor loop.

Both update the same parameters (a model preset's, every one with a random
gradient) in the same process, alternating, so the ratio holds on a noisy
machine::

    python -m benchmarks.bench_optimizer --preset default --steps 20
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from benchmarks.machine import cpu_model
from trainer.models.registry import build_model


def step_seconds(optimizer: torch.optim.Optimizer, steps: int) -> list[float]:
    """Wall seconds of each of ``steps`` optimizer steps (after one warm-up)."""
    optimizer.step()
    times = []
    for _ in range(steps):
        started = time.perf_counter()
        optimizer.step()
        times.append(time.perf_counter() - started)
    return times


def step_timing_parser(prog: str, *, steps: int) -> argparse.ArgumentParser:
    """The flags of a per-step timing of a model preset: the model, its preset,
    the steps timed (default ``steps``) and torch's CPU threads."""
    parser = argparse.ArgumentParser(prog=prog)
    parser.add_argument("--model", default="gem")
    parser.add_argument("--preset", default="default")
    parser.add_argument("--steps", type=int, default=steps)
    parser.add_argument("--threads", type=int, default=1)
    return parser


def speedup_report(
    args: argparse.Namespace,
    details: dict[str, object],
    before: tuple[str, list[float]],
    after: tuple[str, list[float]],
) -> dict[str, object]:
    """The one-line JSON report of two timed ways of a step, printed: the
    machine (with torch's thread count), the model, ``details``, each way's
    median seconds under its key, and ``after``'s speedup over ``before``."""
    (before_key, before_times), (after_key, after_times) = before, after
    before_s = statistics.median(before_times)
    after_s = statistics.median(after_times)
    report = {
        "machine": f"{cpu_model()}, {torch.get_num_threads()} thread(s)",
        "model": f"{args.model}/{args.preset}",
        **details,
        before_key: round(before_s, 4),
        after_key: round(after_s, 4),
        "speedup": round(before_s / after_s, 2),
    }
    print(json.dumps(report))
    return report


def main(argv: list[str] | None = None) -> dict[str, object]:
    """Run the comparison and print one JSON line."""
    parser = step_timing_parser("python -m benchmarks.bench_optimizer", steps=20)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    params = list(build_model(args.model, args.preset).parameters())
    for p in params:
        p.grad = torch.randn_like(p)
    loop = torch.optim.Adam(params, lr=1e-3, foreach=False)
    fused = torch.optim.Adam(params, lr=1e-3, fused=True)
    loop_times, fused_times = [], []
    for _ in range(2):  # alternate, so drift hits both alike
        loop_times += step_seconds(loop, args.steps // 2)
        fused_times += step_seconds(fused, args.steps // 2)
    return speedup_report(
        args,
        {"parameters": sum(p.numel() for p in params)},
        ("per_tensor_loop_s", loop_times),
        ("fused_s", fused_times),
    )


if __name__ == "__main__":
    main()
