"""Model speed on this CPU: train examples/s, FLOPs/example, jagged vs padded.

Usage::

    python -m benchmarks.bench_model_speed [--steps 4] [--batch-size 256] [--json FILE]

1. **Training throughput** per preset (``tiny``, ``default``) and model: a
   small generated set (300 users, 3 days) through ``pipelines.core.reference``,
   batches of ``--batch-size`` built by
   :class:`trainer.data.feature_output.ExampleDataset`
   (windows at the preset's ``max_seq_len``), Adam, one warm-up step, then
   ``--steps`` timed steps on one torch thread (see ``trainer.training.fit`` on why).
   ``large`` is only built and run forward on 8 examples, if it fits.
2. **FLOPs per example**: ``torch.utils.flop_counter.FlopCounterMode`` over
   one forward + backward (matmul-family ops only: gathers, softmax and
   elementwise ops are not counted, so this is a lower bound).
3. **Jagged vs padded** at skewed lengths (B=64: lengths ~ geometric with mean
   40, capped at 99, two sequences at 4096), forward + backward, default dims:
   - op level: the pyramid's causal local-window attention,
     ``trainer.ops.jagged_local_attention`` on (L, H, Dh) jagged tokens, vs
     the same op on the batch padded to its maximum ``(B, Tmax, H, Dh)``
     (outputs checked equal on the real tokens);
   - module level: the whole ``PyramidEncoder`` on the jagged batch vs on the
     batch padded to Tmax (every sequence Tmax long: the compute a padded
     encoder does; a cost peer, its outputs are not the jagged ones).
   Peak memory = peak rise of the process's RSS (sampled every ~0.2 ms)
   during one fwd+bwd, each variant in a fresh subprocess (torch's CPU
   allocator has no peak counter).
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import torch
from torch.utils.flop_counter import FlopCounterMode

from benchmarks.generated import generated_features
from trainer.data.feature_output import ExampleDataset
from trainer.models.config import preset
from trainer.models.loss_wrapper import GEMTrain
from trainer.models.registry import MODEL_NAMES, build_model
from trainer.modules.pyramid import PyramidEncoder
from trainer.ops import JaggedTokens, jagged_local_attention
from trainer.training.fit_trainer import make_optimizer
from trainer.training.run_config import FitConfig
from trainer.training.step import train_step

REPO = Path(__file__).resolve().parents[1]


def make_data(root: Path) -> Path:
    """A small reference feature dir (the generator + reference job)."""
    from pipelines.sources.synthetic import GeneratorConfig

    return generated_features(
        GeneratorConfig(users=300, ads=60, days=3, seed=1), root / "gen", root / "f"
    )


def throughput(
    features: Path, preset_name: str, batch_size: int, steps: int
) -> dict[str, Any]:
    """examples/s and FLOPs/example of every model under one preset."""
    seq = preset(preset_name).embedding.max_seq_len
    data = ExampleDataset(features, max_seq_len=seq)
    batches = list(
        data.batches(batch_size, shuffle=True, max_batches=steps + 1, prefetch=0)
    )
    lengths = torch.cat([b.sequence.lengths()[: b.size] for b in batches]).float()
    out: dict[str, Any] = {
        "max_seq_len": seq,
        "history_mean": lengths.mean().item(),
        "history_max": lengths.max().item(),
        "models": {},
    }
    for name in MODEL_NAMES:
        torch.manual_seed(0)
        model = GEMTrain(build_model(name, preset_name))
        opt = make_optimizer(model, FitConfig(train=Path(), eval=Path()))
        train_step(model, batches[0], opt)  # warm-up
        with FlopCounterMode(display=False) as counter:
            loss, _ = model(batches[0])
            loss.backward()
        flops = counter.get_total_flops() / batches[0].size
        started, seen = time.perf_counter(), 0
        for b in batches[1:]:
            train_step(model, b, opt)
            seen += b.size
        eps = seen / (time.perf_counter() - started)
        params = sum(p.numel() for p in model.parameters())
        out["models"][name] = {
            "examples_per_s": eps,
            "flops_per_example": flops,
            "parameters": params,
        }
        print(
            f"  {preset_name:8s} {name:18s} {eps:8.0f} ex/s  "
            f"{flops / 1e6:9.2f} MFLOP/ex (fwd+bwd)  {params / 1e6:6.2f} M params",
            flush=True,
        )
    return out


def large_forward(features: Path) -> dict[str, Any]:
    """Build ``large`` and run forward on 8 examples (memory permitting)."""
    out: dict[str, Any] = {}
    data = ExampleDataset(features, max_seq_len=preset("large").embedding.max_seq_len)
    batch = next(iter(data.batches(8, prefetch=0)))
    for name in ("gem", "dlrm"):
        try:
            torch.manual_seed(0)
            model = build_model(name, "large").eval()
            # Grad mode on: FlopCounterMode's module tracker asserts under
            # no_grad when parameters require grad (torch 2.13).
            with FlopCounterMode(display=False) as counter:
                started = time.perf_counter()
                model(batch)
                seconds = time.perf_counter() - started
            out[name] = {
                "parameters": sum(p.numel() for p in model.parameters()),
                "forward_s_8_examples": seconds,
                "fwd_flops_per_example": counter.get_total_flops() / 8,
            }
            del model
        except (RuntimeError, MemoryError, AssertionError) as error:  # report it
            out[name] = {"error": f"{type(error).__name__}: {error}"[:300]}
        print(f"  large {name}: {out[name]}", flush=True)
    return out


# --- jagged vs padded ---------------------------------------------------------


def skewed_lengths(batch: int = 64, seed: int = 0) -> torch.Tensor:
    """Most histories < 100 (geometric, mean 40), two at 4096."""
    torch.manual_seed(seed)
    lengths = torch.distributions.Geometric(probs=torch.tensor(1 / 40)).sample((batch,))
    lengths = lengths.clamp(1, 99).long()
    lengths[:2] = 4096
    return lengths


def padded_local_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    lengths: torch.Tensor,
    window: int,
) -> torch.Tensor:
    """The same causal local attention on padded (B, T, H, Dh).

    The jagged op's own algorithm run on every sequence padded to ``T``:
    each padded row is one sequence of ``T`` tokens. Padding sits after the
    real tokens and the attention is causal, so real tokens never see it and
    ``lengths`` needs no mask here (padding outputs are dropped).
    """
    del lengths  # causality already hides the padding
    b, t, heads, dh = q.shape
    offsets = torch.arange(b + 1, device=q.device) * t
    out = jagged_local_attention(
        *(x.reshape(b * t, heads, dh) for x in (q, k, v)), offsets, window
    )
    return out.view(b, t, heads, dh)


def _rss_bytes() -> int:
    """Resident set size now (Linux ``/proc/self/statm``)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


