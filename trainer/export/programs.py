"""Trained models as ``torch.export`` programs over the flat serving inputs.

A model consumes a :class:`~trainer.data.batch.Batch`, which ``torch.export``
cannot take as an input; the programs here take the flat tensors of
:mod:`features.model_inputs` instead and build the batch inside, so the
exported graph starts from plain tensors. Exported non-strict, with the
candidates ``B`` and history events ``N`` dynamic: one program serves any
request size. (``docs/decisions/0034-serving-artifacts.md`` has the
measurements behind ``torch.export`` over TorchScript.)

- :class:`GemProgram`: a ``trainer.fit`` model (GEM or a baseline, with its
  base-rate offsets): ``(probabilities (B, O) of each candidate's own domain,
  summary embedding (B, E))``; ``E`` is 0 for models without GEM's heads.
- :class:`StudentProgram`: a vertical student's serving head:
  ``probabilities (B, O)``; a student that reads the teacher's embedding
  takes it as a sixth input.
"""

from __future__ import annotations

import io
from typing import Final

import torch
import torch.fx.experimental._config as fx_config
from torch import nn
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from features.model_inputs import DENSE_NAMES, SEQUENCE_NAMES, SPARSE_NAMES, TABLE_ROWS
from features.vocab import DOMAINS, TRAINING_OBJECTIVES
from trainer.data.batch import Batch
from trainer.distill.student import VerticalStudent

_F: Final = len(SPARSE_NAMES)
_S: Final = len(SEQUENCE_NAMES)
# Export's bounds on the dynamic sizes: candidates per request, history events.
MAX_CANDIDATES: Final = 4096
MAX_EVENTS: Final = MAX_CANDIDATES * 8192


def flat_batch(
    sparse: torch.Tensor,
    seq_values: torch.Tensor,
    seq_lengths: torch.Tensor,
    dense: torch.Tensor,
    domain: torch.Tensor,
) -> Batch:
    """The batch the flat inputs describe (labels zero: never read in eval)."""
    rows = dense.shape[0]
    return Batch(
        sparse=KeyedJaggedTensor(
            keys=list(SPARSE_NAMES),
            values=sparse.reshape(-1),
            lengths=torch.ones(_F * rows, dtype=torch.int32),
        ),
        sequence=KeyedJaggedTensor(
            keys=list(SEQUENCE_NAMES),
            values=seq_values.reshape(-1),
            lengths=seq_lengths.repeat(_S),
        ),
        dense=dense,
        labels=torch.zeros(rows, len(TRAINING_OBJECTIVES)),
        domain=domain,
    )


def with_guard_row(
    sparse: torch.Tensor,
    seq_values: torch.Tensor,
    seq_lengths: torch.Tensor,
    dense: torch.Tensor,
    domain: torch.Tensor,
) -> tuple[torch.Tensor, ...]:
    """The inputs plus one last candidate with a history of two events.

    Keeps every sequence key's event count at 2 or more, as at trace time,
    so no size guard of the traced graph meets a 0 or a 1 (export also runs
    size-oblivious, :func:`export_program`); the row is dropped from the
    output, and candidates never see each other, so it changes no other row.
    """
    events = torch.ones(_S, 2, dtype=seq_values.dtype)
    return (
        torch.cat([sparse, sparse[:, :1]], dim=1),
        torch.cat([seq_values, events], dim=1),
        torch.cat([seq_lengths, seq_lengths.new_full((1,), 2)]),
        torch.cat([dense, dense[:1]]),
        torch.cat([domain, domain[:1]]),
    )


