"""The trainer on a GPU: every model on CUDA equals itself on the CPU.

Skipped without CUDA (``make test`` on CI and on the 2-core dev box). On a
GPU machine without fbgemm's CUDA build (the CPU wheel is enough to import
torchrec), the models run TorchRec's unsharded modules and our pure-PyTorch
jagged ops on CUDA (:mod:`trainer.ops.kernel` picks per call), so these tests
also prove that path needs no fbgemm CUDA kernel.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from benchmarks.generated import generated_features
from pipelines.sources.synthetic import GeneratorConfig
from tests.test_model_batches import random_batch
from trainer import fit as fit_command
from trainer.data.feature_output import cut_at_fraction, time_forward_split
from trainer.models.config import preset
from trainer.models.loss_wrapper import GEMTrain
from trainer.models.registry import MODEL_NAMES, build_model
from trainer.training import fit as fit_module
from trainer.training.step import train_step

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


@pytest.fixture(autouse=True)
def exact_matmuls() -> None:
    """TF32 off: these tests compare CUDA with the CPU at fp32 tolerances."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_model_on_cuda_equals_the_cpu(name: str) -> None:
    torch.manual_seed(0)
    config = preset("tiny")
    cpu = build_model(name, config).eval()
    gpu = build_model(name, config)
    gpu.load_state_dict(cpu.state_dict())
    gpu = gpu.cuda().eval()
    batch = random_batch([3, 0, 300, 1, 17], seed=4)
    with torch.no_grad():
        expected = cpu(batch)
        got = gpu(batch.to(torch.device("cuda")))
    assert got.device.type == "cuda"
    torch.testing.assert_close(got.cpu(), expected, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("name", ["gem", "dlrm"])
def test_a_train_step_on_cuda_equals_the_cpu(name: str) -> None:
    torch.manual_seed(0)
    config = dataclasses.replace(preset("tiny"))
    cpu = GEMTrain(build_model(name, config))
    gpu = GEMTrain(build_model(name, config))
    gpu.load_state_dict(cpu.state_dict())
    gpu = gpu.cuda()
    batch = random_batch([5, 0, 64, 2], seed=5)
    steps = []
    for model, b in ((cpu, batch), (gpu, batch.to(torch.device("cuda")))):
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        steps.append(train_step(model, b, opt, 10.0))
    torch.testing.assert_close(steps[1].loss.cpu(), steps[0].loss, rtol=1e-4, atol=1e-5)
    for (key, a), (_, b) in zip(
        cpu.state_dict().items(), gpu.state_dict().items(), strict=True
    ):
        torch.testing.assert_close(b.cpu(), a, atol=2e-4, rtol=1e-3, msg=key)


def test_fit_on_cuda_reports_the_device_and_close_metrics(tmp_path: Path) -> None:
    generated_features(
        GeneratorConfig(users=300, ads=60, days=3, seed=7),
        tmp_path / "g",
        tmp_path / "f",
    )
    cut = cut_at_fraction(tmp_path / "f", 0.8)
    time_forward_split(tmp_path / "f", cut, tmp_path / "train", tmp_path / "eval")
    reports = {}
    for device in ("cpu", "cuda"):
        out = tmp_path / f"{device}.json"
        argv = [
            "--train", str(tmp_path / "train"), "--eval", str(tmp_path / "eval"),
            "--model", "dlrm", "--preset", "tiny", "--max-seq-len", "32",
            "--batch-size", "256", "--device", device, "--metrics-out", str(out),
            "--holdout", "0",
        ]  # fmt: skip
        assert fit_command.main(argv) == 0
        reports[device] = json.loads(out.read_text())
    assert reports["cuda"]["config"]["device"] != "cpu"
    for key in ("click", "conversion"):
        a, b = reports["cpu"]["overall"][key], reports["cuda"]["overall"][key]
        assert b["count"] == a["count"]
        assert b["ne"] == pytest.approx(a["ne"], abs=2e-3)
    # The benchmarks' paired bootstrap reads the eval predictions as numpy.
    predictions: dict = {}
    fit_module.fit(
        fit_module.FitConfig(
            train=tmp_path / "train", eval=tmp_path / "eval", model="dlrm",
            max_seq_len=32, device="cuda", max_steps_per_epoch=2, preset="tiny",
            holdout=0,
        ),
        predictions_out=predictions,
    )  # fmt: skip
    assert predictions["probs"].shape == (reports["cpu"]["eval_examples"], 2)


@pytest.mark.parametrize("name", ["gem", "gem_no_pyramid", "dlrm", "dcnv2"])
def test_a_bf16_autocast_step_on_cuda_is_finite(name: str) -> None:
    torch.manual_seed(0)
    model = GEMTrain(build_model(name, preset("tiny"))).cuda()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    batch = random_batch([5, 0, 300, 2, 40], seed=6).to(torch.device("cuda"))
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out = train_step(model, batch, opt, 10.0)
    assert torch.isfinite(out.loss)
    assert torch.isfinite(out.grad_norm)
