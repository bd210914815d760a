"""``trainer.training.fit`` end to end on a tiny generated set (reference features)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from benchmarks.generated import generated_features
from features.cli import CommandError
from features.vocab import DOMAINS, TRAINING_OBJECTIVES
from pipelines.sources.synthetic import GeneratorConfig
from trainer import fit as fit_command
from trainer.data.feature_output import (
    ExampleDataset,
    cut_at_fraction,
    event_time_ms,
    read_examples,
    time_forward_split,
)
from trainer.training import fit as fit_module
from trainer.training import fit_trainer
from trainer.training.device import resolve_device
from trainer.training.step import clip_grad_norm

REPO = Path(__file__).resolve().parents[1]
CONFIG = GeneratorConfig(users=300, ads=60, days=3, seed=7)
# Short windows keep the tiny GEM's padded InterFormer attention cheap.
FAST = ["--preset", "tiny", "--max-seq-len", "32", "--batch-size", "256"]


@pytest.fixture(scope="module")
def split(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, int]:
    """(train dir, eval dir, cut) from one generated set, cut at ~80 %."""
    root = tmp_path_factory.mktemp("fit")
    generated_features(CONFIG, root / "gen", root / "f")
    cut = cut_at_fraction(root / "f", 0.8)
    n_train, n_eval = time_forward_split(root / "f", cut, root / "train", root / "eval")
    assert n_train > 0
    assert n_eval > 0
    assert n_train + n_eval == read_examples(root / "f").num_rows
    return root / "train", root / "eval", cut


def _run(split: tuple[Path, Path, int], out: Path, *extra: str) -> dict:
    """``trainer.fit`` on ``split``'s train and eval dirs, with the fast flags;
    the metrics report it wrote to ``out``."""
    train, evals, _ = split
    argv = ["--train", str(train), "--eval", str(evals), "--metrics-out", str(out)]
    assert fit_command.main([*argv, *FAST, *extra]) == 0
    return json.loads(out.read_text())


def test_time_forward_split_has_no_eval_before_cut(
    split: tuple[Path, Path, int],
) -> None:
    train, evals, cut = split
    assert event_time_ms(read_examples(train)).max() < cut
    assert event_time_ms(read_examples(evals)).min() >= cut


def test_dataset_batches_cover_every_example_once(
    split: tuple[Path, Path, int],
) -> None:
    data = ExampleDataset(split[0], max_seq_len=16)
    sizes = [b.size for b in data.batches(500, shuffle=True, seed=3)]
    assert sum(sizes) == len(data)
    assert max(sizes) == 500
    # Same (seed, epoch): same order; another epoch: another order.
    a = data.order(shuffle=True, seed=3, epoch=0)
    assert np.array_equal(a, data.order(shuffle=True, seed=3, epoch=0))
    assert not np.array_equal(a, data.order(shuffle=True, seed=3, epoch=1))


def test_fit_writes_every_task_and_loss_decreases(
    split: tuple[Path, Path, int], tmp_path: Path
) -> None:
    report = _run(
        split, tmp_path / "m.json", *("--model", "gem", "--epochs", "4", "--lr", "3e-3")
    )
    losses = report["train"]["epoch_loss"]
    assert losses[-1] < losses[0]
    assert set(report["by_task"]) == {
        f"{d}/{o}" for d in DOMAINS for o in TRAINING_OBJECTIVES
    }
    assert set(report["overall"]) == set(TRAINING_OBJECTIVES)
    for m in report["by_task"].values():
        assert {"ne", "auc", "calibration", "count", "positives"} <= set(m)
    assert report["train"]["examples_per_s"] > 0
    assert report["config"]["model"]["embedding"]["max_seq_len"] == 32


def test_validation_selects_the_epoch_that_is_evaluated(
    split: tuple[Path, Path, int], tmp_path: Path
) -> None:
    """With the eval dir as the (whole) validation set, the reported eval NE
    must be the best per-epoch validation NE: the best state was restored."""
    _, evals, _ = split
    report = _run(
        split,
        tmp_path / "v.json",
        *("--model", "dlrm", "--epochs", "3", "--lr", "2e-2"),
        *("--validation", str(evals)),
    )
    t = report["train"]
    assert len(t["epoch_validation_click_ne"]) == 3
    assert len(t["epoch_train_click_ne"]) == 3
    best = min(range(3), key=lambda e: t["epoch_validation_click_ne"][e])
    assert t["selected_epoch"] == best
    assert report["overall"]["click"]["ne"] == pytest.approx(
        t["epoch_validation_click_ne"][best], abs=1e-6
    )


def test_patience_stops_after_epochs_without_a_better_validation_ne(
    split: tuple[Path, Path, int], tmp_path: Path
) -> None:
    """A rate high enough to overfit this small set after its first epoch:
    the run without patience shows validation NE worse at every later epoch,
    so patience N stops after N more; the model evaluated is the same."""
    _, evals, _ = split
    common = ["--model", "dlrm", "--epochs", "5", "--lr", "2e-2"]
    common += ["--validation", str(evals), "--lr-schedule", "constant"]
    full = _run(split, tmp_path / "full.json", *common, "--patience", "5")
    scores = full["train"]["epoch_validation_click_ne"]
    assert full["train"]["selected_epoch"] == 0
    assert min(scores[1:]) > scores[0]
    assert not full["train"]["stopped_early"]
    for patience in (1, 2):
        report = _run(
            split, tmp_path / f"p{patience}.json", *common, "--patience", str(patience)
        )
        t = report["train"]
        assert t["stopped_early"]
        assert t["epochs_run"] == 1 + patience
        assert t["epoch_validation_click_ne"] == scores[: 1 + patience]
        assert t["selected_epoch"] == 0
        assert report["overall"]["click"]["ne"] == full["overall"]["click"]["ne"]


def test_the_default_recipe_holds_out_the_latest_train_examples_and_stops(
    split: tuple[Path, Path, int], tmp_path: Path
) -> None:
    """No tuning flag but the holdout's share (this small set's latest tenth
    holds no click): the latest examples of --train choose the epoch, a
    worse epoch goes back to the best at half the rate, two in a row end
    the run."""
    train, _, _ = split
    flags = ["--model", "dlrm", "--lr", "2e-2", "--holdout", "0.4"]
    report = _run(split, tmp_path / "d.json", *flags)
    t, recipe = report["train"], report["recipe"]
    held_out = int(recipe["validation"].split()[-2])
    times = np.sort(event_time_ms(read_examples(train)))
    assert t["examples"] + t["validation_examples"] == times.size
    assert t["examples"] == int((times < held_out).sum())
    assert t["validation_examples"] == pytest.approx(0.4 * times.size, rel=0.05)
    assert (recipe["epochs"], recipe["patience"]) == (8, 2)
    assert recipe["lr_schedule"] == "plateau"
    scores = t["epoch_validation_click_ne"]
    assert t["stopped_early"], scores  # this rate overfits the small set
    best = t["selected_epoch"]
    assert scores[best] == min(scores)
    assert t["epochs_run"] == best + 3
    # Each epoch after a worse one ran at half the rate before it.
    expected, rate = [], 2e-2
    for epoch in range(t["epochs_run"]):
        expected.append(rate)
        if epoch != best and epoch >= best:
            rate /= 2
    assert t["epoch_lr"] == pytest.approx(expected)


def test_the_plateau_schedule_goes_back_to_the_best_epoch(
    split: tuple[Path, Path, int], tmp_path: Path
) -> None:
    """After a worse epoch the weights are the best epoch's again: the next
    epoch's train NE starts from there, so a run with the same seed that
    stops at the best epoch has the same eval scores."""
    _, evals, _ = split
    common = ["--model", "dlrm", "--lr", "2e-2", "--validation", str(evals)]
    report = _run(split, tmp_path / "p.json", *common, "--epochs", "3")
    t = report["train"]
    assert t["selected_epoch"] == 0
    assert t["epochs_run"] == 3
    assert t["epoch_lr"] == pytest.approx([2e-2, 2e-2, 1e-2])
    once = _run(split, tmp_path / "o.json", *common, "--epochs", "1")
    assert report["overall"] == once["overall"]


def test_a_holdout_of_one_instant_is_refused(tmp_path: Path) -> None:
    """Every example at one time: nothing is before the holdout's start."""
    data = tmp_path / "one"
    generated_features(
        GeneratorConfig(users=20, ads=10, days=1, seed=1), tmp_path / "g", data
    )
    examples = read_examples(data)
    same = ExampleDataset(data, max_seq_len=8)
    same.examples = examples.set_column(
        examples.schema.get_field_index("event_time"),
        "event_time",
        pa.array(
            [examples.column("event_time")[0].as_py()] * examples.num_rows,
            examples.schema.field("event_time").type,
        ),
    )
    with pytest.raises(CommandError, match=r"--holdout 0\.1: every example"):
        fit_module.hold_out_latest(same, 0.1)


