"""Model quality: the 6 models on generated events and on MovieLens-1M-dev.

Usage::

    python -m benchmarks.bench_quality [--section all|generated|movielens]
        [--users 20000 --ads 2000 --days 7] [--epochs 3] [--steps 120]
        [--batch-size 256] [--max-seq-len 32] [--validation-sample 10000]
        [--lrs 1e-3,3e-3] [--device auto|cpu|cuda] [--precision fp32|bf16]
        [--prepare-only] [--work DIR] [--json FILE] [--seeds 0,1,2]
        [--target-match-ablation] [--variants gem_joint_match,...]

Three periods per data set, split forward in time at fixed timestamps:
**train** < validation cut <= **validation** < eval cut <= **eval**. Every
model gets the same budget rule: ``--epochs`` epochs of ``--steps`` batches
(each epoch a fresh seeded random sample of the train period, the same
samples for every model), scored after every epoch on a fixed sample of the
validation period; the epoch with the best validation click NE is the one
evaluated (:func:`trainer.training.fit.fit`). With ``--lrs`` (a learning-rate grid),
each model is trained once per rate and the (rate, epoch) with the best
validation click NE is the one evaluated: the same selection rule for every
model, so no model is stuck with a rate that only suits another. The eval
period is never used to choose.

Work can be spread over processes (a GPU, or several cores): ``--prepare-only``
writes the splits; then one process per ``--models M --lrs R --reuse``; then
``--combine`` tabulates what they saved (``WORK/*_models``).

(a) **generated**: ``pipelines.sources.synthetic`` events → ``pipelines.core.reference``
features → validation = the second-to-last day, eval = the last day → NE /
AUC / calibration per (domain, objective), next to the **Bayes-optimal**
metrics of the generator's true probabilities (``truth.parquet``) on exactly
the eval impressions, and the fraction of the DLRM → Bayes NE gap GEM closes.

(b) **movielens**: ``movielens-1m-dev`` of the shared data folder next to the
repository (skipped with a message when absent) → ``pipelines.sources.movielens``
→ reference features → eval = the last 10 % of impressions (fixed timestamp),
validation = the last 10 % of the rest.

Training seeds: ``--seed`` seeds the generator and, alone, the training
(model init and the epochs' samples). ``--seeds 0,1,2`` trains every model
once per seed on the same data (``WORK/*_models/seed<S>/``; processes can
split seeds and models as above, then ``--combine --seeds``), chooses each
model's learning rate on the mean over seeds of the best validation NE, and
reports the mean over seeds, with the all/click NE per seed and each
model's difference from GEM paired seed by seed
(:mod:`benchmarks.quality_seeds`). A seed moves NE by about an ablation's
margin, which the bootstrap below does not see.

Significance: a paired bootstrap over eval impressions (Poisson(1) weights,
``--bootstrap`` resamples) gives a 95 % interval for every model's overall
click NE minus GEM's (and, on generated data, for the gap GEM closes): with a
few hundred positives, small NE differences are noise.

Model config (:func:`bench_config`): the ``default`` preset with tables capped
at 20,011 rows and ``max_seq_len`` ``--max-seq-len``, the same for all
models; on MovieLens without the shared match-bit rows
(:data:`MOVIELENS_TARGET_MATCH_SHARED`, chosen on validation). NE is
normalized by the eval slice's own base rate.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import math
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq

from benchmarks import quality_seeds
from benchmarks.generated import generated_features, reference_features, world_config
from benchmarks.quality_seeds import best_validation
from features.metrics import binary_metrics
from features.vocab import DOMAINS, TRAINING_OBJECTIVES
from pipelines.sources import movielens
from trainer.data.feature_output import (
    ExampleDataset,
    cut_at_fraction,
    read_examples,
    time_forward_split,
)
from trainer.models.config import ModelConfig, preset
from trainer.models.registry import MODEL_NAMES
from trainer.training.fit import FitConfig, fit
from trainer.training.run_config import OPTIMIZERS

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data"
TABLE_CAP = 20_011


# MovieLens keeps TargetMatch's joint rows only, a choice made on validation
# like the learning rate (the shared match-bit rows help on generated data,
# not on MovieLens; benchmarks/README.md has the figures).
MOVIELENS_TARGET_MATCH_SHARED = False


def bench_config(max_seq_len: int, target_match_shared: bool = True) -> ModelConfig:
    """``default`` with capped tables and the given window length."""
    base = preset("default")
    emb = dataclasses.replace(
        base.embedding,
        max_num_embeddings=TABLE_CAP,
        max_seq_len=max_seq_len,
        target_match_shared=target_match_shared,
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


# GEM without the TargetMatch event feature: what that feature adds.
NO_TARGET_MATCH = "gem_no_target_match"
# GEM whose TargetMatch has only the joint (match, time, action) rows, without
# the shared match-bit embedding (EmbeddingConfig.target_match_shared): the
# evidence for that default.
JOINT_MATCH = "gem_joint_match"
# GEM whose event tokens know nothing of the candidate: no TargetMatch, no
# pyramid (so no target-aware attention). Its sequence arch meets the
# candidate only through interleaving, as in the InterFormer paper; with its
# "sep" twin it asks whether interleaving helps when nothing else makes the
# sequence target-aware.
UNTARGETED = "gem_untargeted"
UNTARGETED_SEP = "gem_untargeted_sep"


def _embedding(cfg: ModelConfig, **changes: Any) -> ModelConfig:
    return dataclasses.replace(
        cfg, embedding=dataclasses.replace(cfg.embedding, **changes)
    )


def _untargeted(cfg: ModelConfig, interleave: bool) -> ModelConfig:
    return dataclasses.replace(
        _embedding(cfg, target_match=False),
        pyramid=dataclasses.replace(cfg.pyramid, enabled=False),
        interformer=dataclasses.replace(cfg.interformer, interleave=interleave),
    )


# GEM variants trained only when asked for: config changes.
GEM_VARIANTS: dict[str, Callable[[ModelConfig], ModelConfig]] = {
    NO_TARGET_MATCH: lambda c: _embedding(c, target_match=False),
    JOINT_MATCH: lambda c: _embedding(c, target_match_shared=False),
    UNTARGETED: lambda c: _untargeted(c, interleave=True),
    UNTARGETED_SEP: lambda c: _untargeted(c, interleave=False),
}
# Besides GEM, the models every other one is bootstrapped against (when run):
# the "sep" ablation.
REFERENCES = ("gem_no_interleave",)


def bayes_probs_aligned(eval_dir: Path, truth_path: Path) -> np.ndarray:
    """True click probabilities in the eval dataset's row order."""
    ids = read_examples(eval_dir).column("example_id").to_pylist()
    truth = pq.read_table(truth_path, columns=["impression_id", "p_click"])
    index = {k: i for i, k in enumerate(truth.column("impression_id").to_pylist())}
    p = truth.column("p_click").to_numpy()
    return np.asarray(p[[index[k] for k in ids]], dtype=np.float64)


