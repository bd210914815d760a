"""What the daemon tells the outside world, all from rank 0.

- JSON lines (one object per log interval) to a file;
- Prometheus gauges on ``/metrics`` (``prometheus_client``; port 0 = off),
  on the loopback interface unless an address says otherwise;
- TensorBoard scalars (``SummaryWriter``) when a log dir is given;
- a one-line progress bar (tqdm) only when stdout is a TTY;
- at the end of a bounded run, a PNG of the windowed NE curves per domain
  (matplotlib, Agg backend: no display needed).
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path
from typing import Any

from trainer.progressive import ProgressiveMetrics


class Reporter:
    """Fan one record per log interval out to every configured sink.

    Args:
        jsonl: JSON-lines file (appended to: restarts continue it).
        prometheus_port: serve ``/metrics`` there; 0 disables it.
        prometheus_address: the interface to listen on; loopback by default,
            so metrics are not exposed to the network without being asked.
        tensorboard_dir: SummaryWriter log dir; None disables it.
        enabled: False on ranks other than 0 (every call is then a no-op).
    """

    def __init__(
        self,
        *,
        jsonl: Path | None = None,
        prometheus_port: int = 0,
        prometheus_address: str = "127.0.0.1",
        tensorboard_dir: Path | None = None,
        enabled: bool = True,
    ) -> None:
        self.enabled = enabled
        self.history: list[dict[str, Any]] = []
        self._jsonl = open(jsonl, "a") if jsonl and enabled else None
        self._gauges: dict[str, Any] = {}
        self.prometheus_port = 0
        self.prometheus_address: str | None = None
        self._server: Any = None
        if prometheus_port and enabled:
            from prometheus_client import CollectorRegistry, Gauge, start_http_server

            self._registry = CollectorRegistry()  # own registry: no global clashes
            labels = ["domain", "objective", "scope"]
            for name in ("ne", "auc", "calibration"):
                self._gauges[name] = Gauge(
                    f"gem_trainer_{name}",
                    f"progressive {name}",
                    labels,
                    registry=self._registry,
                )
            for name, doc in (
                ("step", "optimizer steps"),
                ("examples_per_second", "training throughput"),
                ("loss", "training loss"),
                ("dead_letters", "messages set aside"),
            ):
                self._gauges[name] = Gauge(
                    f"gem_trainer_{name}", doc, registry=self._registry
                )
            server, _ = start_http_server(
                prometheus_port, addr=prometheus_address, registry=self._registry
            )
            self._server = server
            self.prometheus_port = server.server_port
            self.prometheus_address = str(server.server_address[0])
        self._tb = None
        if tensorboard_dir and enabled:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(str(tensorboard_dir))
        self._bar = None
        if enabled and sys.stdout.isatty():
            from tqdm import tqdm

            self._bar = tqdm(desc="train", unit="step", dynamic_ncols=True)
        self._last = (time.monotonic(), 0)

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
        record = {
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
        self.history.append(record)
        if self._jsonl:
            self._jsonl.write(json.dumps(record, allow_nan=True) + "\n")
            self._jsonl.flush()
        for name in ("step", "examples_per_second", "loss", "dead_letters"):
            if name in self._gauges:
                self._gauges[name].set(record[name])
        for scope in ("lifetime", "window"):
            for key, values in record[scope].items():
                domain, objective = key.split("/")
                for name in ("ne", "auc", "calibration"):
                    if name in self._gauges:
                        self._gauges[name].labels(domain, objective, scope).set(
                            values[name]
                        )
                    if self._tb is not None and not math.isnan(values[name]):
                        self._tb.add_scalar(f"{scope}/{name}/{key}", values[name], step)
        if self._tb is not None:
            self._tb.add_scalar("train/loss", loss, step)
        if self._bar is not None:
            self._bar.update(step - self._bar.n)
            self._bar.set_postfix(
                loss=f"{loss:.4f}", ex_s=f"{record['examples_per_second']:.0f}"
            )
        return record

    def plot(self, path: Path) -> Path | None:
        """PNG of windowed (else lifetime) NE per domain over steps; None if no data."""
        if not self.enabled or not self.history:
            return None
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        keys = sorted({k for r in self.history for k in r["lifetime"]})
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
                        for r in self.history
                        if key in r[scope]
                    ]
                    if points:
                        xs, ys = zip(*points, strict=True)
                        ax.plot(xs, ys, style, label=f"{key.split('/')[1]} {scope}")
            ax.set_title(f"{domain}: progressive NE")
            ax.set_xlabel("step")
            ax.legend(fontsize="small")
        fig.tight_layout()
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=80)
        plt.close(fig)
        return path

    def close(self) -> None:
        """Flush and close every sink (and stop serving ``/metrics``)."""
        if self._jsonl:
            self._jsonl.close()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._tb is not None:
            self._tb.close()
        if self._bar is not None:
            self._bar.close()
