"""GEM under ``torch.compile``: one graph, no graph breaks, no recompiles.

Each batch has a different jagged total, and the pyramid's pooling and the
history truncation have data-dependent output sizes. Set up with
:func:`trainer.training.step.compile_model` and
:func:`trainer.training.step.mark_dynamic_batch`, dynamo must trace the whole
forward (TorchRec inputs included) into one graph and reuse it for every
batch. These checks run dynamo only (the traced graph runs eagerly), so they
take seconds; ``test_model_gem.test_torch_compile_smoke`` adds AOT autograd
(the backward graph) and ``GEM_SLOW_TESTS=1`` inductor.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import torch
from torch._dynamo.testing import CompileCounter

from tests.test_model_batches import random_batch
from trainer.models.loss_wrapper import GEMTrain
from trainer.models.registry import build_model
from trainer.ops import (
    Kernel,
    capture_jagged_sizes,
    jagged_last_k,
    jagged_local_attention,
    jagged_pool,
    jagged_softmax,
    jagged_to_padded_dense,
    jagged_truncate_last,
)
from trainer.training.step import compile_model, mark_dynamic_batch

# Histories of different totals; B is fixed, as in training. (A batch with
# fewer than 2 events in all compiles a second graph: dynamo assumes a
# dynamic size is at least 2, the "0/1 specialization".)
BATCH_LENGTHS = [
    [5, 0, 12, 3, 40, 1, 0, 7],
    [300, 2, 0, 0, 9, 64, 1, 1],
    [0, 0, 0, 0, 0, 2, 0, 0],
    [17, 17, 5, 0, 2, 130, 4, 33],
]


@pytest.fixture(autouse=True)
def fresh_dynamo() -> Iterator[None]:
    """Empty dynamo caches around each test; restore the scalar-capture flag."""
    saved = torch._dynamo.config.capture_scalar_outputs
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
    torch._dynamo.config.capture_scalar_outputs = saved


def test_gem_forward_has_no_graph_breaks() -> None:
    torch.manual_seed(0)
    model = GEMTrain(build_model("gem", "tiny"))
    capture_jagged_sizes()
    batch = mark_dynamic_batch(random_batch(BATCH_LENGTHS[0], seed=1))
    explained = torch._dynamo.explain(lambda b: model(b)[0])(batch)
    reasons = [r.reason.splitlines()[0] for r in explained.break_reasons]
    assert explained.graph_break_count == 0, reasons
    assert explained.graph_count == 1


def test_gem_train_steps_compile_once_and_match_eager() -> None:
    torch.manual_seed(0)
    model = GEMTrain(build_model("gem", "tiny"))
    counter = CompileCounter()
    compiled = compile_model(model, backend=counter)
    for i, lengths in enumerate(BATCH_LENGTHS):
        batch = mark_dynamic_batch(random_batch(lengths, seed=i))
        model.zero_grad(set_to_none=True)
        loss, _ = model(batch)
        loss.backward()
        expected = {n: p.grad.clone() for n, p in model.named_parameters()}
        model.zero_grad(set_to_none=True)
        got, _ = compiled(batch)
        got.backward()
        torch.testing.assert_close(got, loss, atol=1e-5, rtol=1e-5)
        for name, param in model.named_parameters():
            torch.testing.assert_close(
                param.grad, expected[name], atol=1e-5, rtol=1e-4, msg=name
            )
    # One frame, traced once: a graph break would add frames, a new total
    # that recompiled would trace it again.
    assert counter.frame_count == 1


def _ops(values: torch.Tensor, offsets: torch.Tensor) -> list[torch.Tensor]:
    pooled, pooled_offsets = jagged_pool(values, offsets, 3)
    truncated, truncated_offsets = jagged_truncate_last(values, offsets, 4)
    last, mask = jagged_last_k(values, offsets, 5)
    return [
        pooled,
        pooled_offsets,
        truncated,
        truncated_offsets,
        last,
        mask,
        jagged_to_padded_dense(values, offsets, 6),
        jagged_softmax(values, offsets, 32, Kernel.FBGEMM),
    ]


@pytest.mark.parametrize("fn", [_ops])
def test_data_dependent_ops_trace_in_one_graph(
    fn: Callable[[torch.Tensor, torch.Tensor], list[torch.Tensor]],
) -> None:
    capture_jagged_sizes()
    compiled = torch.compile(fn, backend="eager", fullgraph=True)
    for lengths in ([3, 0, 11, 1], [0, 0, 0, 0], [7, 7, 2, 0], [1, 20, 0, 5]):
        offsets = torch.tensor([0, *lengths]).cumsum(0)
        values = torch.randn(sum(lengths), 2)
        torch._dynamo.maybe_mark_dynamic(values, 0)
        for got, want in zip(
            compiled(values, offsets), fn(values, offsets), strict=True
        ):
            torch.testing.assert_close(got, want)


def test_local_attention_compiles_once_for_any_total() -> None:
    # Totals that are and are not multiples of the window, on a dynamic
    # (backed) input size, as benchmarks.gpu_check feeds the trunk: a zero
    # top-up of data-dependent size, empty for some totals, used to compile a
    # second graph (found on the H200).
    capture_jagged_sizes()
    counter = CompileCounter()
    compiled = torch.compile(jagged_local_attention, backend=counter)
    for lengths in ([5, 3, 0, 8], [7, 2, 1, 1], [4, 4, 4, 4], [1, 2, 3, 5]):
        offsets = torch.tensor([0, *lengths]).cumsum(0)
        q, k, v = torch.randn(3, sum(lengths), 2, 8).unbind(0)
        for t in (q, k, v):
            torch._dynamo.maybe_mark_dynamic(t, 0)
        torch.testing.assert_close(
            compiled(q, k, v, offsets, window=4),
            jagged_local_attention(q, k, v, offsets, window=4),
        )
    assert counter.frame_count == 1