def run_models(
    train: Path,
    validation: Path,
    evals: Path,
    cfg: ModelConfig,
    predictions: dict[str, dict[str, np.ndarray]],
    variants: tuple[str, ...] = (),
    models: list[str] | None = None,
    save: Path | None = None,
    combine: bool = False,
    lrs: tuple[float, ...] | None = None,
    **fit_args: Any,
) -> dict[str, Any]:
    """Fit every model with the same budget rule; reports by model name.

    ``predictions`` receives each model's eval predictions (row-aligned).
    ``variants``: names from :data:`GEM_VARIANTS` to train besides the
    registry's models.
    ``models`` restricts the run to these labels (several processes can
    share the work on a small CPU); ``save`` keeps each model's report and
    predictions as it finishes; ``combine`` trains nothing and loads every
    model found in ``save`` instead.
    """
    runs = [(name, name, cfg) for name in MODEL_NAMES]
    runs += [(v, "gem", GEM_VARIANTS[v](cfg)) for v in variants]
    default_lr = fit_args.pop("lr")
    lr_values = lrs or (default_lr,)
    reports: dict[str, Any] = {}
    if combine:
        assert save is not None, "--combine needs --save"
        for label, _, _ in runs:
            found = sorted(save.glob(f"{label}@lr*.json"))
            if found:
                reports[label], predictions[label] = select_by_validation(found)
        return reports
    runs = [r for r in runs if models is None or r[0] in models]
    seq = cfg.embedding.max_seq_len
    train_data = ExampleDataset(train, max_seq_len=seq)
    validation_data = ExampleDataset(validation, max_seq_len=seq)
    eval_data = ExampleDataset(evals, max_seq_len=seq)
    tried: dict[str, list[tuple[dict[str, Any], dict[str, np.ndarray]]]] = {}
    for label, name, config in runs:
        for lr in lr_values:
            started = time.perf_counter()
            run_predictions: dict[str, np.ndarray] = {}
            report = fit(
                FitConfig(train=train, eval=evals, model=name, lr=lr, **fit_args),
                base_config=config,
                train_data=train_data,
                eval_data=eval_data,
                validation_data=validation_data,
                predictions_out=run_predictions,
            )
            report["wall_s"] = time.perf_counter() - started
            tried.setdefault(label, []).append((report, run_predictions))
            if save is not None:
                save.mkdir(parents=True, exist_ok=True)
                stem = f"{label}@lr{lr:g}"
                (save / f"{stem}.json").write_text(json.dumps(report))
                np.savez(save / f"{stem}.npz", **run_predictions)
            t = report["train"]
            print(
                f"  {label} lr {lr:g}: {report['wall_s']:.0f} s, "
                f"{t['examples_per_s'] or 0:.0f} ex/s; validation NE by epoch "
                f"{[_f(x) for x in t['epoch_validation_click_ne']]}, "
                f"train NE {[_f(x) for x in t['epoch_train_click_ne']]}",
                flush=True,
            )
    for label, candidates in tried.items():
        reports[label], predictions[label] = _select(candidates)
    return reports


