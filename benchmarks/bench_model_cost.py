"""Where GEM's training time goes on the CPU, and what smaller GEMs would buy.

Usage::

    python -m benchmarks.bench_model_cost [--batch-size 1024] [--threads 2]
        [--repeat 3] [--optimizer adam|adam+adagrad] [--compile [BACKEND]]
        [--json FILE]

On a small generated set (300 users, 3 days; windows of the ``default``
preset's 32 events), in one process:

1. **Cost against DLRM**: training examples/s of GEM's ``default`` preset
   and of smaller GEMs (one InterFormer layer, one pyramid level, one Wukong
   layer, both of the first two), each against DLRM run right before it;
   the batches are built once and replayed, best of ``--repeat``. Both
   train with trainer.fit's ``--optimizer``: under ``adam`` every step
   updates every table row, under ``adam+adagrad`` only the rows read.
2. **Forward time by module**: GEM's top modules and their children
   (forward hooks, the mean over the replayed batches).
3. **Gather backward**: ``trainer.ops.gather_rows`` (``index_select``, whose
   backward is an ``index_add``) against ``source[index]`` (an accumulating
   ``index_put`` backward) at the shapes GEM gathers per token.
4. **The tables' optimizer**: GEM's, DLRM's and DCNv2's training examples/s
   under ``adam+adagrad`` (sparse table gradients) against ``adam`` (every
   row every step), the two timed one after the other, best of ``--repeat``.
5. **Attention masks**: forward + backward of the fused
   ``scaled_dot_product_attention`` with the additive key mask the jagged
   ops pass, against the same attention written out (scores,
   ``masked_fill``, ``softmax``) and against a boolean mask, at the shapes
   of GEM's self-attention (the trunk) and local attention (the pyramid).
6. **Compiled** (with ``--compile``): GEM's and DLRM's examples/s eager and
   under ``trainer.fit --compile``, the compiled model's first step (its
   compile) in seconds, and GEM's compiled time per example against DLRM's
   faster way.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.bench_generator import hardware
from benchmarks.bench_model_speed import make_data
from features.config_flags import add_config_flags
from trainer.data.batch import Batch
from trainer.data.feature_output import ExampleDataset
from trainer.models.config import ModelConfig, default
from trainer.models.loss_wrapper import GEMTrain
from trainer.models.registry import build_model
from trainer.ops import gather_rows
from trainer.ops.pytorch.pt_attention import additive_mask
from trainer.training.fit_trainer import make_optimizer
from trainer.training.run_config import OPTIMIZERS, FitConfig
from trainer.training.step import compile_model, train_step


def smaller_gems() -> dict[str, ModelConfig]:
    """The ``default`` preset and the cuts of it that this benchmark prices."""
    base = default()
    replace = dataclasses.replace
    one_layer = replace(base.interformer, num_layers=1)
    one_level = replace(base.pyramid, num_levels=1)
    return {
        "default": base,
        "1 InterFormer layer": replace(base, interformer=one_layer),
        "1 pyramid level": replace(base, pyramid=one_level),
        "1 Wukong layer": replace(base, wukong=replace(base.wukong, num_layers=1)),
        "1 layer, 1 level": replace(base, interformer=one_layer, pyramid=one_level),
    }


def _model_and_optimizer(
    name: str, config: ModelConfig, fit: FitConfig
) -> tuple[GEMTrain, torch.optim.Optimizer]:
    """Model ``name`` and its optimizer as ``trainer.fit`` builds them, under
    ``fit``'s ``--optimizer`` and ``--compile``."""
    torch.manual_seed(0)
    model = GEMTrain(build_model(name, config))
    if fit.compile is not None:
        model.model = compile_model(model.model, backend=fit.compile)
    return model, make_optimizer(model, fit)


def _best_pass(
    model: GEMTrain,
    optimizer: torch.optim.Optimizer,
    batches: list[Batch],
    repeat: int,
) -> float:
    """Training examples/s of the best of ``repeat`` passes over ``batches``."""
    best = 0.0
    for _ in range(repeat):
        started, seen = time.perf_counter(), 0
        for batch in batches:
            train_step(model, batch, optimizer)
            seen += batch.size
        best = max(best, seen / (time.perf_counter() - started))
    return best


def examples_per_s(
    name: str,
    config: ModelConfig,
    batches: list[Batch],
    repeat: int,
    optimizer_name: str,
) -> float:
    """Training examples/s of model ``name``: a warm-up step, then the
    best of ``repeat`` passes over ``batches``."""
    fit = FitConfig(train=Path(), eval=Path(), optimizer=optimizer_name)
    model, optimizer = _model_and_optimizer(name, config, fit)
    train_step(model, batches[0], optimizer)
    return _best_pass(model, optimizer, batches, repeat)


