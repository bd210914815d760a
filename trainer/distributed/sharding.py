"""Where the parameters live: replicated on every rank, or tables model-parallel.

Two strategies with one interface (:class:`Replicated`, :class:`ModelParallel`),
so the daemon's loop does not care which one runs:

- ``replicated``: every rank holds the whole model; each step all-reduces the
  example-weighted gradients of every parameter (the daemon's original data
  parallelism; one process needs no communication at all).
- ``model-parallel``: TorchRec's ``DistributedModelParallel`` shards the
  embedding tables. Tables of at least ``min_rows`` rows are placed table-wise
  (``TABLE_WISE``, whole table on one rank, greedily balanced by size) and run
  the fused FBGEMM kernel, whose optimizer is applied inside the backward; the
  small pooled tables are ``DATA_PARALLEL`` (replicated). The dense part
  (MLPs, attention, heads) stays replicated: its gradients, and those of the
  data-parallel tables, are all-reduced here, example-weighted, exactly as in
  ``replicated``. We do not wrap it in DDP, because a rank without a batch must
  contribute a zero gradient (see :meth:`ModelParallel.step`).

What runs on CPU (gloo), checked against torchrec 1.8.0 / fbgemm-gpu-cpu 1.8.0:
``TABLE_WISE`` with the ``FUSED`` kernel for both the pooled
``EmbeddingBagCollection`` and the sequence ``EmbeddingCollection``, with
different batch sizes per rank; ``DATA_PARALLEL`` for pooled tables only.
``ROW_WISE`` runs only while every rank has the same batch size: its backward
reduce-scatter falls back on gloo to an ``all_gather`` of equal-sized tensors
("ProcessGroupGloo::allgather: invalid tensor size"), and the daemon's ranks
see messages of any size. The sequence collection cannot be
``DATA_PARALLEL`` (or use the ``DENSE`` kernel) on CPU: fbgemm's CPU dense
kernel pools the rows even when asked not to, so every sequence table is
table-wise. The fused CPU kernel has no Adam, so in ``model-parallel`` the
tables train with (exact, element-wise) Adagrad or SGD; their update of a row
the batch did not touch is zero, which is also what ``torch.optim.Adagrad``
and ``SGD`` do with a dense zero gradient. That is why a model-parallel run
equals a replicated run with ``embedding_optimizer="adagrad"`` on the same
per-rank batches, to float tolerance (``tests/test_daemon_sharded.py``).

Checkpoints are world-size independent: :meth:`full_state` gathers every
sharded table and its optimizer state to full tensors on rank 0, under the
same names an unsharded model has; :meth:`load_full_state` copies each rank's
slice back. So a checkpoint restores on any world size, in either strategy
(when the table optimizers agree), and loads with ``weights_only=True``.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Final, Literal, NamedTuple, Protocol

import torch
import torch.distributed as dist
from torch import nn

from trainer.data.batch import Batch
from trainer.models.loss_wrapper import GEMTrain
from trainer.training.optimizers import adam
from trainer.training.step import train_step

log = logging.getLogger(__name__)

Sharding = Literal["replicated", "model-parallel"]
SHARDINGS: Final = ("replicated", "model-parallel")
EmbeddingOptimizer = Literal["adam", "adagrad", "sgd"]
EMBEDDING_OPTIMIZERS: Final = ("auto", "adam", "adagrad", "sgd")
# Tables with at least this many rows are model-parallel; the rest replicated.
DEFAULT_MIN_ROWS: Final = 1000
ADAGRAD_EPS: Final = 1e-8  # as Adam's; given to torch Adagrad and fbgemm alike


@dataclass(frozen=True, kw_only=True)
class OptimizerConfig:
    """Optimizers of one run.

    Args:
        lr: Adam learning rate of the dense parameters.
        embedding_optimizer: optimizer of the embedding tables; ``adam``
            means one Adam over everything (replicated only).
        embedding_lr: learning rate of the tables (``None``: ``lr``).
    """

    lr: float = 1e-3
    embedding_optimizer: EmbeddingOptimizer = "adam"
    embedding_lr: float | None = None

    @property
    def table_lr(self) -> float:
        """The tables' learning rate."""
        return self.lr if self.embedding_lr is None else self.embedding_lr


