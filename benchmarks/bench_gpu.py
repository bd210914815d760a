"""GPU speed of the real models (TorchRec inputs): training examples/s and MFU.

Usage (on a CUDA machine; torchrec importable, fbgemm's CPU wheel is enough)::

    python -m benchmarks.bench_gpu [--features DIR] [--presets default,large]
        [--batch-sizes 1024,4096] [--precisions fp32,bf16] [--steps 20]
        [--compile [BACKEND]] [--skip-jagged] [--json FILE]

1. **Model throughput**: every model of :data:`MODEL_NAMES` per preset, batch
   size and precision: batches built by
   :class:`trainer.data.feature_output.ExampleDataset`
   (windows at the preset's ``max_seq_len``), moved to the GPU *before* the
   clock starts, Adam, three warm-up steps, then ``--steps`` timed steps
   (``torch.cuda.synchronize`` at both ends). MFU = counted FLOPs
   (``FlopCounterMode`` over one forward + backward: matmul family only, a
   lower bound) x examples/s / the GPU's dense bf16 peak (TF32 for fp32).
2. **Input path**: GEM end to end as ``trainer.training.fit`` feeds it (numpy batch
   building on the prefetch thread, pinned, copied non-blocking), against
   the model-only figure: the share of the GPU the input path leaves idle.
3. **Peer in the same run**: the same model and batches on this machine's
   CPU (all cores, 2 steps) for the ``default`` preset: the GPU / CPU ratio.
4. **Compiled** (``--compile``; inductor unless a backend is named): each
   measurement of 1. again with the model under ``torch.compile``, set up as
   ``trainer.fit --compile`` sets it up (:func:`compile_model` on the bare
   model, the history length marked dynamic on every batch), keyed
   ``.../compiled``: examples/s beside the eager figure of the same run, the
   first step's seconds (compile included), the frames dynamo compiled over
   the warm-up, and the recompiles while timing (0: one graph serves every
   batch of a new history total).
5. **Jagged vs padded on the GPU**: the pyramid's local-window attention
   and the whole ``PyramidEncoder`` at skewed lengths (B=64, geometric mean
   40 capped at 99, two at 4096), forward + backward, jagged vs padded to the
   batch maximum; time and peak GPU memory (``max_memory_allocated``).

Without CUDA it exits with a message (nothing here is meaningful on a CPU;
``bench_model_speed`` is the CPU benchmark). ``--device cpu`` runs part 1
(and 4) on the CPU anyway, as a check that the code path works: a test runs
it with the tiny preset; its figures mean nothing.
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.utils.flop_counter import FlopCounterMode

from benchmarks.bench_model_speed import (
    add_padded_ratios,
    make_data,
    padded_local_attention,
    skewed_lengths,
)
from benchmarks.machine import cpu_model
from trainer.data.batch import Batch
from trainer.data.feature_output import ExampleDataset
from trainer.models.config import preset
from trainer.models.loss_wrapper import GEMTrain
from trainer.models.registry import MODEL_NAMES, build_model
from trainer.modules.pyramid import PyramidEncoder
from trainer.ops import JaggedTokens, jagged_local_attention
from trainer.training.fit_trainer import make_optimizer
from trainer.training.run_config import FitConfig
from trainer.training.step import compile_model, train_step

# Dense peaks by device name (datasheet, SXM): bf16 and TF32, TFLOP/s.
PEAK_TFLOPS = {"H200": (989.0, 494.0), "H100": (989.0, 494.0), "A100": (312.0, 156.0)}


def _peak(precision: str) -> float | None:
    name = torch.cuda.get_device_name()
    for key, (bf16, tf32) in PEAK_TFLOPS.items():
        if key in name:
            return bf16 if precision == "bf16" else tf32
    return None


def _timed(run: Callable[[], Any], steps: int, device: torch.device) -> float:
    """Seconds per call of ``run`` over ``steps`` calls, after a sync."""
    if device.type == "cuda":
        torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(steps):
        run()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - started) / steps


def model_throughput(
    batches: list[Batch],
    name: str,
    preset_name: str,
    precision: str,
    device: torch.device,
    steps: int,
    compile_backend: str | None = None,
) -> dict[str, Any]:
    """examples/s (model only), FLOPs/example and peak memory of one model.

    With ``compile_backend`` the bare model runs under ``torch.compile`` (as
    ``trainer.fit --compile`` runs it), and the result adds the first step's
    seconds, the frames compiled over the warm-up and the recompiles while
    timing.
    """
    torch.manual_seed(0)
    model = GEMTrain(build_model(name, preset_name)).to(device)
    opt = make_optimizer(model, FitConfig(train=Path(), eval=Path()))
    on_device = [b.to(device) for b in batches]
    autocast = torch.autocast(
        device.type, dtype=torch.bfloat16, enabled=precision == "bf16"
    )
    with FlopCounterMode(display=False) as counter, autocast:  # eager, counted
        loss, _ = model(on_device[0])
        loss.backward()
    flops = counter.get_total_flops() / on_device[0].size
    if compile_backend is not None:
        model.model = compile_model(model.model, backend=compile_backend)
    position = iter(range(10**9))

    def step() -> None:
        with autocast:
            train_step(model, on_device[next(position) % len(on_device)], opt, 10.0)

    frames = torch._dynamo.utils.counters["frames"]
    frames_before = frames["total"]
    first_s = _timed(step, 1, device)  # compiles forward and backward, if asked
    for _ in range(2):
        step()
    warm_frames = frames["total"] - frames_before
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    seconds = _timed(step, steps, device)
    eps = on_device[0].size / seconds
    out: dict[str, Any] = {
        "examples_per_s": eps,
        "step_ms": seconds * 1e3,
        "mflop_per_example": flops / 1e6,
        "parameters_m": sum(p.numel() for p in model.parameters()) / 1e6,
    }
    if compile_backend is not None:
        out["backend"] = compile_backend
        out["first_step_s"] = first_s
        out["frames_compiled"] = warm_frames
        out["recompiles_while_timing"] = frames["total"] - frames_before - warm_frames
    if device.type == "cuda":
        peak = _peak(precision)
        out["mfu"] = eps * flops / (peak * 1e12) if peak else None
        out["peak_memory_gib"] = torch.cuda.max_memory_allocated() / 2**30
    return out


def input_path(
    data: ExampleDataset, preset_name: str, batch_size: int, steps: int
) -> dict[str, Any]:
    """GEM fed as trainer.fit feeds it: build, pin, copy, train."""
    device = torch.device("cuda")
    torch.manual_seed(0)
    model = GEMTrain(build_model("gem", preset_name)).to(device)
    opt = make_optimizer(model, FitConfig(train=Path(), eval=Path()))
    batches = data.batches(
        batch_size, shuffle=True, max_batches=steps + 3, pin_memory=True
    )
    for _, batch in zip(range(3), batches, strict=False):  # warm-up
        train_step(model, batch.to(device, non_blocking=True), opt, 10.0)
    torch.cuda.synchronize()
    started, seen = time.perf_counter(), 0
    for batch in batches:
        train_step(model, batch.to(device, non_blocking=True), opt, 10.0)
        seen += batch.size
    torch.cuda.synchronize()
    return {"examples_per_s": seen / (time.perf_counter() - started)}


def _variant(
    variant: str, lengths: torch.Tensor, device: torch.device
) -> Callable[[], torch.Tensor]:
    """One forward of a jagged-vs-padded variant (``op_*`` or ``pyramid_*``)."""
    cfg = preset("default")
    dim, pcfg = cfg.embedding.dim, cfg.pyramid
    heads, dh = pcfg.num_heads, dim // pcfg.num_heads
    tmax = int(lengths.max())
    torch.manual_seed(0)
    run_lengths = torch.full_like(lengths, tmax) if "padded" in variant else lengths
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), run_lengths.cumsum(0)])
    offsets = offsets.to(device)
    total = int(offsets[-1])
    if variant.startswith("op"):
        padded = variant == "op_padded"
        shape = (lengths.numel(), tmax, heads, dh) if padded else (total, heads, dh)
        q, k, v = (
            torch.randn(shape, device=device, requires_grad=True) for _ in range(3)
        )
        on_device = lengths.to(device)
        if padded:
            return lambda: padded_local_attention(q, k, v, on_device, pcfg.window)
        return lambda: jagged_local_attention(q, k, v, offsets, pcfg.window)
    encoder = PyramidEncoder(dim, pcfg).to(device)
    x = torch.randn(total, dim, device=device, requires_grad=True)
    target = torch.randn(lengths.numel(), dim, device=device)

    def run() -> torch.Tensor:
        encoded = encoder(JaggedTokens(x, offsets, tmax), target)
        return encoded.tokens.values.sum() + encoded.summary.sum()

    return run


def jagged_vs_padded(device: torch.device, repeats: int = 5) -> dict[str, Any]:
    """Local attention op and PyramidEncoder, jagged vs padded, on ``device``."""
    lengths = skewed_lengths()
    out: dict[str, Any] = {"real_tokens": int(lengths.sum()), "max": int(lengths.max())}
    for variant in ("op_jagged", "op_padded", "pyramid_jagged", "pyramid_padded"):
        run = _variant(variant, lengths, device)
        run().sum().backward()  # warm-up
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        seconds = _timed(lambda run=run: run().sum().backward(), repeats, device)
        out[variant] = {
            "ms": seconds * 1e3,
            "peak_memory_mib": (torch.cuda.max_memory_allocated() - base) / 2**20,
        }
        print(f"  {variant:15s} {out[variant]}", flush=True)
    add_padded_ratios(out, "ms", "peak_memory_mib")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--features", type=Path, default=None, help="feature-job output")
    p.add_argument("--presets", default="default,large")
    p.add_argument("--batch-sizes", default="1024,4096")
    p.add_argument("--precisions", default="fp32,bf16")
    p.add_argument("--models", default=",".join(MODEL_NAMES))
    p.add_argument("--steps", type=int, default=20)
    p.add_argument(
        "--compile",
        nargs="?",
        const="inductor",
        default=None,
        metavar="BACKEND",
        help="also time every model under torch.compile (default backend inductor)",
    )
    p.add_argument("--skip-cpu-peer", action="store_true")
    p.add_argument("--skip-jagged", action="store_true", help="skip part 5")
    p.add_argument(
        "--device",
        choices=("cuda", "cpu"),
        default="cuda",
        help="cpu: part 1 (and 4) only, to check the code path",
    )
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    on_gpu = args.device == "cuda"
    if on_gpu and not torch.cuda.is_available():
        print("bench_gpu: no CUDA device here; nothing to measure")
        return 0
    torch.backends.cuda.matmul.allow_tf32 = True
    device = torch.device(args.device)
    features = args.features
    if features is None:
        features = make_data(Path(tempfile.mkdtemp(prefix="bench_gpu_")))
    result: dict[str, Any] = {
        "device": torch.cuda.get_device_name() if on_gpu else cpu_model(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "throughput": {},
    }
    print(f"{result['device']}, torch {result['torch']}", flush=True)
    models = args.models.split(",")
    backends = [None] if args.compile is None else [None, args.compile]
    for preset_name in args.presets.split(","):
        seq = preset(preset_name).embedding.max_seq_len
        data = ExampleDataset(features, max_seq_len=seq)
        for batch_size in (int(b) for b in args.batch_sizes.split(",")):
            batches = list(
                data.batches(batch_size, shuffle=True, max_batches=4, prefetch=0)
            )
            if batches[-1].size < batch_size:
                batches = batches[:-1]
            if not batches:
                print(f"  {preset_name} B={batch_size}: too few examples, skipped")
                continue
            for precision in args.precisions.split(","):
                for name in models:
                    for backend in backends:
                        key = f"{preset_name}/B{batch_size}/{precision}/{name}"
                        key += "" if backend is None else "/compiled"
                        try:
                            r = model_throughput(
                                batches, name, preset_name, precision, device,
                                args.steps, backend,
                            )  # fmt: skip
                        except torch.OutOfMemoryError as error:
                            r = {"error": f"OOM: {error}"[:200]}
                        except Exception as error:
                            # A compile that fails is a finding to record; the
                            # eager figures and the other models still count.
                            if backend is None:
                                raise
                            r = {"error": f"{type(error).__name__}: {error}"[:400]}
                        if on_gpu:
                            torch.cuda.empty_cache()
                        result["throughput"][key] = r
                        print(f"  {key:49s} {json.dumps(r)}", flush=True)
            if on_gpu and batch_size == int(args.batch_sizes.split(",")[0]):
                r = input_path(data, preset_name, batch_size, args.steps)
                result["throughput"][f"{preset_name}/B{batch_size}/input_path/gem"] = r
                print(f"  {preset_name}/B{batch_size} gem input path {r}", flush=True)
                if preset_name == "default" and not args.skip_cpu_peer:
                    for name in ("gem", "dlrm"):
                        r = model_throughput(
                            batches[:2], name, preset_name, "fp32",
                            torch.device("cpu"), 2,
                        )  # fmt: skip
                        result["throughput"][f"default/B{batch_size}/cpu/{name}"] = r
                        print(f"  cpu peer {name} {r}", flush=True)
    if on_gpu and not args.skip_jagged:
        print("jagged vs padded (GPU):", flush=True)
        result["jagged_vs_padded"] = jagged_vs_padded(device)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
