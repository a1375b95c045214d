"""Gradient accumulation with the same bytes for every micro-batch split (docs/exact-v1.md §5).

Contractions over the token axis (weight, bias, layer-norm and embedding gradients, the loss sum)
are computed per sequence: each sequence's partial is an exact value (block-quantised integers
summed exactly, one power-of-two scale). The partials are then folded in sequence order into a
float64 pair (hi, lo) by error-free transformations and rounded once to float32. A micro-batch
holds whole, consecutive sequences, so every split deposits the same partials in the same order
and the fold performs the same operations: identical bytes.

Use (the step code)::

    acc = ExactGradAccumulator(params)          # leaf tensors with requires_grad, canonical order
    for lo, hi in micro_batch_slices:
        with acc.micro_batch():
            logits = model(...inputs[lo:hi]...)
            loss = ops.cross_entropy(logits, targets[lo:hi], total_count=n_tokens_in_step)
            loss.backward()
    grads = acc.grads()                          # float32, one per param, in order
    loss = acc.loss()                            # float32 mean over the whole step

While a micro-batch is open, the exact ops' backward passes hand parameter-gradient partials to the
accumulator instead of returning them to autograd (so param.grad stays None); cross_entropy hands it
the per-sequence loss sums. A parameter used at several places (a tied embedding and head) gets one
fold per use site, numbered in the order the backward pass reaches them; grads() folds the sites'
(hi, lo) pairs in site order and rounds once. Without an open accumulator the same ops return the
rounded per-site gradient to autograd, which equals grads() for every parameter used once.

The fold is exact whenever each running total is representable as hi + lo (a 106-bit window);
`inexact_count` reports how many element updates were not, which in practice stays 0. Either way
the result is a fixed sequence of IEEE operations in sequence order, so splits cannot change it.
"""

from __future__ import annotations

import builtins
import contextlib
import threading

import torch

from oracle.exact import kernels
from oracle.exact.quant import F32, F64, ExactError, canon_nan, round_odd, two_sum

_state = threading.local()


def active() -> ExactGradAccumulator | None:
    """The accumulator whose micro-batch is open on this thread, if any."""
    return getattr(_state, "acc", None)


class Fold:
    """A running sum (hi, lo) of float64 tensors, added to in a fixed order."""

    def __init__(self, shape, device) -> None:
        self._shape, self._device = tuple(shape), device
        # None stands for +0 everywhere (the fold starts at (0, 0); after one value lo is still
        # +0): the words are allocated only when an operation needs them
        self._hi: torch.Tensor | None = None
        self._lo: torch.Tensor | None = None
        self.count = 0
        self._bad: list[torch.Tensor | int] = []

    def _zeros(self) -> torch.Tensor:
        return torch.zeros(self._shape, dtype=F64, device=self._device)

    @property
    def hi(self) -> torch.Tensor:
        if self._hi is None:
            self._hi = self._zeros()
        return self._hi

    @hi.setter
    def hi(self, value: torch.Tensor) -> None:
        self._hi = value

    @property
    def lo(self) -> torch.Tensor:
        if self._lo is None:
            self._lo = torch.zeros_like(self.hi)
        return self._lo

    @lo.setter
    def lo(self, value: torch.Tensor | None) -> None:
        self._lo = value

    def copy(self) -> Fold:
        """An independent Fold with the same words, count and inexact record."""
        f = Fold(self._shape, self._device)
        f._hi = None if self._hi is None else self._hi.clone()
        f._lo = None if self._lo is None else self._lo.clone()
        f.count, f._bad = self.count, list(self._bad)
        return f

    @property
    def inexact(self) -> int:
        """Element updates whose low-word addition was not exact (expected: 0)."""
        return int(builtins.sum(int(b) for b in self._bad))

    def add(self, v: torch.Tensor, rows: torch.Tensor | None = None) -> None:
        """Add the exact float64 value v (to the given rows only, if `rows` is set)."""
        if rows is not None:
            h, lo, bad = _fold_step(self.hi[rows], self.lo[rows], v)
            self.hi[rows] = h
            self.lo[rows] = lo
            self._bad.append(bad)
        elif self.count == 0:
            # the first step from (0, 0) is exactly (v + 0, +0): same bytes, no work
            self._hi = v + 0.0
            self._lo = None
        else:
            self.add_many(v.unsqueeze(0))
            return
        self.count += 1

    def add_many(self, values: torch.Tensor, owned: bool = False) -> None:
        """Add values[0], values[1], ... in that order (each param-shaped). `owned`: the caller
        hands `values` over (it is not used after), so a single value may become the fold's hi
        in place."""
        n = values.shape[0]
        if n == 0:
            return
        if self.count == 0 and owned and n == 1 and values.dtype == F64:
            self._hi = values[0].add_(0.0)  # as add(): (v + 0, +0), without a copy
            self._lo = None
            self.count = 1
            return
        if self.count == 0:
            self.add(values[0])
            values = values[1:]
            n -= 1
        if n == 0:
            return
        if kernels.enabled() and values.device.type == "cpu" and self.hi.is_contiguous():
            flat = values.reshape(n, -1).contiguous()
            self._bad.append(kernels.fold_into(self.hi.view(-1), self.lo.view(-1), flat))
        else:
            for b in range(n):
                self.hi, self.lo, bad = _fold_step(self.hi, self.lo, values[b])
                self._bad.append(bad)
        self.count += n

    def add_fold(self, other: Fold) -> None:
        self.add(other.hi)
        self.add(other.lo)
        self._bad.extend(other._bad)

    def result(self) -> torch.Tensor:
        """float32 of hi + lo, rounded once; canonical NaN."""
        if self.count <= 1:  # lo is zero: one conversion rounds hi
            if kernels.enabled() and self.hi.device.type == "cpu":
                return kernels.f64_to_f32(self.hi)
            return canon_nan(self.hi.to(F32))
        if kernels.enabled() and self.hi.device.type == "cpu":
            return kernels.fold_result(self.hi, self.lo)
        s, err = two_sum(self.hi, self.lo)
        s = torch.where(torch.isfinite(s), s, self.hi)
        err = torch.where(torch.isfinite(err), err, torch.zeros_like(err))
        return canon_nan(round_odd(s, err).to(F32))