def resolve_embedding_optimizer(name: str, sharding: str) -> EmbeddingOptimizer:
    """``auto`` → ``adam`` when replicated (unchanged), ``adagrad`` when sharded.

    Example:
        >>> resolve_embedding_optimizer("auto", "model-parallel")
        'adagrad'
    """
    if name == "auto":
        return "adagrad" if sharding == "model-parallel" else "adam"
    if name == "adam" and sharding == "model-parallel":
        raise ValueError(
            "model-parallel tables train with fbgemm's fused optimizer, which "
            "has no Adam on CPU (and a lazy one, rows in the batch only, on "
            "GPU): use --embedding-optimizer adagrad or sgd"
        )
    if name not in EMBEDDING_OPTIMIZERS:
        raise ValueError(f"unknown embedding optimizer {name!r}")
    return name  # type: ignore[return-value]


def table_modules(model: nn.Module) -> Iterator[tuple[str, nn.Module]]:
    """(path, module) of every ``EmbeddingBagCollection`` / ``EmbeddingCollection``."""
    from torchrec.modules.embedding_modules import (
        EmbeddingBagCollection,
        EmbeddingCollection,
    )

    for name, module in model.named_modules():
        if isinstance(module, (EmbeddingBagCollection, EmbeddingCollection)):
            yield name, module


def table_parameter_names(model: nn.Module) -> set[str]:
    """Fully qualified names of every embedding-table weight of ``model``."""
    names = set()
    for path, module in table_modules(model):
        names |= {f"{path}.{n}" for n, _ in module.named_parameters()}
    return names


def _world() -> tuple[int, int]:
    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _weighted_allreduce(params: list[nn.Parameter], total_examples: int) -> None:
    """Σ_r (n_r g_r) / N over ranks, in place (rank r backpropagated n_r loss_r)."""
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    flat = torch.cat([p.grad.reshape(-1) for p in params])  # type: ignore[union-attr]
    if dist.is_initialized():
        dist.all_reduce(flat)  # sync point: every rank reaches it once per step
    flat /= total_examples
    # copy_, not vector_to_parameters: a data-parallel table's .grad is a view
    # into its batched kernel's gradient, and rebinding .data would not reach it.
    offset = 0
    for p in params:
        grad = p.grad
        assert grad is not None
        grad.copy_(flat[offset : offset + grad.numel()].view_as(grad))
        offset += grad.numel()


def _table_optimizer(
    params: list[nn.Parameter], config: OptimizerConfig
) -> torch.optim.Optimizer | None:
    if not params:
        return None
    if config.embedding_optimizer == "adagrad":
        return torch.optim.Adagrad(params, lr=config.table_lr, eps=ADAGRAD_EPS)
    return torch.optim.SGD(params, lr=config.table_lr)


def _named_sum_state(
    optimizer: torch.optim.Optimizer | None, names: dict[int, str]
) -> dict[str, torch.Tensor]:
    """Adagrad's ``sum`` per parameter name (SGD has no state)."""
    if optimizer is None:
        return {}
    return {
        names[id(p)]: state["sum"]
        for p, state in optimizer.state.items()
        if "sum" in state
    }


def _load_sum_state(
    optimizer: torch.optim.Optimizer | None,
    params: dict[str, nn.Parameter],
    sums: dict[str, torch.Tensor],
) -> None:
    if optimizer is None or not isinstance(optimizer, torch.optim.Adagrad):
        return
    for name, p in params.items():
        if name in sums:
            optimizer.state[p]["sum"].copy_(sums[name])


class Stepped(NamedTuple):
    """A step's loss and its forward's logits (B, NUM_DOMAINS, O), made
    before the update, detached; ``logits`` is None where no forward ran."""

    loss: torch.Tensor
    logits: torch.Tensor | None