class _RssPeak:
    """Samples RSS every ~0.2 ms on a thread; ``bytes`` is the maximum seen.

    ru_maxrss cannot be reset and already holds the import-time peak, so small
    variants read 0; sampling the current RSS works because tensors this size
    are mmap-ed and given back on free.
    """

    def __enter__(self) -> _RssPeak:
        self.bytes = _rss_bytes()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.bytes = max(self.bytes, _rss_bytes())
            time.sleep(0.0002)

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()
        self.bytes = max(self.bytes, _rss_bytes())


def _variant(name: str, repeats: int) -> dict[str, float]:
    """Run one variant (in its own process): mean seconds and peak RSS rise."""
    torch.manual_seed(0)
    torch.set_num_threads(1)
    cfg = preset("default")
    dim, pcfg = cfg.embedding.dim, cfg.pyramid
    heads, dh = pcfg.num_heads, cfg.embedding.dim // pcfg.num_heads
    lengths = skewed_lengths()
    tmax = int(lengths.max())
    if name.endswith("padded"):
        lengths_run = torch.full_like(lengths, tmax)
    else:
        lengths_run = lengths
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths_run.cumsum(0)])
    total = int(offsets[-1])
    if name.startswith("op"):
        shape = (
            (lengths.numel(), tmax, heads, dh)
            if name == "op_padded"
            else (total, heads, dh)
        )
        q, k, v = (torch.randn(shape, requires_grad=True) for _ in range(3))

        def run() -> torch.Tensor:
            if name == "op_padded":
                return padded_local_attention(q, k, v, lengths, pcfg.window)
            return jagged_local_attention(q, k, v, offsets, pcfg.window)
    else:
        encoder = PyramidEncoder(dim, pcfg)
        x = torch.randn(total, dim, requires_grad=True)
        target = torch.randn(lengths.numel(), dim)

        def run() -> torch.Tensor:
            out = encoder(JaggedTokens(x, offsets, tmax), target)
            return out.tokens.values.sum() + out.summary.sum()

    before = _rss_bytes()
    with _RssPeak() as peak:  # first run: its peak is the memory figure
        run().sum().backward()
    started = time.perf_counter()
    for _ in range(repeats):
        run().sum().backward()
    return {
        "seconds": (time.perf_counter() - started) / repeats,
        "peak_rss_rise_mib": (peak.bytes - before) / 2**20,
        "tokens": total,
    }


