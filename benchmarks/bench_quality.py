"""Model quality: the 6 models on generated events and on MovieLens-1M-dev.

Usage::

    python -m benchmarks.bench_quality [--section all|generated|movielens]
        [--users 2000 --ads 250 --days 6] [--epochs 2] [--batch-size 256]
        [--max-seq-len 64] [--ml-steps 120] [--work DIR] [--json FILE]

(a) **generated**: ``pipelines.synthetic`` events → ``pipelines.reference``
features → time-forward split at the fixed timestamp "start of the last day"
(so ~(days-1)/days of the impressions train) → each model trained with the
same budget (epochs, batch, seed) → NE / AUC / calibration per (domain,
objective) on the eval impressions, next to the **Bayes-optimal** metrics of
the generator's true probabilities (``truth.parquet``) on exactly those
impressions, and the fraction of the DLRM → Bayes NE gap GEM closes.

(b) **movielens**: ``../shared/data/movielens-1m-dev`` (skipped with a
message when absent) → ``pipelines.movielens`` → reference features → split at
the timestamp before which 90 % of the impressions lie → the same 6 models,
each for one epoch of ``--ml-steps`` batches (the same random sample of the
train period for every model: 400 k train examples do not fit the CPU budget).

Model config: the ``default`` preset with two changes, the same for all
models: tables capped at 20,011 rows (these sets have < 4,000 users and ads,
so the cap adds no real collisions, and a dense Adam step over 100,003-row
tables costs ~10 % of a step) and ``max_seq_len`` ``--max-seq-len`` (the
pure-PyTorch pyramid costs ~linear in window length; see README). NE is
normalized by the eval slice's own base rate.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq

from features.metrics import binary_metrics
from features.vocab import DOMAINS, TRAINING_OBJECTIVES
from pipelines import movielens, reference
from pipelines.synthetic import GeneratorConfig, generate_dataset
from trainer.config import ModelConfig, preset
from trainer.data import (
    ExampleDataset,
    cut_at_fraction,
    read_examples,
    time_forward_split,
)
from trainer.fit import FitConfig, fit
from trainer.models.registry import MODEL_NAMES

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data"
TABLE_CAP = 20_011


def bench_config(max_seq_len: int) -> ModelConfig:
    """``default`` with capped tables and the given window length."""
    base = preset("default")
    emb = dataclasses.replace(
        base.embedding, max_num_embeddings=TABLE_CAP, max_seq_len=max_seq_len
    )
    return dataclasses.replace(base, embedding=emb)


def bayes_on(eval_dir: Path, truth_path: Path) -> dict[str, Any]:
    """Bayes-optimal metrics of the true probabilities on eval_dir's impressions."""
    ids = read_examples(eval_dir).column("example_id")
    truth = pq.read_table(truth_path)
    truth = truth.filter(pc.is_in(truth.column("impression_id"), value_set=ids))
    assert truth.num_rows == len(ids), "every eval example has a truth row"
    dom = np.asarray(truth.column("domain").to_pylist())
    out: dict[str, Any] = {"by_task": {}, "overall": {}}
    for o, (pcol, ycol) in {
        "click": ("p_click", "clicked"),
        "conversion": ("p_conversion", "converted"),
    }.items():
        p, y = truth.column(pcol).to_numpy(), truth.column(ycol).to_numpy()
        out["overall"][o] = dataclasses.asdict(binary_metrics(y, p))
        for d in DOMAINS:
            m = dom == d
            out["by_task"][f"{d}/{o}"] = dataclasses.asdict(binary_metrics(y[m], p[m]))
    return out


def run_models(
    train: Path, evals: Path, cfg: ModelConfig, **fit_args: Any
) -> dict[str, Any]:
    """Fit every model with the same budget; reports by model name."""
    seq = cfg.embedding.max_seq_len
    train_data = ExampleDataset(train, max_seq_len=seq)
    eval_data = ExampleDataset(evals, max_seq_len=seq)
    reports = {}
    for name in MODEL_NAMES:
        started = time.perf_counter()
        reports[name] = fit(
            FitConfig(train=train, eval=evals, model=name, **fit_args),
            base_config=cfg,
            train_data=train_data,
            eval_data=eval_data,
        )
        reports[name]["wall_s"] = time.perf_counter() - started
        print(
            f"  {name}: {reports[name]['wall_s']:.0f} s, overall click NE "
            f"{reports[name]['overall']['click']['ne']:.4f}",
            flush=True,
        )
    return reports


def _f(x: float | None, spec: str = ".4f") -> str:
    return (
        "n/a"
        if x is None or (isinstance(x, float) and math.isnan(x))
        else format(x, spec)
    )


def table(reports: dict[str, Any], objectives: tuple[str, ...]) -> str:
    """Markdown: one row per model (and Bayes), NE / AUC / calib per slice."""
    slices = [f"{d}/{o}" for o in objectives for d in DOMAINS] + [
        f"all/{o}" for o in objectives
    ]
    lines = [
        "| model | " + " | ".join(slices) + " | ex/s |",
        "|---|" + "---:|" * (len(slices) + 1),
    ]
    for name, r in reports.items():
        cells = []
        for s in slices:
            d, o = s.split("/")
            m = r["overall"][o] if d == "all" else r["by_task"][s]
            cells.append(
                f"{_f(m['ne'])} / {_f(m['auc'], '.3f')} / {_f(m['calibration'], '.2f')}"
            )
        eps = r.get("train", {}).get("examples_per_s")
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {_f(eps, '.0f')} |")
    first = next(iter(reports.values()))
    cells = []
    for s in slices:
        d, o = s.split("/")
        m = first["overall"][o] if d == "all" else first["by_task"][s]
        cells.append(f"{m['count']} / {m['positives']}")
    lines.append("| count / positives | " + " | ".join(cells) + " | |")
    return "\n".join(lines)