def _select(
    candidates: list[tuple[dict[str, Any], dict[str, np.ndarray]]],
) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The run with the best validation NE; its report notes the whole grid."""
    best_report, best_predictions = min(candidates, key=lambda c: best_validation(c[0]))
    chosen = dict(best_report)
    chosen["lr_grid"] = {
        f"{c[0]['config']['fit']['lr']:g}": best_validation(c[0]) for c in candidates
    }
    chosen["selected_lr"] = best_report["config"]["fit"]["lr"]
    return chosen, best_predictions


def select_by_validation(
    files: list[Path],
) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Load saved runs (``LABEL@lrR.json`` + ``.npz``) and pick by validation."""
    candidates = []
    for file in files:
        with np.load(file.with_suffix(".npz")) as saved:
            candidates.append((json.loads(file.read_text()), dict(saved)))
    return _select(candidates)


def _weighted_ne(y: np.ndarray, p: np.ndarray, w: np.ndarray) -> np.ndarray:
    """NE of predictions ``p`` under each row of weights ``w`` (R, N) → (R,)."""
    eps = 1e-12
    p = np.clip(p, eps, 1 - eps)
    loss = -(y * np.log(p) + (1 - y) * np.log(1 - p))
    n = w.sum(1)
    rate = np.clip((w @ y) / n, eps, 1 - eps)
    base = -(rate * np.log(rate) + (1 - rate) * np.log(1 - rate))
    return (w @ loss) / (n * base)


def _interval(x: np.ndarray, key: str = "diff_mean") -> dict[str, float]:
    """Mean and 95 % percentile interval of bootstrap replicates."""
    lo, hi = np.percentile(x, [2.5, 97.5])
    return {key: float(x.mean()), "lo": float(lo), "hi": float(hi)}