def compiled_against_eager(
    batches: list[Batch], repeat: int, optimizer_name: str, backend: str
) -> dict[str, Any]:
    """GEM's and DLRM's examples/s eager and under ``trainer.fit --compile
    backend``, with the seconds of the compiled model's first step (the
    compile)."""
    out: dict[str, Any] = {}
    for name in ("gem", "dlrm"):
        eager = examples_per_s(name, default(), batches, repeat, optimizer_name)
        fit = FitConfig(
            train=Path(), eval=Path(), optimizer=optimizer_name, compile=backend
        )
        model, optimizer = _model_and_optimizer(name, default(), fit)
        started = time.perf_counter()
        train_step(model, batches[0], optimizer)
        first_step = time.perf_counter() - started
        compiled = _best_pass(model, optimizer, batches, repeat)
        out[name] = {
            "eager": eager,
            "compiled": compiled,
            "speedup": compiled / eager,
            "first_step_s": first_step,
        }
        print(
            f"  {name:6s} eager {eager:7,.0f} ex/s  compiled {compiled:7,.0f}"
            f"  {compiled / eager:.2f}x  first step {first_step:.0f} s"
        )
    fastest_dlrm = max(out["dlrm"]["eager"], out["dlrm"]["compiled"])
    out["gem_compiled_time_vs_dlrm"] = fastest_dlrm / out["gem"]["compiled"]
    print(
        f"  GEM compiled, time ÷ DLRM's faster: {out['gem_compiled_time_vs_dlrm']:.2f}x"
    )
    return out


def table_optimizer_speedup(
    batches: list[Batch], repeat: int
) -> dict[str, dict[str, float]]:
    """Each model's examples/s under ``adam`` and ``adam+adagrad``."""
    out = {}
    for name in ("gem", "dlrm", "dcnv2"):
        dense = examples_per_s(name, default(), batches, repeat, "adam")
        sparse = examples_per_s(name, default(), batches, repeat, "adam+adagrad")
        out[name] = {"adam": dense, "adam+adagrad": sparse, "speedup": sparse / dense}
        print(
            f"  {name:6s} adam {dense:7,.0f} ex/s  adam+adagrad {sparse:7,.0f}"
            f"  {sparse / dense:.2f}x"
        )
    return out


def cost_against_dlrm(
    batches: list[Batch], repeat: int, optimizer_name: str
) -> dict[str, dict[str, float]]:
    """Each GEM of :func:`smaller_gems` against DLRM timed just before it."""
    out = {}
    for label, config in smaller_gems().items():
        dlrm = examples_per_s("dlrm", config, batches, repeat, optimizer_name)
        gem = examples_per_s("gem", config, batches, repeat, optimizer_name)
        out[label] = {"gem": gem, "dlrm": dlrm, "gem_time_vs_dlrm": dlrm / gem}
        print(
            f"  {label:20s} GEM {gem:7,.0f} ex/s  DLRM {dlrm:7,.0f}  {dlrm / gem:.2f}x"
        )
    return out


def forward_ms_by_module(batches: list[Batch], depth: int = 3) -> dict[str, float]:
    """Mean training-mode forward milliseconds per batch of GEM's modules to
    ``depth`` levels (a ``ModuleList`` counts as a level)."""
    torch.manual_seed(0)
    model = build_model("gem", default())
    spent: dict[str, float] = {}
    started: dict[str, float] = {}

    def hook(module: nn.Module, name: str) -> None:
        def before(*_: Any) -> None:
            started[name] = time.perf_counter()

        def after(*_: Any) -> None:
            spent[name] = spent.get(name, 0.0) + time.perf_counter() - started[name]

        module.register_forward_pre_hook(before)
        module.register_forward_hook(after)

    for name, module in model.named_modules():
        if name and name.count(".") < depth:
            hook(module, name)
    model(batches[0]).sum().backward()  # warm-up
    spent.clear()
    for batch in batches:
        model(batch).sum().backward()
    ms = {name: 1e3 * s / len(batches) for name, s in spent.items()}
    return dict(sorted(ms.items(), key=lambda kv: -kv[1]))


def gather_backward(tokens: int, batch: int, repeats: int = 10) -> dict[str, Any]:
    """Forward + backward ms of ``gather_rows`` against ``source[index]``."""
    torch.manual_seed(0)
    index = torch.sort(torch.randint(0, batch, (tokens,))).values
    out: dict[str, Any] = {}
    for label, shape in (("(B, H, Dh)", (batch, 2, 16)), ("(B, n, D)", (batch, 4, 32))):
        source = torch.randn(*shape, requires_grad=True)
        grad = torch.randn(tokens, *shape[1:])
        ways: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
            "gather_rows": lambda rows: gather_rows(rows, index),
            "indexing": lambda rows: rows[index],
        }
        ms = {}
        for way, gather in ways.items():
            gather(source).backward(grad)
            started = time.perf_counter()
            for _ in range(repeats):
                gather(source).backward(grad)
            ms[way] = 1e3 * (time.perf_counter() - started) / repeats
        out[label] = {**ms, "speedup": ms["indexing"] / ms["gather_rows"]}
        print(
            f"  {label}: gather_rows {ms['gather_rows']:.2f} ms, indexing "
            f"{ms['indexing']:.2f} ms ({out[label]['speedup']:.1f}x)"
        )
    return out


