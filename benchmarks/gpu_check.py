"""GPU throughput check of GEM's pure-PyTorch path: examples/s and MFU.

Usage::

    python -m benchmarks.gpu_check [--preset default|large] [--batch-size 1024]
        [--steps 50] [--no-compile] [--backend aot_eager] [--peak-tflops T]
        [--device cpu]
    python -m benchmarks.gpu_check --smoke        # seconds, on CPU, eager

Written for a CUDA machine with torch (2.11+) but **without torchrec or
fbgemm**. Where torchrec and fbgemm's *CPU* wheel can be installed (enough for
torchrec to import), :mod:`benchmarks.bench_gpu` times the real models
instead. Without them the real model (:class:`trainer.models.gem.GEM`) cannot
run: its input adapter is TorchRec's ``EmbeddingBagCollection`` /
``EmbeddingCollection`` over ``KeyedJaggedTensor`` batches, and
:mod:`trainer.modules.embeddings` (which also holds ``TARGET_FEATURES`` and
``capped_size``, which this script reads) imports torchrec at module level.
So this script:

- never imports torchrec: it registers inert placeholder modules under the
  ``torchrec`` names *only so that* ``trainer.modules.embeddings`` can be
  imported for those two names (nothing of TorchRec is ever
  instantiated or called);
- runs the **real** trunk modules: :class:`PyramidEncoder` (jagged, pure
  PyTorch ops of :mod:`trainer.ops`, ``Kernel.PYTORCH``), :class:`InterFormer`
  (with Wukong inside) and :class:`MultiDomainHeads`, wired as in
  ``GEM.forward``;
- replaces the input adapter by plain ``nn.EmbeddingBag`` (sparse, one id per
  feature) and ``nn.Embedding`` (sequence, summed over features) stand-ins of
  the preset's sizes, fed synthetic ids and skewed history lengths.

Each step is forward + domain-masked BCE + backward + Adam, under bf16
autocast on CUDA and ``torch.compile`` unless ``--no-compile``. The compile
is set up as for the real model: :func:`trainer.ops.capture_jagged_sizes`
(the jagged ops' data-dependent totals become unbacked SymInts, no graph
breaks), the jagged total of every batch marked dynamic, and the history
bound ``max_len`` a constant (``--max-len``), so one graph serves every
batch. The first step's time (compile included) is reported apart from the
steady state, with the number of frames compiled during the timed steps
(0 means no recompiles). MFU = counted FLOPs (FlopCounterMode on one eager
step: matmul family only, so a lower bound) x steps/s / peak dense bf16
FLOP/s of the GPU (a small table by device name, else ``--peak-tflops``).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
import types
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

PEAK_BF16_TFLOPS = {
    "H200": 989.0,
    "H100": 989.0,
    "A100": 312.0,
    "L40S": 362.0,
    "L4": 121.0,
    "A10": 125.0,
    "B200": 2250.0,
}


def _placeholder_torchrec() -> None:
    """Inert ``torchrec`` names so trainer.modules.embeddings imports (never used)."""
    names = {
        "torchrec": [],
        "torchrec.modules": [],
        "torchrec.modules.embedding_configs": [
            "EmbeddingBagConfig",
            "PoolingType",
            "EmbeddingConfig",
        ],
        "torchrec.modules.embedding_modules": [
            "EmbeddingBagCollection",
            "EmbeddingCollection",
        ],
        "torchrec.sparse": [],
        "torchrec.sparse.jagged_tensor": ["KeyedJaggedTensor"],
    }
    for mod, attrs in names.items():
        m = types.ModuleType(mod)
        m.__path__ = []  # a package, so submodules resolve
        for a in attrs:
            setattr(m, a, type(a, (), {"__init__": _unavailable}))
        sys.modules[mod] = m


def _unavailable(*_: Any, **__: Any) -> None:
    raise RuntimeError("torchrec is not available in gpu_check (placeholder)")


_placeholder_torchrec()

from features.registry import DENSE_FEATURES, SEQUENCE_FEATURES, SPARSE_FEATURES  # noqa: E402
from trainer.models.config import ModelConfig, preset  # noqa: E402
from trainer.modules.embeddings import TARGET_FEATURES, capped_size  # noqa: E402
from trainer.modules.heads import MultiDomainHeads, multi_domain_loss  # noqa: E402
from trainer.modules.interformer import InterFormer  # noqa: E402
from trainer.modules.mlp import mlp  # noqa: E402
from trainer.modules.pyramid import PyramidEncoder  # noqa: E402
from trainer.ops import (  # noqa: E402
    JaggedTokens,
    Kernel,
    capture_jagged_sizes,
)


class PlainGEM(nn.Module):
    """GEM's trunk with nn.EmbeddingBag / nn.Embedding input stand-ins."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        emb, dim = config.embedding, config.embedding.dim
        cap = emb.max_num_embeddings
        self.rows = [capped_size(f.num_embeddings, cap) for f in SPARSE_FEATURES]
        self.seq_rows = [capped_size(f.num_embeddings, cap) for f in SEQUENCE_FEATURES]
        self.sparse = nn.ModuleList(
            nn.EmbeddingBag(r, dim, mode="sum") for r in self.rows
        )
        self.seq = nn.ModuleList(nn.Embedding(r, dim) for r in self.seq_rows)
        self.num_dense_tokens = emb.num_dense_tokens
        self.dense = mlp(
            len(DENSE_FEATURES), (*emb.dense_hidden, emb.num_dense_tokens * dim)
        )
        names = [f.name for f in SPARSE_FEATURES]
        self.target_index = [names.index(n) for n in TARGET_FEATURES]
        self.target = nn.Linear(len(TARGET_FEATURES) * dim, dim)
        self.pyramid = PyramidEncoder(dim, config.pyramid, Kernel.PYTORCH)
        num_tokens = emb.num_dense_tokens + len(SPARSE_FEATURES)
        self.trunk = InterFormer(num_tokens, config)
        self.heads = MultiDomainHeads(self.trunk.num_out_tokens * dim, config.heads)
        self.dim = dim

    def forward(
        self,
        sparse: torch.Tensor,
        seq_ids: torch.Tensor,
        offsets: torch.Tensor,
        max_len: int,
        dense: torch.Tensor,
        domain: torch.Tensor,
    ) -> torch.Tensor:
        b = dense.shape[0]
        sparse_tok = torch.stack(
            [t(sparse[:, i : i + 1]) for i, t in enumerate(self.sparse)], dim=1
        )
        tokens = torch.cat(
            [self.dense(dense).view(b, self.num_dense_tokens, self.dim), sparse_tok],
            dim=1,
        )
        target = self.target(sparse_tok[:, self.target_index].flatten(1))
        values = sum(t(seq_ids[:, i]) for i, t in enumerate(self.seq))
        sequence, prefix = self.pyramid(JaggedTokens(values, offsets, max_len), target)
        h = self.trunk(tokens, sequence, prefix)
        return self.heads(h.flatten(1), domain)


