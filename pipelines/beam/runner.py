"""Which Beam runner a job runs on, and the Prism binary Beam's local runner needs.

Beam's ``DirectRunner`` hands a pipeline to Prism, Beam's portable local
runner (a Go program), when Prism supports the pipeline and the binary can be
had; otherwise it falls back to the in-process ``FnApiRunner`` without a word.
Beam would download Prism from GitHub; here ``make prism`` builds it from the
Go module proxy into ``.tools/bin/prism`` and :func:`use_local_prism` points
the options at it (``--prism_location``), so no download is ever tried.
:func:`runner_that_ran` tells from the result which runner really ran, and
:func:`job_counters` what the job counted.

Without ``--runner`` the batch job runs on the FnApiRunner, which runs this
job faster than Prism (``benchmarks/README.md`` has the figures);
``--runner=DirectRunner`` runs it on Prism, as Beam would.
"""

from __future__ import annotations

import difflib
import logging
import os
from pathlib import Path
from typing import Any, Final

from apache_beam.metrics.metric import MetricsFilter
from apache_beam.options.pipeline_options import (
    PipelineOptions,
    PortableOptions,
    PrismRunnerOptions,
    StandardOptions,
)

from features.cli import CommandError

log = logging.getLogger(__name__)

DEFAULT_LOCAL_RUNNER: Final = "FnApiRunner"
PRISM_ENV: Final = "GEM_PRISM"
DEFAULT_PRISM: Final = Path(__file__).resolve().parents[2] / ".tools" / "bin" / "prism"
# Runners that may hand the pipeline to Prism.
_PRISM_RUNNERS: Final = frozenset(
    {"DirectRunner", "SwitchingDirectRunner", "PrismRunner"}
)


def prism_binary() -> Path:
    """Where the local Prism binary is (``GEM_PRISM`` overrides); may not exist."""
    override = os.environ.get(PRISM_ENV)
    return Path(override) if override else DEFAULT_PRISM


def runner_name(options: PipelineOptions) -> str:
    """The ``--runner`` asked for, by class name (Beam's default: DirectRunner)."""
    runner = options.view_as(StandardOptions).runner
    if runner is None:
        return "DirectRunner"
    name = runner if isinstance(runner, str) else type(runner).__name__
    return name.rsplit(".", 1)[-1]


def prepare_runner(options: PipelineOptions) -> None:
    """The default runner where none is named; the local Prism where it is used."""
    standard = options.view_as(StandardOptions)
    if standard.runner is None:
        standard.runner = DEFAULT_LOCAL_RUNNER
    use_local_prism(options)


def use_local_prism(options: PipelineOptions) -> None:
    """Point a DirectRunner or PrismRunner job at the local Prism binary.

    Leaves an explicit ``--prism_location`` and every other runner alone.
    Without a binary a DirectRunner job would try GitHub and then fall back
    to the FnApiRunner; that is said in a warning rather than left silent.
    """
    if runner_name(options) not in _PRISM_RUNNERS:
        return
    prism = options.view_as(PrismRunnerOptions)
    if prism.prism_location:
        return
    binary = prism_binary()
    if binary.is_file() and os.access(binary, os.X_OK):
        prism.prism_location = str(binary)
        return
    log.warning(
        "no Prism binary at %s (run `make prism`): the DirectRunner will fall "
        "back to the FnApiRunner",
        binary,
    )


def prism_location(options: PipelineOptions) -> str | None:
    """The Prism binary the options point at, if any."""
    location = options.view_as(PrismRunnerOptions).prism_location
    return str(location) if location else None


def runner_that_ran(options: PipelineOptions, result: Any) -> str:
    """The runner that really ran the job: the DirectRunner says which it chose.

    It returns the result of the runner it delegated to: a portable job's
    result means Prism, an in-process one the FnApiRunner. Any other runner
    is the one asked for.
    """
    asked = runner_name(options)
    if asked not in _PRISM_RUNNERS:
        return asked
    from apache_beam.runners.portability.fn_api_runner.fn_runner import RunnerResult
    from apache_beam.runners.portability.portable_runner import PipelineResult

    if isinstance(result, PipelineResult):
        return "PrismRunner"
    if isinstance(result, RunnerResult):
        return "FnApiRunner"
    return "BundleBasedDirectRunner"


