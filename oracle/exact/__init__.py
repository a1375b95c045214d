"""exact-v1 arithmetic: ops whose bytes are the same on every CPU, thread count and GPU.

How to use it (the model and step code):

* Ops live in ``oracle.exact.ops`` (``from oracle.exact import ops``); same signatures as
  ``oracle.native``. Every tensor is float32 unless stated; int64 for indices and targets.

  - ``linear(x, weight, bias=None, *, variant)`` (x[..., in] @ weight[out, in].T + bias) and
    ``matmul(a, b, *, variant)`` (batched, equal batch dims). ``variant`` is the spec's
    ``exact.matmul``: "single" (one slice) or "hilo" (two slices, three GEMMs, ~2x the bits).
    ``bf16=True`` (also on ``causal_attention``; spec dtype "bf16-mixed", which
    ``oracle.profiles.MixedOps`` applies) rounds the operands and the result to bfloat16 with
    ``oracle.exact.bf16.round_bf16``; gradients pass the roundings unchanged.
  - ``sum(x, dim=None, keepdim=False)``, ``mean(...)``, ``softmax(x, dim=-1)``,
    ``log_softmax(x, dim=-1)``, ``layer_norm(x, weight, bias, eps=1e-5)`` (weight/bias may be
    None), ``gelu(x, form="tanh"|"erf")``, ``exp``, ``log``, ``tanh``, ``erf``, ``sin``, ``cos``,
    ``sigmoid``, ``silu``, ``mul(a, b)`` (same shapes), ``rms_norm(x, weight, eps=1e-6)``,
    ``rope(x, cos, sin)`` with ``rope_tables(n_pos, head_dim, theta)``, ``repeat_heads(x, n_rep)``.
  - ``embedding(idx, weight)``; ``cross_entropy(logits[..., V], targets[...], *, total_count=None)``
    (mean over tokens, or the sum over ``total_count`` when given); ``dropout(x, p, keep_mask)``
    (the caller draws ``keep_mask`` from Philox); ``causal_attention(q, k, v, *, variant,
    dropout_p=0.0, dropout_mask=None)`` on [B, H, T, D] (k, v may have fewer heads); ``add(a, b)`` (same
    shapes only); ``sum_of_squares(tensors)`` -> float32 scalar, exact over the list (canonical order).
  - Errors: bad input raises ``oracle.exact.ExactError`` (a ValueError) naming the problem.

* Sequences: ops that contract the token axis into a parameter gradient (linear weight/bias,
  layer-norm weight/bias, embedding) and the loss treat dim 0 as the sequence index when the
  input has a token axis too ([B, T, C] activations, [B, T] ids, [B, T, V] logits); a tensor
  without one is a single sequence. Position embeddings: ``embedding(pos.expand(B, T), wpe)``.

* Gradients and micro-batches (``oracle.exact.accumulate``, ``oracle.exact.grads``): for bytes
  that do not depend on the split, run every micro-batch inside one ``ExactGradAccumulator``::

      acc = ExactGradAccumulator(leaves)            # float32 leaf tensors, canonical order
      for lo, hi in slices:                         # whole sequences, in order
          with acc.micro_batch():
              logits = model(ops, ..., inputs[lo:hi])
              ops.cross_entropy(logits, targets[lo:hi], total_count=all_tokens).backward()
      grads, loss = acc.grads(), acc.loss()         # float32, each rounded once

  ``micro_batch_grads(forward, params, targets, slices, total_count=None)`` (the step code runs
  it) does exactly this loop: ``forward(leaves, lo, hi)`` returns the logits of sequences
  lo..hi-1; it returns ``(loss, [grads in params order])``.

  Inside a micro-batch the parameter gradients go to the accumulator (``p.grad`` stays None);
  outside one they are returned to autograd, already rounded (equal to ``acc.grads()`` for every
  parameter used at one site; a tied embedding/head needs the accumulator).

* Float64 building blocks for other exact-v1 code (the RNG's Box-Muller, the optimizers):
  ``oracle.exact.transcendental`` has ``exp_f64``, ``log_f64``, ``sin_f64``, ``cos_f64``,
  ``tanh_f64``, ``erf_f64``, ``expm1_f64`` (float64 in and out, not rounded) and float32
  versions ``exp32`` etc. ``oracle.exact.quant`` has ``quantise``/``quantise_hilo``,
  ``exact_sum64``, ``to_f32_once`` and the bit budgets ``sum_bits``/``dot_bits``;
  ``oracle.exact.gemm`` has ``exact_matmul`` and ``matmul_parts``. Square roots are correctly
  rounded: ``oracle.exact.sqrt`` has ``sqrt64``/``sqrt32`` (the definition, any device) and
  ``oracle.exact.kernels.sqrt`` picks the CPU kernel or that definition; stock ``torch.sqrt`` is not
  allowed (``oracle.exact.allowed_ops`` lists the torch ops exact-v1 code may use).

CPU tensors use the numba kernels of ``oracle.exact.kernels`` (transcendental chain, softmax
rows, layer norm, GEMM operand quantisation, the accumulation fold, square roots); they equal the eager
definitions bit for bit (POT_EXACT_KERNELS=0 forces the eager path everywhere). The
normative text is docs/exact-v1.md.
"""

from oracle.exact.accumulate import ExactGradAccumulator
from oracle.exact.grads import micro_batch_grads
from oracle.exact.quant import ExactError

__all__ = ["ExactGradAccumulator", "ExactError", "micro_batch_grads"]