def bootstrap_vs_gem(
    predictions: dict[str, Any],
    bayes_probs: np.ndarray | None = None,
    resamples: int = 1000,
    seed: int = 0,
    reference: str = "gem",
) -> dict[str, Any]:
    """Paired bootstrap over eval impressions of overall click NE differences.

    ``predictions``: by model, one run's eval predictions, or a list of
    runs (training seeds): a model's NE is then the mean of its seeds' NE
    under the same weights, so the interval is that of the seed-mean
    difference over eval impressions (the seeds' own spread is reported
    beside it, :func:`benchmarks.quality_seeds.paired_by_seed`).
    ``reference``: the model the others are compared with (GEM, or an
    experimental GEM variant).

    Poisson(1) weights per impression (the same weights for every model), so
    each difference's interval accounts for the shared sampling noise.

    Returns:
        ``{model: {"diff_mean", "lo", "hi"}}`` for NE(model) - NE(reference)
        (positive: GEM better), plus ``"gap_closed"`` (GEM's share of the
        DLRM → Bayes gap) when ``bayes_probs`` (row-aligned) is given.
    """
    if reference not in predictions:
        return {}
    runs = {
        name: pred if isinstance(pred, list) else [pred]
        for name, pred in predictions.items()
    }
    labels = runs[reference][0]["labels"][:, 0]
    for name, model_runs in runs.items():
        for run in model_runs:
            assert np.array_equal(run["labels"][:, 0], labels), name
    y = labels.astype(np.float64)
    rng = np.random.default_rng(seed)
    chunks = []
    for start in range(0, resamples, 100):
        chunks.append(rng.poisson(1.0, (min(100, resamples - start), y.size)))
    weights = [w.astype(np.float64) for w in chunks]

    def ne(p: np.ndarray) -> np.ndarray:
        return np.concatenate(
            [_weighted_ne(y, p.astype(np.float64), w) for w in weights]
        )

    def mean_ne(model_runs: list[dict[str, np.ndarray]]) -> np.ndarray:
        return np.mean([ne(run["probs"][:, 0]) for run in model_runs], axis=0)

    ref_ne = mean_ne(runs[reference])
    out: dict[str, Any] = {}
    for name, model_runs in runs.items():
        if name != reference:
            out[name] = _interval(mean_ne(model_runs) - ref_ne)
    if bayes_probs is not None and "dlrm" in runs:
        dlrm = mean_ne(runs["dlrm"])
        best = ne(bayes_probs)
        share = (dlrm - ref_ne) / (dlrm - best)
        lo, hi = np.percentile(share, [2.5, 97.5])
        out["gap_closed"] = {
            "mean": float(share.mean()),
            "lo": float(lo),
            "hi": float(hi),
        }
        diff = best - ref_ne
        lo, hi = np.percentile(diff, [2.5, 97.5])
        out["bayes"] = {
            "diff_mean": float(diff.mean()),
            "lo": float(lo),
            "hi": float(hi),
        }
    return out


def split_three(
    section: str,
    source: Path,
    validation_cut: int,
    eval_cut: int,
    work: Path,
    prefix: str,
    reuse: bool = False,
) -> tuple[Path, Path, Path, tuple[int, int, int]]:
    """train < validation_cut <= validation < eval_cut <= eval, as three dirs;
    prints the cuts and the sizes for ``section``.

    ``reuse``: the dirs exist from an earlier run with the same arguments.
    """
    rest, train, validation, evals = (
        work / f"{prefix}_{n}" for n in ("rest", "train", "validation", "eval")
    )
    if reuse:
        sizes = tuple(read_examples(d).num_rows for d in (train, validation, evals))
        counts = (sizes[0], sizes[1], sizes[2])
    else:
        _, n_eval = time_forward_split(source, eval_cut, rest, evals)
        n_train, n_validation = time_forward_split(
            rest, validation_cut, train, validation
        )
        shutil.rmtree(rest)
        counts = (n_train, n_validation, n_eval)
    print(
        f"{section}: validation from {validation_cut}, eval from {eval_cut}; "
        f"train / validation / eval examples {counts}",
        flush=True,
    )
    return train, validation, evals, counts


def run_args(args: argparse.Namespace, save: Path) -> dict[str, Any]:
    """:func:`run_models` keywords: the budget plus which models, where saved."""
    return {
        **fit_args(args),
        "models": args.models.split(",") if args.models else None,
        "save": save,
        "combine": args.combine,
        "lrs": tuple(float(x) for x in args.lrs.split(",")) if args.lrs else None,
    }


def fit_args(args: argparse.Namespace) -> dict[str, Any]:
    """The budget rule, the same for every model and both sections."""
    return {
        "epochs": args.epochs,
        "batch_size": args.batch_size,
        "lr": args.lr,
        "optimizer": args.optimizer,
        "lr_schedule": args.lr_schedule,
        "max_steps_per_epoch": args.steps,
        "validation_sample": args.validation_sample,
        "train_ne_sample": 5_000,
        "seed": args.seed,
        "device": args.device,
        "precision": args.precision,
        "max_train_seconds": args.max_train_seconds,
        "recalibrate": args.recalibrate,
    }


def _f(x: float | None, spec: str = ".4f") -> str:
    return (
        "n/a"
        if x is None or (isinstance(x, float) and math.isnan(x))
        else format(x, spec)
    )


def table_head(
    objectives: tuple[str, ...], last_column: str
) -> tuple[list[str], list[str]]:
    """A Markdown table's slices (each domain, then all, per objective) and
    its header lines: a model column, the slices, then ``last_column``."""
    slices = [f"{d}/{o}" for o in objectives for d in DOMAINS] + [
        f"all/{o}" for o in objectives
    ]
    return slices, [
        "| model | " + " | ".join(slices) + f" | {last_column} |",
        "|---|" + "---:|" * (len(slices) + 1),
    ]


