"""Throughput of the Beam feature job next to two single-process peers.

For each scale (0.5 M, 1 M and 2 M raw events by default, to check that time
grows linearly), one data set is generated, then on the same files:

- **beam** on each of ``--runners`` (16 user shards): ``fnapi`` is
  ``--runner=FnApiRunner`` (the in-process runner, one SDK worker);
  ``prism`` is ``--runner=DirectRunner``, which hands the job to Prism
  (Beam's portable local runner; the child checks that Prism ran it);
  ``flink`` is ``--runner=PortableRunner`` on a Flink job server started
  for the run (``launchers.flink_job_server``, after ``make flink``; its
  start-up is a cluster's, outside the job's wall time);
- **reference**: ``python -m pipelines.reference`` (pyarrow / pandas / numpy
  in one process, the oracle);
- **polars**: ``python -m benchmarks.polars_peer`` (the same job written with
  Polars, on all of Polars' threads), the peer the ratios are taken against.

Each runs in its own subprocess, so the peak resident memory
(``resource.getrusage(RUSAGE_SELF).ru_maxrss``, reported by the child) is
that job's alone; the wall time is measured around the subprocess, so it
includes interpreter start and imports: what a user waits for. CPU seconds
(user + system, the child and any SDK worker processes it waited for) are
reported too: on a machine shared with other work they move much less than
wall time, so the CPU ratio is the steadier comparison. On Prism and Flink
they are the Python side; the engine's own CPU seconds (Prism's Go process,
Flink's JVM during the job) are printed beside them.
The best of ``--repeat`` runs is the headline; every job's counts are
compared with the reference's (the outputs themselves:
``tests/test_polars_peer.py`` and ``tests/test_build.py``). The load average
before and after is printed.

First, every job runs on a tiny data set (about 18k events): their fixed
start-up cost, the floor under every wall time below.

Usage::

    python -m benchmarks.bench_build [--scales 0.5,1,2] [--repeat 1] [--json]
        [--runners fnapi,prism,flink] [--beam-args "--direct_num_workers=2
                                 --direct_running_mode=multi_processing"]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from importlib.metadata import version
from pathlib import Path
from typing import Any

from benchmarks.bench_generator import hardware
from benchmarks.machine import cpu_seconds
from launchers.flink_job_server import FlinkJobServer
from pipelines.sources.synthetic import GeneratorConfig, generate_dataset

ROOT = Path(__file__).resolve().parents[1]
# About 40.7 raw events per user at 10 base events per user-day over 4 days.
USERS_PER_MILLION = 25_000

_CHILD = """
import json, resource, sys, time
kind, source, out, *runner = sys.argv[1:]
start = time.perf_counter()
ran = None
split = None
engine = None
if kind == "beam":
    import os
    from benchmarks.machine import cpu_seconds, process_stat
    from pipelines import build
    summary = build.run([*runner, "--input", source, "--output", out])
    counts, ran = summary["counts"], summary["runner"]
    # Prism's own CPU: the job server Beam started as a child of this process
    # and keeps running until it exits (Linux /proc; none on the FnApiRunner).
    for pid in map(int, filter(str.isdigit, os.listdir("/proc"))):
        try:
            parent = int(process_stat(pid)[1])
            exe = os.path.basename(os.readlink(f"/proc/{pid}/exe"))
            if parent == os.getpid() and exe == "prism":
                engine = (engine or 0.0) + cpu_seconds(pid)
        except OSError:
            continue
else:
    # What ``python -m benchmarks.polars_peer`` and ``python -m
    # pipelines.reference --overwrite`` do, timed by part.
    from pathlib import Path
    from pipelines.core.reference import validation_clock
    if kind == "polars":
        from benchmarks import polars_peer
        read, compute = polars_peer.read_input, polars_peer.build
        write = polars_peer.write_output
    else:
        import shutil
        from pipelines import reference as reference_command  # its import cost
        from pipelines.core import reference
        from features.memory import reuse_freed_memory
        reuse_freed_memory()  # as reference_command.main() does
        for part in reference.OUTPUT_PARTS:
            path = Path(out) / part
            shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
        read, write = reference.read_input, reference.write_output
        compute = lambda tables, now: reference.build_reference(*tables, now_ms=now)
    split = {"imports": time.perf_counter() - start}
    now = validation_clock(Path(source), None)
    tick = time.perf_counter()
    data = read(Path(source))
    split["read"] = time.perf_counter() - tick
    tick = time.perf_counter()
    output = compute(data, now)
    split["compute"] = time.perf_counter() - tick
    tick = time.perf_counter()
    write(output, Path(out), now_ms=now)
    split["write"] = time.perf_counter() - tick
    counts = output.counts
