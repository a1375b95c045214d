"""The accumulator's storage changes none of its bytes: row-sparse embedding folds, sites combined
without copies, grads(consume=True), and leaves that share the parameters' storage.

Checked against a plain dense fold written here (both words stored in full from the first
deposit, every addition one eager fold step: the definition of docs/exact-v1.md §5), against the
same code with the row-sparse form switched off, and against the state digests of 3-step walks
recorded with the dense code (before the sparse forms existed).
"""

from __future__ import annotations

import math

import pytest
import torch

from commitments.spec import Spec
from oracle.exact import ExactError, ExactGradAccumulator, kernels, ops
from oracle.exact.accumulate import Fold
from oracle.exact.grads import micro_batch_grads
from oracle.step import init_state, step
from tests.oracle.test_exact_accumulate import B, _data, _forward, _params
from tests.oracle.vectors.edge import bits

pytestmark = pytest.mark.usefixtures("single_thread")

F32, F64 = torch.float32, torch.float64


# --- the dense reference ---------------------------------------------------------------------


def _two_sum(a, b):
    s = a + b
    bb = s - a
    return s, (a - (s - bb)) + (b - bb)


class DenseFold:
    """The fold of §5 with both words stored in full, eager torch throughout."""

    def __init__(self, shape):
        self.hi = torch.zeros(shape, dtype=F64)
        self.lo = torch.zeros(shape, dtype=F64)
        self.count = 0
        self.inexact = 0

    def _step(self, hi, lo, v):
        s, e = _two_sum(hi, v)
        t, f = _two_sum(lo, e)
        h2, l2 = _two_sum(s, t)
        self.inexact += int((torch.isfinite(f) & (f != 0)).sum())
        fin = torch.isfinite(s)
        return torch.where(fin, h2, s), torch.where(fin & torch.isfinite(l2), l2, torch.zeros_like(l2))

    def add(self, v, rows=None):
        if rows is not None:
            h, lo = self._step(self.hi[rows], self.lo[rows], v)
            self.hi[rows] = h
            self.lo[rows] = lo
        elif self.count == 0:
            self.hi = v + 0.0
        else:
            self.hi, self.lo = self._step(self.hi, self.lo, v)
        self.count += 1

    def add_fold(self, other):
        self.add(other.hi)
        self.add(other.lo)
        self.inexact += other.inexact

    def result(self):
        if self.count <= 1:
            out = self.hi.to(F32)
        else:
            s, err = _two_sum(self.hi, self.lo)
            s = torch.where(torch.isfinite(s), s, self.hi)
            err = torch.where(torch.isfinite(err), err, torch.zeros_like(err))
            b = s.view(torch.int64)
            fix = (err != 0) & (b % 2 == 0) & torch.isfinite(s)
            step_ = torch.where((s > 0) == (err > 0), 1, -1)
            out = torch.where(fix, b + step_, b).view(F64).to(F32)
        return torch.where(torch.isnan(out), torch.full_like(out, math.nan), out)


def _ref_combine(sites):
    total = sites[0]
    for s in sites[1:]:
        total.add_fold(s)
    return total.result(), total.inexact


# --- deposits with edge values ---------------------------------------------------------------

V, C = 40, 6