def _fold_step(hi: torch.Tensor, lo: torch.Tensor, v: torch.Tensor):
    """The fold's definition (the CPU kernel kernels.fold_into performs the same operations)."""
    s, e = two_sum(hi, v)
    t, f = two_sum(lo, e)
    h2, l2 = two_sum(s, t)
    bad = torch.count_nonzero(torch.isfinite(f) & (f != 0))
    # non-finite totals follow IEEE: once hi is inf or NaN it stays so, with lo = 0
    fin = torch.isfinite(s)
    h2 = torch.where(fin, h2, s)
    l2 = torch.where(fin & torch.isfinite(l2), l2, torch.zeros_like(l2))
    return h2, l2, bad


def fold_rows(values: torch.Tensor) -> torch.Tensor:
    """float32 of the fold of values[0], values[1], ... (sequence order), rounded once."""
    f = Fold(values.shape[1:], values.device)
    f.add_many(values)
    return f.result()


class FoldState:
    """The folds of an accumulator after some leading sequences of a step: per use site
    (param index, site) and for the loss, (hi, lo, count, inexact) as Fold keeps them."""

    def __init__(self, sites: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor, int, int]],
                 loss: tuple[torch.Tensor, torch.Tensor, int, int] | None, loss_total) -> None:
        self.sites = sites
        self.loss = loss
        self.loss_total = loss_total


def _restored(hi: torch.Tensor, lo: torch.Tensor, count: int, bad: int) -> Fold:
    f = Fold(hi.shape, hi.device)
    f.hi, f.lo, f.count = hi.clone(), lo.clone(), int(count)
    f._bad = [int(bad)] if bad else []
    return f


