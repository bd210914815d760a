"""What the daemon tells the outside world, all from rank 0.

- JSON lines (one object per log interval) to a file: the complete record;
- Prometheus on ``/metrics`` (:mod:`trainer.metrics.prometheus`; port 0 = off), on
  the loopback interface unless an address says otherwise;
- TensorBoard scalars (``SummaryWriter``) when a log dir is given;
- a one-line progress bar (tqdm) only when stdout is a TTY;
- at the end of a bounded run, a PNG of the windowed NE curves per domain
  (matplotlib, Agg backend: no display needed), drawn from the bounded
  history (:class:`ThinnedHistory`).
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final

from trainer.metrics.progressive import ProgressiveMetrics
from trainer.metrics.prometheus import RunTotals

# Records kept in memory for the end-of-run plot: a few KB each, so a few MB
# however long a daemon runs (the JSON-lines file has every record).
HISTORY_CAP: Final = 1024


class ThinnedHistory:
    """At most ``cap`` records that span the whole run, evenly spaced.

    Every record is kept until ``cap`` are held; then every other one is
    dropped and from there on only every 2nd record is kept, then every 4th
    after the next thinning, and so on: the kept records are always those
    whose index is a multiple of the current stride. The latest record is
    always available too (:attr:`records` ends with it), so a curve ends
    where the run ended.
    """

    def __init__(self, cap: int = HISTORY_CAP) -> None:
        if cap < 2:
            raise ValueError(f"history cap must be at least 2, got {cap}")
        self.cap = cap
        self.stride = 1
        self._kept: list[dict[str, Any]] = []
        self._seen = 0
        self._latest: dict[str, Any] | None = None

    def append(self, record: dict[str, Any]) -> None:
        """Offer one record (kept if its index is on the stride)."""
        if self._seen % self.stride == 0:
            self._kept.append(record)
            if len(self._kept) >= self.cap:
                self._kept = self._kept[::2]
                self.stride *= 2
        self._seen += 1
        self._latest = record

    @property
    def records(self) -> list[dict[str, Any]]:
        """The kept records, oldest first, ending with the latest."""
        if self._latest is None or (self._kept and self._kept[-1] is self._latest):
            return list(self._kept)
        return [*self._kept, self._latest]

    def __len__(self) -> int:
        return len(self.records)


class Reporter:
    """Fan one record per log interval out to every configured sink.

    Args:
        jsonl: JSON-lines file (appended to: restarts continue it).
        prometheus_port: serve ``/metrics`` there; 0 disables it.
        prometheus_address: the interface to listen on; loopback by default,
            so metrics are not exposed to the network without being asked.
        tensorboard_dir: SummaryWriter log dir; None disables it.
        enabled: False on ranks other than 0 (every call is then a no-op).
        history_cap: records kept in memory for :meth:`plot`.
        prefix: Prometheus metric name prefix.
        restored: the resumed checkpoint's run-wide counts: the counters
            continue from them, throughput counts from its examples.
    """

    def __init__(
        self,
        *,
        jsonl: Path | None = None,
        prometheus_port: int = 0,
        prometheus_address: str = "127.0.0.1",
        tensorboard_dir: Path | None = None,
        enabled: bool = True,
        history_cap: int = HISTORY_CAP,
        prefix: str = "gem_trainer",
        restored: RunTotals | None = None,
    ) -> None:
        self.enabled = enabled
        self._history = ThinnedHistory(history_cap)
        self._jsonl = open(jsonl, "a") if jsonl and enabled else None
        self.prometheus_port = 0
        self.prometheus_address: str | None = None
        self._prometheus: Any = None
        if prometheus_port and enabled:
            from trainer.metrics.prometheus import DaemonMetrics

            self._prometheus = DaemonMetrics(
                prefix, prometheus_port, prometheus_address, restored=restored
            )
            self.prometheus_port = self._prometheus.port
            self.prometheus_address = self._prometheus.address
        self._tb = None
        if tensorboard_dir and enabled:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(str(tensorboard_dir))
        self._bar = None
        if enabled and sys.stdout.isatty():
            from tqdm import tqdm

            self._bar = tqdm(desc="train", unit="step", dynamic_ncols=True)
        self._last = (time.monotonic(), restored.examples if restored else 0)

    @property
    def history(self) -> list[dict[str, Any]]:
        """The records kept for the plot (bounded: see :class:`ThinnedHistory`)."""
        return self._history.records

    def count(self, *, step: int, examples: int, dead_letters: int) -> None:
        """Bring the run-wide counters up to date (cheap: every iteration)."""
        if self._prometheus is not None:
            self._prometheus.advance(
                examples=examples, steps=step, dead_letters=dead_letters
            )

    def checkpoint_written(self, step: int) -> None:
        """A durable checkpoint at ``step``: the checkpoint age restarts."""
        if self._prometheus is not None:
            self._prometheus.checkpoint_written(step)

    def checkpoint_failed(self) -> None:
        """A checkpoint write failed."""
        if self._prometheus is not None:
            self._prometheus.checkpoint_failed()

    def watch_consumer(self, topic: str, lag: Callable[[], Mapping[int, int]]) -> None:
        """Export ``lag()`` (partition → records behind) as the consumer lag."""
        if self._prometheus is not None:
            self._prometheus.watch_consumer(topic, lag)

    def watch_gaps(self, topic: str, records: Callable[[], int]) -> None:
        """Export ``records()`` (the run's offset gaps) as a counter."""
        if self._prometheus is not None:
            self._prometheus.watch_gaps(topic, records)

    def log(
        self,
        *,
        step: int,
        examples: int,
        loss: float,
        dead_letters: int,
        metrics: ProgressiveMetrics,
    ) -> dict[str, Any]:
        """Emit one record (step, throughput, loss, windowed + lifetime metrics)."""
        if not self.enabled:
            return {}
        now = time.monotonic()
        seconds, before = now - self._last[0], self._last[1]
        self._last = (now, examples)
        record: dict[str, Any] = {
            "time": time.time(),
            "step": step,
            "examples": examples,
            "examples_per_second": (examples - before) / seconds
            if seconds > 0
            else 0.0,
            "loss": loss,
            "dead_letters": dead_letters,
            "lifetime": metrics.table("lifetime"),
            "window": metrics.table("last_window"),
        }
        self._history.append(record)
        if self._jsonl:
            self._jsonl.write(json.dumps(record, allow_nan=True) + "\n")
            self._jsonl.flush()
        if self._prometheus is not None:
            self.count(step=step, examples=examples, dead_letters=dead_letters)
            self._prometheus.set("examples_per_second", record["examples_per_second"])
            self._prometheus.set("loss", loss)
            for scope in ("lifetime", "window"):
                self._prometheus.set_quality(scope, record[scope])
        if self._tb is not None:
            for scope in ("lifetime", "window"):
                for key, values in record[scope].items():
                    for name in ("ne", "auc", "calibration"):
                        if not math.isnan(values[name]):
                            self._tb.add_scalar(
                                f"{scope}/{name}/{key}", values[name], step
                            )
            self._tb.add_scalar("train/loss", loss, step)
            self._tb.add_scalar(
                "train/examples_per_second", record["examples_per_second"], step
            )
        if self._bar is not None:
            self._bar.update(step - self._bar.n)
            self._bar.set_postfix(
                loss=f"{loss:.4f}", ex_s=f"{record['examples_per_second']:.0f}"
            )
        return record

    def plot(self, path: Path) -> Path | None:
        """PNG of windowed (else lifetime) NE per domain over steps; None if no data."""
        history = self.history
        if not self.enabled or not history:
            return None
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        keys = sorted({k for r in history for k in r["lifetime"]})
        domains = sorted({k.split("/")[0] for k in keys})
        if not domains:
            return None
        fig, axes = plt.subplots(
            1, len(domains), figsize=(5 * len(domains), 3.5), squeeze=False
        )
        for ax, domain in zip(axes[0], domains, strict=True):
            for key in (k for k in keys if k.startswith(domain + "/")):
                for scope, style in (("window", "-"), ("lifetime", "--")):
                    points = [
                        (r["step"], r[scope][key]["ne"])
                        for r in history
                        if key in r[scope]
                    ]
                    if points:
                        xs, ys = zip(*points, strict=True)
                        ax.plot(xs, ys, style, label=f"{key.split('/')[1]} {scope}")
            ax.set_title(f"{domain}: progressive NE")
            ax.set_xlabel("step")
            ax.legend(fontsize="small")
        return save_png(fig, path)

    def close(self) -> None:
        """Flush and close every sink (and stop serving ``/metrics``)."""
        if self._jsonl:
            self._jsonl.close()
        if self._prometheus is not None:
            self._prometheus.close()
            self._prometheus = None
        if self._tb is not None:
            self._tb.close()
        if self._bar is not None:
            self._bar.close()


def save_png(fig: Any, path: Path, dpi: int = 80) -> Path:
    """Lay ``fig`` (a matplotlib figure) out, write it to ``path`` as a PNG
    (making its folder) and close it; ``path``."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path