def _values(g, shape, specials=True):
    """float64 values over a wide exponent range (some folds become inexact), with -0, +0, ±inf,
    NaN and subnormals sprinkled in."""
    v = torch.randn(shape, generator=g, dtype=F64) * torch.exp(
        torch.randn(shape, generator=g, dtype=F64) * 30
    )
    if specials:
        flat = v.view(-1)
        pick = torch.randint(0, flat.numel(), (max(1, flat.numel() // 6),), generator=g)
        menu = torch.tensor([-0.0, 0.0, -0.0, math.inf, -math.inf, math.nan, 5e-324, -5e-324, 1e308, -1e308],
                            dtype=F64)
        flat[pick] = menu[torch.randint(0, menu.numel(), pick.shape, generator=g)]
    return v


def _rows(g, n_max=12, vocab=V):
    ids = torch.randint(0, vocab, (int(torch.randint(1, n_max + 1, (), generator=g)),), generator=g)
    return torch.unique(ids, sorted=True)  # what the embedding's backward passes


def _site_deposits(g, kind, n, specials=True):
    """n deposits of one site: 'rows' (embedding-like) or 'dense' (param-shaped partials)."""
    out = []
    for _ in range(n):
        if kind == "rows":
            r = _rows(g)
            out.append((_values(g, (r.numel(), C), specials), r))
        else:
            out.append((_values(g, (V, C), specials), None))
    return out


def _fill(deps, owned=False):
    def fill(fold):
        for v, r in deps:
            if r is None:
                fold.add_many(v.clone().unsqueeze(0), owned=owned)
            else:
                fold.add(v.clone(), r)
    return fill


def _accumulate(site_deps, consume, owned=False):
    w = torch.zeros(V, C, requires_grad=True)
    acc = ExactGradAccumulator([w])
    with acc.micro_batch():
        for deps in site_deps:
            acc.deposit_site(w, _fill(deps, owned))
    sparse = [acc._sites[(0, k)].sparse for k in range(len(site_deps))]
    n_bad = acc.inexact_count
    g = acc.grads(consume=consume)[0]
    assert acc.inexact_count == n_bad  # consuming keeps the count
    return g, n_bad, sparse, acc


def _reference(site_deps):
    sites, n_bad = [], 0
    for deps in site_deps:
        f = DenseFold((V, C))
        for v, r in deps:
            f.add(v, r)
        sites.append(f)
        n_bad += f.inexact
    out, _ = _ref_combine(sites)
    return out, n_bad


SITE_PLANS = [
    ("rows",), ("rows", "rows"), ("dense", "rows"), ("rows", "dense"), ("dense", "rows", "rows"),
    ("rows", "dense", "rows"), ("dense", "dense"), ("dense",), ("rows", "rows", "dense"),
]


@pytest.mark.parametrize("use_kernels", [True, False], ids=["kernels", "eager"])
@pytest.mark.parametrize("consume", [False, True])
@pytest.mark.parametrize("plan", SITE_PLANS, ids=["-".join(p) for p in SITE_PLANS])
def test_sites_equal_the_dense_fold(plan, consume, use_kernels):
    for seed in range(4):
        g = torch.Generator().manual_seed(1000 * len(plan) + seed)
        site_deps = [_site_deposits(g, kind, int(torch.randint(1, 4, (), generator=g)), specials=seed != 0)
                     for kind in plan]
        with (_null() if use_kernels else kernels.disabled()):
            got, n_bad, sparse, _ = _accumulate(site_deps, consume, owned=seed % 2 == 1)
        ref, ref_bad = _reference(site_deps)
        assert torch.equal(bits(got), bits(ref)), (plan, seed)
        assert n_bad == ref_bad
        assert sparse == [kind == "rows" for kind in plan]  # the row-sparse form did run
        # the combined words themselves, not only their rounding (lo rarely decides a float32)
        with (_null() if use_kernels else kernels.disabled()):
            folds = []
            for deps in site_deps:
                f = Fold((V, C), "cpu")
                _fill(deps)(f)
                folds.append(f)
            total = folds[0]
            for f in folds[1:]:
                total.add_fold(f)
        ref_total = _reference_folds(site_deps)
        _same_words(total, ref_total)
        assert total.count == ref_total.count and total.inexact == ref_total.inexact


def _reference_folds(site_deps):
    sites = []
    for deps in site_deps:
        f = DenseFold((V, C))
        for v, r in deps:
            f.add(v, r)
        sites.append(f)
    for s in sites[1:]:
        sites[0].add_fold(s)
    return sites[0]


def _same_words(fold, ref):
    """Equal (hi, lo) words; NaN payloads aside (kernel and eager may propagate different ones,
    and every result is the canonical NaN)."""
    hi, lo = fold.hi, fold.lo
    nan = torch.isnan(hi)
    assert torch.equal(nan, torch.isnan(ref.hi))
    assert torch.equal(hi.view(torch.int64)[~nan], ref.hi.view(torch.int64)[~nan])
    assert torch.equal(lo.view(torch.int64), ref.lo.view(torch.int64))


def test_inexact_folds_count_the_same():
    # totals spanning far more than the 106 bits of hi + lo: the fold drops low bits (f != 0)
    g = torch.Generator().manual_seed(3)
    rows = torch.arange(0, V, 3)
    deps = [
        (torch.full((rows.numel(), C), (-1.0) ** k * 2.0**k, dtype=F64), rows)
        for k in (0, 80, -60, 150, -100)
    ]
    deps.append((_values(g, (rows.numel(), C), False), rows))
    for site_deps in ([_site_deposits(g, "dense", 2), deps], [deps], [deps, deps]):
        got, n_bad, _, _ = _accumulate(site_deps, consume=True)
        ref, ref_bad = _reference(site_deps)
        assert torch.equal(bits(got), bits(ref))
        assert n_bad == ref_bad and n_bad > 0


def test_the_low_word_of_a_row_sparse_site_decides_a_tie():
    # dense site 1.0; row site 2^-24 then 2^-80 on rows 1, 3: 1 + 2^-24 alone is a float32 tie
    # (to even: 1.0), the low word 2^-80 carries it up to 1 + 2^-23; rows 0 and 2 have -2^-80
    rows = torch.tensor([0, 1, 2, 3])
    sign = torch.tensor([-1.0, 1.0, -1.0, 1.0], dtype=F64).unsqueeze(1).expand(4, C)
    deps = [(torch.full((4, C), 2.0**-24, dtype=F64), rows), (sign * 2.0**-80, rows)]
    for use in (True, False):
        with (_null() if use else kernels.disabled()):
            got, _, sparse, _ = _accumulate([[(torch.ones(V, C, dtype=F64), None)], deps], consume=True)
        ref, _ = _reference([[(torch.ones(V, C, dtype=F64), None)], deps])
        assert torch.equal(bits(got), bits(ref)) and sparse == [False, True]
        assert got[1, 0].item() == 1 + 2.0**-23 and got[0, 0].item() == 1.0 and got[4, 0].item() == 1.0


def test_negative_zeros_and_untouched_rows_round_to_plus_zero():
    rows = torch.tensor([1, 4, 7])
    negz = torch.full((3, C), -0.0, dtype=F64)
    for plan in (("rows",), ("dense", "rows"), ("rows", "rows")):
        site_deps = [
            [(torch.full((V, C), -0.0, dtype=F64), None)] if k == "dense" else [(negz, rows), (negz, rows)]
            for k in plan
        ]
        got, _, _, _ = _accumulate(site_deps, consume=True)
        ref, _ = _reference(site_deps)
        assert torch.equal(bits(got), bits(ref))
        assert bool((bits(got) == 0).all())  # +0.0 everywhere, reached rows and the others


def test_nan_and_inf_deposits_follow_the_dense_fold():
    rows = torch.tensor([0, 2, 3, V - 1])
    a = torch.tensor([[math.inf, -math.inf, math.nan, 1.0, -1.0, 0.0]] * 4, dtype=F64)
    b = torch.tensor([[1.0, math.inf, 2.0, math.inf, -math.inf, math.nan]] * 4, dtype=F64)
    head = torch.full((V, C), 3.0, dtype=F64)
    head[2, 0] = -math.inf
    for site_deps in ([[(a, rows), (b, rows)]], [[(head, None)], [(a, rows), (b[:2], rows[:2])]]):
        got, _, _, _ = _accumulate(site_deps, consume=False)
        ref, _ = _reference(site_deps)
        assert torch.equal(bits(got), bits(ref))
        assert bool(torch.isnan(got).any()) and bool(torch.isinf(got).any())


def test_row_additions_outside_the_sparse_form_take_the_dense_path():
    # repeated, unsorted or negative rows: the dense path (which defines them) runs, same bytes
    g = torch.Generator().manual_seed(9)
    for rows in (torch.tensor([3, 1, 2]), torch.tensor([2, -1, 5]), torch.tensor([], dtype=torch.int64)):
        v = _values(g, (rows.numel(), C), False)
        f = Fold((V, C), "cpu")
        f.add(v, rows)
        f.add(v, rows)
        ref = DenseFold((V, C))
        ref.add(v, rows)
        ref.add(v, rows)
        assert torch.equal(bits(f.result()), bits(ref.result()))
    f = Fold((V, C), "cpu")
    f.add(_values(g, (2, C)), torch.tensor([4, 9]))
    assert f.sparse
    hi, lo = f.hi, f.lo  # the dense words on demand
    assert (
        not f.sparse
        and hi.shape == (V, C)
        and bool((hi[[0, 1, 2, 3, 5]] == 0).all())
        and bool((lo == 0).all())
    )


def test_consumed_accumulator_refuses_a_second_look():
    g = torch.Generator().manual_seed(4)
    _, _, _, acc = _accumulate([_site_deposits(g, "dense", 2), _site_deposits(g, "rows", 2)], consume=True)
    assert acc._sites == {}
    with pytest.raises(ExactError, match="released"):
        acc.grads()
    with pytest.raises(ExactError, match="released"):
        acc.fold_state()


# --- whole models --------------------------------------------------------------------------------


def _null():
    import contextlib

    return contextlib.nullcontext()


def _dense_only(monkeypatch):
    monkeypatch.setattr(Fold, "_sparse_rows_ok", lambda self, v, rows: False)


@pytest.mark.parametrize("variant", ["single", "hilo"])
@pytest.mark.parametrize("tied", [True, False])
def test_model_gradients_equal_the_dense_path_for_every_split(variant, tied, monkeypatch):
    P = _params(11, tied)
    idx, tgt, mask = _data(12)
    idx[1] = idx[1, 0]  # a sequence of one repeated id
    idx[2, ::2] = idx[3, 1]  # ids shared across sequences

    def fwd(leaves, lo, hi):
        return _forward(leaves, idx[lo:hi], variant, mask[lo:hi])

    splits = {1: [(0, B)], 2: [(0, 4), (4, B)], 4: [(0, 2), (2, 4), (4, 6), (6, B)]}
    runs = {}
    for use in (True, False):
        with (_null() if use else kernels.disabled()):
            for m, sl in splits.items():
                runs[(use, m, "sparse")] = micro_batch_grads(fwd, P, tgt, sl)
    _dense_only(monkeypatch)
    runs["dense"] = micro_batch_grads(fwd, P, tgt, splits[1])
    loss0, g0 = runs["dense"]
    for key, (loss, grads) in runs.items():
        assert bits(loss) == bits(loss0), key
        for a, b in zip(grads, g0, strict=True):
            assert torch.equal(bits(a), bits(b)), key
    assert all(p.grad is None for p in P.values())


def test_embedding_sites_stay_row_sparse_in_a_model():
    P = _params(15, tied=True)
    idx, tgt, _ = _data(16)
    names = list(P)
    acc = ExactGradAccumulator([P[n] for n in names])
    with acc.micro_batch():
        ops.cross_entropy(_forward(P, idx, "single"), tgt).backward()
    wte, wpe = names.index("wte"), names.index("wpe")
    # the tied head is reached first (site 0, dense), the token embedding second (row-sparse)
    assert not acc._sites[(wte, 0)].sparse and acc._sites[(wte, 1)].sparse
    assert acc._sites[(wpe, 0)].sparse
    assert acc._sites[(wte, 1)]._rows.numel() == torch.unique(idx).numel()


def test_micro_batch_grads_leaves_the_params_unmodified():
    P = _params(13, tied=True)
    idx, tgt, mask = _data(14)
    before = {n: p.detach().clone() for n, p in P.items()}
    micro_batch_grads(
        lambda lv, lo, hi: _forward(lv, idx[lo:hi], "single", mask[lo:hi]), P, tgt, [(0, 3), (3, B)]
    )
    for n, p in P.items():
        assert torch.equal(bits(p.detach()), bits(before[n])), n
        assert p.grad is None


# --- 3-step walks: digests recorded with the dense-fold code ---------------------------------------

GPT = {"kind": "gpt", "vocab_size": 64, "block_size": 8, "n_layer": 2, "n_head": 2, "n_embd": 16,
       "dropout": 0.1, "tie_weights": True}
LLAMA = {"kind": "llama", "vocab_size": 96, "block_size": 8, "n_layer": 2, "n_head": 4, "n_kv_head": 2,
         "n_embd": 16, "intermediate_size": 24, "tie_weights": True}
WALKS = {  # name -> (spec overrides, (digest after step 3, loss bits of step 3))
    "gpt-tied-dropout": ({"model": GPT},
                         ("84332c7e17e3ab4fdcc237fa81820df875d3b424347d939c3060f4512a54e916", 1082379996)),
    "gpt-tied-hilo": ({"model": GPT, "exact": {"matmul": "hilo"}},
                      ("b0432d7e3ea03e4b0d8456992ef35e465692e8efe76d2b587a701cdc209eaab0", 1082379996)),
    "gpt-untied-erf": ({"model": {**GPT, "tie_weights": False, "gelu": "erf"}},
                       ("f8d3be7e0170d0cc5540619392f46f94abc8a7a50b0f9155b7d845a68885593b", 1082399502)),
    "gpt-wide-vocab": ({"model": {**GPT, "vocab_size": 700}},
                       ("6e32b92c4e64c0acc35a0a0861fdab4ba07045cc537d2aa0db8ef35e6708660b", 1087575034)),
    "gpt-bf16": ({"model": GPT, "dtype": "bf16-mixed"},
                 ("c07dd52ee6239363bac8d7b514b88787a0e70c52def28d100e605993ed428d92", 1082379795)),
    "llama-tied": ({"model": LLAMA},
                   ("06c337359a3986598d511fe5dc9334299e7abe1cac9028acf33ba29581c4a5cd", 1083060936)),
}


def _walk_spec(name):
    d = {"optimizer": {"kind": "adamw", "lr": 1e-2, "weight_decay": 0.1, "grad_clip": 1.0},
         "batch": {"batch_size": 4, "seq_len": 8}, "rng": {"seed": 5}}
    d.update(WALKS[name][0])
    return Spec.from_dict(d)


def _walk_batch(spec, t):
    g = torch.Generator().manual_seed(100 + t)  # test data only
    b, n, v = spec.batch.batch_size, spec.sample_len, spec.model.vocab_size
    if t == 3:  # three distinct ids, repeated within and across sequences
        return torch.randint(0, 3, (b, n), generator=g) * (v // 3)
    return torch.randint(0, v, (b, n), generator=g)


def _walk(name, micro_batches):
    spec = _walk_spec(name)
    st = init_state(spec)
    for t in range(1, 4):
        before = {n: p.clone() for n, p in st.params().items()}
        nxt, loss = step(st, _walk_batch(spec, t), spec, t, micro_batches=micro_batches)
        for n, p in st.params().items():  # the step leaves its input state's parameters alone
            assert torch.equal(bits(p), bits(before[n])), (name, t, n)
        st = nxt
    return st.digest().hex(), int(loss.view(torch.int32).item())


@pytest.mark.parametrize("name", sorted(WALKS))
def test_walk_digests_are_those_of_the_dense_fold(name):
    assert _walk(name, 1) == WALKS[name][1]


@pytest.mark.parametrize("name", ["gpt-tied-dropout", "gpt-wide-vocab", "llama-tied"])
def test_walk_digests_for_every_split_and_without_kernels(name):
    for m in (2, 4):
        assert _walk(name, m) == WALKS[name][1], m
    with kernels.disabled():
        assert _walk(name, 2) == WALKS[name][1]