def table(reports: dict[str, Any], objectives: tuple[str, ...]) -> str:
    """Markdown: one row per model (and Bayes), NE / AUC / calib per slice."""
    slices, lines = table_head(objectives, "ex/s")
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

    if "dlrm" not in reports or "gem" not in reports:
        return math.nan
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


def requested_variants(args: argparse.Namespace) -> tuple[str, ...]:
    """The GEM variants the flags ask for, each once, in a fixed order."""
    return tuple(
        dict.fromkeys(
            [NO_TARGET_MATCH] * args.target_match_ablation
            + [v for v in args.variants.split(",") if v]
        )
    )


def train_or_combine(
    args: argparse.Namespace,
    train: Path,
    validation: Path,
    evals: Path,
    cfg: ModelConfig,
    root: Path,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Every model's report and eval predictions, trained now or loaded.

    One training seed (``--seed``): as :func:`run_models`. With ``--seeds``:
    each seed's runs are saved under ``root/seed<S>`` (trained now unless
    ``--combine``), then every model saved for all seeds gets its mean
    report and its per-seed predictions (:mod:`benchmarks.quality_seeds`).
    """
    variants = requested_variants(args)
    if not args.seeds:
        predictions: dict[str, Any] = {}
        reports = run_models(
            train,
            validation,
            evals,
            cfg,
            predictions,
            variants=variants,
            **run_args(args, root),
        )
        return reports, predictions
    if not args.combine:
        for seed in args.seeds:
            print(f"training seed {seed}", flush=True)
            run_models(
                train,
                validation,
                evals,
                cfg,
                {},
                variants=variants,
                **{
                    **run_args(args, quality_seeds.seed_dir(root, seed)),
                    "seed": seed,
                },
            )
    return quality_seeds.combine(root, args.seeds, [*MODEL_NAMES, *variants])


def seed_figures(
    args: argparse.Namespace, reports: dict[str, Any], bayes: dict[str, Any] | None
) -> dict[str, Any]:
    """With ``--seeds``: the per-seed pairing against GEM (and, on generated
    data, the share of the gap GEM closes on each seed); else nothing."""
    if not args.seeds:
        return {}
    out: dict[str, Any] = {
        "seeds": args.seeds,
        "paired_by_seed": quality_seeds.paired_by_seed(reports),
    }
    if bayes is not None and {"gem", "dlrm"} <= reports.keys():
        best = bayes["overall"]["click"]["ne"]
        out["gap_closed_by_seed"] = [
            (d - g) / (d - best)
            for d, g in zip(
                reports["dlrm"]["per_seed_click_ne"],
                reports["gem"]["per_seed_click_ne"],
                strict=True,
            )
        ]
    return out


def periods(
    cut: int, validation_cut: int, counts: tuple[int, int, int]
) -> dict[str, int]:
    """A section's cuts and its train / validation / eval example counts."""
    return {
        "cut_ms": cut,
        "validation_cut_ms": validation_cut,
        "train": counts[0],
        "validation": counts[1],
        "eval": counts[2],
    }


