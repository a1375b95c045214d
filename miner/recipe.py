"""Run documents (recipes): a run stated before any GPU runs it, checkable by anyone with the corpus.

A recipe walks N steps from the spec's seed and promises the state digests at chosen steps
(1-5, 9, 19, 49, 99, 199, 499, 999, ... and N). Its size does not grow with the model. The body is
bound by its digest and an Ed25519 signature, so a tampered document is refused before any compute.

    document = CBOR({"body": CBOR(body), "digest": digest("pot/recipe/v1", body),
                     "public_key": 32 bytes, "signature": Ed25519 over digest})
    body     = {"version", "spec" (canonical CBOR), "seeds": {"init", "schedule"}, "dataset_hash",
                "num_samples", "schedule_commitment", "steps", "promises": [[t, state_digest], ...]}
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from nacl.exceptions import BadSignatureError
from nacl.signing import SigningKey, VerifyKey
from tqdm import tqdm

from commitments import cbor
from commitments.errors import CommitmentError
from commitments.hashing import DIGEST_SIZE, digest
from commitments.spec import Spec
from miner.trainer import run_schedule
from oracle.step import init_state
from oracle.step import step as oracle_step

RECIPE_VERSION = "pot/recipe/v1"
MAX_RECIPE_BYTES = 1024 * 1024
EQUAL, DIFFERENT = "EQUAL", "DIFFERENT"
BODY_FIELDS = frozenset({"version", "spec", "seeds", "dataset_hash", "num_samples", "schedule_commitment",
                         "steps", "promises"})


class RecipeRefused(ValueError):
    """A run document that is malformed or tampered with, or does not fit the corpus; with the reason."""


def promise_steps(n: int) -> list[int]:
    """Steps 1-5, then m * 10^k - 1 for m in (1, 2, 5) (9, 19, 49, 99, 199, 499, ...), and n; all <= n."""
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise RecipeRefused(f"a recipe needs at least one step, got {n!r}")
    out = {t for t in range(1, 6) if t <= n}
    k = 10
    while k - 1 <= n:
        for m in (1, 2, 5):
            if m * k - 1 <= n:
                out.add(m * k - 1)
        k *= 10
    out.add(n)
    return sorted(out)


@dataclass(frozen=True)
class Recipe:
    body: dict[str, Any]
    digest: bytes
    public_key: bytes
    spec: Spec

    @property
    def steps(self) -> int:
        return self.body["steps"]

    @property
    def promises(self) -> list[tuple[int, bytes]]:
        return [(t, d) for t, d in self.body["promises"]]


@dataclass
class PromiseResult:
    step: int
    promised: bytes
    computed: bytes
    loss: float

    @property
    def result(self) -> str:
        return EQUAL if self.promised == self.computed else DIFFERENT

    def as_json(self) -> dict[str, Any]:
        return {"step": self.step, "result": self.result, "promised": self.promised.hex(),
                "computed": self.computed.hex(), "loss": self.loss}


@dataclass
class RecipeReport:
    digest: bytes
    public_key: bytes
    results: list[PromiseResult] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return bool(self.results) and all(r.result == EQUAL for r in self.results)

    def as_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "digest": self.digest.hex(), "public_key": self.public_key.hex(),
                "promises": [r.as_json() for r in self.results]}


def _walk(spec: Spec, dataset: Any, schedule: Any, steps: int, wanted: set[int], progress: bool,
          on_step: Callable[[int, Any, Any], None]) -> None:
    state = init_state(spec)
    rng: Any = range(1, steps + 1)
    if progress:
        rng = tqdm(rng, desc="walk", unit="step", file=sys.stderr)
    for t in rng:
        state, loss = oracle_step(state, dataset.batch(schedule.batch(t)), spec, t)
        if t in wanted:
            on_step(t, state, loss)


def write_recipe(
    spec: Spec, dataset: Any, steps: int, *, signing_key: Any = None, progress: bool = False
) -> bytes:
    """Walk `steps` steps from the seed and return the signed run document."""
    if not isinstance(steps, int) or isinstance(steps, bool) or not 1 <= steps <= spec.steps:
        raise RecipeRefused(f"steps must be in 1..{spec.steps} (the spec's declared steps), got {steps!r}")
    if dataset.sample_len != spec.sample_len:
        raise RecipeRefused(f"the corpus was opened with {dataset.sample_len}-token samples, the spec needs "
                            f"{spec.sample_len}")
    schedule = run_schedule(spec, dataset)
    wanted = promise_steps(steps)
    promised: dict[int, bytes] = {}
    _walk(spec, dataset, schedule, steps, set(wanted), progress,
          lambda t, state, loss: promised.__setitem__(t, state.digest()))
    body = {
        "version": RECIPE_VERSION,
        "spec": spec.to_cbor(),
        "seeds": {"init": spec.rng.seed, "schedule": spec.rng.schedule_seed},
        "dataset_hash": dataset.dataset_hash,
        "num_samples": dataset.num_samples,
        "schedule_commitment": schedule.commitment,
        "steps": steps,
        "promises": [[t, promised[t]] for t in wanted],
    }
    key = signing_key if signing_key is not None else SigningKey.generate()
    d = digest(RECIPE_VERSION, body)
    return cbor.encode({"body": cbor.encode(body), "digest": d, "public_key": bytes(key.verify_key),
                        "signature": key.sign(d).signature})


def _uint(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 1 << 64


def load_recipe(data: bytes, *, expect_key: bytes | None = None) -> Recipe:
    """Check a document's form, digest and signature (no compute); refuse anything else."""
    if not isinstance(data, (bytes, bytearray)):
        raise RecipeRefused(f"a recipe is bytes, got {type(data).__name__}")
    if len(data) > MAX_RECIPE_BYTES:
        raise RecipeRefused(f"the document is {len(data)} bytes, over the limit of {MAX_RECIPE_BYTES}")
    try:
        outer = cbor.decode(bytes(data), max_bytes=MAX_RECIPE_BYTES)
    except CommitmentError as exc:
        raise RecipeRefused(f"not a run document: {exc}") from None
    if not isinstance(outer, dict) or set(outer) != {"body", "digest", "public_key", "signature"}:
        raise RecipeRefused("not a run document: expected the fields body, digest, public_key, signature")
    raw, d, pk, sig = outer["body"], outer["digest"], outer["public_key"], outer["signature"]
    if not (
        isinstance(raw, bytes) and isinstance(d, bytes) and isinstance(pk, bytes) and isinstance(sig, bytes)
    ):
        raise RecipeRefused("not a run document: body, digest, public_key and signature must be bytes")
    try:
        body = cbor.decode(raw, max_bytes=MAX_RECIPE_BYTES)
    except CommitmentError as exc:
        raise RecipeRefused(f"tampered document: the body is not canonical CBOR ({exc})") from None
    if not isinstance(body, dict):
        raise RecipeRefused("tampered document: the body is not a map")
    if digest(RECIPE_VERSION, body) != d:
        raise RecipeRefused("tampered document: the body does not match its digest")
    if len(pk) != 32:
        raise RecipeRefused("not a run document: public_key must be 32 bytes")
    try:
        VerifyKey(pk).verify(d, sig)
    except (BadSignatureError, ValueError, TypeError):
        raise RecipeRefused("tampered document: the signature does not verify") from None
    if expect_key is not None and pk != expect_key:
        raise RecipeRefused(
            f"the document is signed by {pk.hex()[:16]}, not the expected key {expect_key.hex()[:16]}"
        )
    if set(body) != BODY_FIELDS or body.get("version") != RECIPE_VERSION:
        raise RecipeRefused(f"not a {RECIPE_VERSION} body (fields {', '.join(sorted(map(str, body)))})")
    try:
        spec = Spec.from_cbor(body["spec"]) if isinstance(body["spec"], bytes) else None
    except CommitmentError as exc:
        raise RecipeRefused(f"the document's spec is not usable: {exc}") from None
    if spec is None or spec.to_cbor() != body["spec"]:
        raise RecipeRefused("the document's spec is not in canonical form")
    if body["seeds"] != {"init": spec.rng.seed, "schedule": spec.rng.schedule_seed}:
        raise RecipeRefused("the document's seeds differ from its spec's")
    steps = body["steps"]
    if not _uint(steps) or not 1 <= steps <= spec.steps:
        raise RecipeRefused(f"the document's steps {steps!r} are outside 1..{spec.steps}")
    for name in ("dataset_hash", "schedule_commitment"):
        if not (isinstance(body[name], bytes) and len(body[name]) == DIGEST_SIZE):
            raise RecipeRefused(f"the document's {name} must be 32 bytes")
    if not _uint(body["num_samples"]):
        raise RecipeRefused("the document's num_samples must be an unsigned integer")
    promises = body["promises"]
    if not isinstance(promises, list) or not promises:
        raise RecipeRefused("the document promises nothing")
    last = 0
    for p in promises:
        if not (isinstance(p, list) and len(p) == 2 and _uint(p[0]) and isinstance(p[1], bytes)
                and len(p[1]) == DIGEST_SIZE):
            raise RecipeRefused("each promise must be [step, 32-byte state digest]")
        if not last < p[0] <= steps:
            raise RecipeRefused(f"promised steps must increase within 1..{steps}, got {p[0]} after {last}")
        last = p[0]
    return Recipe(body, d, pk, spec)


