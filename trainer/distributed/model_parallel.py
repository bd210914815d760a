"""The model-parallel strategy: TorchRec shards the embedding tables.

TorchRec's ``DistributedModelParallel`` places each table of at least
``min_rows`` rows table-wise (``TABLE_WISE``, whole table on one rank,
greedily balanced by size) and runs the fused FBGEMM kernel, whose optimizer
is applied inside the backward; the small pooled tables are
``DATA_PARALLEL`` (replicated). The dense part (MLPs, attention, heads)
stays replicated: its gradients, and those of the data-parallel tables, are
all-reduced here, example-weighted, as in the replicated strategy. It is not
wrapped in DDP, because a rank without a batch must contribute a zero
gradient (see :meth:`ModelParallel.step`).

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

:meth:`ModelParallel.full_state` gathers every shard to full tensors on rank
0, so its checkpoints restore on any world size
(:mod:`trainer.distributed.sharding`).
"""

from __future__ import annotations

import copy
from typing import Any, Final

import torch
import torch.distributed as dist
from torch import nn

from trainer.data.batch import Batch
from trainer.distributed.strategy import (
    Sharding,
    Stepped,
    rank_and_size,
    weighted_allreduce,
)
from trainer.distributed.tables import (
    ADAGRAD_EPS,
    OptimizerConfig,
    check_optimizer,
    load_sum_state,
    named_sum_state,
    resolve_embedding_optimizer,
    table_modules,
    table_optimizer,
    table_parameter_names,
)
from trainer.models.loss_wrapper import GEMTrain
from trainer.training.optimizers import adam

# Tables with at least this many rows are model-parallel; the rest replicated.
DEFAULT_MIN_ROWS: Final = 1000


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
        _, world = rank_and_size()
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
        self.table_optimizer = table_optimizer(list(self._dp_tables.values()), config)
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
        weighted_allreduce(self._replicated, 1)
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

        rank, world = rank_and_size()
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
        sums = named_sum_state(
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
        check_optimizer(state, self.config.embedding_optimizer)
        self.optimizer.load_state_dict(state["optimizer"])
        sums = state.get("table_optimizer_state", {})
        if self.table_optimizer is not None:
            load_sum_state(self.table_optimizer, self._dp_tables, sums)
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
    rank, _ = rank_and_size()
    box: list[Any] = [batch if rank == lender else None]
    dist.broadcast_object_list(box, src=lender)
    return box[0]  # type: ignore[no-any-return]