def generated(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """Section (a)."""
    gen = world_config(args)
    reuse = args.reuse and (work / "gen_eval").exists()
    if not reuse:
        generated_features(gen, work / "gen", work / "gen_f", overwrite=True)

    def day_start(offset: int) -> int:
        day = gen.start + dt.timedelta(days=args.days + offset)
        return int(dt.datetime.combine(day, dt.time(), dt.UTC).timestamp() * 1000)

    cut, validation_cut = day_start(-1), day_start(-2)
    train, validation, evals, counts = split_three(
        "generated", work / "gen_f", validation_cut, cut, work, "gen", reuse
    )
    if args.prepare_only:
        return {"prepared": counts}
    cfg = bench_config(args.max_seq_len)
    reports, predictions = train_or_combine(
        args, train, validation, evals, cfg, work / "gen_models"
    )
    bayes = bayes_on(evals, work / "gen" / "truth.parquet")
    bayes_probs = bayes_probs_aligned(evals, work / "gen" / "truth.parquet")
    gaps = {
        k: gap_closed(reports, bayes, k)
        for k in [f"{d}/click" for d in DOMAINS] + ["all/click", "all/conversion"]
    }
    return {
        **seed_figures(args, reports, bayes),
        **periods(cut, validation_cut, counts),
        "models": reports,
        "bayes": bayes,
        "gem_gap_closed": gaps,
        "bootstrap": bootstrap_vs_gem(predictions, bayes_probs, args.bootstrap),
        **bootstraps_vs_references(predictions, args.bootstrap, bayes_probs),
        "beats_bayes": beats_bayes(reports, bayes),
    }


def bootstraps_vs_references(
    predictions: dict[str, Any],
    resamples: int,
    bayes_probs: np.ndarray | None = None,
) -> dict[str, Any]:
    """``bootstrap_vs_<ref>`` for each of :data:`REFERENCES` that was run."""
    return {
        f"bootstrap_vs_{ref}": bootstrap_vs_gem(
            predictions, bayes_probs, resamples, reference=ref
        )
        for ref in REFERENCES
        if ref in predictions
    }


def print_bootstraps_vs_references(section: dict[str, Any]) -> None:
    """Print what :func:`bootstraps_vs_references` found."""
    for ref in REFERENCES:
        if against := section.get(f"bootstrap_vs_{ref}"):
            print(f"vs {ref}, all/click:", json.dumps(against, indent=1))


def movielens_section(args: argparse.Namespace, work: Path) -> dict[str, Any] | None:
    """Section (b); None when the data is absent."""
    source = args.movielens
    if not (source / "ratings.dat").exists():
        print(f"movielens: {source} absent, section skipped", flush=True)
        return None
    reuse = args.reuse and (work / "ml_eval").exists()
    if not reuse:
        movielens.run(source, work / "ml", overwrite=True)
        reference_features(work / "ml", work / "ml_f", overwrite=True)
    cut = cut_at_fraction(work / "ml_f", 0.9)
    # The validation cut: 90 % of the impressions before the eval cut (81 % of all).
    validation_cut = cut_at_fraction(work / "ml_f", 0.81)
    train, validation, evals, counts = split_three(
        "movielens", work / "ml_f", validation_cut, cut, work, "ml", reuse
    )
    if args.prepare_only:
        return {"prepared": counts}
    reports, predictions = train_or_combine(
        args,
        train,
        validation,
        evals,
        bench_config(args.max_seq_len, MOVIELENS_TARGET_MATCH_SHARED),
        work / "ml_models",
    )
    return {
        **seed_figures(args, reports, None),
        **periods(cut, validation_cut, counts),
        "models": reports,
        "bootstrap": bootstrap_vs_gem(predictions, None, args.bootstrap),
        **bootstraps_vs_references(predictions, args.bootstrap),
    }


def print_seeds(section: dict[str, Any]) -> None:
    """The per-seed table of a ``--seeds`` run (the tables above are means)."""
    if "seeds" not in section:
        return
    print("\n### all/click NE by training seed (tables above: means over seeds)\n")
    print(
        quality_seeds.seed_table(
            section["models"],
            section["paired_by_seed"],
            section["bootstrap"],
            section["seeds"],
        )
    )
    if "gap_closed_by_seed" in section:
        print(
            "GEM share of the DLRM→Bayes gap closed, by seed:",
            [round(x, 3) for x in section["gap_closed_by_seed"]],
        )


def save_result(result: dict[str, Any], path: Path | None) -> None:
    """``result`` as JSON in ``path`` (nothing when ``None``)."""
    if path is not None:
        path.write_text(json.dumps(result, indent=1, default=str))


def finish_run(result: dict[str, Any], started: float, path: Path | None) -> int:
    """Add the run's seconds since ``started`` to ``result``, print them and
    save the result (:func:`save_result`); the exit status."""
    result["seconds"] = time.perf_counter() - started
    print(f"\ntotal {result['seconds']:.0f} s")
    save_result(result, path)
    return 0


def add_training_arguments(p: argparse.ArgumentParser) -> None:
    """The batch size, history length, learning rate and optimizer flags, with
    defaults every model of this benchmark trains with."""
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--max-seq-len", type=int, default=32)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument(
        "--optimizer",
        choices=OPTIMIZERS,
        default="adam",
        help="trainer.fit's --optimizer, for every model (the tables in "
        "benchmarks/README.md that do not name one: adam)",
    )