def verify_recipe(data: bytes, dataset: Any, *, expect_key: bytes | None = None,
                  progress: bool = False) -> RecipeReport:
    """Refuse a tampered document or another corpus first, then recompute every promised digest."""
    recipe = load_recipe(data, expect_key=expect_key)
    spec, body = recipe.spec, recipe.body
    if dataset.sample_len != spec.sample_len:
        raise RecipeRefused(f"the corpus was opened with {dataset.sample_len}-token samples, the spec needs "
                            f"{spec.sample_len}")
    if dataset.num_samples != body["num_samples"] or dataset.dataset_hash != body["dataset_hash"]:
        raise RecipeRefused(
            f"the corpus is not the document's: dataset hash {dataset.dataset_hash.hex()[:16]} "
            f"({dataset.num_samples} samples) != {body['dataset_hash'].hex()[:16]} "
            f"({body['num_samples']} samples)"
        )
    schedule = run_schedule(spec, dataset)
    if schedule.commitment != body["schedule_commitment"]:
        raise RecipeRefused(
            "the schedule derived from the spec's seed differs from the document's commitment"
        )
    promised = dict(recipe.promises)
    report = RecipeReport(recipe.digest, recipe.public_key)

    def check(t: int, state: Any, loss: Any) -> None:
        report.results.append(PromiseResult(t, promised[t], state.digest(), float(loss)))

    _walk(spec, dataset, schedule, recipe.steps, set(promised), progress, check)
    return report


__all__ = [
    "DIFFERENT",
    "EQUAL",
    "RECIPE_VERSION",
    "Recipe",
    "RecipeRefused",
    "RecipeReport",
    "load_recipe",
    "promise_steps",
    "verify_recipe",
    "write_recipe",
]
