"""Stateful property test of the witness journal: whatever order of journal attempts and tx
transitions, a (challenge, verifier) keeps its first commitment and tx states only move forward."""

from __future__ import annotations

import os
import shutil
import tempfile

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from node import journal
from node.db import open_database

CIDS = [bytes([i]) * 32 for i in range(2)]
VERIFIERS = ["v1", "v2"]
ORDER = {"unstarted": 0, "in_progress": 1, "unconfirmed": 2, "confirmed": 3, "failed": 3}


class JournalMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="pot-journal-")
        self.engine = open_database(f"sqlite:///{self.dir}/n.db", init=True)
        self.first: dict[tuple[bytes, str], bytes] = {}
        self.seen_state: dict[int, str] = {}

    def teardown(self) -> None:
        self.engine.dispose()
        shutil.rmtree(self.dir, ignore_errors=True)

    @rule(
        cid=st.sampled_from(CIDS),
        verifier=st.sampled_from(VERIFIERS),
        value=st.binary(min_size=32, max_size=32),
        bucket=st.integers(-(2**31), 2**31 - 1),
    )
    def attempt(self, cid, verifier, value, bucket):
        entry, inserted = journal.check_and_insert_witness(
            self.engine,
            challenge_id=cid,
            verifier=verifier,
            value_hash=value,
            norm_bucket=bucket,
            salt=os.urandom(32),
            proof_hash=value[::-1],
        )
        key = (cid, verifier)
        assert inserted == (key not in self.first)
        self.first.setdefault(key, entry.commitment)
        assert entry.commitment == self.first[key]

    @rule(data=st.data(), to=st.sampled_from(["in_progress", "unconfirmed", "confirmed", "failed"]))
    def transition(self, data, to):
        rows = journal.list_txs(self.engine)
        if not rows:
            return
        tx = data.draw(st.sampled_from(rows))
        if to == "in_progress":
            try:
                journal.mark_in_progress(self.engine, tx.id, head=1)
            except journal.JournalError:
                assert tx.state in ("confirmed", "failed")
        elif to == "unconfirmed":
            journal.mark_unconfirmed(self.engine, tx.id, b"\x01" * 32)
        else:
            with self.engine.begin() as c:
                (journal.confirm_tx if to == "confirmed" else journal.fail_tx)(
                    c,
                    tx.challenge_id,
                    tx.verifier,
                    tx.kind,
                    *([5] if to == "confirmed" else ["window closed"]),
                )

    @invariant()
    def one_witness_per_key_and_states_move_forward(self):
        for key, commitment in self.first.items():
            assert journal.get_witness(self.engine, *key).commitment == commitment
        for tx in journal.list_txs(self.engine):
            before = self.seen_state.get(tx.id)
            if before in ("confirmed", "failed"):
                assert tx.state == before, f"a final tx moved from {before} to {tx.state}"
            elif before is not None:
                assert ORDER[tx.state] >= ORDER[before] or (
                    before == "unconfirmed" and tx.state == "in_progress"
                )
            self.seen_state[tx.id] = tx.state


JournalMachine.TestCase.settings = settings(max_examples=25, stateful_step_count=20, deadline=None)
TestJournalMachine = JournalMachine.TestCase
