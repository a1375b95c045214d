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
    """A running sum (hi, lo) of float64 tensors, added to in a fixed order.

    Storage (an implementation choice; every form stands for the same (hi, lo) per element):

    * dense: `_hi`, `_lo` are full tensors, or None for +0 everywhere (the fold starts at (0, 0),
      and after one value lo is still +0, so the words are allocated only when needed);
    * row-sparse (a fold only ever added to by rows, the embedding's scatter): `_rows` holds the
      rows reached so far, sorted and distinct, `_rhi`/`_rlo` their words; every other row is
      (+0, +0). Each reached element sees exactly the fold steps the dense form performs;
    * dense hi with row-sparse lo (a dense site after a row-sparse one was folded into it):
      `_hi` full, `_rows`/`_rlo` the rows whose lo may be non-zero, lo +0 elsewhere.

    The `hi`/`lo` properties return the dense words, converting the fold to the dense form.

    Two facts about every reachable state (h, l) make the sparse forms exact (docs/exact-v1.md
    §5): neither word is ever −0, and adding +0 leaves (h, l) unchanged and is never inexact.
    * h ≠ −0: h is v + 0 (round to nearest: −0 + +0 = +0, x + 0 = x otherwise), or the TwoSum sum
      s + t where s = h + v; a sum is −0 only when both terms are −0, and h is not (induction).
      l ≠ −0: l is +0, or (s − (h2 − bb)) + (t − bb), whose first term is −0 only if s were.
    * Adding v = +0 to (h, l), h finite: s = h, e = (h − h) + (0 − 0) = +0, t = l, f = +0 (not
      inexact), h2 = fl(h + l) = h ((h, l) is a TwoSum pair, or l = +0), l2 = +0 + l = l; h non-
      finite: s = h, (h, +0) again (a NaN keeps being a NaN, and results are canonical NaNs).
    * So a row the sparse form never reached, (+0, +0), rounds to +0.0 as the dense zeros do; a
      dense fold gaining a row-sparse site's words changes only the rows that site reached; and a
      dense h with l = +0 rounds the same through `fold_result(h, +0)` as through
      `f64_to_f32(h)` (TwoSum(h, +0) = (h, +0), which needs h ≠ −0).
    """

    def __init__(self, shape, device) -> None:
        self._shape, self._device = tuple(shape), device
        self._hi: torch.Tensor | None = None
        self._lo: torch.Tensor | None = None
        self._rows: torch.Tensor | None = None
        self._rhi: torch.Tensor | None = None
        self._rlo: torch.Tensor | None = None
        self.count = 0
        self._bad: list[torch.Tensor | int] = []

    def _zeros(self) -> torch.Tensor:
        return torch.zeros(self._shape, dtype=F64, device=self._device)

    def _dense(self) -> None:
        """Convert to the dense form: the same words, stored in full."""
        if self._rows is None:
            return
        rows, self._rows = self._rows, None
        if self._hi is None:  # row-sparse
            self._hi = self._zeros()
            self._hi[rows] = self._rhi
        self._lo = self._zeros()
        self._lo[rows] = self._rlo
        self._rhi = self._rlo = None

    @property
    def _empty(self) -> bool:
        """Nothing stored yet: (+0, +0) everywhere, in no form."""
        return self._hi is None and self._lo is None and self._rows is None

    @property
    def sparse(self) -> bool:
        """True while the fold keeps only the rows its row additions reached."""
        return self._rows is not None and self._hi is None

    @property
    def hi(self) -> torch.Tensor:
        self._dense()
        if self._hi is None:
            self._hi = self._zeros()
        return self._hi

    @hi.setter
    def hi(self, value: torch.Tensor) -> None:
        self._dense()
        self._hi = value

    @property
    def lo(self) -> torch.Tensor:
        self._dense()
        if self._lo is None:
            self._lo = torch.zeros_like(self.hi)
        return self._lo

    @lo.setter
    def lo(self, value: torch.Tensor | None) -> None:
        self._dense()
        self._lo = value

    def copy(self) -> Fold:
        """An independent Fold with the same words, count and inexact record."""
        f = Fold(self._shape, self._device)
        for name in ("_hi", "_lo", "_rows", "_rhi", "_rlo"):
            t = getattr(self, name)
            setattr(f, name, None if t is None else t.clone())
        f.count, f._bad = self.count, list(self._bad)
        return f

    @property
    def inexact(self) -> int:
        """Element updates whose low-word addition was not exact (expected: 0)."""
        return int(builtins.sum(int(b) for b in self._bad))

    def _sparse_rows_ok(self, v: torch.Tensor, rows: torch.Tensor) -> bool:
        """Whether a row addition can stay row-sparse: a fold with nothing stored yet or already
        row-sparse, float64 values of shape [len(rows), *row], rows int64, distinct, increasing and
        in range (anything else takes the dense path, which defines what it does)."""
        if not (self.sparse or self._empty):
            return False
        if len(self._shape) < 1 or rows.dtype != torch.int64 or rows.dim() != 1:
            return False
        if v.dtype != F64 or tuple(v.shape) != (rows.shape[0], *self._shape[1:]):
            return False
        if v.device != rows.device or v.device != torch.device(self._device):
            return False
        if rows.numel() == 0:
            return True
        return bool((rows[1:] > rows[:-1]).all()) and int(rows[0]) >= 0 and int(rows[-1]) < self._shape[0]

    def _add_rows_sparse(self, v: torch.Tensor, rows: torch.Tensor) -> None:
        if self._rows is None:  # nothing reached yet: every row of `rows` is at (+0, +0)
            z = torch.zeros(v.shape, dtype=F64, device=v.device)
            self._rows = rows.clone()
            self._rhi, self._rlo, bad = _fold_step(z, z, v)
            self._bad.append(bad)
            return
        k = self._rows.shape[0]
        # union: sorted; inv: where each known row, then each of `rows`, sits in it
        union, inv = torch.unique(torch.cat([self._rows, rows]), sorted=True, return_inverse=True)
        if union.shape[0] != k:  # new rows join at (+0, +0)
            shape = (union.shape[0], *self._shape[1:])
            rhi = torch.zeros(shape, dtype=F64, device=v.device)
            rlo = torch.zeros(shape, dtype=F64, device=v.device)
            rhi[inv[:k]] = self._rhi
            rlo[inv[:k]] = self._rlo
            self._rows, self._rhi, self._rlo = union, rhi, rlo
        at = inv[k:]  # (when no row is new, union is the known rows)
        h, lo, bad = _fold_step(self._rhi[at], self._rlo[at], v)  # the dense path's operations
        self._rhi[at] = h
        self._rlo[at] = lo
        self._bad.append(bad)

    def add(self, v: torch.Tensor, rows: torch.Tensor | None = None) -> None:
        """Add the exact float64 value v (to the given rows only, if `rows` is set)."""
        if rows is not None:
            if self._sparse_rows_ok(v, rows):
                self._add_rows_sparse(v, rows)
            else:
                h, lo, bad = _fold_step(self.hi[rows], self.lo[rows], v)
                self.hi[rows] = h
                self.lo[rows] = lo
                self._bad.append(bad)
        elif self.count == 0 and self._rows is None:
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
        self._dense()
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
        """Add other's hi, then other's lo (each a whole param-shaped value, as add() does)."""
        if other._rows is not None and other._hi is not None:
            other._dense()  # dense hi, row-sparse lo: rare (a third site); no shortcut
        if other.sparse:
            rows = other._rows
            if self.sparse or self._empty:
                # row-sparse into row-sparse (or into nothing): the rows path's fold steps on the
                # rows other reached; every other element adds +0 twice, which changes nothing
                self.add(other._rhi, rows)
                self.add(other._rlo, rows)
            else:
                self._add_sparse_into_dense(other._rhi, other._rlo, rows)
        else:
            self.add(other.hi)
            if other._lo is None:  # adding +0 everywhere leaves every element as it is
                self.count += 1
            else:
                self.add(other._lo)
        self._bad.extend(other._bad)

    def _add_sparse_into_dense(self, vh: torch.Tensor, vl: torch.Tensor, rows: torch.Tensor) -> None:
        """Dense self += the row-sparse words (vh, vl) of `rows`: the fold steps of add(hi) and
        add(lo) on the elements of those rows; every other element adds +0 twice (no change)."""
        if self._rows is not None:
            self._dense()
        hi = self.hi
        h = hi[rows]
        lo = torch.zeros_like(h) if self._lo is None else self._lo[rows]
        h, lo, bad1 = _fold_step(h, lo, vh)
        h, lo, bad2 = _fold_step(h, lo, vl)
        hi[rows] = h
        if self._lo is None:  # lo stays +0 outside these rows
            self._rows, self._rlo = rows, lo
        else:
            self._lo[rows] = lo
        self._bad += [bad1, bad2]
        self.count += 2

    def result(self) -> torch.Tensor:
        """float32 of hi + lo, rounded once; canonical NaN."""
        if self._rows is not None:
            # row-sparse: unreached rows are (+0, +0) and round to +0.0. Dense hi with row-sparse
            # lo (count >= 2): where lo is +0, fold_result(h, +0) = f64_to_f32(h) (class doc).
            out = torch.zeros(self._shape, dtype=F32, device=self._device) if self._hi is None \
                else _round(self._hi, None)
            rhi = self._rhi if self._hi is None else self._hi[self._rows]
            out[self._rows] = _round(rhi, self._rlo if self.count > 1 else None)
            return out
        if self.count <= 1:  # lo is zero: one conversion rounds hi
            return _round(self.hi, None)
        return _round(self.hi, self.lo)