class Strategy(Protocol):
    """What the daemon needs from a placement strategy."""

    model: nn.Module  # callable batch → (loss, outputs), on every rank
    sharding: Sharding

    def step(self, batch: Batch, examples: int, total_examples: int) -> Stepped:
        """One step; ``examples`` = 0 marks a rank without a batch."""
        ...

    def full_state(self) -> dict[str, Any]:
        """Model and optimizer state, unsharded (a collective; full on rank 0)."""
        ...

    def load_full_state(self, state: dict[str, Any]) -> None:
        """Restore from :meth:`full_state`'s output (every rank reads it)."""
        ...

    def replicated_parameters(self) -> list[nn.Parameter]:
        """Parameters every rank holds a copy of (to prove they are equal)."""
        ...

    def replicated_state(self) -> list[torch.Tensor]:
        """Tensors every rank holds a copy of (broadcast from rank 0 at start)."""
        ...


class Replicated:
    """Every rank holds everything (see the module docstring).

    Args:
        model: the model, already on its device.
        config: optimizers.
    """

    sharding: Sharding = "replicated"

    def __init__(self, model: GEMTrain, config: OptimizerConfig) -> None:
        self.model = model
        self.config = config
        self._names = {id(p): n for n, p in model.named_parameters()}
        if config.embedding_optimizer == "adam":
            # One Adam over everything: the daemon's original optimizer.
            self.optimizer = adam(model.parameters(), lr=config.lr)
            self.table_optimizer = None
            self._params = [p for p in model.parameters() if p.requires_grad]
            return
        tables = table_parameter_names(model)
        dense = [p for n, p in model.named_parameters() if n not in tables]
        self._tables = {n: p for n, p in model.named_parameters() if n in tables}
        self.optimizer = adam(dense, lr=config.lr)
        self.table_optimizer = _table_optimizer(list(self._tables.values()), config)
        self._params = [p for p in model.parameters() if p.requires_grad]

    def step(self, batch: Batch, examples: int, total_examples: int) -> Stepped:
        """Forward, backward, example-weighted all-reduce, optimizer steps."""
        single = not dist.is_initialized() or dist.get_world_size() == 1
        if single and self.table_optimizer is None:
            out = train_step(self.model, batch, self.optimizer)
            return Stepped(out.loss, out.logits)
        self.optimizer.zero_grad(set_to_none=False)
        if self.table_optimizer is not None:
            self.table_optimizer.zero_grad(set_to_none=False)
        loss, logits = torch.zeros(()), None
        if examples:
            self.model.train()
            loss, outputs = self.model(batch)
            logits = outputs.logits.detach()
            (loss * examples).backward()  # example-weighted: Σ_r n_r g_r / N
        _weighted_allreduce(self._params, total_examples)
        self.optimizer.step()
        if self.table_optimizer is not None:
            self.table_optimizer.step()
        return Stepped(loss.detach(), logits)

    def full_state(self) -> dict[str, Any]:
        """``model``, ``optimizer`` (Adam's own format) and the tables' state."""
        state: dict[str, Any] = {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "embedding_optimizer": self.config.embedding_optimizer,
        }
        if self.table_optimizer is not None:
            state["table_optimizer_state"] = _named_sum_state(
                self.table_optimizer, self._names
            )
        return state

    def load_full_state(self, state: dict[str, Any]) -> None:
        """Restore a checkpoint written by either strategy."""
        _check_optimizer(state, self.config.embedding_optimizer)
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.table_optimizer is not None:
            _load_sum_state(
                self.table_optimizer,
                self._tables,
                state.get("table_optimizer_state", {}),
            )

    def replicated_parameters(self) -> list[nn.Parameter]:
        """All of them."""
        return list(self.model.parameters())

    def replicated_state(self) -> list[torch.Tensor]:
        """The whole state dict."""
        return list(self.model.state_dict().values())


