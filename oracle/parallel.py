"""Exact data parallelism: one exact-v1 step's batch split over the ranks of a torch.distributed group.

Each rank runs forward and backward on its shard (whole, consecutive sequences of the scheduled
batch; shards may be unequal). The gradient folds then travel down the ranks in order: rank r
continues the fold state of sequences 0..lo_r-1 with its own per-sequence partials, which are the
operations one process folding the whole batch performs. The last rank rounds once and broadcasts
the float32 gradients and loss; every rank applies the same optimizer update. The new state is
byte-identical for every world size and to `oracle.step.step` in one process (docs/exact-v1.md §5.1).

gloo carries CPU tensors, NCCL CUDA tensors: the backend follows the state's device.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from oracle.profiles import ProfileError, split_rows

# header of one fold record sent between ranks: param index (-1 = the loss), site, count, inexact
_FIELDS = 4


@dataclass(frozen=True)
class Ranks:
    """This process's place in a data-parallel group (the default torch.distributed group)."""

    rank: int
    world: int
    local_rank: int = 0

    @property
    def leader(self) -> bool:
        """Rank 0: the one that commits, journals and serves."""
        return self.rank == 0

    @classmethod
    def from_env(cls, *, backend: str | None = None, timeout_s: float = 1800.0) -> Ranks | None:
        """The group torchrun describes in the environment (RANK, WORLD_SIZE, LOCAL_RANK,
        MASTER_ADDR, MASTER_PORT), joined on first use; None outside torchrun. The backend is
        NCCL when CUDA is available, else gloo, unless `backend` names one."""
        if "WORLD_SIZE" not in os.environ:
            return None
        try:
            world, rank = int(os.environ["WORLD_SIZE"]), int(os.environ.get("RANK", "0"))
            local = int(os.environ.get("LOCAL_RANK", "0"))
        except ValueError:
            raise ProfileError("WORLD_SIZE, RANK and LOCAL_RANK must be integers") from None
        if not 0 <= rank < world:
            raise ProfileError(f"RANK {rank} is outside 0..WORLD_SIZE-1 ({world})")
        if not dist.is_initialized():
            import datetime

            chosen = backend or ("nccl" if torch.cuda.is_available() else "gloo")
            if chosen == "nccl":
                torch.cuda.set_device(local)
            dist.init_process_group(chosen, timeout=datetime.timedelta(seconds=timeout_s))
        return cls(rank, world, local)

    @property
    def device(self) -> torch.device:
        """Where this rank's tensors live: its GPU under NCCL, else the CPU."""
        if dist.is_initialized() and dist.get_backend() == "nccl":
            return torch.device("cuda", self.local_rank)
        return torch.device("cpu")

    def barrier(self) -> None:
        if self.world > 1:
            dist.barrier()

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()


def shards(batch_size: int, world: int) -> list[tuple[int, int]]:
    """Each rank's rows [lo, hi) of the batch: contiguous, as even as possible (8 over 3 ranks: 3, 3, 2)."""
    if world > batch_size:
        raise ProfileError(
            f"{world} ranks cannot share a batch of {batch_size} sequences: each rank needs one"
        )
    return split_rows(batch_size, world)