def add_movielens_argument(p: argparse.ArgumentParser) -> None:
    """The ``--movielens`` flag: the folder :func:`movielens_section` reads."""
    p.add_argument(
        "--movielens",
        type=Path,
        default=SHARED / "movielens-1m-dev",
        help="MovieLens-1M(-dev) dir with ratings.dat (read in place)",
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--section", choices=("all", "generated", "movielens"), default="all"
    )
    p.add_argument("--users", type=int, default=20_000)
    p.add_argument("--ads", type=int, default=2_000)
    p.add_argument("--days", type=int, default=7)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--steps", type=int, default=120, help="batches per epoch")
    add_training_arguments(p)
    p.add_argument(
        "--lrs",
        default=None,
        help="comma-separated learning-rate grid; each model keeps the rate "
        "with the best validation NE (default: --lr alone)",
    )
    p.add_argument(
        "--lr-schedule",
        choices=("constant", "cosine"),
        default="constant",
        help="the same schedule for every model (trainer.fit --lr-schedule)",
    )
    p.add_argument("--device", default="auto", help="auto | cpu | cuda[:N]")
    p.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    p.add_argument(
        "--max-train-seconds",
        type=float,
        default=None,
        help="per model run: start no new epoch after this (a safety net)",
    )
    p.add_argument(
        "--recalibrate",
        action="store_true",
        help="recalibrate each model on the validation period and choose its "
        "epoch after that shift, as trainer.fit does by default (without "
        "this flag: --no-recalibrate, the recorded tables' setting)",
    )
    p.add_argument(
        "--prepare-only",
        action="store_true",
        help="write the data splits under --work and stop (then --reuse)",
    )
    p.add_argument("--validation-sample", type=int, default=10_000)
    p.add_argument("--bootstrap", type=int, default=1000)
    p.add_argument(
        "--models", default=None, help="comma-separated subset (default: all)"
    )
    p.add_argument("--reuse", action="store_true", help="reuse the prepared split dirs")
    p.add_argument(
        "--combine",
        action="store_true",
        help="train nothing; tabulate the models saved under WORK/*_models",
    )
    p.add_argument(
        "--target-match-ablation",
        action="store_true",
        help=f"also train {NO_TARGET_MATCH}",
    )
    p.add_argument(
        "--variants",
        default="",
        help="comma-separated GEM variants to train too: " + ", ".join(GEM_VARIANTS),
    )
    p.add_argument(
        "--seed",
        type=int,
        default=0,
        help="the generator's seed; also the training seed unless --seeds",
    )
    p.add_argument(
        "--seeds",
        type=lambda v: [int(x) for x in v.split(",")],
        default=None,
        help="comma-separated training seeds (same data): each model is "
        "trained on every seed, chosen on mean validation NE, and reported "
        "as the mean over seeds with the per-seed NE beside it",
    )
    add_movielens_argument(p)
    p.add_argument("--work", type=Path, default=Path("/tmp/bench_quality"))
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    if unknown := {v for v in args.variants.split(",") if v} - set(GEM_VARIANTS):
        p.error(f"unknown --variants {sorted(unknown)}; known: {list(GEM_VARIANTS)}")
    args.work.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    result: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}}
    g = generated(args, args.work) if args.section in ("all", "generated") else {}
    if g:
        result["generated"] = g
    if "models" in g:
        print("\n## generated: NE / AUC / calibration (eval, time-forward)\n")
        print(table({**g["models"], "bayes-optimal": g["bayes"]}, TRAINING_OBJECTIVES))
        print(
            "\nGEM share of the DLRM→Bayes NE gap closed:",
            {k: round(v, 3) for k, v in g["gem_gap_closed"].items()},
        )
        print("models below Bayes NE:", g["beats_bayes"] or "none")
        print_seeds(g)
        print("paired bootstrap, all/click:", json.dumps(g["bootstrap"], indent=1))
        print_bootstraps_vs_references(g)
    if args.section in ("all", "movielens"):
        m = result["movielens"] = movielens_section(args, args.work)
        if m is not None and "models" in m:
            print(
                "\n## MovieLens-1M-dev: NE / AUC / calibration (click = conversion)\n"
            )
            print(table(m["models"], ("click",)))
            print_seeds(m)
            print("paired bootstrap, all/click:", json.dumps(m["bootstrap"], indent=1))
            print_bootstraps_vs_references(m)
    return finish_run(result, started, args.json)


if __name__ == "__main__":
    raise SystemExit(main())
