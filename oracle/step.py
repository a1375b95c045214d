"""The training step: (state, batch, spec, t) -> (new state, loss), and the initial state.

Under exact-v1 the result is a pure function of its arguments: the same bytes on every device,
thread count and micro-batch split. The batch holds seq_len + 1 tokens per sequence; inputs are
[:, :-1] and targets [:, 1:]. Dropout is keyed by (seed, t, site, element index).
"""

from __future__ import annotations

import numpy as np
import torch

from commitments.spec import Spec
from oracle import models, optim, profiles
from oracle.state import StateError, TrainState


class StepError(ValueError):
    """A step that cannot run on these arguments (bad batch, wrong step index), with the reason."""


def init_state(spec: Spec, *, device=None, pretrained=None) -> TrainState:
    """The state before step 1: parameters from Philox(seed, step 0), or for a spec with [init]
    the pretrained parameters (`pretrained`: a parameters file written by oracle.importer, or its
    tensors), checked against the spec's params digest; zero moments, step 0."""
    if spec.init is not None:
        if pretrained is None:
            raise StepError("the spec starts from pretrained parameters ([init]); give the parameters file")
        from oracle import importer

        if isinstance(pretrained, dict):
            names = [p.name for p in models.build(spec.model, matmul=spec.exact.matmul).param_specs()]
            missing = [n for n in names if n not in pretrained]
            if missing or len(pretrained) != len(names):
                raise StepError(f"pretrained parameters do not fit the spec's model (missing {missing[:3]})")
            params = {n: pretrained[n].to(torch.float32) for n in names}
            got = importer.params_digest(params).hex()
            if got != spec.init.params_digest:
                raise StepError(f"pretrained params digest {got[:16]}... is not the spec's "
                                f"init.params_digest {spec.init.params_digest[:16]}...")
        else:
            try:
                params = importer.read_params(pretrained, spec)
            except importer.ImportRefused as exc:
                raise StepError(str(exc)) from None
        if device is not None:
            params = {n: t.to(device) for n, t in params.items()}
    elif pretrained is not None:
        raise StepError("pretrained parameters were given but the spec has no [init]: its initial "
                        "state is drawn from the seed")
    else:
        model = models.build(spec.model, matmul=spec.exact.matmul)
        params = models.init_params(model.param_specs(), spec.rng.seed, device=device)
    moments = {m: {n: models.zeros(tuple(p.shape), p.device) for n, p in params.items()}
               for m in optim.moment_names(spec.optimizer)}
    return TrainState.assemble(spec, params, moments, step=0, seed=spec.rng.seed)


def as_batch(batch, spec: Spec, device=None) -> torch.Tensor:
    """Check a batch against the spec and return it as an int64 tensor [B, seq_len + 1]."""
    if isinstance(batch, np.ndarray):
        if batch.dtype.kind not in "iu":
            raise StepError(f"batch must hold integer token ids, got dtype {batch.dtype}")
        batch = torch.from_numpy(np.ascontiguousarray(batch, dtype=np.int64))
    if not isinstance(batch, torch.Tensor):
        raise StepError(f"batch must be a tensor or numpy array, got {type(batch).__name__}")
    if batch.dtype != torch.int64:
        raise StepError(f"batch must be int64, got {batch.dtype}")
    want = (spec.batch.batch_size, spec.sample_len)
    if tuple(batch.shape) != want:
        raise StepError(f"batch has shape {tuple(batch.shape)}, the spec needs {want} "
                        f"(batch_size, seq_len + 1)")
    if batch.numel():
        lo, hi = int(batch.min()), int(batch.max())
        if lo < 0 or hi >= spec.model.vocab_size:
            bad = lo if lo < 0 else hi
            raise StepError(
                f"batch holds token id {bad}, outside the vocabulary [0, {spec.model.vocab_size})"
            )
    return batch.to(device) if device is not None else batch


def step(state: TrainState, batch, spec: Spec, step_index: int, *,
         micro_batches: int | None = None, ranks=None) -> tuple[TrainState, torch.Tensor]:
    """Run training step `step_index` (1-based) on `state`; returns (new state, float32 loss).

    `micro_batches` defaults to the spec's batch.micro_batches. Under exact-v1 any other split
    gives the same bytes (a replay may choose its own); under torch-native the split is part of
    the arithmetic, so only the spec's is accepted.

    With `ranks` (an oracle.parallel.Ranks of world size > 1) every rank of the group calls this
    with the same state and batch; each computes the gradients of its shard and all get the
    bytes of the one-process step (exact-v1 only)."""
    if not isinstance(step_index, int) or isinstance(step_index, bool) or not 1 <= step_index < 2**32:
        raise StepError(f"step_index must be an int in [1, 2^32), got {step_index!r}")
    try:
        state.check(spec)
    except StateError as exc:
        raise StepError(str(exc)) from None
    if micro_batches is None:
        micro_batches = spec.batch.micro_batches
    if (not isinstance(micro_batches, int) or isinstance(micro_batches, bool)
            or not 1 <= micro_batches <= spec.batch.batch_size):
        raise StepError(f"micro_batches must be between 1 and batch_size {spec.batch.batch_size}, "
                        f"got {micro_batches!r}")
    if spec.profile == "torch-native" and micro_batches != spec.batch.micro_batches:
        raise StepError(f"micro_batches {micro_batches}: under torch-native the split changes the bytes; "
                        f"this spec's steps run as batch.micro_batches = {spec.batch.micro_batches}")
    parallel = ranks is not None and ranks.world > 1
    if parallel and spec.profile != "exact-v1":
        raise StepError(f"data-parallel training needs profile exact-v1 (its reductions are exact in any "
                        f"split); this spec is {spec.profile}")
    if parallel and ranks.world > spec.batch.batch_size:
        raise StepError(f"{ranks.world} ranks cannot share a batch of {spec.batch.batch_size} sequences")
    if state.step != step_index - 1:
        raise StepError(f"step {step_index} needs the state after step {step_index - 1}; "
                        f"this state is after step {state.step}")
    prof = profiles.get(spec.profile, spec.dtype)
    device = state.device
    tokens = as_batch(batch, spec, device)
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    model = models.build(spec.model, matmul=spec.exact.matmul)
    params = state.params()
    role_of = {p.name: p.role for p in model.param_specs()}
    seed = state.seed

    def drop_for(row_offset: int) -> models.Dropout | None:
        if spec.model.dropout == 0.0:
            return None
        return models.Dropout(seed, step_index, spec.model.dropout, row_offset)

    if parallel:
        from oracle import parallel as dp

        loss, grads = dp.exact_grads(ranks, model, params, inputs, targets, drop_for, micro_batches,
                                     ops=prof.ops)
    else:
        loss, grads = prof.grads(model, params, inputs, targets, drop_for, micro_batches)
    names = list(params)
    with torch.no_grad():
        # the gradients are this step's own: clipping scales them in place
        grads, _ = optim.clip(prof.ops, grads, spec.optimizer.grad_clip, owned=True)
        moments = state.moments(spec)
        new_p, new_m = optim.update(spec.optimizer, step_index, names, [params[n] for n in names], grads,
                                    {k: [v[n] for n in names] for k, v in moments.items()},
                                    [role_of[n] for n in names])
    new_state = TrainState.assemble(
        spec, dict(zip(names, new_p, strict=True)),
        {k: dict(zip(names, v, strict=True)) for k, v in new_m.items()},
        step=step_index, seed=seed)
    return new_state, loss.detach().to(torch.float32).reshape(())

