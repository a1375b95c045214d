"""The red team's lab: one honest run and one substituted run trained by the real Trainer on a
dev chain, a local prover that serves whatever the red team hands it, and the helpers a forger
uses (rebuild an opening, commit a forged trajectory, train on from a forged state)."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from chain import protocol as P
from chain.calls import BondVerifier, StartTrainingCommitment, SubmitCheckpointRoot, derive_run_id
from chain.dev import DevTransport
from chain.protocol import ProtocolParams
from chain.view import ChainView
from challenges.opening import build_opening, encode_opening, load_opening
from commitments import merkle
from commitments.dataset import Dataset, prepare_default_corpus
from commitments.hashing import digest, h
from commitments.leaves import loss_bits, parse_step_leaf, step_leaf
from commitments.spec import Spec
from miner.trainer import Trainer
from node.pipeline import ChainFacts
from oracle.step import StepError, step

CHALLENGED = 3  # the step every edit attacks (its pre-state is neither leaf 0 nor the last)
STEPS = 6
SPEC = {"steps": STEPS, "model": {"kind": "mlp", "block_size": 16, "hidden": [32]},
        "batch": {"batch_size": 4, "seq_len": 16}, "rng": {"seed": 7, "schedule_seed": 11}}
CORPUS_BYTES = 200_000
LAB_VERIFIER = "lab-seats"  # the account whose bond backs the committees' seats (it never commits)
LAB_SEATS = 4096  # seat units of its bond: more challenges than the probes ever open at once


def bond_seats(path: Path, params: ProtocolParams) -> None:
    """Bond LAB_VERIFIER's LAB_SEATS seat units on the dev chain at `path` (one block): a chain's
    challenges are issued only while a committee's seats are free."""
    seats = DevTransport(path, LAB_VERIFIER, sealing="instant")
    try:
        seats.submit([BondVerifier(amount=LAB_SEATS * params.verifier_stake)])
    finally:
        seats.close()


class RedTeamError(RuntimeError):
    """The red team could not set up its run (corpus, chain, training), with the reason."""


# --- the prover the forgeries are served from -------------------------------------------------


@dataclass
class Serve:
    """How the prover answers one path: a body, or one of the ways a hostile prover misbehaves."""

    body: bytes = b""
    gz: bool = False  # announce Content-Encoding: gzip (the body is the compressed bytes)
    redirect: str | None = None  # answer 302 to this location instead
    header_trickle_s: float = 0.0  # slowloris: the status line and headers one byte per this many seconds
    body_trickle_s: float = 0.0  # the body one byte per this many seconds
    stall_after: int | None = None  # send this many body bytes, then pause `stall_s` before the rest
    stall_s: float = 0.0


class _Served(http.server.BaseHTTPRequestHandler):
    files: dict[str, Serve]
    hits: dict[str, int]
    closing: threading.Event

    def _send_slowly(self, data: bytes, every_s: float) -> bool:
        for i in range(len(data)):
            if self.closing.wait(every_s):
                return False
            self.wfile.write(data[i:i + 1])
            self.wfile.flush()
        return True

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        self.hits[self.path] = self.hits.get(self.path, 0) + 1
        item = self.files.get(self.path)
        if item is None:
            self.send_error(404)
            return
        try:
            self._answer(item)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the verifier hung up on an oversized or slow body: that is the refusal under test

    def _answer(self, item: Serve) -> None:
        if item.redirect is not None:
            self.send_response(302)
            self.send_header("Location", item.redirect)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        body = item.body
        head = [b"HTTP/1.1 200 OK", f"Content-Length: {len(body)}".encode()]
        if item.gz:
            head.append(b"Content-Encoding: gzip")
        raw_head = b"\r\n".join(head) + b"\r\n\r\n"
        if item.header_trickle_s:
            self.close_connection = True
            if not self._send_slowly(raw_head, item.header_trickle_s):
                return
        else:
            self.wfile.write(raw_head)
        if item.body_trickle_s:
            self._send_slowly(body, item.body_trickle_s)
            return
        if item.stall_after is not None:
            self.wfile.write(body[:item.stall_after])
            self.wfile.flush()
            if self.closing.wait(item.stall_s):
                return
            body = body[item.stall_after:]
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