def _check_optimizer(state: dict[str, Any], expected: str) -> None:
    saved = state.get("embedding_optimizer", "adam")
    if saved != expected:
        raise ValueError(
            f"the checkpoint's tables were trained with {saved!r}, this run uses "
            f"{expected!r}: pass --embedding-optimizer {saved}"
        )


class _NoDataParallelWrapper:
    """DMP's hook to wrap the dense part (in DDP by default): we sync it ourselves."""

    def wrap(self, dmp: nn.Module, env: Any, device: torch.device) -> None:
        """Move to ``device`` as TorchRec's default wrapper does, without DDP."""
        dmp._dmp_wrapped_module.to(device)  # type: ignore[operator]


def sharding_plan(
    model: nn.Module,
    world_size: int,
    device_type: str,
    compute_kernel: str,
    min_rows: int = DEFAULT_MIN_ROWS,
) -> Any:
    """TorchRec ``ShardingPlan``: big tables table-wise, small pooled ones replicated.

    Each table of at least ``min_rows`` rows (and every sequence table) goes
    whole onto one rank, greedily: largest first, onto the rank with the
    fewest parameters so far (deterministic, so every rank computes the same
    plan).
    """
    from torchrec.distributed.sharding_plan import (
        construct_module_sharding_plan,
        data_parallel,
        table_wise,
    )
    from torchrec.distributed.types import ShardingPlan
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    load = [0] * world_size
    plan = {}
    for path, module in table_modules(model):
        pooled = isinstance(module, EmbeddingBagCollection)
        configs = (
            module.embedding_bag_configs() if pooled else module.embedding_configs()
        )
        per_table = {}
        # Sequence tables are always table-wise: see the module docstring.
        big = [c for c in configs if c.num_embeddings >= min_rows or not pooled]
        for table in sorted(
            big, key=lambda c: (-c.num_embeddings * c.embedding_dim, c.name)
        ):
            rank = min(range(world_size), key=lambda r: (load[r], r))
            load[rank] += table.num_embeddings * table.embedding_dim
            per_table[table.name] = table_wise(rank=rank, compute_kernel=compute_kernel)
        for table in configs:
            per_table.setdefault(table.name, data_parallel())
        plan[path] = construct_module_sharding_plan(
            module,
            per_table,
            local_size=world_size,
            world_size=world_size,
            device_type=device_type,
        )
    return ShardingPlan(plan)


def _fused_params(config: OptimizerConfig) -> dict[str, Any]:
    from fbgemm_gpu.split_embedding_configs import EmbOptimType

    if config.embedding_optimizer == "adagrad":
        return {
            "optimizer": EmbOptimType.EXACT_ADAGRAD,
            "learning_rate": config.table_lr,
            "eps": ADAGRAD_EPS,
        }
    return {"optimizer": EmbOptimType.EXACT_SGD, "learning_rate": config.table_lr}


def _local_shards(tensor: Any) -> list[tuple[list[int], torch.Tensor]]:
    """(offsets, local tensor) of a ShardedTensor's shards on this rank."""
    return [(list(s.metadata.shard_offsets), s.tensor) for s in tensor.local_shards()]


def _slice(full: torch.Tensor, offsets: list[int], shape: torch.Size) -> torch.Tensor:
    index = tuple(slice(o, o + n) for o, n in zip(offsets, shape, strict=True))
    return full[index]