own = resource.getrusage(resource.RUSAGE_SELF)
kids = resource.getrusage(resource.RUSAGE_CHILDREN)  # SDK worker processes
cpu = own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime
peak = max(own.ru_maxrss, kids.ru_maxrss) / 1024
print(json.dumps({"job_s": time.perf_counter() - start, "cpu_s": cpu,
                  "peak_mb": peak, "counts": counts, "runner": ran,
                  "split_s": split, "engine_cpu_s": engine}))
"""

# The Beam runners compared, by name: their flags and the runner that must
# have run the job. ``--beam-args`` adds flags to each (two SDK workers:
# ``--direct_num_workers=2 --direct_running_mode=multi_processing``).
RUNNERS: dict[str, tuple[list[str], str]] = {
    "fnapi": (["--runner=FnApiRunner"], "FnApiRunner"),
    "prism": (["--runner=DirectRunner"], "PrismRunner"),
    # The job server's flags are added where it is started (_run_job).
    "flink": ([], "PortableRunner"),
}
DEFAULT_RUNNERS = "fnapi,prism"


def _run_child(
    kind: str, source: Path, out: Path, beam_args: Sequence[str] = ()
) -> dict[str, Any]:
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, kind, str(source), str(out), *beam_args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    wall = time.perf_counter() - start
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    result["wall_s"] = wall
    return result


PEERS = ("reference", "polars")
"""The single-process jobs, by child kind; ``polars`` is the ratios' base."""
PEER = "polars"


def _run_job(
    job: str, source: Path, out: Path, beam_args: Sequence[str]
) -> dict[str, Any]:
    """A peer (:data:`PEERS`), or the Beam job on the runner ``job`` names."""
    if job in PEERS:
        return _run_child(job, source, out)
    flags, expected = RUNNERS[job]
    if job == "flink":
        with FlinkJobServer() as server:
            assert server.process is not None
            engine_before = cpu_seconds(server.process.pid)
            result = _run_child("beam", source, out, [*server.beam_flags(), *beam_args])
            result["engine_cpu_s"] = cpu_seconds(server.process.pid) - engine_before
    else:
        result = _run_child("beam", source, out, [*flags, *beam_args])
    if result["runner"] != expected:
        raise RuntimeError(f"{job}: the job ran on {result['runner']}, not {expected}")
    return result


