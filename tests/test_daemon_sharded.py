"""Model-parallel tables (TorchRec ``DistributedModelParallel``, gloo, 2 ranks).

1. Equality: two sharded ranks stepping on fixed per-rank batches (with a step
   where one rank has no batch) end with the parameters and optimizer state of
   the replicated data-parallel computation on the same batches, computed here
   in one process: grad = Σ_r n_r g_r / N, Adam on the dense part, Adagrad on
   the tables. (Not "one process on the concatenated batch": the loss is a
   per-task mean, so the mean of per-rank losses is not the loss of the union.)
   The gathered checkpoint restores into a fresh sharded model and into a
   one-process replicated one, and training continues identically.
2. Exactly once: the daemon under torchrun with ``--sharding model-parallel``,
   SIGKILLed after a checkpoint and restarted, applies every record once; its
   ranks die with the launcher.

This file is also the worker of test 1: ``torchrun -m tests.test_daemon_sharded``.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.example_feed import MAX_LEN, ExampleFeed, tiny_reference
from tests.test_daemon import applied_chain
from trainer.training.checkpoint import load_latest

REPO = Path(__file__).resolve().parents[1]


TORCHRUN = str(Path(sys.executable).with_name("torchrun"))
# (start row, examples) per rank per step; 0 examples = the rank has no batch.
SCHEDULE = [
    [(0, 16), (40, 12)],
    [(100, 16), (0, 0)],
    [(300, 8), (400, 16)],
    [(0, 0), (200, 16)],
]
CONTINUE = [(500, 16), (600, 12)]


def _batch(start: int, count: int) -> object:
    from features.windows import timeline_segments
    from trainer.data.inputs import make_batch

    reference = tiny_reference()
    chunk = reference.examples.slice(start, count)
    segments = timeline_segments(chunk, reference.timelines, MAX_LEN)
    return make_batch(chunk, segments, max_seq_len=MAX_LEN)


def _model(seed: int) -> torch.nn.Module:
    from trainer.models.base_rate import BaseRateOffset, prior_logits
    from trainer.models.loss_wrapper import GEMTrain
    from trainer.models.registry import build_model

    torch.manual_seed(seed)
    return GEMTrain(
        BaseRateOffset(build_model("gem", "tiny"), prior_logits(0.02, 0.002))
    )


def _reference_step(model: torch.nn.Module, optimizers: list, step: list) -> None:
    """The replicated data-parallel math, all ranks in one process."""
    for optimizer in optimizers:
        optimizer.zero_grad(set_to_none=False)
    total = sum(n for _, n in step)
    for start, n in step:
        if n:
            loss, _ = model(_batch(start, n))
            (loss * n).backward()
    for p in model.parameters():
        if p.grad is not None:
            p.grad /= total
    for optimizer in optimizers:
        optimizer.step()


def _children(parent: int) -> list[int]:
    """Pids of ``parent``'s child processes."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if int(fields[1]) == parent:
            pids.append(int(stat.parent.name))
    return pids