class Prover:
    """A local HTTP server (127.0.0.1 unless told) serving what the red team hands it."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.files: dict[str, Serve] = {}
        self.hits: dict[str, int] = {}
        self.closing = threading.Event()
        handler = type(
            "Handler", (_Served,), {"files": self.files, "hits": self.hits, "closing": self.closing}
        )
        self.http = http.server.ThreadingHTTPServer((host, 0), handler)
        self.http.daemon_threads = True
        self.thread = threading.Thread(target=self.http.serve_forever, daemon=True)
        self.thread.start()
        self.endpoint = f"http://{host}:{self.http.server_address[1]}"

    def put(self, path: str, data: bytes, *, gz: bool = False) -> str:
        return self.serve(path, Serve(data, gz=gz))

    def serve(self, path: str, how: Serve) -> str:
        self.files[path] = how
        return f"{self.endpoint}{path}"

    @property
    def requests(self) -> int:
        return sum(self.hits.values())

    def close(self) -> None:
        self.closing.set()  # slow answers stop at their next byte
        self.http.shutdown()
        self.http.server_close()
        self.thread.join(5)


# --- the lab: a trained run on a dev chain, and forged runs beside it ---------------------------


class Lab:
    """One honest run trained by the real Trainer on a dev chain, plus helpers to forge from it."""

    def __init__(self, workdir: Path, *, log: Callable[[str], None]) -> None:
        self.dir = workdir
        self.log = log
        self.spec = Spec.from_dict(SPEC)
        corpus = workdir / "corpus.npy"
        log(f"preparing the default corpus ({CORPUS_BYTES} bytes) in {corpus}")
        prepare_default_corpus(corpus, max_bytes=CORPUS_BYTES)
        self.dataset = Dataset.open(corpus, self.spec.sample_len, vocab_size=self.spec.model.vocab_size)
        # Every step of every run is challenged, the attacked one first. A challenge is issued only
        # when a committee's seats are free (each reserves verifier_stake of a bond until its round
        # is settled): one seat a committee, and one bonded account backing LAB_SEATS of them, so the
        # challenges of every run the probes register sit side by side.
        self.params = ProtocolParams(
            challenges_per_run=STEPS,
            challenge_delay=1,
            opening_deadline=50,
            commit_window=50,
            reveal_window=50,
            quorum_min_reveals=1,
            committee_size=1,
            forced_challenge_steps=(CHALLENGED,),
        )
        chain_path = workdir / "chain.db"
        self.chain = DevTransport(chain_path, "miner", sealing="instant")
        self.chain.record_params(self.params)
        bond_seats(chain_path, self.params)
        self.prover = Prover()
        self.served = 0
        log(f"training the honest run ({STEPS} steps, tiny MLP) with the real trainer")
        self.honest = Trainer(
            self.spec,
            self.dataset,
            workdir / "honest",
            self.chain,
            endpoint=self.prover.endpoint,
            keep_every=2,
            progress=False,
            log=log,
            params=self.params,
        )
        self.honest.run(follow=False)
        log("training a second run whose step "
            f"{CHALLENGED} trains on a substituted batch (the trainer's fault injection)")
        self.substituted = Trainer(self.spec, self.dataset, workdir / "substituted", self.chain,
                                   endpoint=self.prover.endpoint, keep_every=2, progress=False, log=log,
                                   substitute_batch_at=CHALLENGED, params=self.params)
        self.substituted.run(follow=False)
        self.leaves = list(self.honest.store.leaves)
        self.states = [self.honest.store.state(t) for t in range(STEPS + 1)]
        self._opening_cache: dict[tuple[bytes, int], bytes] = {}
        self.forged = 0

    def close(self) -> None:
        self.prover.close()
        for tr in (self.honest, self.substituted):
            tr.close()
        self.chain.close()

    # --- chain facts --------------------------------------------------------------------------
    def view(self) -> Any:
        # Seal until every run's challenges are issued: one per block from the run's challenges_at
        # on (instant chains only move on submit).
        view = ChainView(self.chain, self.params)
        view.sync()
        for _ in range(self.params.challenge_delay + self.params.challenges_per_run + 2):
            pending = [r for r in view.state.runs.values() if r.challenges_at is not None
                       and r.drawn < min(self.params.challenges_per_run, r.size - 1)]
            if not pending:
                break
            self.chain.seal()
            view.sync()
        return view

    def facts(self, view: Any, run_id: bytes, step: int, expected_digest: bytes) -> Any:
        """What the verifier reads from the chain for the challenge of `step` in `run_id`."""
        reg = next(e for e in view.of(P.RunRegistered) if e.run_id == run_id)
        ch = next(e for e in view.of(P.ChallengeIssued) if e.run_id == run_id and e.step == step)
        return ChainFacts(
            expected_digest=expected_digest,
            run_id=run_id,
            step=step,
            spec_digest=reg.spec_digest,
            dataset_hash=reg.dataset_hash,
            schedule_commitment=reg.schedule_commitment,
            initial_hash=reg.initial_hash,
            root=ch.root,
            size=ch.size,
        )

    # --- openings -----------------------------------------------------------------------------
    def opening(self, t: int = CHALLENGED, *, run: Any = None) -> bytes:
        """The honest opening of step t of a trained run (the trainer's own opening code)."""
        tr = run or self.honest
        key = (tr.run_id, t)
        if key not in self._opening_cache:
            self._opening_cache[key] = tr.opening_for(t, STEPS + 1)[1]
        return self._opening_cache[key]

    def rebuild(self, data: bytes, edit: Callable[[dict[str, Any]], None] | None = None,
                pre_state: bytes | None = None) -> bytes:
        """The opening with its manifest edited and/or pre-state replaced, blob digest kept consistent."""
        op = load_opening(data)
        m = dict(op.manifest)
        blob = op.pre_state if pre_state is None else pre_state
        m["pre_state_blob"], m["pre_state_len"] = h(blob), len(blob)
        if edit is not None:
            edit(m)
        return encode_opening(m, blob)

    def register(self, leaves: list[bytes], *, initial_hash: bytes | None = None, tag: Any = None) -> bytes:
        """Register a run of the lab's miner account with these leaves and its complete root; its
        run id is derive_run_id(miner, nonce), the nonce drawn from `tag` and the root."""
        nonce = digest("pot/redteam/run-nonce/v1", tag, merkle.root(leaves))[:16]
        run_id = derive_run_id(self.chain.account, nonce)
        init = initial_hash if initial_hash is not None else parse_step_leaf(leaves[0]).state_digest
        self.chain.submit(
            [
                StartTrainingCommitment(
                    run_id,
                    nonce,
                    init,
                    self.honest.schedule.commitment,
                    self.dataset.dataset_hash,
                    self.spec.to_cbor(),
                    self.spec.steps,
                    self.prover.endpoint,
                )
            ]
        )
        self.chain.submit([SubmitCheckpointRoot(run_id, merkle.root(leaves), len(leaves), ())])
        return run_id

    def commit_trajectory(self, states_or_leaves: list[Any], *, initial_hash: bytes | None = None) -> bytes:
        """Register a forged run on chain with these leaves (a miner committing its own trajectory)."""
        leaves = list(states_or_leaves)
        if leaves == self.leaves:
            return self.honest.run_id  # identical bytes: the honest commitment itself
        self.forged += 1
        return self.register(leaves, initial_hash=initial_hash, tag=f"forged-{self.forged}")

    def forged_opening(
        self, run_id: bytes, leaves: list[bytes], pre_state: Any, t: int = CHALLENGED
    ) -> bytes:
        return build_opening(spec=self.spec, run_id=run_id, step=t, pre_state=pre_state, dataset=self.dataset,
                             schedule=self.honest.schedule, leaves=leaves)

    def continue_from(self, state: Any, t: int, loss_bits_t: int | None = None) -> list[bytes]:
        """Leaves 0..T of a trajectory that takes `state` as its state after step t and trains on.

        A forger commits whatever it likes; when the oracle cannot step from the forged state
        (a step counter out of place), the honest later leaves stand in.
        """
        honest_t = parse_step_leaf(self.leaves[t])
        bits = honest_t.loss_bits if loss_bits_t is None else loss_bits_t
        leaves = self.leaves[:t] + [step_leaf(t, state.digest(), bits)]
        cur = state
        for u in range(t + 1, STEPS + 1):
            try:
                cur, loss = step(cur, self.dataset.batch(self.honest.schedule.batch(u)), self.spec, u)
                leaves.append(step_leaf(u, cur.digest(), loss_bits(loss)))
            except StepError:
                leaves += self.leaves[len(leaves):]
                break
        return leaves