def gap_closed(reports: dict[str, Any], bayes: dict[str, Any], key: str) -> float:
    """(NE_dlrm - NE_gem) / (NE_dlrm - NE_bayes) on slice ``key``."""

    def ne(r: dict[str, Any]) -> float:
        d, o = key.split("/")
        return (r["overall"][o] if d == "all" else r["by_task"][key])["ne"]

    values = ne(reports["dlrm"]), ne(reports["gem"]), ne(bayes)
    if any(v is None for v in values):
        return math.nan  # a slice without positives has no NE
    dlrm, gem, best = values
    return (dlrm - gem) / (dlrm - best)


def beats_bayes(reports: dict[str, Any], bayes: dict[str, Any]) -> list[str]:
    """Slices where a model's NE is below Bayes NE (leak suspects; small
    slices fluctuate)."""
    found = []
    for name, r in reports.items():
        for key, m in [
            *r["by_task"].items(),
            *[(f"all/{o}", m) for o, m in r["overall"].items()],
        ]:
            b = (
                bayes["overall"][key[4:]]
                if key.startswith("all/")
                else bayes["by_task"][key]
            )
            if m["ne"] is not None and b["ne"] is not None and m["ne"] < b["ne"]:
                found.append(
                    f"{name} {key}: NE {m['ne']:.4f} < Bayes {b['ne']:.4f} "
                    f"({m['positives']} positives)"
                )
    return found


def generated(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """Section (a)."""
    gen = GeneratorConfig(
        users=args.users, ads=args.ads, days=args.days, seed=args.seed
    )
    generate_dataset(gen, work / "gen")
    assert (
        reference.main(
            [
                "--input",
                str(work / "gen"),
                "--output",
                str(work / "gen_f"),
                "--overwrite",
            ]
        )
        == 0
    )
    cut_day = gen.start + dt.timedelta(days=args.days - 1)
    cut = int(dt.datetime.combine(cut_day, dt.time(), dt.UTC).timestamp() * 1000)
    n_train, n_eval = time_forward_split(
        work / "gen_f", cut, work / "gen_train", work / "gen_eval"
    )
    print(
        f"generated: cut {cut_day}T00:00Z ({cut}), train {n_train}, eval {n_eval}",
        flush=True,
    )
    reports = run_models(
        work / "gen_train",
        work / "gen_eval",
        bench_config(args.max_seq_len),
        epochs=args.epochs,
        batch_size=args.batch_size,
        lr=args.lr,
        seed=args.seed,
    )
    bayes = bayes_on(work / "gen_eval", work / "gen" / "truth.parquet")
    gaps = {
        k: gap_closed(reports, bayes, k)
        for k in [f"{d}/click" for d in DOMAINS] + ["all/click", "all/conversion"]
    }
    return {
        "cut_ms": cut,
        "train": n_train,
        "eval": n_eval,
        "models": reports,
        "bayes": bayes,
        "gem_gap_closed": gaps,
        "beats_bayes": beats_bayes(reports, bayes),
    }


def movielens_section(args: argparse.Namespace, work: Path) -> dict[str, Any] | None:
    """Section (b); None when the data is absent."""
    source = SHARED / "movielens-1m-dev"
    if not (source / "ratings.dat").exists():
        print(f"movielens: {source} absent, section skipped", flush=True)
        return None
    movielens.run(source, work / "ml", overwrite=True)
    assert (
        reference.main(
            ["--input", str(work / "ml"), "--output", str(work / "ml_f"), "--overwrite"]
        )
        == 0
    )
    cut = cut_at_fraction(work / "ml_f", 0.9)
    n_train, n_eval = time_forward_split(
        work / "ml_f", cut, work / "ml_train", work / "ml_eval"
    )
    print(f"movielens: cut {cut}, train {n_train}, eval {n_eval}", flush=True)
    reports = run_models(
        work / "ml_train",
        work / "ml_eval",
        bench_config(args.max_seq_len),
        epochs=1,
        batch_size=2 * args.batch_size,
        lr=args.lr,
        max_steps_per_epoch=args.ml_steps,
        seed=args.seed,
    )
    return {"cut_ms": cut, "train": n_train, "eval": n_eval, "models": reports}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--section", choices=("all", "generated", "movielens"), default="all"
    )
    p.add_argument("--users", type=int, default=2000)
    p.add_argument("--ads", type=int, default=250)
    p.add_argument("--days", type=int, default=6)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--max-seq-len", type=int, default=64)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--ml-steps", type=int, default=120)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--work", type=Path, default=Path("/tmp/bench_quality"))
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    result: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}}
    if args.section in ("all", "generated"):
        g = result["generated"] = generated(args, args.work)
        print("\n## generated: NE / AUC / calibration (eval, time-forward)\n")
        print(table({**g["models"], "bayes-optimal": g["bayes"]}, TRAINING_OBJECTIVES))
        print(
            "\nGEM share of the DLRM→Bayes NE gap closed:",
            {k: round(v, 3) for k, v in g["gem_gap_closed"].items()},
        )
        print("models below Bayes NE:", g["beats_bayes"] or "none")
    if args.section in ("all", "movielens"):
        m = result["movielens"] = movielens_section(args, args.work)
        if m is not None:
            print(
                "\n## MovieLens-1M-dev: NE / AUC / calibration (click = conversion)\n"
            )
            print(table(m["models"], ("click",)))
    result["seconds"] = time.perf_counter() - started
    print(f"\ntotal {result['seconds']:.0f} s")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