def _round(hi: torch.Tensor, lo: torch.Tensor | None) -> torch.Tensor:
    """float32 of hi + lo rounded once (§1.4), canonical NaN; lo None: hi alone (lo = +0)."""
    cpu = kernels.enabled() and hi.device.type == "cpu"
    if lo is None:
        return kernels.f64_to_f32(hi) if cpu else canon_nan(hi.to(F32))
    if cpu:
        return kernels.fold_result(hi, lo)
    s, err = two_sum(hi, lo)
    s = torch.where(torch.isfinite(s), s, hi)
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
        self._consumed = False  # grads(consume=True) released the folds
        self._released_inexact = 0  # their inexact counts

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
        if self._consumed:
            raise ExactError("grads(consume=True) released the folds already")
        sites = {k: (f.hi, f.lo, f.count, f.inexact) for k, f in sorted(self._sites.items())}
        loss = (
            None
            if self._loss is None
            else (self._loss.hi, self._loss.lo, self._loss.count, self._loss.inexact)
        )
        return FoldState(sites, loss, self._loss_total)

    def continue_from(self, state: FoldState) -> None:
        """Install the folds of the sequences before ours, then fold our deposits onto them in
        the order they came: the operations one process folding the whole batch performs."""
        if not self._deferred:
            raise ExactError("continue_from() needs an accumulator made with deferred=True")
        if (
            self._loss_total is not None
            and state.loss_total is not None
            and self._loss_total != state.loss_total
        ):
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
        return (sum(f.inexact for f in self._sites.values()) + self._released_inexact
                + (self._loss.inexact if self._loss else 0))

    def grads(self, consume: bool = False) -> list[torch.Tensor]:
        """float32 gradient of every param (zeros where none was deposited), each rounded once.
        `consume`: release each param's folds as soon as its gradient is rounded (the peak
        memory of the step drops by the folds' words); the accumulator then has no folds left
        (loss() and inexact_count still work, grads() and fold_state() refuse)."""
        if self._deferred:
            raise ExactError("a deferred accumulator has no gradients before continue_from()")
        if self._consumed:
            raise ExactError("grads(consume=True) released the folds already")
        for i, p in enumerate(self.params):
            if p.grad is not None:
                raise ExactError(f"param {i} (shape {tuple(p.shape)}) received a gradient outside the "
                                 f"exact ops; every use of a parameter must go through oracle.exact.ops")
        by_param: dict[int, list[tuple[int, int]]] = {}
        for k in sorted(self._sites):
            by_param.setdefault(k[0], []).append(k)
        out = []
        for i, p in enumerate(self.params):
            keys = by_param.get(i)
            if not keys:
                out.append(torch.zeros_like(p))
                continue
            if consume:
                folds = [self._sites.pop(k) for k in keys]
                self._released_inexact += builtins.sum(f.inexact for f in folds)
            else:
                folds = [self._sites[k] for k in keys]
            if len(folds) == 1:  # one use site: its fold is the gradient
                out.append(folds[0].result())
                continue
            # the sites in site order: site 0's words, then each later site's hi and lo
            total = folds[0] if consume else folds[0].copy()
            for f in folds[1:]:
                total.add_fold(f)
            out.append(total.result())
            del folds, total
        if consume:
            self._consumed = True
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