class GemProgram(nn.Module):
    """A ``trainer.fit`` model (``BaseRateOffset``-wrapped) over flat inputs.

    The summary embedding is the input of GEM's heads, captured with a
    forward hook as the teacher-output job captures it. One guard row rides
    along with every call (:func:`with_guard_row`).
    """

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model
        self._captured: list[torch.Tensor] = []
        heads = getattr(getattr(model, "inner", model), "heads", None)
        self.embedding_dim = 0
        if isinstance(heads, nn.Module):
            heads.register_forward_hook(
                lambda _m, inputs, _out: self._captured.append(inputs[0])
            )
            self.embedding_dim = -1  # known after the first forward

    def forward(
        self,
        sparse: torch.Tensor,
        seq_values: torch.Tensor,
        seq_lengths: torch.Tensor,
        dense: torch.Tensor,
        domain: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        self._captured.clear()
        rows = dense.shape[0]
        guarded = with_guard_row(sparse, seq_values, seq_lengths, dense, domain)
        logits = self.model(flat_batch(*guarded))[:rows]
        index = domain.view(-1, 1, 1).expand(-1, 1, logits.shape[2])
        probabilities = torch.sigmoid(logits.gather(1, index).squeeze(1))
        if self._captured:
            embedding = self._captured[0][:rows]
        else:
            embedding = dense.new_zeros(rows, 0)
        return probabilities, embedding


class StudentProgram(nn.Module):
    """A vertical student's serving head over flat inputs."""

    def __init__(self, student: VerticalStudent) -> None:
        super().__init__()
        self.student = student

    def forward(
        self,
        sparse: torch.Tensor,
        seq_values: torch.Tensor,
        seq_lengths: torch.Tensor,
        dense: torch.Tensor,
        domain: torch.Tensor,
        teacher_embedding: torch.Tensor | None = None,
    ) -> torch.Tensor:
        batch = flat_batch(sparse, seq_values, seq_lengths, dense, domain)
        return torch.sigmoid(self.student(batch, teacher_embedding).serving)


def example_inputs(max_seq_len: int, rows: int = 3) -> tuple[torch.Tensor, ...]:
    """Flat inputs of ``rows`` candidates with ids in range, histories of
    different lengths (one full window, one empty) for tracing."""
    generator = torch.Generator().manual_seed(0)
    lengths = torch.tensor([max_seq_len, 0, *([3] * (rows - 2))], dtype=torch.int64)
    events = int(lengths.sum())
    sparse = torch.stack(
        [
            torch.randint(1, TABLE_ROWS[n], (rows,), generator=generator)
            for n in SPARSE_NAMES
        ]
    )
    sparse[SPARSE_NAMES.index("domain")] = 1
    seq = torch.stack(
        [
            torch.randint(1, TABLE_ROWS[n], (events,), generator=generator)
            for n in SEQUENCE_NAMES
        ]
    )
    dense = torch.rand(rows, len(DENSE_NAMES), generator=generator)
    domain = torch.zeros(rows, dtype=torch.int64)
    return sparse, seq, lengths, dense, domain


def export_program(
    program: nn.Module, inputs: tuple[torch.Tensor, ...]
) -> torch.export.ExportedProgram:
    """``torch.export`` (non-strict) with ``B`` and ``N`` dynamic."""
    rows = torch.export.Dim("candidates", min=1, max=MAX_CANDIDATES)
    events = torch.export.Dim("events", min=0, max=MAX_EVENTS)
    shapes: list[dict[int, torch.export.Dim]] = [
        {1: rows},
        {1: events},
        {0: rows},
        {0: rows},
        {0: rows},
    ]
    shapes += [{0: rows}] * (len(inputs) - 5)
    program.eval()
    # Size-oblivious: a request may hold 0 or 1 candidate events, which a
    # traced size is otherwise assumed not to be.
    with torch.no_grad(), fx_config.patch(backed_size_oblivious=True):
        return torch.export.export(
            program, inputs, dynamic_shapes=tuple(shapes), strict=False
        )


def program_bytes(exported: torch.export.ExportedProgram) -> bytes:
    """The ``.pt2`` file of an exported program."""
    buffer = io.BytesIO()
    torch.export.save(exported, buffer)
    return buffer.getvalue()


def domain_index(domain: str) -> int:
    """0-based index of a domain (the flat ``domain`` input)."""
    return DOMAINS.index(domain)