def check_padded_matches() -> float:
    """Max |jagged - padded| of the local attention on real tokens."""
    torch.manual_seed(0)
    lengths = torch.tensor([3, 7, 1, 12])
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])
    q, k, v = (torch.randn(int(offsets[-1]), 2, 4) for _ in range(3))
    jag = jagged_local_attention(q, k, v, offsets, 4)
    pad = [torch.zeros(4, 12, 2, 4) for _ in range(3)]
    for i in range(4):
        for p, src in zip(pad, (q, k, v), strict=True):
            p[i, : lengths[i]] = src[offsets[i] : offsets[i + 1]]
    out = padded_local_attention(*pad, lengths, 4)
    real = torch.cat([out[i, : lengths[i]] for i in range(4)])
    return float((real - jag).abs().max())


def jagged_vs_padded(repeats: int) -> dict[str, Any]:
    """Every variant in a fresh subprocess; ratios padded / jagged."""
    res: dict[str, Any] = {
        "lengths": skewed_lengths().tolist(),
        "max_abs_diff_op": check_padded_matches(),
    }
    for name in ("op_jagged", "op_padded", "pyramid_jagged", "pyramid_padded"):
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "benchmarks.bench_model_speed",
                "--variant",
                name,
                "--repeats",
                str(repeats),
            ],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=True,
        )
        res[name] = json.loads(done.stdout.strip().splitlines()[-1])
        print(f"  {name:15s} {res[name]}", flush=True)
    add_padded_ratios(res, "seconds", "peak_rss_rise_mib")
    return res


def add_padded_ratios(res: dict[str, Any], time_key: str, memory_key: str) -> None:
    """``{op,pyramid}_{time,memory}_ratio`` = padded / jagged, added to ``res``."""
    for level in ("op", "pyramid"):
        j, p = res[f"{level}_jagged"], res[f"{level}_padded"]
        res[f"{level}_time_ratio"] = p[time_key] / j[time_key]
        res[f"{level}_memory_ratio"] = p[memory_key] / max(j[memory_key], 1e-9)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--variant", default=None, help=argparse.SUPPRESS)
    p.add_argument("--skip-large", action="store_true")
    p.add_argument("--skip-throughput", action="store_true")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    if args.variant:
        print(json.dumps(_variant(args.variant, args.repeats)))
        return 0
    torch.set_num_threads(1)
    result: dict[str, Any] = {
        "machine": platform.processor() or platform.machine(),
        "torch": torch.__version__,
        "threads": 1,
    }
    with tempfile.TemporaryDirectory() as tmp:
        features = make_data(Path(tmp))
        print("training throughput (1 thread):", flush=True)
        result["throughput"] = (
            {}
            if args.skip_throughput
            else {
                n: throughput(features, n, args.batch_size, args.steps)
                for n in ("tiny", "default")
            }
        )
        if not args.skip_large:
            print("large preset, forward on 8 examples:", flush=True)
            result["large"] = large_forward(features)
    print("jagged vs padded (B=64, skewed lengths, fwd+bwd):", flush=True)
    result["jagged_vs_padded"] = jagged_vs_padded(args.repeats)
    jp = result["jagged_vs_padded"]
    print(
        f"  padded/jagged: op time {jp['op_time_ratio']:.1f}x, memory "
        f"{jp['op_memory_ratio']:.1f}x; pyramid time {jp['pyramid_time_ratio']:.1f}x, "
        f"memory {jp['pyramid_memory_ratio']:.1f}x"
    )
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
