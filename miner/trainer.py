"""The miner's trainer: train on the committed dataset and schedule, commit every step, answer challenges.

Before step 1 it registers the run (start_training_commitment); after every step it appends the
leaf to the checkpoint tree and the signed transcript, moves the root on chain at a cadence (with
consistency proofs) and at the end, then follows the chain and opens every challenged step.

The run id belongs to the account that signs the registration: it is
`chain.calls.derive_run_id(account, nonce)` with a fresh random nonce kept in the run's metadata,
so a restart sends the identical registration and a copy of it by another account is refused.
Every ChallengeIssued of the run is answered, re-challenge rounds included (a new challenge id for
the same step: the same opening file, submitted again for the new id within its deadline).
Data-parallel (`ranks`, oracle.parallel): every rank computes each step's shard; rank 0 alone
keeps the run directory, talks to the chain and serves, and its commitments do not depend on
the number of ranks (the steps are byte-identical to one process).
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nacl.signing import SigningKey
from tqdm import tqdm

from chain.calls import (
    MAX_MIRRORS,
    CallError,
    DeclareWitnessNormBucket,
    StartTrainingCommitment,
    SubmitCheckpointRoot,
    SubmitOpening,
    derive_run_id,
)
from chain.network import BlockMemo, NetworkParamsError, check_pinned, read_network
from chain.outcome import submit_and_read
from chain.protocol import ChallengeIssued, ChallengeResolved
from chain.protocol.cost import opening_blocks
from chain.protocol.params import MAX_URI_BYTES
from chain.protocol.state import registration_digest
from chain.transport import TransportError
from chain.view import ChainView
from challenges.opening import OpeningRefused, build_opening, opening_digest
from commitments import cbor, merkle
from commitments.dataset import Dataset, train_validation_split
from commitments.leaves import initial_leaf, loss_bits, step_leaf
from commitments.retry import Backoff
from commitments.schedule import Schedule, derive_schedule
from commitments.spec import Spec
from commitments.transcript import TranscriptWriter, load_session_key, save_session_key
from miner.checkpoints import CheckpointError, CheckpointStore
from miner.window import (
    BlockTime,
    Fit,
    block_time,
    declared_fit,
    largest_declared,
    largest_within,
    reference_pace,
)
from oracle.norm_bucket import norm_bucket
from oracle.step import init_state
from oracle.step import step as oracle_step

NONCE_BYTES = 16
# The account a run prepared without a chain transport is derived for (recipes, tools, tests):
# its run id is `derive_run_id("offline", nonce)`, which no other account can register.
OFFLINE_ACCOUNT = "offline"
DEFAULT_ENDPOINT = "http://127.0.0.1:8760"
SUBMIT_TRIES = 5
SUBMIT_BACKOFF = Backoff(base_s=0.5, cap_s=30.0)
PACE_STEPS = 16  # the step time is the median of this many latest steps
PACE_MIN_STEPS = 3  # measured steps before the measured step time replaces the reference estimate


class TrainerError(RuntimeError):
    """A run that cannot start, resume or commit, with the reason."""


def run_schedule(spec: Spec, dataset: Dataset) -> Schedule:
    """The committed schedule: seeded by the spec, drawing from the training split only."""
    train, _ = train_validation_split(dataset.num_samples)
    return derive_schedule(spec.rng.schedule_seed, len(train), spec.steps, spec.batch.batch_size)


def substitute_indices(indices: list[int], num_samples: int) -> list[int]:
    """The batch a fault-injected step trains on instead: every index moved to the next sample."""
    return [(i + 1) % num_samples for i in indices]


class Trainer:
    """One run of `spec` on `dataset`, kept in `run_dir`, committed through `transport`.

    `substitute_batch_at` is a fault injection for tests and demos: that step trains on a
    different batch while the schedule's batch stays committed, so a challenge of it must fail.
    """

    def __init__(
        self,
        spec: Spec,
        dataset: Dataset,
        run_dir: str | os.PathLike[str],
        transport: Any = None,
        *,
        endpoint: str = DEFAULT_ENDPOINT,
        keep_every: int = 10,
        root_every: int | None = None,
        substitute_batch_at: int | None = None,
        params: Any = None,
        progress: bool = True,
        log: Callable[[str], None] | None = None,
        submit_timeout: float = 60.0,
        ranks: Any = None,
        pretrained: Any = None,
        mirrors: Any = (),
        account: str | None = None,
        adapt_keep_every: bool = True,
        block_seconds: float | None = None,
    ) -> None:
        if dataset.sample_len != spec.sample_len:
            raise TrainerError(f"the dataset's samples hold {dataset.sample_len} tokens, the spec needs "
                               f"{spec.sample_len} (seq_len + 1)")
        if substitute_batch_at is not None and not 1 <= substitute_batch_at <= spec.steps:
            raise TrainerError(f"substitute_batch_at {substitute_batch_at} is outside steps 1..{spec.steps}")
        if root_every is not None and root_every < 1:
            raise TrainerError(f"root_every must be positive, got {root_every}")
        if block_seconds is not None and not block_seconds > 0:
            raise TrainerError(f"block_seconds must be a positive number of seconds, got {block_seconds}")
        self.spec = spec
        self.dataset = dataset
        self.ranks = ranks if ranks is not None and ranks.world > 1 else None
        self.leader = self.ranks is None or self.ranks.leader
        self.device = self.ranks.device if self.ranks is not None else None
        if not self.leader and transport is not None:
            raise TrainerError("only rank 0 talks to the chain: pass no transport to the other ranks")
        self.transport = transport
        if transport is not None and account is not None and account != transport.account:
            raise TrainerError(f"account {account!r} given, but the transport signs as {transport.account!r}")
        self._account = account or OFFLINE_ACCOUNT
        self.endpoint = endpoint.rstrip("/")
        _check_uri_room(self.endpoint, "the endpoint")
        self.mirrors = check_mirrors(mirrors, self.endpoint)
        self.root_every = root_every or max(1, spec.steps // 4)
        self.substitute_batch_at = substitute_batch_at
        self.progress = progress and self.leader
        self.submit_timeout = submit_timeout
        self._log = log or (lambda msg: print(msg, file=sys.stderr))
        self.schedule = run_schedule(spec, dataset)
        self._train_n = self.schedule.num_samples
        # the other ranks keep nothing: the run directory is rank 0's
        self.store: Any = (CheckpointStore(run_dir, keep_every=keep_every, spec=spec, batch_fn=self.batch)
                           if self.leader else None)
        self._params = params
        # The opening window (miner.window): the keep-every asked for, whether it may be lowered to
        # fit, the checkpoint_interval the registration declares, the window and its block time.
        self.requested_keep_every = keep_every
        self.adapt_keep_every = adapt_keep_every
        self.block_seconds = block_seconds
        self.checkpoint_interval: int | None = None
        self.window_blocks: int | None = None
        self.block: BlockTime | None = None
        self._step_times: deque[float] = deque(maxlen=PACE_STEPS)
        self._pace_warned = False
        self.pretrained = pretrained  # a fine-tune's parameters file (the spec's [init])
        if spec.init is not None and pretrained is None:
            raise TrainerError("the spec fine-tunes pretrained parameters ([init]): give their file (--init)")
        self.view: Any = None
        self.run_id: bytes = b""
        self.nonce: bytes = b""
        self.initial_hash: bytes = b""
        self.state: Any = None
        self.tree = merkle.MerkleTree()
        self.submitted_size = 0
        self.transcript: Any = None
        self.answered: dict[bytes, bytes] = {}  # challenge_id -> opening digest
        self.issued: dict[bytes, int] = {}  # our challenge_id -> step (every round)
        self.rounds: dict[bytes, tuple[bytes, int]] = {}  # our challenge_id -> (its first round's id, round)
        self.resolved: dict[bytes, str] = {}  # our challenge_id -> verdict (an inconclusive round included)
        self.failed: dict[bytes, str] = {}  # our challenge_id -> why no opening could be built or sent
        self.refused: dict[
            bytes, str
        ] = {}  # our challenge_id -> the chain's refusal of its opening, in words
        self.refusals: list[dict[str, Any]] = []  # every refusal of a call this trainer sent, as it was read
        # (step, size, root) -> digest of its opening file: a re-challenge of a step reuses it
        self._openings: dict[tuple[int, int, bytes], bytes] = {}
        self._unseen: list[Any] = []  # synced events poll has not looked at yet

    # --- the batches ----------------------------------------------------------------------
    def batch_indices(self, t: int) -> list[int]:
        """The indices step t actually trains on (the schedule's, unless fault-injected)."""
        idx = self.schedule.batch(t)
        if t == self.substitute_batch_at:
            idx = substitute_indices(idx, self._train_n)
        return idx

    def batch(self, t: int) -> Any:
        return self.dataset.batch(self.batch_indices(t))

    # --- setup and resume -----------------------------------------------------------------
    @property
    def account(self) -> str:
        """The account the run id is derived for: the transport's signer, or (no transport) the
        `account` given, else OFFLINE_ACCOUNT."""
        return self.transport.account if self.transport is not None else self._account

    def prepare(self) -> None:
        """Create the run (initial state, leaf 0, run id, transcript) or resume it from run_dir.
        Data-parallel, every rank calls it: the others take rank 0's state."""
        if self.leader:
            self._prepare_run()
        if self.ranks is not None:
            from oracle import parallel

            last = parallel.broadcast_object(self.ranks, self.state.step if self.leader else None)
            state = (self.state if self.leader else init_state(self.spec, pretrained=self.pretrained)).to(
                self.device
            )
            parallel.broadcast_state(self.ranks, state.tensors)
            if state.step != last:
                raise TrainerError(f"rank {self.ranks.rank} holds the state after step {state.step}, "
                                   f"rank 0 resumes after {last}")
            self.state = state

    def _prepare_run(self) -> None:
        meta = self.store.read_meta()
        key_path = self.store.dir / "session.key"
        transcript_path = self.store.dir / "transcript.cbor"
        if meta is None:
            if len(self.store):
                raise TrainerError(
                    f"{self.store.dir}: holds leaves but no run metadata; use a fresh directory"
                )
            self._plan(None)  # the keep-every and the interval to declare, before anything is written
            state = init_state(self.spec, pretrained=self.pretrained)
            self.initial_hash = state.digest()
            # The nonce is persisted before anything is sent: a restart re-sends the same registration.
            self.nonce = os.urandom(NONCE_BYTES)
            try:
                self.run_id = derive_run_id(self.account, self.nonce)
            except CallError as exc:
                raise TrainerError(f"cannot derive the run id: {exc}") from None
            self.store.write_meta(self._meta(self.nonce))
            self.store.save_state(state)
            self.store.append_leaf(initial_leaf(self.initial_hash))
            key = SigningKey.generate()
            save_session_key(key_path, key)
            self.transcript = TranscriptWriter.create(transcript_path, self.run_id.hex(), key)
            self.transcript.append("commitment", self._commitment_record())
            self.state = state
        else:
            self._check_meta(meta)
            self.run_id, self.nonce, self.initial_hash = meta["run_id"], meta["nonce"], meta["initial_hash"]
            # The registration is re-sent identical: the interval declared then (a run directory
            # written before runs declared one registered the call's default, 1).
            declared = meta.get("checkpoint_interval", 1)
            if not isinstance(declared, int) or isinstance(declared, bool) or declared < 1:
                raise TrainerError(
                    f"{self.store.dir}: meta.cbor holds no usable checkpoint_interval ({declared!r})"
                )
            self._plan(declared, kept=meta.get("keep_every"))
            self.transcript = TranscriptWriter.resume(transcript_path, load_session_key(key_path),
                                                      drop_partial_tail=True)
            if not len(self.store):
                raise TrainerError(f"{self.store.dir}: the leaves file lost leaf 0; the run cannot resume")
            last = len(self.store) - 1
            try:
                self.state = self.store.state(last, progress=self.progress)
            except CheckpointError as exc:
                raise TrainerError(f"cannot resume at step {last}: {exc}") from None
            self._log(f"resuming run {self.run_id.hex()[:16]} after step {last}")
        for leaf in self.store.leaves:
            self.tree.append(leaf)

    def _meta(self, nonce: bytes) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "nonce": nonce,
            "account": self.account,
            "spec": self.spec.to_cbor(),
            "corpus": str(self.dataset.path),
            "dataset_hash": self.dataset.dataset_hash,
            "num_samples": self.dataset.num_samples,
            "schedule_commitment": self.schedule.commitment,
            "initial_hash": self.initial_hash,
            "steps": self.spec.steps,
            "keep_every": self.store.keep_every,
            "checkpoint_interval": self.checkpoint_interval,
            "endpoint": self.endpoint,
            "substitute_batch_at": self.substitute_batch_at,
        }

    def _check_meta(self, meta: dict[str, Any]) -> None:
        for name, ours in (("spec", self.spec.to_cbor()), ("dataset_hash", self.dataset.dataset_hash),
                           ("schedule_commitment", self.schedule.commitment),
                           ("substitute_batch_at", self.substitute_batch_at)):
            if meta.get(name) != ours:
                raise TrainerError(
                    f"{self.store.dir}: holds a run with another {name}; use a fresh directory"
                )
        nonce, run_id, owner = meta.get("nonce"), meta.get("run_id"), meta.get("account")
        try:
            derived = derive_run_id(owner, nonce) if isinstance(owner, str) and owner else None
        except CallError:
            derived = None
        if derived is None or derived != run_id:
            raise TrainerError(
                f"{self.store.dir}: its run id is not derive_run_id(account, nonce) of its metadata "
                "(a run of protocol v1, or a damaged meta.cbor); use a fresh directory"
            )
        if owner != self.account:
            raise TrainerError(
                f"{self.store.dir}: its run id belongs to account {owner!r}, and this trainer signs as "
                f"{self.account!r}; a run id cannot change hands: use that account or a fresh directory"
            )

    def _commitment_record(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "initial_hash": self.initial_hash,
            "schedule_commitment": self.schedule.commitment,
            "dataset_hash": self.dataset.dataset_hash,
            "spec_digest": self.spec.digest(),
            "declared_steps": self.spec.steps,
            "endpoint": self.endpoint,
        }

    # --- the opening window ----------------------------------------------------------------
    def _protocol_params(self) -> Any:
        """The parameters the run's window is sized under: the chain's as of its head (a transport),
        else the pinned ones, else None (an offline run: nothing to size against)."""
        if self.transport is None:
            return self._params
        self._sync()
        return self.view.params

    def _plan(self, declared: int | None, *, kept: Any = None) -> None:
        """Choose the keep-every, and for a new run (`declared` None) the checkpoint_interval its
        registration declares: the keep-every, whose regeneration must fit in the opening window the
        protocol gives for it (miner.window), at the reference speed since no step is measured yet.
        A resumed run keeps the interval it declared (`declared`) and keeps states at most that far
        apart (and no farther apart than `kept`, the keep-every it had). A keep-every that does not fit
        is lowered with adapt_keep_every, else refused (TrainerError naming the largest that fits)."""
        want = min(
            self.requested_keep_every, max(1, self.spec.steps)
        )  # past the last step keeps nothing more
        if declared is not None:
            want = min(want, declared)
            if isinstance(kept, int) and not isinstance(kept, bool) and kept >= 1:
                want = min(want, kept)
        params = self._protocol_params()
        if params is None:
            self.checkpoint_interval = declared or want
            self.store.keep_every = want
            return
        self.block = block_time(self.transport, params, self.block_seconds)
        (step, build), source = reference_pace(self.spec, params), "the reference estimate"
        if declared is None:
            fit = declared_fit(self.spec, params, want, self.block, step, source, build)
            too_long = fit.window_blocks > params.max_replay_blocks
            best = (want if fit.fits and not too_long
                    else largest_declared(self.spec, params, want, self.block, step, build))
        else:
            fit = Fit(want, opening_blocks(self.spec, params, declared), self.block, step, source, build)
            too_long = False
            best = want if fit.fits else largest_within(fit.window_blocks, want, self.block, step, build)
            if not Fit(best, fit.window_blocks, self.block, step, source, build).fits:
                best = None
        if best != want:
            why = fit.words() + (f"; that window is over the protocol's max_replay_blocks "
                                 f"({params.max_replay_blocks})" if too_long else "")
            if best is None:
                raise TrainerError(
                    f"--keep-every {self.requested_keep_every} does not fit the run's opening window, "
                    f"and no keep-every does, not even 1: {why}"
                )
            if not self.adapt_keep_every:
                raise TrainerError(
                    f"--keep-every {self.requested_keep_every} does not fit the run's opening window: "
                    f"{why}. The largest keep-every that fits is {best}: pass --keep-every {best}, "
                    "or --adapt-keep-every to lower it by itself"
                )
            self._log(
                f"--keep-every {self.requested_keep_every} lowered to {best} (--adapt-keep-every): {why}"
            )
        self.checkpoint_interval = declared if declared is not None else best
        self.window_blocks = opening_blocks(self.spec, params, self.checkpoint_interval)
        self.store.keep_every = best

    def _check_pace(self, t: int) -> bool:
        """After step t: with this machine's measured step time (the median of the last PACE_STEPS
        steps), does regenerating from a state kept every keep_every steps still fit in
        FIT_SHARE of the run's opening window? If not, lower keep_every from step t on (True: the
        caller keeps the state after step t, so the next steps regenerate from it), and say so.
        Without adapt_keep_every it only warns, once. A data-parallel step is no measure: rank 0
        regenerates alone, on the CPU, so there the reference estimate stays the only one."""
        if (self.window_blocks is None or self.block is None or self.ranks is not None
                or len(self._step_times) < PACE_MIN_STEPS):
            return False
        step = statistics.median(self._step_times)
        k = self.store.keep_every
        fit = Fit(
            k,
            self.window_blocks,
            self.block,
            step,
            f"measured: the median of the last {len(self._step_times)} steps",
        )
        if fit.fits:
            return False
        best = largest_within(self.window_blocks, k, self.block, step)
        if best >= k or not self.adapt_keep_every:
            if not self._pace_warned:
                self._pace_warned = True
                self._log(f"warning after step {t}: {fit.words()}; openings may come late"
                          + ("" if best >= k else f" (pass --keep-every {best}, or --adapt-keep-every)"))
            return False
        self.store.keep_every = best
        self.store.write_meta(self._meta(self.nonce))
        self._log(
            f"keep-every lowered from {k} to {best} from step {t} on: {fit.words()} (the states kept before "
            f"step {t} stay {k} steps apart)"
        )
        return True

    # --- chain ----------------------------------------------------------------------------
    def _submit(self, calls: list[Any], what: str) -> Any:
        """Submit, wait for the block that includes the calls and read what the chain made of each
        (chain.outcome), retrying transport failures (capped exponential backoff, full jitter).
        Every refusal is logged as it is read; the caller decides what it means for the run."""
        if self.transport is None:
            raise TrainerError(f"cannot {what}: no chain transport")

        def send(calls: list[Any], timeout: float) -> Any:
            for attempt in range(1, SUBMIT_TRIES + 1):
                try:
                    return self.transport.submit(calls, timeout=timeout)
                except TransportError as exc:
                    if attempt == SUBMIT_TRIES:
                        raise TrainerError(f"cannot {what} after {attempt} tries: {exc}") from None
                    self._log(f"{what}: {exc}; retrying")
                    time.sleep(SUBMIT_BACKOFF.delay(attempt - 1))
            raise AssertionError("unreachable")

        try:
            outcome = submit_and_read(self.transport, calls, self._chain_view(), timeout=self.submit_timeout,
                                      submit=send)
        except TransportError as exc:
            raise TrainerError(f"cannot {what}: {exc}") from None
        self._unseen += outcome.synced
        for c in outcome.calls:
            if not c.ok:
                self.refusals.append(
                    {
                        "what": what,
                        "call": c.call,
                        "block": c.block,
                        "refusal": c.refusal.refusal,
                        "reason": c.refusal.reason,
                        "words": c.words(),
                    }
                )
                self._log(f"{what}: the chain refused it: {c.words()}")
        return outcome

    def _chain_view(self) -> Any:
        """The chain's protocol state, from genesis, under the chain's own parameters: `params`
        given to the trainer pin them, and a chain that records others is refused."""
        if self.view is None:
            memo = BlockMemo(self.transport)
            try:
                rec = read_network(memo, memo.until)
                check_pinned(rec, self._params, pin_name="the miner's parameters (--params)")
            except NetworkParamsError as exc:
                raise TrainerError(str(exc)) from None
            self.view = ChainView(memo, rec.initial or self._params)
        return self.view

    def _sync(self) -> list[Any]:
        """Apply new finalized blocks. Their events also wait in `_unseen` for `poll`, whichever
        call synced them (a restarted trainer's registration reads the whole history)."""
        events = self._chain_view().sync()
        self._unseen += events
        return events

    def registration(self) -> StartTrainingCommitment:
        """The run's start_training_commitment: the same bytes every time (the nonce and the declared
        checkpoint_interval are persisted)."""
        if self.checkpoint_interval is None:
            raise TrainerError(
                "the run is not prepared: prepare() chooses the checkpoint_interval it declares"
            )
        return StartTrainingCommitment(
            run_id=self.run_id, nonce=self.nonce, initial_hash=self.initial_hash,
            schedule_commitment=self.schedule.commitment, dataset_hash=self.dataset.dataset_hash,
            spec=self.spec.to_cbor(), declared_steps=self.spec.steps, endpoint=self.endpoint,
            checkpoint_interval=self.checkpoint_interval)

    def register(self) -> None:
        """Submit start_training_commitment (idempotent: an identical repeat is a no-op on chain)
        and check the chain holds the run as ours; a refusal or another run under the id raises."""
        call = self.registration()
        registration = registration_digest(cbor.encode(call.to_wire()))
        if self.transport is not None:
            self._chain_view()  # refuses other parameters before anything is sent
            self._sync()
            known = self.view.state.runs.get(self.run_id)
            if known is not None and known.miner == self.account and known.registration == registration:
                # A restart: the chain holds this very registration. Sending it again is a no-op
                # for the protocol, but on Substrate its transfer would pay stake and escrow twice.
                self._log(
                    f"run {self.run_id.hex()[:16]} is already registered: not sending its registration again"
                )
                self._registered(known)
                return
        outcome = self._submit([call], "register the run")
        (got,) = outcome.calls
        if not got.ok:
            raise TrainerError(f"run {self.run_id.hex()[:16]} was not registered: {got.words()}")
        run = self.view.state.runs.get(self.run_id)
        if run is None or run.miner != self.account or run.registration != registration:
            why = ("it is not on chain" if run is None else "the run id belongs to another account"
                   if run.miner != self.account else "it is already registered with different commitments")
            raise TrainerError(f"run {self.run_id.hex()[:16]} was not registered: {why}")
        self._log(got.words())
        self._registered(run)

    def _registered(self, run: Any) -> None:
        """What the trainer keeps of its run as the chain holds it."""
        self.submitted_size = run.size
        self.window_blocks = run.opening_blocks  # the chain's figure is the one that counts
        if self.block is not None:
            self._log(f"opening window: {run.opening_blocks} blocks of {self.block.seconds:.3g} s "
                      f"({self.block.source}) for a state kept every {self.store.keep_every} steps "
                      f"(declared checkpoint_interval {run.checkpoint_interval})")

    def submit_root(self) -> None:
        """Move the run's root on chain to the current tree (append-only, with a consistency proof);
        a refused root raises (the chain keeps the previous one)."""
        size = self.tree.size
        if size <= self.submitted_size:
            return
        proof = self.tree.consistency_proof(self.submitted_size) if self.submitted_size else []
        outcome = self._submit(
            [
                SubmitCheckpointRoot(
                    run_id=self.run_id, root=self.tree.root(), size=size, consistency_proof=proof
                )
            ],
            f"submit the root of size {size}",
        )
        if not outcome.ok:
            raise TrainerError(f"the root of size {size} was not taken: {outcome.words()}")
        self.submitted_size = size
        self.transcript.append("checkpoint-root", {"size": size, "root": self.tree.root()})

    # --- training -------------------------------------------------------------------------
    def train(self, steps: int | None = None) -> None:
        """Train up to step `steps` (default: the spec's), committing as it goes."""
        last = self.spec.steps if steps is None else min(steps, self.spec.steps)
        first = self.state.step + 1
        rng = range(first, last + 1)
        if self.progress:
            rng = tqdm(rng, desc="train", unit="step", file=sys.stderr, initial=first - 1, total=last)
        for t in rng:
            began = time.perf_counter()
            self.state, loss = oracle_step(self.state, self.batch(t), self.spec, t, ranks=self.ranks)
            if not self.leader:
                continue
            here = self.state if self.state.device.type == "cpu" else self.state.to("cpu")
            leaf = step_leaf(t, here.digest(), loss_bits(loss.cpu()))
            self._step_times.append(time.perf_counter() - began)
            if self._check_pace(t) or self.store.should_keep(t, self.spec.steps):
                self.store.save_state(here)
            self.store.append_leaf(leaf)
            self.tree.append(leaf)
            self.transcript.append("step", {"t": t, "leaf": leaf})
            if self.transport is not None and (t % self.root_every == 0 or t == self.spec.steps):
                self.submit_root()
            if self.progress and hasattr(rng, "set_postfix"):
                rng.set_postfix(loss=f"{float(loss):.4f}")

    # --- challenges -----------------------------------------------------------------------
    def poll(self) -> bool:
        """Apply new finalized blocks; open each new challenge of this run, every round of it (a
        re-challenge is a new challenge id for the same step). True once the run's challenges are
        all drawn and every round of each is resolved."""
        self._sync()
        events, self._unseen = self._unseen, []
        for ev in events:
            if getattr(ev, "run_id", None) != self.run_id:
                continue
            if isinstance(ev, ChallengeIssued):
                self.issued[ev.challenge_id] = ev.step
                self.rounds[ev.challenge_id] = (ev.first or ev.challenge_id, ev.round)
                if ev.round > 1:
                    self._log(f"challenge {ev.challenge_id.hex()[:16]}: round {ev.round} of step {ev.step} "
                              f"(re-challenge of {(ev.first or b'').hex()[:16]}), opening due by block "
                              f"{ev.opening_deadline}")
                if ev.challenge_id not in self.answered and ev.challenge_id not in self.failed:
                    self._answer_issued(ev)
            elif isinstance(ev, ChallengeResolved):
                self.resolved[ev.challenge_id] = ev.verdict
                more = f"; re-challenged as {ev.rechallenge.hex()[:16]}" if ev.rechallenge is not None else ""
                self._log(
                    f"challenge {ev.challenge_id.hex()[:16]} (step {ev.step}, round {ev.round}) resolved: "
                    f"{ev.verdict} ({ev.reason}){more}"
                )
                self.transcript.append("verdict", {"challenge_id": ev.challenge_id, "step": ev.step,
                                                   "verdict": ev.verdict})
        return self.all_resolved()

    def all_resolved(self) -> bool:
        """True once the chain has drawn every challenge of the run and resolved every round of
        each (no re-challenge left open), as the chain view's state says."""
        if self.view is None:
            return False
        st = self.view.state
        run = st.runs.get(self.run_id)
        if run is None or run.challenges_at is None or not run.challenges:
            return False
        if run.drawn < min(st.params.challenges_per_run, run.size - 1):
            return False
        return all(st.challenges[c].verdict is not None for c in run.challenges)

    def final_verdicts(self) -> dict[bytes, str]:
        """{first round's challenge id: the verdict of its last resolved round}: what the run's
        challenges came to, a re-challenged step counted once."""
        out: dict[bytes, tuple[int, str]] = {}
        for cid, verdict in self.resolved.items():
            first, round_ = self.rounds.get(cid, (cid, 1))
            if first not in out or out[first][0] < round_:
                out[first] = (round_, verdict)
        return {first: v for first, (_, v) in out.items()}

    def _answer_issued(self, ev: Any) -> None:
        """Answer one ChallengeIssued unless the chain shows it needs no answer (opened already,
        say by this run's process before a restart; resolved; past its opening deadline)."""
        cid = ev.challenge_id
        ch = self.view.state.challenges.get(cid) if self.view is not None else None
        if ch is not None and ch.opening is not None:
            self.answered[cid] = ch.opening["opening_digest"]
            return
        if ch is not None and ch.verdict is not None:
            self.failed[cid] = f"resolved ({ch.verdict}) before this process could open it"
            return
        # A submission lands in a block after the head: at the deadline's block it is too late.
        if ch is not None and self.view.state.head >= ch.opening_deadline:
            self.failed[cid] = f"its opening deadline (block {ch.opening_deadline}) has passed"
            self._log(f"challenge {cid.hex()[:16]}: cannot open step {ev.step}: {self.failed[cid]}")
            return
        try:
            self.answer(ev)
        except (CheckpointError, OpeningRefused, TrainerError) as exc:
            # Without an opening the challenge resolves as fraud; keep following the rest.
            self.failed[cid] = str(exc)
            self._log(f"challenge {cid.hex()[:16]}: cannot open step {ev.step}: {exc}")

    def opening_for(self, step: int, size: int, root: bytes | None = None) -> tuple[bytes, bytes]:
        """(digest, file bytes) of the opening of `step` for the tree of `size` leaves."""
        pre = self.store.state(step - 1, progress=self.progress)
        data = build_opening(
            spec=self.spec,
            run_id=self.run_id,
            step=step,
            pre_state=pre,
            dataset=self.dataset,
            schedule=self.schedule,
            leaves=self.store.leaves,
            size=size,
            root=root,
        )
        return opening_digest(data), data

    def stored_opening(self, step: int, size: int, root: bytes | None = None) -> bytes:
        """The digest of the stored opening of `step` for the tree of `size` leaves, built and
        stored the first time; every round of a challenge of that step serves the same file."""
        key = (step, size, root or merkle.root(self.store.leaves[:size]))
        d = self._openings.get(key)
        if d is None or not self.store.opening_path(d).exists():
            d, data = self.opening_for(step, size, root)
            self.store.put_opening(d, data)
            self._openings[key] = d
        return d

    def uris(self, d: bytes) -> tuple[str, tuple[str, ...]]:
        """(uri, mirrors) of the opening `d`: the prover's endpoint and each mirror base URL, all
        under /openings/<digest hex> (the mirrors serve copies of the same file)."""
        path = f"/openings/{d.hex()}"
        return f"{self.endpoint}{path}", tuple(f"{m}{path}" for m in self.mirrors)

    def answer(self, ev: Any) -> bytes:
        """Store the opening of a ChallengeIssued event's step (reused across its rounds), then
        submit_opening for the event's challenge id (and, cross-architecture, the bucket)."""
        t, size = ev.step, ev.size
        d = self.stored_opening(t, size, ev.root)
        leaves = self.store.leaves
        proof = merkle.MerkleTree.from_leaves(leaves[:size]).inclusion_proof(t)
        uri, mirrors = self.uris(d)
        calls: list[Any] = [
            SubmitOpening(
                challenge_id=ev.challenge_id,
                opening_digest=d,
                uri=uri,
                leaf=leaves[t],
                leaf_proof=proof,
                mirrors=mirrors,
            )
        ]
        if ev.mode == "bucket":
            bucket = norm_bucket(self.store.state(t - 1), self.store.state(t))
            calls.append(DeclareWitnessNormBucket(challenge_id=ev.challenge_id, bucket=bucket))
        outcome = self._submit(calls, f"open step {t}")
        if not outcome.calls[0].ok:
            # Not answered: the challenge resolves without this opening (the caller records why).
            self.refused[ev.challenge_id] = outcome.calls[0].words()
            raise TrainerError(f"the chain refused the opening of step {t}: {outcome.calls[0].words()}")
        if not outcome.ok:  # the opening stands; its norm-bucket declaration was refused
            self._log(f"challenge {ev.challenge_id.hex()[:16]}: {outcome.calls[1].words()}")
        self.answered[ev.challenge_id] = d
        self.transcript.append("opening", {"challenge_id": ev.challenge_id, "step": t, "digest": d})
        self._log(f"challenge {ev.challenge_id.hex()[:16]}: opened step {t} as {d.hex()[:16]}"
                  + (f" (round {ev.round})" if getattr(ev, "round", 1) > 1 else ""))
        return d

    def follow(self, *, poll: float | None = None, timeout: float | None = None,
               stop: Callable[[], bool] | None = None) -> dict[bytes, str]:
        """Answer challenges until every challenge of the run is resolved (or timeout/stop). The
        chain is read every `poll` seconds: by default a quarter of its block time (at most 1 s,
        at least 0.05 s), so that noticing a challenge takes little of its opening window."""
        if poll is None:
            poll = 1.0 if self.block is None else min(1.0, max(0.05, self.block.seconds / 4))
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.poll():
            if stop is not None and stop():
                break
            if deadline is not None and time.monotonic() > deadline:
                raise TrainerError(
                    f"challenges of run {self.run_id.hex()[:16]} not resolved within {timeout:.0f} s"
                )
            time.sleep(poll)
        return dict(self.resolved)

    def run(self, *, follow: bool = True, **follow_kw: Any) -> dict[bytes, str]:
        """prepare, register, train, submit the final root, then (optionally) answer challenges."""
        if self.transport is not None:
            self._chain_view()  # the chain's parameters, checked against a pin, before any work
        self.prepare()
        if self.transport is not None:
            self.register()
        self.train()
        if self.ranks is not None:
            self.ranks.barrier()  # every rank is done training; only rank 0 goes on
            if not self.leader:
                return {}
        if self.transport is not None:
            self.submit_root()
            if follow:
                return self.follow(**follow_kw)
        return {}

    def close(self) -> None:
        if self.transcript is not None:
            self.transcript.close()

    def __enter__(self) -> Trainer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_OPENING_PATH_BYTES = len("/openings/") + 64