def job_counters(result: Any, namespace: str) -> dict[str, int]:
    """The finished job's Beam counters in ``namespace``, by name, summed over
    steps: committed values (a retried bundle counts once) where the runner
    reports them, else attempted ones."""
    query = result.metrics().query(MetricsFilter().with_namespace(namespace))
    found: dict[str, int] = {}
    for counter in query["counters"]:
        value = counter.committed
        if value is None:
            value = counter.attempted
        name = counter.key.metric.name
        found[name] = found.get(name, 0) + int(value or 0)
    return found


def job_gauges(result: Any, namespace: str) -> dict[str, Any]:
    """The finished job's Beam gauges (``gauges``: the latest value of each)
    and distributions (``distributions``: count, sum, min, max, mean) in
    ``namespace``, by name; committed values where the runner reports them,
    else attempted ones."""
    query = result.metrics().query(MetricsFilter().with_namespace(namespace))
    gauges: dict[str, tuple[Any, int]] = {}
    for gauge in query["gauges"]:
        value = gauge.committed or gauge.attempted
        if value is None or value.value is None:
            continue
        name = gauge.key.metric.name
        seen = gauges.get(name)
        if seen is None or value.timestamp > seen[0]:
            gauges[name] = (value.timestamp, int(value.value))
    distributions: dict[str, dict[str, Any]] = {}
    for dist in query["distributions"]:
        data = dist.committed or dist.attempted
        if data is None or not data.count:
            continue
        distributions[dist.key.metric.name] = {
            "count": int(data.count),
            "sum": int(data.sum),
            "min": int(data.min),
            "max": int(data.max),
            "mean": float(data.mean),
        }
    return {
        "gauges": {name: value for name, (_, value) in sorted(gauges.items())},
        "distributions": distributions,
    }


# Runners that start their own job server from a jar: their options are known
# only once it runs, and Beam keeps those it then describes.
_SELF_SERVED_RUNNERS: Final = frozenset({"FlinkRunner", "SparkRunner"})
DESCRIBE_TIMEOUT_S: Final = 30


class RunnerOptionError(CommandError):
    """A flag neither Beam nor the runner knows (one line, naming it)."""


def passed_through(options: PipelineOptions) -> list[str]:
    """The flags given that no Beam or job options class knows: what
    :func:`pipelines.beam.beam_flags.runner_options` handed on."""
    from apache_beam.options.pipeline_options import _BeamArgumentParser

    # Beam's own parse of the known options would warn of the others.
    parser = _BeamArgumentParser(allow_abbrev=False)
    classes = {str(cls): cls for cls in PipelineOptions.__subclasses__()}
    for cls in classes.values():
        cls._add_argparse_args(parser)
    known = {action.dest for action in parser._actions}
    everything = options.get_all_options(retain_unknown_options=True)
    return sorted(set(everything) - known)


def described_options(job_endpoint: str) -> set[str]:
    """The options a job server describes (``checkpointing_interval``...),
    the ones Beam sends it beside its own."""
    import grpc
    from apache_beam.portability.api import beam_job_api_pb2, beam_job_api_pb2_grpc

    with grpc.insecure_channel(job_endpoint) as channel:
        stub = beam_job_api_pb2_grpc.JobServiceStub(channel)
        answer = stub.DescribePipelineOptions(
            beam_job_api_pb2.DescribePipelineOptionsRequest(),
            timeout=DESCRIBE_TIMEOUT_S,
        )
    return {option.name for option in answer.options}


def check_runner_options(options: PipelineOptions) -> None:
    """Refuse a passed-through flag the runner does not know, before the job
    starts: Beam would drop it without a word.

    A runner behind ``--job_endpoint`` is asked which options it has; a
    runner that starts its own job server is left to Beam; any other runner
    has no options beyond Beam's.

    Raises:
        RunnerOptionError: the first unknown flag, with the closest the
            runner knows.
    """
    given = passed_through(options)
    if not given:
        return
    name = runner_name(options)
    if name in _SELF_SERVED_RUNNERS:
        return
    endpoint = options.view_as(PortableOptions).job_endpoint
    known: set[str] = set()
    where = f"--runner={name}"
    if endpoint and endpoint != "embed":
        known = described_options(endpoint)
        where = f"the job server at {endpoint}"
    for option in given:
        if option in known:
            continue
        close = difflib.get_close_matches(option, sorted(known), n=1)
        hint = f" (did you mean --{close[0]}?)" if close else ""
        raise RunnerOptionError(
            f"unrecognized arguments: --{option}: neither Beam nor {where} "
            f"knows it{hint}"
        )