class ExactGradAccumulator:
    """Collects exact per-sequence gradient partials across micro-batches; see the module doc."""

    def __init__(self, params, *, deferred: bool = False) -> None:
        self.params = list(params)
        for i, p in enumerate(self.params):
            if not isinstance(p, torch.Tensor) or p.dtype != F32:
                raise ExactError(f"param {i}: expected a float32 tensor, got "
                                 f"{getattr(p, 'dtype', type(p).__name__)}")
        self._index = {id(p): i for i, p in enumerate(self.params)}
        self._sites: dict[tuple[int, int], Fold] = {}
        self._seen: dict[int, int] = {}
        self._loss: Fold | None = None
        self._loss_total: float | None = None
        self._open = False
        # deferred: deposits are kept in order and folded only once continue_from() installs the
        # fold state of the sequences before ours (exact data parallelism, oracle.parallel)
        self._deferred = deferred
        self._pending: list[tuple[tuple[int, int] | None, object]] = []

    # --- micro-batches -----------------------------------------------------------------------
    @contextlib.contextmanager
    def micro_batch(self):
        """Open one micro-batch: run its forward and backward inside. Micro-batches must come in
        sequence order and hold whole sequences."""
        if active() is not None:
            raise ExactError("an ExactGradAccumulator micro-batch is already open on this thread")
        self._seen = {}
        _state.acc = self
        self._open = True
        try:
            yield self
        finally:
            _state.acc = None
            self._open = False

    def owns(self, t: torch.Tensor) -> bool:
        return id(t) in self._index

    def deposit(self, param: torch.Tensor, values: torch.Tensor) -> None:
        """Add the exact per-sequence partials values[b] (float64, param-shaped) for the next use
        site of `param`, in sequence order."""
        self.deposit_site(param, lambda fold: fold.add_many(values))

    def deposit_site(self, param: torch.Tensor, fill) -> None:
        """Call fill(fold) with the Fold of `param`'s next use site in this micro-batch."""
        i = self._index[id(param)]
        site = self._seen.get(i, 0)
        self._seen[i] = site + 1
        key = (i, site)
        if self._deferred:
            self._pending.append((key, fill))
            return
        fold = self._sites.get(key)
        if fold is None:
            fold = self._sites[key] = Fold(param.shape, param.device)
        fill(fold)

    def deposit_loss(self, per_sequence: torch.Tensor, total_count) -> None:
        """Per-sequence loss sums (float64 exact values) and the step's token count."""
        if self._deferred:
            if self._loss_total is None:
                self._loss_total = total_count
            elif self._loss_total != total_count:
                raise ExactError(f"cross_entropy total_count changed between micro-batches "
                                 f"({self._loss_total} then {total_count})")
            self._pending.append((None, lambda fold: fold.add_many(per_sequence)))
            return
        if self._loss is None:
            self._loss = Fold(per_sequence.shape[1:], per_sequence.device)
            self._loss_total = total_count
        elif self._loss_total != total_count:
            raise ExactError(f"cross_entropy total_count changed between micro-batches "
                             f"({self._loss_total} then {total_count})")
        self._loss.add_many(per_sequence)

    # --- the fold across ranks (oracle.parallel) ------------------------------------------------
    def fold_state(self) -> FoldState:
        """Every fold as it stands: what the next rank continues from."""
        if self._deferred:
            raise ExactError("a deferred accumulator has no fold state before continue_from()")
        sites = {k: (f.hi, f.lo, f.count, f.inexact) for k, f in sorted(self._sites.items())}
        loss = None if self._loss is None else (self._loss.hi, self._loss.lo, self._loss.count, self._loss.inexact)
        return FoldState(sites, loss, self._loss_total)

    def continue_from(self, state: FoldState) -> None:
        """Install the folds of the sequences before ours, then fold our deposits onto them in
        the order they came: the operations one process folding the whole batch performs."""
        if not self._deferred:
            raise ExactError("continue_from() needs an accumulator made with deferred=True")
        if self._loss_total is not None and state.loss_total is not None and self._loss_total != state.loss_total:
            raise ExactError(f"cross_entropy total_count differs between ranks ({state.loss_total} "
                             f"then {self._loss_total})")
        for (i, site), (hi, lo, count, bad) in state.sites.items():
            if not 0 <= i < len(self.params) or tuple(hi.shape) != tuple(self.params[i].shape):
                raise ExactError(f"fold state of param {i} site {site} has shape {tuple(hi.shape)}, "
                                 f"which this model does not have")
            self._sites[(i, site)] = _restored(hi, lo, count, bad)
        if state.loss is not None:
            self._loss = _restored(*state.loss)
            self._loss_total = state.loss_total if self._loss_total is None else self._loss_total
        self._deferred = False
        pending, self._pending = self._pending, []
        for key, fill in pending:
            if key is None:
                if self._loss is None:
                    self._loss = Fold((), self.params[0].device)
                fill(self._loss)
                continue
            fold = self._sites.get(key)
            if fold is None:
                fold = self._sites[key] = Fold(self.params[key[0]].shape, self.params[key[0]].device)
            fill(fold)

    # --- results -----------------------------------------------------------------------------
    @property
    def inexact_count(self) -> int:
        return sum(f.inexact for f in self._sites.values()) + (self._loss.inexact if self._loss else 0)

    def grads(self) -> list[torch.Tensor]:
        """float32 gradient of every param (zeros where none was deposited), each rounded once."""
        if self._deferred:
            raise ExactError("a deferred accumulator has no gradients before continue_from()")
        out = []
        for i, p in enumerate(self.params):
            if p.grad is not None:
                raise ExactError(f"param {i} (shape {tuple(p.shape)}) received a gradient outside the "
                                 f"exact ops; every use of a parameter must go through oracle.exact.ops")
            sites = sorted(k for k in self._sites if k[0] == i)
            if not sites:
                out.append(torch.zeros_like(p))
                continue
            if len(sites) == 1:  # one use site: its fold is the gradient
                out.append(self._sites[sites[0]].result())
                continue
            total = self._sites[sites[0]].copy()
            for k in sites[1:]:
                total.add_fold(self._sites[k])
            out.append(total.result())
        return out

    def loss(self) -> torch.Tensor:
        """float32 loss of the whole step: the folded per-sequence sums over total_count."""
        if self._deferred:
            raise ExactError("a deferred accumulator has no loss before continue_from()")
        if self._loss is None:
            raise ExactError("no cross_entropy loss was computed inside a micro-batch")
        s, err = two_sum(self._loss.hi, self._loss.lo)
        del err
        total = torch.full((), float(self._loss_total), dtype=F64, device=s.device)
        return canon_nan((s / total).to(F32))