class ModelParallel:
    """TorchRec model-parallel tables + replicated dense part (module docstring).

    Args:
        model: the unsharded model (on CPU or ``device``; its initial table
            weights are copied into the shards, so every run starts where a
            replicated one with the same seed starts).
        config: optimizers (``embedding_optimizer`` adagrad or sgd).
        device: this rank's device.
        min_rows: tables with fewer rows stay replicated (pooled ones only).
    """

    sharding: Sharding = "model-parallel"

    def __init__(
        self,
        model: GEMTrain,
        config: OptimizerConfig,
        device: torch.device,
        min_rows: int = DEFAULT_MIN_ROWS,
    ) -> None:
        from torchrec.distributed.comm_ops import set_gradient_division
        from torchrec.distributed.embedding import EmbeddingCollectionSharder
        from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
        from torchrec.distributed.model_parallel import DistributedModelParallel
        from torchrec.distributed.types import ShardingType

        resolve_embedding_optimizer(config.embedding_optimizer, self.sharding)
        # TorchRec's all-to-all backward divides the table gradients by the
        # world size by default (DDP's averaging); our losses are already
        # example-weighted (n_r / N), so the ranks' contributions must add up.
        set_gradient_division(False)
        self.config = config
        _, world = _world()
        initial = copy.deepcopy(model.state_dict())  # sharding re-initialises tables
        tables = table_parameter_names(model)  # before sharding replaces them
        fused = _fused_params(config)
        self.plan = sharding_plan(model, world, device.type, "fused", min_rows)
        self.model = DistributedModelParallel(
            model,
            device=device,
            plan=self.plan,
            sharders=[
                EmbeddingBagCollectionSharder(fused_params=fused),
                EmbeddingCollectionSharder(fused_params=fused),
            ],
            data_parallel_wrapper=_NoDataParallelWrapper(),  # type: ignore[arg-type]
        )
        # Which parameters each rank owns a piece of vs. holds a copy of.
        self._sharded_prefixes = {
            f"{path}.{kind}.{table}."
            for path, module_plan in self.plan.plan.items()
            for table, sharding in module_plan.items()
            for kind in ("embedding_bags", "embeddings")
            if sharding.sharding_type != ShardingType.DATA_PARALLEL.value
        }
        named = dict(self.model.named_parameters())
        self._replicated_names = [n for n in named if not self._is_sharded(n)]
        self._dp_tables = {n: named[n] for n in self._replicated_names if n in tables}
        dense = [named[n] for n in self._replicated_names if n not in tables]
        self.optimizer = adam(dense, lr=config.lr)
        self.table_optimizer = _table_optimizer(list(self._dp_tables.values()), config)
        self._replicated = [named[n] for n in self._replicated_names]
        self.load_full_state({"model": initial}, model_only=True)

    def _is_sharded(self, name: str) -> bool:
        return any(name.startswith(prefix) for prefix in self._sharded_prefixes)

    def step(self, batch: Batch, examples: int, total_examples: int) -> Stepped:
        """Every rank runs forward and backward (the table all-to-alls are
        collectives); a rank without a batch runs a borrowed one with weight 0.
        The sharded tables receive Σ_r (n_r/N) g_r through the all-to-all and
        update themselves in the backward; the replicated rest is all-reduced.
        """
        self.optimizer.zero_grad(set_to_none=False)
        if self.table_optimizer is not None:
            self.table_optimizer.zero_grad(set_to_none=False)
        self.model.train()
        loss, outputs = self.model(batch)
        logits = outputs.logits.detach()
        (loss * (examples / total_examples)).backward()
        _weighted_allreduce(self._replicated, 1)
        self.optimizer.step()
        if self.table_optimizer is not None:
            self.table_optimizer.step()
        return Stepped(loss.detach(), logits)

    def _fused_state(self) -> dict[str, Any]:
        """This rank's tables' fused Adagrad sums (ShardedTensors), by weight name.

        Each rank lists only the tables it holds a shard of.
        """
        state = self.model.fused_optimizer.state_dict()["state"]
        return {
            name: value
            for name, values in state.items()
            for key, value in values.items()
            if key.endswith("momentum1")  # exact Adagrad's running sum
        }

    def full_state(self) -> dict[str, Any]:
        """Gather shards to full tensors on rank 0 (every rank must call this).

        Each rank sends its local shards (name, offsets, tensor) once with
        ``gather_object``; rank 0 pastes them into full tensors. This works
        for any sharding type and for state only some ranks know about (the
        fused optimizer lists local tables only, so ``ShardedTensor.gather``,
        a collective over the same tensor on every rank, does not fit).
        """
        from torch.distributed._shard.sharded_tensor import ShardedTensor

        rank, world = _world()
        model = self.model.state_dict()
        pieces: list[tuple[str, str, list[int], list[int], torch.Tensor]] = []
        for key, value in model.items():
            if isinstance(value, ShardedTensor):
                for offsets, local in _local_shards(value):
                    pieces.append(
                        ("model", key, list(value.size()), offsets, local.cpu())
                    )
        for key, value in self._fused_state().items():
            for offsets, local in _local_shards(value):
                pieces.append(("sum", key, list(value.size()), offsets, local.cpu()))
        everyone: list[Any] = [None] * world if rank == 0 else []
        dist.gather_object(pieces, everyone if rank == 0 else None, dst=0)  # sync point
        if rank != 0:
            return {}
        full: dict[str, dict[str, torch.Tensor]] = {"model": {}, "sum": {}}
        for kind, key, size, offsets, local in (p for ps in everyone for p in ps):
            target = full[kind].setdefault(key, torch.zeros(size, dtype=local.dtype))
            _slice(target, offsets, local.shape).copy_(local)
        sums = _named_sum_state(
            self.table_optimizer, {id(p): n for n, p in self._dp_tables.items()}
        )
        sums = {k: v.detach().cpu().clone() for k, v in sums.items()}
        sums.update(full["sum"])
        return {
            "model": {
                k: full["model"].get(
                    k, v.detach().cpu() if isinstance(v, torch.Tensor) else v
                )
                for k, v in model.items()
            },
            "optimizer": self.optimizer.state_dict(),
            "embedding_optimizer": self.config.embedding_optimizer,
            "table_optimizer_state": sums,
        }

    def load_full_state(self, state: dict[str, Any], model_only: bool = False) -> None:
        """Copy each rank's slice of the full tensors in ``state`` into place."""
        from torch.distributed._shard.sharded_tensor import ShardedTensor

        full = state["model"]
        with torch.no_grad():
            for key, value in self.model.state_dict().items():
                if isinstance(value, ShardedTensor):
                    for offsets, local in _local_shards(value):
                        local.copy_(_slice(full[key], offsets, local.shape))
                else:
                    value.copy_(full[key])
        if model_only:
            return
        _check_optimizer(state, self.config.embedding_optimizer)
        self.optimizer.load_state_dict(state["optimizer"])
        sums = state.get("table_optimizer_state", {})
        if self.table_optimizer is not None:
            _load_sum_state(self.table_optimizer, self._dp_tables, sums)
        with torch.no_grad():
            for name, value in self._fused_state().items():
                for offsets, local in _local_shards(value):
                    local.copy_(_slice(sums[name], offsets, local.shape).view_as(local))

    def replicated_parameters(self) -> list[nn.Parameter]:
        """The dense part and the data-parallel tables."""
        return list(self._replicated)

    def replicated_state(self) -> list[torch.Tensor]:
        """The replicated parameters (views: a broadcast writes in place)."""
        return [p.detach() for p in self._replicated]


def borrow_batch(batch: Batch | None, lender: int) -> Batch:
    """Rank ``lender``'s batch on every rank (a collective: all ranks call it).

    A model-parallel rank without data still has to run the forward and
    backward (their all-to-alls are collectives); it runs a borrowed batch
    with weight 0. The daemon borrows once and keeps it.
    """
    rank, _ = _world()
    box: list[Any] = [batch if rank == lender else None]
    dist.broadcast_object_list(box, src=lender)
    return box[0]  # type: ignore[no-any-return]


def build_strategy(
    model: GEMTrain,
    sharding: str,
    config: OptimizerConfig,
    device: torch.device,
    min_rows: int = DEFAULT_MIN_ROWS,
) -> Replicated | ModelParallel:
    """The strategy called ``sharding`` (``replicated`` or ``model-parallel``)."""
    if sharding == "replicated":
        return Replicated(model.to(device), config)
    if sharding == "model-parallel":
        return ModelParallel(model, config, device, min_rows)
    raise ValueError(f"unknown sharding {sharding!r}; choose from {SHARDINGS}")