def written_out_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, visible: torch.Tensor
) -> torch.Tensor:
    """The peer of the fused attention: scores, ``masked_fill``, ``softmax``."""
    scores = (q @ k.transpose(-1, -2)) / q.shape[-1] ** 0.5
    fill = torch.finfo(scores.dtype).min
    return torch.softmax(scores.masked_fill(~visible, fill), dim=-1) @ v


def attention_masks(
    batch: int, tokens: int, repeats: int = 10
) -> dict[str, dict[str, float]]:
    """Forward + backward ms of masked attention, fused with an additive mask
    against a boolean one and against the attention written out."""
    torch.manual_seed(0)
    heads, dh = 2, 16
    shapes = {
        # (batches, queries, keys): the trunk attends over the pyramid's top
        # tokens and the summary tokens; local attention over chunks of
        # ``window`` queries and two chunks of keys.
        "self (B, 2, 12, 12)": (batch, 12, 12),
        "local (L/16, 2, 16, 32)": (tokens // 16, 16, 32),
    }
    out: dict[str, dict[str, float]] = {}
    for label, (n, nq, nk) in shapes.items():
        q = torch.randn(n, heads, nq, dh, requires_grad=True)
        k, v = (torch.randn(n, heads, nk, dh, requires_grad=True) for _ in range(2))
        visible = torch.rand(n, 1, nq, nk) < 0.7
        visible[..., 0] = True  # every query sees a key, as in the ops
        additive = additive_mask(visible, torch.float32)
        sdpa = F.scaled_dot_product_attention
        ways: dict[str, Callable[..., torch.Tensor]] = {
            "additive": functools.partial(sdpa, attn_mask=additive),
            "boolean": functools.partial(sdpa, attn_mask=visible),
            "written out": functools.partial(written_out_attention, visible=visible),
        }
        ms = {}
        for way, attend in ways.items():
            attend(q, k, v).sum().backward()
            started = time.perf_counter()
            for _ in range(repeats):
                attend(q, k, v).sum().backward()
            ms[way] = 1e3 * (time.perf_counter() - started) / repeats
        out[label] = ms
        print(
            f"  {label}: additive {ms['additive']:.2f} ms, boolean "
            f"{ms['boolean']:.2f} ms ({ms['boolean'] / ms['additive']:.2f}x), "
            f"written out {ms['written out']:.2f} ms "
            f"({ms['written out'] / ms['additive']:.2f}x)"
        )
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument(
        "--optimizer",
        choices=OPTIMIZERS,
        default=FitConfig.optimizer,
        help="trainer.fit's --optimizer (default: its default), for both models",
    )
    # trainer.fit's own flag; given, GEM and DLRM are also timed compiled
    # (minutes of compiling per model).
    add_config_flags(p, FitConfig, only=["compile"])
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        data = ExampleDataset(
            make_data(Path(tmp)), max_seq_len=default().embedding.max_seq_len
        )
        batches = [
            b
            for b in data.batches(args.batch_size, shuffle=True, prefetch=0)
            if b.size == args.batch_size
        ]
    # The sequence KJT holds one key per event field; the first key's lengths
    # are the histories'.
    tokens = int(sum(b.sequence.lengths()[: b.size].sum() for b in batches))
    result: dict[str, Any] = {
        "hardware": hardware(),
        "threads": args.threads,
        "batch_size": args.batch_size,
        "optimizer": args.optimizer,
        "batches": len(batches),
        "history_events_per_example": tokens / (len(batches) * args.batch_size),
    }
    print(f"{len(batches)} batches of {args.batch_size}, {args.threads} threads")
    print(f"training time against DLRM's, both under {args.optimizer}:", flush=True)
    result["cost"] = cost_against_dlrm(batches, args.repeat, args.optimizer)
    print("forward ms per batch, the 15 slowest modules:", flush=True)
    result["forward_ms"] = forward_ms_by_module(batches)
    for name, ms in list(result["forward_ms"].items())[:15]:
        print(f"  {name:30s} {ms:7.1f}")
    print("gather forward + backward:", flush=True)
    per_token = tokens // len(batches)
    result["gather"] = gather_backward(per_token, args.batch_size)
    print("the tables' optimizer, examples/s:", flush=True)
    result["table_optimizer"] = table_optimizer_speedup(batches, args.repeat)
    print("attention masks, forward + backward:", flush=True)
    result["attention"] = attention_masks(args.batch_size, per_token)
    if args.compile is not None:
        print(f"compiled ({args.compile}) against eager, examples/s:", flush=True)
        result["compiled"] = compiled_against_eager(
            batches, args.repeat, args.optimizer, args.compile
        )
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