def test_patience_is_refused_without_a_validation_period(
    split: tuple[Path, Path, int],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    train, evals, _ = split
    argv = ["--train", str(train), "--eval", str(evals), "--patience", "1"]
    argv += ["--holdout", "0"]
    assert fit_command.main([*argv, "--metrics-out", str(tmp_path / "x.json")]) == 2
    assert capsys.readouterr().err.strip() == (
        "python -m trainer.fit: error: --patience needs a validation period; "
        "add --validation DIR, or a --holdout share above 0"
    )
    with pytest.raises(ValueError, match="--patience needs a validation period"):
        fit_module.fit(
            fit_module.FitConfig(train=train, eval=evals, holdout=0, patience=1)
        )


def test_time_limit_stops_before_the_next_epoch(
    split: tuple[Path, Path, int], tmp_path: Path
) -> None:
    report = _run(
        split,
        tmp_path / "t.json",
        *("--model", "dlrm", "--epochs", "3", "--max-steps-per-epoch", "2"),
        *("--max-train-seconds", "0", "--device", "cpu"),
    )
    assert report["train"]["epochs_run"] == 1
    assert report["train"]["selected_epoch"] == 0
    assert report["config"]["device"] == "cpu"


def _seeded_trainer(
    cfg: fit_module.FitConfig, data: ExampleDataset, seed: int = 0
) -> fit_trainer.FitTrainer:
    """A CPU, float32 trainer of ``cfg`` for three steps on ``data``,
    initialised from ``seed``."""
    import torch

    torch.manual_seed(seed)
    return fit_trainer.FitTrainer(
        cfg,
        fit_module.resolved_model_config(cfg),
        fit_module.base_rate_logits(data),
        torch.device("cpu"),
        fit_module.autocast_for(torch.device("cpu"), "fp32"),
        total_steps=3,
    )


def test_fit_trainer_state_resumes_the_same_run(
    split: tuple[Path, Path, int],
) -> None:
    """A trainer loaded from another's :meth:`state_dict` steps as it would."""
    import torch

    train, evals, _ = split
    cfg = fit_module.FitConfig(
        train=train,
        eval=evals,
        model="dlrm",
        preset="tiny",
        max_seq_len=32,
        optimizer="adam+adagrad",
        lr_schedule="cosine",
    )
    data = ExampleDataset(train, max_seq_len=32)
    batches = list(data.batches(64, shuffle=True, seed=0, max_batches=3))
    whole, saved = _seeded_trainer(cfg, data), _seeded_trainer(cfg, data)
    for batch in batches[:2]:
        whole.step(batch)
        saved.step(batch)
    # Another init: the state must overwrite all of it.
    resumed = _seeded_trainer(cfg, data, seed=1)
    # From a trainer that steps no more: the optimizers may share its tensors.
    resumed.load_state_dict(saved.state_dict())
    assert resumed.steps == whole.steps == 2
    losses = [t.step(batches[2]).item() for t in (whole, resumed)]
    assert losses[0] == pytest.approx(losses[1], rel=1e-6)
    for name, tensor in whole.state_dict()["model"].items():
        torch.testing.assert_close(resumed.state_dict()["model"][name], tensor)


@pytest.mark.parametrize("model", ["dlrm", "gem"])
def test_adagrad_tables_step_on_sparse_gradients_as_on_dense_ones(
    split: tuple[Path, Path, int], model: str
) -> None:
    """Under ``adam+adagrad`` the tables' gradients hold only the rows read,
    and the run (clipping included) equals one on dense table gradients."""
    import torch
    from torch import nn

    train, evals, _ = split
    cfg = fit_module.FitConfig(
        train=train,
        eval=evals,
        model=model,
        preset="tiny",
        max_seq_len=32,
        optimizer="adam+adagrad",
        embedding_lr=0.5,
        max_grad_norm=0.05,  # below some steps' norms: clipping runs
    )
    data = ExampleDataset(train, max_seq_len=32)
    batches = list(data.batches(64, shuffle=True, seed=0, max_batches=3))

    def tables(t: fit_trainer.FitTrainer) -> list[nn.Module]:
        kinds = nn.Embedding | nn.EmbeddingBag
        return [m for m in t.model.modules() if isinstance(m, kinds)]

    sparse, dense = _seeded_trainer(cfg, data), _seeded_trainer(cfg, data)
    for table in tables(dense):
        table.sparse = False
    norms: dict[str, list[float]] = {"sparse": [], "dense": []}
    for batch in batches:
        for label, t in (("sparse", sparse), ("dense", dense)):
            t.step(batch)
            params = list(t.model.parameters())
            norms[label].append(clip_grad_norm(params, float("inf")).item())
    assert all(t.weight.grad.is_sparse for t in tables(sparse))
    assert not any(t.weight.grad.is_sparse for t in tables(dense))
    assert norms["sparse"] == pytest.approx(norms["dense"], rel=1e-5)
    assert pytest.approx(0.05, rel=1e-4) in norms["dense"]  # a clipped step
    initial = _seeded_trainer(cfg, data).state_dict()["model"]
    moved = 0
    for name, tensor in dense.state_dict()["model"].items():
        torch.testing.assert_close(sparse.state_dict()["model"][name], tensor)
        moved += int(not torch.equal(tensor, initial[name]))
    assert moved > 0


def test_clip_grad_norm_matches_torch_on_dense_gradients() -> None:
    """The clip equals ``nn.utils.clip_grad_norm_``; with an infinite bound
    it measures and leaves the gradients as they are."""
    import torch
    from torch import nn

    def layers() -> list[nn.Parameter]:
        torch.manual_seed(0)
        net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
        (net(torch.randn(16, 4)).sum() * 100).backward()
        return list(net.parameters())

    ours, theirs, unclipped = layers(), layers(), layers()
    norm = clip_grad_norm(ours, 1.0)
    torch.testing.assert_close(norm, nn.utils.clip_grad_norm_(theirs, 1.0))
    for a, b in zip(ours, theirs, strict=True):
        torch.testing.assert_close(a.grad, b.grad)
    before = [p.grad.clone() for p in unclipped]
    torch.testing.assert_close(clip_grad_norm(unclipped, float("inf")), norm)
    for p, grad in zip(unclipped, before, strict=True):
        assert torch.equal(p.grad, grad)


def test_cosine_schedule_anneals_every_step_to_zero(
    split: tuple[Path, Path, int], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen_lrs: list[float] = []
    real_step = fit_trainer.train_step

    def recording_step(model, batch, optimizer, max_grad_norm):  # type: ignore[no-untyped-def]
        seen_lrs.append(optimizer.param_groups[0]["lr"])
        return real_step(model, batch, optimizer, max_grad_norm)

    monkeypatch.setattr(fit_trainer, "train_step", recording_step)
    _run(
        split,
        tmp_path / "c.json",
        *("--model", "dlrm", "--epochs", "2", "--max-steps-per-epoch", "2"),
        *("--lr", "0.01", "--lr-schedule", "cosine", "--device", "cpu"),
    )
    # 4 steps: 0.01 * (1 + cos(pi * k / 4)) / 2 for k = 0..3.
    assert seen_lrs == pytest.approx([0.01, 0.0085355, 0.005, 0.0014645], rel=1e-4)
    assert fit_trainer.lr_factor("cosine", 4, 4) == pytest.approx(0.0)
    with pytest.raises(ValueError, match="unknown lr schedule"):
        fit_trainer.lr_factor("step", 0, 4)


def test_recalibration_calibrates_the_validation_period_and_keeps_rankings(
    tmp_path: Path,
) -> None:
    """Validated on the eval dir itself: every task's calibration becomes 1,
    while AUC (a ranking within the task) does not move. A bigger world than
    ``split``'s, so that tasks have the positives a shift needs."""
    generated_features(
        GeneratorConfig(users=3000, ads=200, days=3, seed=3),
        tmp_path / "g",
        tmp_path / "f",
    )
    cut = cut_at_fraction(tmp_path / "f", 0.7)
    train, evals = tmp_path / "train", tmp_path / "eval"
    time_forward_split(tmp_path / "f", cut, train, evals)
    common = (
        *("--model", "dlrm", "--epochs", "1", "--max-steps-per-epoch", "3"),
        *("--lr", "2e-2", "--validation", str(evals)),
    )
    plain = _run((train, evals, cut), tmp_path / "p.json", *common, "--no-recalibrate")
    recalibrated = _run((train, evals, cut), tmp_path / "r.json", *common)
    assert (plain["recipe"]["recalibrate"], recalibrated["recipe"]["recalibrate"]) == (
        False,
        True,
    )
    assert plain["train"]["recalibration_shifts"] is None
    shifts = recalibrated["train"]["recalibration_shifts"]
    assert any(abs(v) > 1e-3 for v in shifts.values())
    checked = 0
    for task, metrics in recalibrated["by_task"].items():
        before = plain["by_task"][task]
        assert metrics["auc"] == pytest.approx(before["auc"], abs=1e-6, nan_ok=True)
        if min(metrics["positives"], metrics["count"] - metrics["positives"]) >= 5:
            assert metrics["calibration"] == pytest.approx(1.0, abs=1e-3), task
            checked += 1
        else:
            assert shifts[task] == 0.0
    assert checked >= 3
    # Epochs are scored after the shifts: validated on the eval dir itself,
    # the recalibrated model's eval NE is the chosen epoch's score.
    common = (*common[:2], "--epochs", "3", *common[4:])
    chosen = _run((train, evals, cut), tmp_path / "c.json", *common)
    t = chosen["train"]
    scores = t["epoch_validation_click_ne"]
    before = t["epoch_validation_click_calibration"]
    assert len(scores) == len(before) == t["epochs_run"] > 1
    assert t["selected_epoch"] == min(range(len(scores)), key=scores.__getitem__)
    assert chosen["overall"]["click"]["ne"] == pytest.approx(
        scores[t["selected_epoch"]], abs=1e-5
    )
    assert abs(before[t["selected_epoch"]] - 1.0) > 1e-3


@pytest.mark.skipif(
    fit_module.torch.cuda.is_available(), reason="checks the no-GPU message"
)
def test_asking_for_cuda_without_a_gpu_names_the_problem() -> None:
    with pytest.raises(ValueError, match="no CUDA device"):
        resolve_device("cuda")


def test_learning_rate_grid_keeps_the_best_validation_run() -> None:
    from benchmarks.bench_quality import _select

    def run(lr: float, validation: list[float | None]) -> tuple[dict, dict]:
        report = {
            "config": {"fit": {"lr": lr}},
            "train": {"epoch_validation_click_ne": validation},
        }
        return report, {"probs": np.array([lr])}

    chosen, predictions = _select(
        [run(1e-3, [0.99, 0.97]), run(3e-3, [0.98, 0.96, None]), run(1e-2, [None])]
    )
    assert chosen["selected_lr"] == 3e-3
    assert predictions["probs"][0] == 3e-3
    assert chosen["lr_grid"] == {"0.001": 0.97, "0.003": 0.96, "0.01": float("inf")}


def test_paired_bootstrap_orders_models() -> None:
    from benchmarks.bench_quality import bootstrap_vs_gem

    rng = np.random.default_rng(0)
    truth = rng.uniform(0.01, 0.2, 5_000)
    labels = (rng.random(5_000) < truth).astype(np.float32)

    def pred(p: np.ndarray) -> dict[str, np.ndarray]:
        return {"labels": np.stack([labels, labels], 1), "probs": np.stack([p, p], 1)}

    flat = np.full(5_000, labels.mean())
    out = bootstrap_vs_gem(
        {"gem": pred(truth), "dlrm": pred(flat), "same": pred(truth)},
        bayes_probs=truth,
        resamples=200,
    )
    assert out["same"] == {"diff_mean": 0.0, "lo": 0.0, "hi": 0.0}
    assert out["dlrm"]["lo"] > 0  # the informed model is significantly better
    assert out["gap_closed"]["mean"] == pytest.approx(1.0)


def test_fit_is_deterministic(split: tuple[Path, Path, int], tmp_path: Path) -> None:
    args = ("--model", "gem", "--epochs", "2", "--seed", "5")
    a = _run(split, tmp_path / "a.json", *args)
    b = _run(split, tmp_path / "b.json", *args)
    assert a["by_task"] == b["by_task"]
    assert a["train"]["epoch_loss"] == b["train"]["epoch_loss"]


def test_compiled_fit_trains_the_same_model(
    split: tuple[Path, Path, int], tmp_path: Path
) -> None:
    """``--compile``: dynamo + AOT autograd (aot_eager: no code generation)
    trace the same arithmetic as eager mode. DLRM keeps the compile short; GEM's
    own graph is checked in test_compile.py and test_model_gem.py."""
    args = ("--model", "dlrm", "--max-steps-per-epoch", "4", "--seed", "3")
    eager = _run(split, tmp_path / "eager.json", *args)
    compiled = _run(split, tmp_path / "compiled.json", *args, "--compile", "aot_eager")
    assert compiled["config"]["fit"]["compile"] == "aot_eager"
    assert compiled["train"]["epoch_loss"] == pytest.approx(
        eager["train"]["epoch_loss"], rel=1e-4
    )
    for objective, metrics in eager["overall"].items():
        got = compiled["overall"][objective]
        assert got["ne"] == pytest.approx(metrics["ne"], rel=1e-3)


def test_fit_cli_baseline(split: tuple[Path, Path, int], tmp_path: Path) -> None:
    """The module entry point, as a subprocess, with the paper's optimizer split."""
    train, evals, _ = split
    out = tmp_path / "dlrm.json"
    cmd = [
        sys.executable,
        "-m",
        "trainer.fit",
        "--train",
        str(train),
        "--eval",
        str(evals),
        "--model",
        "dlrm",
        "--optimizer",
        "adam+adagrad",
        "--metrics-out",
        str(out),
        *FAST,
    ]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "all/click" in done.stdout
    assert json.loads(out.read_text())["config"]["fit"]["optimizer"] == "adam+adagrad"


def test_gpu_check_smoke_runs_on_cpu() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu_check", "--smoke"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "examples/s" in done.stdout


def test_bench_gpu_compiles_the_real_model_into_one_graph(
    split: tuple[Path, Path, int], tmp_path: Path
) -> None:
    # bench_gpu's compiled path on the CPU, with dynamo's eager backend (it
    # traces and counts graphs without generating code). The real GEM, its
    # TorchRec inputs included, must compile one frame and never again over
    # batches of new history totals, as it must on the GPU it is there for.
    train, _, _ = split
    out = tmp_path / "bench_gpu.json"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.bench_gpu",
            "--device",
            "cpu",
            "--features",
            str(train),
            "--presets",
            "tiny",
            "--batch-sizes",
            "64",
            "--precisions",
            "fp32",
            "--models",
            "gem",
            "--steps",
            "3",
            "--compile",
            "eager",
            "--json",
            str(out),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr
    timed = json.loads(out.read_text())["throughput"]
    eager, compiled = timed["tiny/B64/fp32/gem"], timed["tiny/B64/fp32/gem/compiled"]
    assert "frames_compiled" not in eager
    assert compiled["frames_compiled"] == 1
    assert compiled["recompiles_while_timing"] == 0
    assert compiled["mflop_per_example"] == eager["mflop_per_example"]
    assert compiled["examples_per_s"] > 0