MODEL_INPUTS = ("sparse", "seq_ids", "offsets", "max_len", "dense", "domain")
"""A :func:`synthetic_batch`'s entries that :meth:`PlainGEM.forward` takes, in order."""


def model_inputs(batch: dict[str, Any]) -> list[Any]:
    """The arguments of :meth:`PlainGEM.forward` from a :func:`synthetic_batch`."""
    return [batch[name] for name in MODEL_INPUTS]


def synthetic_batch(
    config: ModelConfig,
    batch: int,
    device: torch.device,
    gen: torch.Generator,
    max_len: int,
) -> dict[str, Any]:
    """Random ids; history lengths mostly < 100, ~1 % at ``max_len``.

    ``max_len`` (the history bound) is what the model gets as the bound, not
    the batch's longest history: a constant, so it never triggers a recompile.
    """
    lengths = torch.randint(1, 100, (batch,), generator=gen)
    lengths[torch.rand(batch, generator=gen) < 0.01] = max_len
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])
    cap = config.embedding.max_num_embeddings
    sparse = torch.stack(
        [
            torch.randint(
                0, capped_size(f.num_embeddings, cap), (batch,), generator=gen
            )
            for f in SPARSE_FEATURES
        ],
        1,
    )
    total = int(offsets[-1])
    seq = torch.stack(
        [
            torch.randint(
                0, capped_size(f.num_embeddings, cap), (total,), generator=gen
            )
            for f in SEQUENCE_FEATURES
        ],
        1,
    )
    return {
        "sparse": sparse.to(device),
        "seq_ids": seq.to(device),
        "offsets": offsets.to(device),
        "max_len": max_len,
        "dense": torch.rand(batch, len(DENSE_FEATURES), generator=gen).to(device),
        "domain": torch.randint(0, 3, (batch,), generator=gen).to(device),
        "labels": (torch.rand(batch, 2, generator=gen) < 0.05).float().to(device),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", choices=("tiny", "default", "large"), default="large")
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--max-len", type=int, default=4096)
    p.add_argument("--no-compile", action="store_true")
    p.add_argument(
        "--backend",
        default="inductor",
        help="torch.compile backend; aot_eager checks graphs and recompiles "
        "on a CPU without generating code",
    )
    p.add_argument("--peak-tflops", type=float, default=None)
    p.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    p.add_argument("--smoke", action="store_true", help="tiny, CPU, few steps, eager")
    args = p.parse_args(argv)
    if args.smoke:
        args.preset, args.batch_size, args.steps, args.max_len = "tiny", 16, 2, 64
        args.no_compile, args.device = True, "cpu"
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(args.device)
    config = dataclasses.replace(preset(args.preset), kernel=Kernel.PYTORCH)
    torch.manual_seed(0)
    model = PlainGEM(config).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(0)
    batches = [
        synthetic_batch(config, args.batch_size, device, gen, args.max_len)
        for _ in range(min(args.steps, 8))
    ]
    autocast = torch.autocast(
        device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"
    )
    if args.no_compile:
        forward = model
    else:
        capture_jagged_sizes()
        forward = torch.compile(model, backend=args.backend)

    def step(b: dict[str, Any]) -> torch.Tensor:
        # The jagged total differs in every batch: symbolic from the start.
        torch._dynamo.maybe_mark_dynamic(b["seq_ids"], 0)
        opt.zero_grad(set_to_none=True)
        with autocast:
            logits = forward(*model_inputs(b))
        loss, _ = multi_domain_loss(logits.float(), b["labels"], b["domain"])
        loss.backward()
        opt.step()
        return loss.detach()

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    with FlopCounterMode(display=False) as counter:  # eager, one step
        opt.zero_grad(set_to_none=True)
        b = batches[0]
        logits = model(*model_inputs(b))
        F.binary_cross_entropy_with_logits(logits[:, 0], b["labels"]).backward()
    flops_per_example = counter.get_total_flops() / args.batch_size
    frames = torch._dynamo.utils.counters["frames"]
    started = time.perf_counter()
    step(batches[0])  # compiles forward and backward (unless --no-compile)
    sync()
    first_s = time.perf_counter() - started
    started = time.perf_counter()
    step(batches[1 % len(batches)])  # a new jagged total: must not recompile
    sync()
    second_s = time.perf_counter() - started
    compiled_frames = frames["total"]
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    started = time.perf_counter()
    for i in range(args.steps):
        loss = step(batches[i % len(batches)])
    float(loss)  # one sync at the end
    seconds = time.perf_counter() - started
    recompiles = frames["total"] - compiled_frames
    eps = args.steps * args.batch_size / seconds
    name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    peak = args.peak_tflops or next(
        (v for k, v in PEAK_BF16_TFLOPS.items() if k in name), None
    )
    mfu = (
        f"{eps * flops_per_example / (peak * 1e12):.2%}"
        if peak
        else "n/a (no --peak-tflops)"
    )
    print(
        "model: GEM trunk (pyramid + InterFormer/Wukong + PLE heads), "
        "nn.EmbeddingBag/nn.Embedding inputs, no torchrec"
    )
    print(
        f"device {name}, preset {args.preset}, batch {args.batch_size}, "
        f"bf16 autocast {device.type == 'cuda'}, "
        f"compile {'off' if args.no_compile else args.backend}"
    )
    print(
        f"params {sum(q.numel() for q in model.parameters()) / 1e6:.1f} M, "
        f"{flops_per_example / 1e6:.1f} MFLOP/example (fwd+bwd, counted)"
    )
    print(
        f"first step {first_s:.1f} s"
        f"{'' if args.no_compile else ' (compile included)'}, second batch "
        f"{second_s:.2f} s; frames compiled {compiled_frames}, "
        f"recompiles while timing {recompiles}"
    )
    print(f"steady state: {eps:,.0f} examples/s, MFU {mfu}")
    if device.type == "cuda":
        print(f"peak memory {torch.cuda.max_memory_allocated() / 2**30:.2f} GiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