def exact_grads(ranks: Ranks, model, params, inputs, targets, drop_for, micro_batches: int, ops=None):
    """(loss, gradients) of the whole batch under exact-v1, computed by all ranks together; every
    rank gets the same bytes. `micro_batches` splits each rank's shard further (at most its size).
    `ops` is the step's op namespace (oracle.exact.ops, or its bf16-mixed form); default the former."""
    from oracle.exact.accumulate import ExactGradAccumulator
    from oracle.exact.grads import leaves_of, run_micro_batches
    from oracle.exact.quant import ExactError

    lo, hi = shards(inputs.shape[0], ranks.world)[ranks.rank]
    mine = split_rows(hi - lo, min(micro_batches, hi - lo))
    names = list(params)
    leaves = leaves_of({n: params[n] for n in names})
    acc = ExactGradAccumulator([leaves[n] for n in names], deferred=ranks.rank > 0)

    def forward(lv, a, b):
        return model.forward(ops if ops is not None else _ops(), lv, inputs[a:b], drop_for(a))

    run_micro_batches(acc, forward, leaves, targets, [(lo + a, lo + b) for a, b in mine], rows=(lo, hi),
                      total_count=inputs.numel())
    device = inputs.device
    if ranks.rank > 0:
        acc.continue_from(_recv_state(ranks.rank - 1, [leaves[n] for n in names], device))
    last = ranks.world - 1
    if ranks.rank < last:
        _send_state(acc.fold_state(), ranks.rank + 1, device)
    if ranks.rank == last:
        loss = acc.loss()
        grads = acc.grads(consume=True)
        flat = torch.cat([g.reshape(-1) for g in grads] + [loss.reshape(1)])
    else:
        flat = torch.empty(sum(leaves[n].numel() for n in names) + 1, dtype=torch.float32, device=device)
    dist.broadcast(flat, src=last)
    out, at = [], 0
    for n in names:
        k = leaves[n].numel()
        out.append(flat[at:at + k].reshape(leaves[n].shape).clone())
        at += k
    if at + 1 != flat.numel():
        raise ExactError("broadcast gradient buffer has the wrong length")
    return flat[at].clone().reshape(()), out


def _ops():
    from oracle.exact import ops

    return ops


def _send_state(state, dst: int, device) -> None:
    records = [(i, site, c, b, hi, lo) for (i, site), (hi, lo, c, b) in state.sites.items()]
    if state.loss is not None:
        hi, lo, c, b = state.loss
        records.append((-1, 0, c, b, hi, lo))
    total = -1 if state.loss_total is None else int(state.loss_total)
    head = torch.tensor([len(records), total] + [v for r in records for v in r[:_FIELDS]], dtype=torch.int64)
    n = torch.tensor([head.numel()], dtype=torch.int64)
    dist.send(n.to(device), dst)
    dist.send(head.to(device), dst)
    for r in records:
        dist.send(r[4].contiguous(), dst)
        dist.send(r[5].contiguous(), dst)


def _recv_state(src: int, params: list[torch.Tensor], device):
    from oracle.exact.accumulate import FoldState
    from oracle.exact.quant import ExactError

    n = torch.empty(1, dtype=torch.int64, device=device)
    dist.recv(n, src)
    size = int(n.item())
    if size < 2 or (size - 2) % _FIELDS:
        raise ExactError(f"rank {src} sent a fold header of {size} values")
    head = torch.empty(size, dtype=torch.int64, device=device)
    dist.recv(head, src)
    h = head.cpu().tolist()
    count, total = h[0], h[1]
    sites: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor, int, int]] = {}
    loss = None
    for j in range(count):
        i, site, c, bad = h[2 + _FIELDS * j: 2 + _FIELDS * (j + 1)]
        if i >= len(params):
            raise ExactError(f"rank {src} sent the fold of param {i}; the model has {len(params)}")
        shape = () if i < 0 else params[i].shape
        hi = torch.empty(shape, dtype=torch.float64, device=device)
        lo = torch.empty(shape, dtype=torch.float64, device=device)
        dist.recv(hi, src)
        dist.recv(lo, src)
        if i < 0:
            loss = (hi, lo, c, bad)
        else:
            sites[(i, site)] = (hi, lo, c, bad)
    return FoldState(sites, loss, None if total < 0 else total)


def broadcast_state(ranks: Ranks, tensors: dict[str, torch.Tensor]) -> None:
    """In place: every rank's tensors become rank 0's (a resumed run's state), in the given order."""
    if ranks.world <= 1:
        return
    for t in tensors.values():
        if t.dtype == torch.uint64:  # not every backend carries uint64: move the bits as int64
            v = t.view(torch.int64)
            dist.broadcast(v, src=0)
        else:
            dist.broadcast(t, src=0)


def broadcast_object(ranks: Ranks, obj: Any) -> Any:
    """Rank 0's picklable value on every rank (small control values: the step to resume after)."""
    if ranks.world <= 1:
        return obj
    box = [obj if ranks.leader else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


__all__ = ["Ranks", "broadcast_object", "broadcast_state", "exact_grads", "shards"]