def _check_uri_room(base: str, what: str) -> None:
    """An opening's address is base + /openings/<64 hex>: the protocol keeps at most MAX_URI_BYTES
    of it, and refuses the whole opening (a fraud verdict) over that."""
    if len(base.encode("utf-8")) + _OPENING_PATH_BYTES > MAX_URI_BYTES:
        raise TrainerError(f"{what} is too long: with /openings/<digest> an opening's address must fit in "
                           f"{MAX_URI_BYTES} bytes")


def check_mirrors(mirrors: Any, endpoint: str = "") -> tuple[str, ...]:
    """Mirror base URLs of the prover, checked: at most MAX_MIRRORS, each http(s)://..., none
    repeated nor equal to the endpoint; returned without a trailing slash."""
    if isinstance(mirrors, str):
        raise TrainerError("mirrors must be a list of base URLs, not one string")
    out: list[str] = []
    for m in mirrors or ():
        if not isinstance(m, str) or not m.startswith(("http://", "https://")) or len(m.rstrip("/")) <= len("https://"):
            raise TrainerError(f"a mirror must be a base URL such as https://host:port, got {m!r}")
        m = m.rstrip("/")
        _check_uri_room(m, f"mirror {m[:60]}")
        if m == endpoint or m in out:
            raise TrainerError(f"mirror {m} is listed twice (or is the endpoint itself)")
        out.append(m)
    if len(out) > MAX_MIRRORS:
        raise TrainerError(f"{len(out)} mirrors given; an opening carries at most {MAX_MIRRORS}")
    return tuple(out)


def open_run_dir(run_dir: str | os.PathLike[str]) -> tuple[CheckpointStore, dict[str, Any]]:
    """A run directory's store and metadata (for the prover and tools); refuses a directory without a run."""
    p = Path(run_dir)
    if not (p / "meta.cbor").exists():
        raise TrainerError(f"{p}: not a run directory (no meta.cbor)")
    store = CheckpointStore(p)
    meta = store.read_meta()
    assert meta is not None
    store.keep_every = meta.get("keep_every", store.keep_every)
    return store, meta


__all__ = ["DEFAULT_ENDPOINT", "OFFLINE_ACCOUNT", "Trainer", "TrainerError", "check_mirrors", "open_run_dir",
           "run_schedule", "substitute_indices"]