def _alive(pid: int) -> bool:
    """Running (a zombie waiting to be reaped is dead)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def _max_diff(a: dict, b: dict) -> tuple[float, str]:
    worst = (0.0, "")
    for key, tensor in a.items():
        if isinstance(tensor, torch.Tensor) and tensor.is_floating_point():
            diff = float((tensor - b[key]).abs().max()) if tensor.numel() else 0.0
            worst = max(worst, (diff, key))
    return worst


def worker(out: Path) -> None:
    """Rank body of the equality test (run under torchrun, 2 ranks)."""
    import torch.distributed as dist

    from trainer.distributed.model_parallel import ModelParallel, borrow_batch
    from trainer.distributed.replicated import Replicated
    from trainer.distributed.tables import (
        ADAGRAD_EPS,
        OptimizerConfig,
        table_parameter_names,
    )
    from trainer.training.checkpoint import save_checkpoint
    from trainer.training.ranks import leave_process_group

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    config = OptimizerConfig(lr=1e-2, embedding_optimizer="adagrad", embedding_lr=0.1)
    sharded = ModelParallel(_model(0), config, torch.device("cpu"))
    reference = _model(0)
    tables = table_parameter_names(reference)
    named = dict(reference.named_parameters())
    ref_optimizers = [
        torch.optim.Adam([p for n, p in named.items() if n not in tables], lr=1e-2),
        torch.optim.Adagrad(
            [p for n, p in named.items() if n in tables], lr=0.1, eps=ADAGRAD_EPS
        ),
    ]
    idle = None
    for step in SCHEDULE:
        start, n = step[rank]
        batch = _batch(start, n) if n else None
        if idle is None:  # every rank needs a batch to run with weight 0
            lender = next(r for r, (_, m) in enumerate(step) if m)
            idle = borrow_batch(batch, lender)
        sharded.step(batch or idle, n, sum(m for _, m in step))
        _reference_step(reference, ref_optimizers, step)
    state = sharded.full_state()
    result: dict[str, object] = {"plan": str(sharded.plan)}
    directory = out.parent / "ckpt"
    if rank == 0:
        result["model"] = _max_diff(reference.state_dict(), state["model"])
        sums = state["table_optimizer_state"]
        ref_sums = {n: ref_optimizers[1].state[named[n]]["sum"] for n in tables}
        result["table_optimizer"] = _max_diff(ref_sums, sums)
        result["tables_with_state"] = len(sums)
        save_checkpoint(directory, {**state, "step": 4, "offsets": {}}, keep=1)
    dist.barrier()
    loaded = load_latest(directory)
    assert loaded is not None
    restored = ModelParallel(_model(1), config, torch.device("cpu"))
    restored.load_full_state(loaded[0])
    for strategy in (sharded, restored):
        start, n = CONTINUE[rank]
        strategy.step(_batch(start, n), n, sum(m for _, m in CONTINUE))
    a, b = sharded.full_state(), restored.full_state()
    if rank == 0:
        result["continued"] = _max_diff(a["model"], b["model"])
        one = Replicated(_model(2), config)
        one.load_full_state(loaded[0])
        result["world_size_1_restored"] = _max_diff(
            loaded[0]["model"], one.full_state()["model"]
        )
        # The dense Adam state is index-keyed: the orders must name the same
        # parameters in both strategies for a cross-mode restore to be right.
        names = {id(p): n for n, p in one.model.named_parameters()}
        ours = {id(p): n for n, p in restored.model.named_parameters()}
        result["dense_order_equal"] = [
            names[id(p)] for p in one.optimizer.param_groups[0]["params"]
        ] == [ours[id(p)] for p in restored.optimizer.param_groups[0]["params"]]
        _reference_step(reference, ref_optimizers, CONTINUE)
        result["reference_continued"] = _max_diff(reference.state_dict(), a["model"])
        out.write_text(json.dumps(result))
    dist.barrier()
    del sharded, restored, strategy  # TorchRec's modules hold the group
    leave_process_group()


def test_sharded_equals_replicated_and_restores(tmp_path: Path) -> None:
    out = tmp_path / "result.json"
    command = [TORCHRUN, "--standalone", "--nproc-per-node", "2",
               "-m", "tests.test_daemon_sharded", str(out)]  # fmt: skip
    done = subprocess.run(command, cwd=REPO, capture_output=True, timeout=300)
    assert done.returncode == 0, done.stderr.decode()[-4000:]
    result = json.loads(out.read_text())
    assert "table_wise" in result["plan"]
    assert "data_parallel" in result["plan"]
    # Adagrad's first touch of a weight moves it by lr·g/(|g|+eps) ≈ ±lr
    # whatever |g| is, so float rounding in a near-zero gradient shows up
    # amplified, to about a third of the bound after 4 steps of ±0.1 updates.
    assert result["model"][0] < 2e-4, result["model"]
    assert result["table_optimizer"][0] < 1e-5, result["table_optimizer"]
    assert result["tables_with_state"] == 20
    assert result["continued"][0] < 2e-4, result["continued"]
    assert result["reference_continued"][0] < 2e-4, result["reference_continued"]
    assert result["world_size_1_restored"][0] == 0.0
    assert result["dense_order_equal"]


def test_sharded_daemon_sigkill_restart_exactly_once(
    feed: ExampleFeed, tmp_path: Path
) -> None:
    from tests.test_daemon_faults import daemon_command, newest_step, wait_for

    topic, sent = feed.topic(feed.messages(16), 2)
    args = daemon_command(
        feed.settings, topic, "g-sharded", tmp_path, "--checkpoint-every", "2",
        "--idle-seconds", "2.5", "--sharding", "model-parallel",
    )  # fmt: skip
    environment = {
        **os.environ,
        "GEM_DAEMON_APPLIED_LOG": str(tmp_path / "applied.jsonl"),
    }

    def launch() -> subprocess.Popen[bytes]:
        log = open(tmp_path / "daemon.log", "ab")
        return subprocess.Popen(
            [TORCHRUN, "--standalone", "--nproc-per-node", "2",
             "-m", "trainer.daemon", *args],
            cwd=REPO, env=environment, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,  # torchrun's group (the ranks have their own)
        )  # fmt: skip

    process = launch()
    try:
        assert wait_for(lambda: newest_step(tmp_path) >= 0, process, 120)
        time.sleep(random.Random(3).uniform(0.0, 0.5))
        ranks = _children(process.pid)
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(10)
    assert len(ranks) == 2, ranks
    # Only the launcher was killed: its ranks must die with it, or they go on
    # training and checkpointing next to the restarted run.
    deadline = time.monotonic() + 10
    while any(map(_alive, ranks)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(map(_alive, ranks)), "ranks outlived the launcher"
    killed_at = load_latest(tmp_path / "ckpt")
    assert killed_at is not None
    assert killed_at[0]["step"] < len(sent)  # killed mid-run, not after it
    process = launch()
    code: int | None = None
    try:
        code = process.wait(120)
    except subprocess.TimeoutExpired:
        pass  # a hang: the assertion below shows the log
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)
    assert code == 0, (tmp_path / "daemon.log").read_text()[-3000:]
    records = applied_chain(tmp_path / "applied.jsonl", tmp_path / "ckpt")
    assert sorted(records) == sorted(sent)  # every record, exactly once
    final = load_latest(tmp_path / "ckpt")
    assert final is not None
    state = final[0]
    assert (state["sharding"], state["world_size"]) == ("model-parallel", 2)
    assert state["embedding_optimizer"] == "adagrad"
    assert state["param_checksums"][0] == state["param_checksums"][1]
    # Full, unsharded tensors under the unsharded names (any world size).
    name = "model.inner.inputs.sequence.ec.embeddings.t_seq_item_id.weight"
    assert state["model"][name].shape == (1000, 8)
    assert state["table_optimizer_state"][name].shape == (1000, 8)
    assert "resumed from" in (tmp_path / "daemon.log").read_text()


if __name__ == "__main__":
    worker(Path(sys.argv[1]))


@pytest.mark.parametrize("embedding_optimizer", ["adam", "adagrad"])
@pytest.mark.parametrize("name", ["gem", "gem_no_seq", "dlrm", "dcnv2"])
def test_a_step_scores_its_batch_as_an_eval_forward_before_it_would(
    name: str, embedding_optimizer: str
) -> None:
    """The daemon's progressive metrics come from the step's own forward:
    equal to scoring the batch in eval mode just before the step."""
    from trainer.distributed.replicated import Replicated
    from trainer.distributed.tables import OptimizerConfig
    from trainer.models.loss_wrapper import GEMTrain
    from trainer.models.registry import build_model
    from trainer.training.step import eval_step, scored

    torch.manual_seed(0)
    model = GEMTrain(build_model(name, "tiny"))
    strategy = Replicated(
        model, OptimizerConfig(embedding_optimizer=embedding_optimizer)
    )
    for start in (0, 40):  # the second step's weights are trained ones
        batch = _batch(start, 40)
        before = eval_step(model, batch)
        result = strategy.step(batch, batch.size, batch.size)
        assert result.logits is not None
        torch.testing.assert_close(scored(result.logits, batch).probs, before.probs)