def scale_config(millions: float) -> GeneratorConfig:
    """The generated world of about ``millions`` M raw events (4 days)."""
    users = int(USERS_PER_MILLION * millions)
    return GeneratorConfig(users=users, ads=max(users // 10, 1), days=4, seed=0)


def measure(
    millions: float,
    repeat: int,
    workdir: Path,
    runners: Sequence[str],
    beam_args: Sequence[str] = (),
) -> dict[str, Any]:
    """Generate one data set of about ``millions`` M events; time every job."""
    config = scale_config(millions)
    source = workdir / f"data-{millions}"
    data, _ = generate_dataset(config, source)
    events = data.events.num_rows
    runs: dict[str, list[dict[str, Any]]] = {j: [] for j in [*runners, *PEERS]}
    for _ in range(repeat):
        for job in runs:
            out = workdir / f"out-{job}"
            if out.exists():
                shutil.rmtree(out)
            runs[job].append(_run_job(job, source, out, beam_args))
    best = {job: min(r, key=lambda x: x["wall_s"]) for job, r in runs.items()}
    reference, peer = best["reference"], best[PEER]
    return {
        "events": events,
        "users": config.users,
        "counts_equal": all(b["counts"] == reference["counts"] for b in best.values()),
        "jobs": best,
        "events_per_s": {job: events / b["wall_s"] for job, b in best.items()},
        # Speed against the Polars peer: above 1 is faster than it.
        "ratio": {job: peer["wall_s"] / b["wall_s"] for job, b in best.items()},
        "cpu_ratio": {job: peer["cpu_s"] / b["cpu_s"] for job, b in best.items()},
    }


def fixed_cost(
    workdir: Path, runners: Sequence[str], beam_args: Sequence[str]
) -> dict[str, Any]:
    """Every job on a tiny data set (300 users, ~18k events): start-up cost.

    Interpreter, imports, graph construction and the runner's per-stage
    work do not grow with the data; this is the part of the 2 M wall time
    that more cores or faster kernels cannot remove.
    """
    config = GeneratorConfig(users=300, ads=30, days=4, seed=0)
    source = workdir / "data-tiny"
    data, _ = generate_dataset(config, source)
    return {
        "events": data.events.num_rows,
        "jobs": {
            job: _run_job(job, source, workdir / f"out-tiny-{job}", beam_args)
            for job in [*runners, *PEERS]
        },
    }


def format_table(results: list[dict[str, Any]]) -> str:
    """Markdown table of the measurements: one row per scale and job."""
    lines = [
        "| events | job | wall s | CPU s | events/s | peak MB "
        f"| speed / {PEER} (wall) | (CPU) |",
        "|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        for job, run in r["jobs"].items():
            lines.append(
                f"| {r['events']:,} | {job} | {run['wall_s']:.2f} "
                f"| {run['cpu_s']:.2f} | {r['events_per_s'][job]:,.0f} "
                f"| {run['peak_mb']:,.0f} | {r['ratio'][job]:.2f} "
                f"| {r['cpu_ratio'][job]:.2f} |"
            )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scales", default="0.5,1,2", help="millions of events")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--runners",
        default=DEFAULT_RUNNERS,
        help=f"Beam runners to time, of {', '.join(RUNNERS)}",
    )
    parser.add_argument("--beam-args", default="", help="more flags for every Beam run")
    args = parser.parse_args(argv)
    scales = [float(s) for s in args.scales.split(",")]
    runners = args.runners.split(",")
    unknown = set(runners) - set(RUNNERS)
    if unknown:
        parser.error(f"unknown runner(s) {', '.join(sorted(unknown))}")
    beam_args = args.beam_args.split()
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="bench-build-") as tmp:
        fixed = fixed_cost(Path(tmp), runners, beam_args)
        results = [
            measure(m, args.repeat, Path(tmp), runners, beam_args) for m in scales
        ]
    report = {
        "hardware": hardware(),
        "polars": version("polars"),
        "runners": runners,
        "beam_args": beam_args,
        "load_before": load_before,
        "load": os.getloadavg(),
        "fixed_cost": fixed,
        "results": results,
    }
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        hw = report["hardware"]
        print(
            f"hardware: {hw['cpu']}, {hw['usable_cores']} usable cores, "
            f"Python {hw['python']}, pyarrow {hw['pyarrow']}, "
            f"polars {report['polars']}; load average "
            f"{report['load_before'][0]:.1f} before, {report['load'][0]:.1f} after; "
            f"Beam runners: {', '.join(runners)} {' '.join(beam_args)}"
        )
        print(
            f"fixed cost ({fixed['events']:,} events): "
            + ", ".join(
                f"{job} {run['wall_s']:.2f} s wall / {run['cpu_s']:.2f} s CPU"
                for job, run in fixed["jobs"].items()
            )
        )
        print(format_table(results))
        for r in results:
            for job in PEERS:
                split = r["jobs"][job]["split_s"]
                print(
                    f"{job} at {r['events']:,} events: "
                    + ", ".join(f"{k} {v:.2f} s" for k, v in split.items())
                )
            for job, run in r["jobs"].items():
                if run.get("engine_cpu_s") is not None:
                    print(
                        f"{job} at {r['events']:,} events: its engine "
                        f"{run['engine_cpu_s']:.2f} CPU s besides "
                        f"the job's {run['cpu_s']:.2f}"
                    )
        if not all(r["counts_equal"] for r in results):
            print("WARNING: the jobs' counts differ")
    return 0


if __name__ == "__main__":
    sys.exit(main())
