"""A node database with a known history, written through the node's own tables and event classes:
two runs, resolved honest and fraud challenges with full timelines and reveals (a lazy verifier's
copy of H(leaf t) with a wrong proof among them), a job waiting to retry, missed ones (one of them
penalised), this node's bond, and a tail of pending challenges for pagination.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

from sqlalchemy.engine import Engine

from chain import protocol as P
from chain.protocol import new_state
from chain.protocol.events import VerifierBonded, VerifierPenalized
from challenges.refused import REFUSED_BUCKET, refused_value_hash
from node import stake
from node.db import chain_cursor, chain_events, challenges, runs, stage_log, txs, witness_conflicts, witnesses

RUN_A = bytes([0xA1]) * 32
RUN_B = bytes([0xB2]) * 32
LOSSES_A = [5.5, 5.1, 4.8, 4.6, 4.3, 4.2, 4.0, 3.9]
STAGES_DONE = ["awaiting_opening", "fetch", "validate", "losschecks", "replay", "witness", "commit", "reveal",
               "resolution"]


def cid(n: int) -> bytes:
    return bytes([0xC0, n]) + bytes(30)


@dataclass
class Seeded:
    now: float
    head: int
    honest: bytes = cid(1)
    fraud: bytes = cid(2)
    retrying: bytes = cid(3)
    missed_fetch: bytes = cid(4)
    missed_commit: bytes = cid(5)
    pending: list[bytes] = field(default_factory=list)
    durations: dict[str, float] = field(default_factory=dict)  # honest challenge: stage -> seconds


def _run(conn, run_id: bytes, miner: str, block: int, steps: int) -> None:
    conn.execute(runs.insert().values(
        run_id=run_id, miner=miner, spec_digest=bytes([7]) * 32, mode="value", declared_steps=steps,
        endpoint="http://127.0.0.1:8800", initial_hash=bytes([1]) * 32, schedule_commitment=bytes([2]) * 32,
        dataset_hash=bytes([3]) * 32, registered_block=block, slashed=0))


def _challenge(
    conn, c: bytes, run_id: bytes, *, step: int, block: int, stage: str, now: float, **values
) -> None:
    base = dict(challenge_id=c, run_id=run_id, idx=0, step=step, root=bytes([9]) * 32, size=9, mode="value",
                endpoint="http://127.0.0.1:8800", issued_block=block, opening_deadline=block + 4,
                commit_deadline=block + 30, reveal_deadline=block + 38, stage=stage, attempts=0,
                next_attempt_at=0.0, created_at=now - 100, updated_at=now - 50, round=1,
                committee=json.dumps(COMMITTEE), on_committee=True)
    if stage != "awaiting_opening":  # the daemon records the opening's block as it moves a job on
        base["opening_block"] = block + 2
    base.update(values)
    conn.execute(challenges.insert().values(**base))


def _events(conn, block: int, events: list[P.Event]) -> None:
    for pos, ev in enumerate(events):
        conn.execute(chain_events.insert().values(
            block=block, position=pos, name=ev.NAME, challenge_id=getattr(ev, "challenge_id", None),
            run_id=getattr(ev, "run_id", None), body=ev.to_json()))


PROOF = bytes([0xDD]) * 32  # the honest replayers' proof half of the honest challenge
LAZY_PROOF = bytes([0x1A]) * 32  # v3's made-up one
COMMITTEE = ["v1", "v2", "v3"]
BOND, PENALTY = 100, 50


def seed(engine: Engine, *, pending: int = 7) -> Seeded:
    now = time.time()
    s = Seeded(now=now, head=50)
    leaf_hash = bytes([0xAA]) * 32
    other = bytes([0xEE]) * 32
    with engine.begin() as conn:
        conn.execute(chain_cursor.insert().values(id=1, block=s.head, block_hash=bytes(32), snapshot=b"\x80",
                                                  updated_at=now - 1.0))
        _run(conn, RUN_A, "miner-a", 3, 8)
        _run(conn, RUN_B, "miner-b", 5, 8)

        # Run A, step 7: honest; v1 (this node) and v2 agree, v3 copied H(leaf t) with a made-up proof.
        report = {"steps": 8, "ok": True, "findings": [], "losses": LOSSES_A}
        _challenge(
            conn,
            s.honest,
            RUN_A,
            step=7,
            block=10,
            stage="done",
            now=now,
            verdict="honest",
            verdict_reason="the largest cluster equals H(leaf t)",
            resolved_block=40,
            winning_value=leaf_hash.hex(),
            in_winning_cluster=True,
            outlier=False,
            leaf_hash=leaf_hash,
            opening_digest=bytes([4]) * 32,
            opening_uri="http://127.0.0.1:8800/openings/x",
            opening_mirrors=json.dumps(["http://mirror.example/openings/x"]),
            opening_source="http://127.0.0.1:8800/openings/x",
            opening_bytes=5000,
            loss_checks=json.dumps(report),
            matches_leaf=True,
            value_hash=leaf_hash,
            proof_hash=PROOF,
            replay_proof_hash=PROOF,
            norm_bucket=12,
        )
        t = now - 100
        for i, st in enumerate(STAGES_DONE):
            d = 0.25 * (i + 1)
            s.durations[st] = d
            conn.execute(
                stage_log.insert().values(
                    challenge_id=s.honest, stage=st, started_at=t, finished_at=t + d, detail=f"{st} ok"
                )
            )
            t += d
        conn.execute(witnesses.insert().values(challenge_id=s.honest, verifier="v1", salt=bytes(32),
                                               value_hash=leaf_hash, norm_bucket=12, commitment=bytes(32),
                                               created_at=now - 90))
        for kind, block in (("commit", 20), ("reveal", 35)):
            conn.execute(txs.insert().values(challenge_id=s.honest, verifier="v1", kind=kind, origin="v1",
                                             payload=b"x", state="confirmed", block=block, sends=1,
                                             created_at=now - 90, updated_at=now - 80))
        _events(conn, 35, [P.WitnessRevealed(35, s.honest, v, leaf_hash, 12, p)
                           for v, p in (("v1", PROOF), ("v2", PROOF), ("v3", LAZY_PROOF))])
        _events(
            conn,
            40,
            [
                P.ChallengeResolved(
                    40,
                    s.honest,
                    RUN_A,
                    7,
                    "honest",
                    "the largest cluster equals H(leaf t)",
                    "value",
                    leaf_hash,
                    2,
                    3,
                    ((leaf_hash + PROOF, 2), (leaf_hash + LAZY_PROOF, 1)),
                    ("v3",),
                )
            ],
        )

        # Run B, step 3: fraud (this node's replay differed from leaf t, like everyone's).
        _challenge(conn, s.fraud, RUN_B, step=3, block=12, stage="done", now=now, verdict="fraud",
                   verdict_reason="the largest cluster differs from H(leaf t)", resolved_block=42,
                   winning_value=other.hex(), in_winning_cluster=True, outlier=False, leaf_hash=leaf_hash,
                   matches_leaf=False, miner_slashed=500)
        _events(conn, 41, [P.WitnessRevealed(41, s.fraud, "v1", other, 3, PROOF)])

        # A job in the replay stage waiting out a backoff after a failed attempt.
        _challenge(conn, s.retrying, RUN_B, step=5, block=30, stage="replay", now=now, attempts=1,
                   next_attempt_at=now + 3600, status="replay attempt 1 failed: worker died")
        conn.execute(stage_log.insert().values(challenge_id=s.retrying, stage="fetch", started_at=now - 60,
                                               finished_at=now - 59, detail="5000 bytes"))
        # Missed while fetching, commit window still open (block 61 > head 50): re-queueable.
        _challenge(conn, s.missed_fetch, RUN_B, step=6, block=31, stage="missed", now=now,
                   status="fetch failed: unreachable")
        conn.execute(
            stage_log.insert().values(
                challenge_id=s.missed_fetch,
                stage="fetch",
                started_at=now - 60,
                finished_at=now - 58,
                detail="unreachable",
            )
        )
        # Missed at the commit: the tx failed; nothing to re-queue; the chain took a no-show penalty.
        _challenge(conn, s.missed_commit, RUN_B, step=2, block=8, stage="missed", now=now,
                   status="commit failed: the commit window closed", verdict="inconclusive",
                   verdict_reason="no quorum", resolved_block=46, penalty=PENALTY, penalty_why="no_commit")
        # This node's stake: bonded at block 2, penalised at 46.
        for ev in (VerifierBonded(2, "v1", BOND, BOND),
                   VerifierPenalized(46, s.missed_commit, "v1", PENALTY, "no_commit")):
            stake.record_event(conn, ev)
        state = new_state()
        state.head, state.vbonds["v1"], state.slashed["v1"] = s.head, BOND - PENALTY, PENALTY
        stake.save_stake(conn, "v1", state, target=BOND)
        conn.execute(
            stage_log.insert().values(
                challenge_id=s.missed_commit,
                stage="commit",
                started_at=now - 60,
                finished_at=now - 58,
                detail="the commit window closed",
            )
        )
        for i in range(pending):
            c = cid(0x10 + i)
            s.pending.append(c)
            _challenge(conn, c, RUN_A, step=1 + i % 8, block=44 + i % 3, stage="awaiting_opening", now=now)
    return s


# The sealed challenges: witnessed and committed, not yet revealed. Distinct byte patterns, so a
# test can search every response for any trace of them (the dashboard shortens hex to 12 digits).
SEALED_VALUE = bytes.fromhex("d15c105e" * 8)
SEALED_LEAF = bytes.fromhex("5ea1ed1e" * 5)
SEALED_STATE = bytes.fromhex("57a7ed16" * 8)
SEALED_RECOMPUTED = bytes.fromhex("0dd5eed0" * 8)
SEALED_BUCKET = 424242
SEALED_LOSS_BITS = 1085507584


@dataclass
class Sealed:
    replayed: bytes = cid(0x60)  # replayed, matched leaf t, committed; a determinism conflict recorded
    refused: bytes = cid(0x61)  # the opening was unavailable: the refused value was committed

    def refused_value(self) -> bytes:
        return refused_value_hash(self.refused, "unavailable")

    def secrets(self) -> list[str]:
        """Every string that would tell one of the sealed witnesses."""
        hexes = [SEALED_VALUE, SEALED_LEAF, SEALED_STATE, SEALED_RECOMPUTED, self.refused_value()]
        return [h.hex()[:12] for h in hexes] + [str(SEALED_BUCKET), str(SEALED_LOSS_BITS)]


def seed_sealed(engine: Engine, now: float | None = None) -> Sealed:
    """Two open challenges of run B at the reveal stage, written as the daemon writes them: the
    stage log details, the witness journal, a confirmed commit and an unconfirmed reveal tx."""
    now = time.time() if now is None else now
    s = Sealed()
    with engine.begin() as conn:
        _challenge(
            conn,
            s.replayed,
            RUN_B,
            step=4,
            block=45,
            stage="reveal",
            now=now,
            leaf_hash=bytes([0xAB]) * 32,
            opening_digest=bytes([5]) * 32,
            opening_bytes=5000,
            matches_leaf=True,
            replay_leaf=SEALED_LEAF,
            replay_state_digest=SEALED_STATE,
            replay_loss_bits=SEALED_LOSS_BITS,
            value_hash=SEALED_VALUE,
            norm_bucket=SEALED_BUCKET,
        )
        _challenge(
            conn,
            s.refused,
            RUN_B,
            step=1,
            block=45,
            stage="reveal",
            now=now,
            leaf_hash=bytes([0xAC]) * 32,
            refusal_class="unavailable",
            refusal_reason="GET http://127.0.0.1:8800/openings/x: connection refused",
            value_hash=s.refused_value(),
            norm_bucket=REFUSED_BUCKET,
        )
        t = now - 60
        for st, detail in (("awaiting_opening", "opening on chain at block 46"), ("fetch", "5000 bytes"),
                           ("validate", None), ("losschecks", "ok"), ("replay", "matches leaf t"),
                           ("witness", f"value {SEALED_VALUE.hex()[:16]} bucket {SEALED_BUCKET}; DETERMINISM "
                                       f"CONFLICT: recomputed value {SEALED_RECOMPUTED.hex()[:16]} bucket 7"),
                           ("commit", "commit in block 47")):
            conn.execute(
                stage_log.insert().values(
                    challenge_id=s.replayed, stage=st, started_at=t, finished_at=t + 1, detail=detail
                )
            )
            t += 1
        for st, detail in (("fetch", "GET http://127.0.0.1:8800/openings/x: connection refused"),
                           ("witness", f"value {s.refused_value().hex()[:16]} bucket {REFUSED_BUCKET}")):
            conn.execute(
                stage_log.insert().values(
                    challenge_id=s.refused, stage=st, started_at=t, finished_at=t + 1, detail=detail
                )
            )
        for c, value, bucket in ((s.replayed, SEALED_VALUE, SEALED_BUCKET), (s.refused, s.refused_value(),
                                                                            REFUSED_BUCKET)):
            conn.execute(
                witnesses.insert().values(
                    challenge_id=c,
                    verifier="v1",
                    salt=bytes(32),
                    value_hash=value,
                    norm_bucket=bucket,
                    commitment=bytes(32),
                    created_at=now - 30,
                )
            )
            conn.execute(
                txs.insert().values(
                    challenge_id=c,
                    verifier="v1",
                    kind="commit",
                    origin="v1",
                    payload=b"x",
                    state="confirmed",
                    block=47,
                    sends=1,
                    created_at=now - 30,
                    updated_at=now - 20,
                )
            )
            conn.execute(
                txs.insert().values(
                    challenge_id=c,
                    verifier="v1",
                    kind="reveal",
                    origin="v1",
                    payload=b"y",
                    state="unconfirmed",
                    sends=1,
                    created_at=now - 30,
                    updated_at=now - 20,
                )
            )
        conn.execute(
            witness_conflicts.insert().values(
                challenge_id=s.replayed,
                verifier="v1",
                journaled_value_hash=SEALED_VALUE,
                journaled_norm_bucket=SEALED_BUCKET,
                recomputed_value_hash=SEALED_RECOMPUTED,
                recomputed_norm_bucket=7,
                created_at=now - 25,
            )
        )
    return s


def confirm_reveal(engine: Engine, challenge_id: bytes, block: int = 48) -> None:
    """The daemon's record of this node's reveal landing in a finalized block."""
    with engine.begin() as conn:
        conn.execute(txs.update().where(txs.c.challenge_id == challenge_id, txs.c.kind == "reveal")
                     .values(state="confirmed", block=block, updated_at=time.time()))
        conn.execute(challenges.update().where(challenges.c.challenge_id == challenge_id)
                     .values(stage="revealed", updated_at=time.time()))
