"""The red team: train a fresh tiny run, forge its openings and trajectories in every way the
protocol must stop, and run each forgery through the verifier's real path (fetch -> load/validate
-> replay) against the facts a dev chain records. `pot redteam` (devnet/cli.py) prints the table.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from chain.transport import TransportError
from challenges.opening import OpeningRefused, load_opening
from commitments.errors import CommitmentError
from commitments.hashing import h

# The second round's probes (docs/redteam.md), one module per finding: importing one registers its
# probes in devnet.hostile.PROBES, after the first round's (each imports devnet.hostile, so that
# module cannot import them).
from devnet import (  # noqa: F401
    hostile_follower,
    hostile_isolation,
    hostile_memory,
    hostile_params,
    hostile_sealing,
)
from devnet.forge import EDITS, Attempt, max_opening_bytes
from devnet.hostile import PROBES
from devnet.lab import CHALLENGED, SPEC, STEPS, Lab, RedTeamError
from miner.trainer import TrainerError
from node.egress import EgressPolicy
from node.fetch import FetchPolicy
from node.pipeline import replay_file, stage_fetch, stage_validate

OUTCOMES = ("refused", "caught", "no-byte-change", "missed")
LABELS = {"refused": "refused before compute", "caught": "caught at the step",
          "no-byte-change": "passes: changes no byte", "missed": "MISSED"}


@dataclass
class EditResult:
    name: str
    kind: str
    outcome: str
    stage: str
    reason: str
    must: str | None = None  # a hostile-input probe: what the node must do

    def as_json(self) -> dict[str, Any]:
        out = {"name": self.name, "outcome": self.outcome, "kind": self.kind, "stage": self.stage,
               "reason": self.reason}
        if self.must is not None:
            out["must"] = self.must
        return out


@dataclass
class Report:
    edits: list[EditResult]
    honest_checked: int
    honest_flagged: list[tuple[int, str]] = field(default_factory=list)

    @property
    def missed(self) -> list[EditResult]:
        return [e for e in self.edits if e.outcome == "missed"]

    @property
    def ok(self) -> bool:
        return not self.missed and not self.honest_flagged

    def as_json(self) -> dict[str, Any]:
        return {"edits": [e.as_json() for e in self.edits], "honest_flagged": len(self.honest_flagged)}


# --- the verifier's path ------------------------------------------------------------------------


def verify(lab: Lab, view: Any, attempt: Attempt, tag: str) -> tuple[str, str, str]:
    """(refused | caught | passed, stage, reason): fetch -> load/validate -> replay, as the node does."""
    cap = max_opening_bytes(lab)
    try:
        expected = load_opening(attempt.data, max_bytes=cap).digest
    except OpeningRefused:
        expected = h(attempt.data)  # the miner posts some digest; the file is refused before it matters
    facts = lab.facts(view, attempt.run_id, attempt.step, expected)
    served = attempt.data
    uri = lab.prover.put(f"/openings/{tag}", served, gz=attempt.gzip)
    dest = lab.dir / "verifier" / f"{tag}.opening"
    policy = FetchPolicy(
        connect_timeout_s=5,
        read_timeout_s=10,
        total_timeout_s=30,
        attempts=2,
        backoff_base_s=0.05,
        backoff_max_s=0.2,
        egress=EgressPolicy.from_allow(["127.0.0.1"]),
    )
    fetched = stage_fetch(uri=uri, endpoint=lab.prover.endpoint, run_id=attempt.run_id, dest=dest,
                          leaves_dest=dest.with_suffix(".leaves"), max_opening_bytes=cap,
                          max_leaves_bytes=1 << 20, policy=policy, facts=facts)
    if not fetched.ok:
        return "refused", "fetch", f"[{fetched.refusal_class}] {fetched.reason}"
    validated = stage_validate(dest, facts, max_bytes=cap)
    if not validated.ok:
        return "refused", "validate", f"[{validated.refusal_class}] {validated.reason}"
    msg = replay_file(str(dest), facts.kwargs(), cap)
    if msg["result"] is None:
        return "caught", "replay", msg["reason"] or "the step could not be replayed"
    if not msg["matches"]:
        return "caught", "replay", msg["reason"]
    return "passed", "replay", "the replayed leaf equals the committed leaf"


def run_redteam(workdir: Path, *, log: Callable[[str], None] = lambda s: None,
                only: list[str] | None = None) -> Report:
    """Set up the lab, apply every edit (or those named in `only`), verify each, then run the
    hostile-input probes (or those named), then the honest steps."""
    known = [name for name, _, _ in EDITS] + [p.name for p in PROBES]
    unknown = sorted(set(only or ()) - set(known))
    if unknown:
        raise RedTeamError(f"unknown edit(s) {', '.join(unknown)}; known: {', '.join(known)}")

    torch.set_num_threads(1)  # the verifier's replay workers run one thread each
    try:
        lab = Lab(workdir, log=log)
    except (CommitmentError, TrainerError, TransportError, OSError) as exc:
        raise RedTeamError(f"cannot set up the run under {workdir}: {exc}") from None
    try:
        attempts: list[tuple[str, str, Attempt]] = []
        for name, kind, make in EDITS:
            if only and name not in only:
                continue
            attempts.append((name, kind, make(lab)))
        view = lab.view()
        results = []
        for name, kind, attempt in attempts:
            outcome, stage, reason = verify(lab, view, attempt, name)
            if outcome == "passed":
                outcome = "missed" if attempt.changed else "no-byte-change"
            elif not attempt.changed:
                # An edit that changes nothing yet fails would flag an honest opening.
                outcome = "missed"
                reason = f"an unchanged opening was flagged: {reason}"
            results.append(EditResult(name, kind, outcome, stage, reason))
            log(f"{name}: {outcome} at {stage}: {reason[:120]}")
        for p in PROBES:
            if only and p.name not in only:
                continue
            try:
                held, stage, reason = p.check(lab)
            except Exception as exc:  # a probe that breaks the verifier's part is a finding, not a crash
                held, stage, reason = (
                    False,
                    "probe",
                    f"the probe raised {type(exc).__name__}: {str(exc)[:160]}",
                )
            results.append(
                EditResult(p.name, p.kind, "refused" if held else "missed", stage, reason, must=p.must)
            )
            log(f"{p.name}: {'held' if held else 'MISSED'} at {stage}: {reason[:120]}")
        flagged = []
        for t in range(1, STEPS + 1):
            data = lab.opening(t)
            outcome, stage, reason = verify(
                lab, view, Attempt(data, lab.honest.run_id, step=t, changed=False), f"honest-{t}"
            )
            if outcome != "passed":
                flagged.append((t, f"{stage}: {reason}"))
        return Report(results, STEPS, flagged)
    finally:
        lab.close()


def format_table(report: Report) -> str:
    edits = [e for e in report.edits if e.must is None]
    probes = [e for e in report.edits if e.must is not None]
    w = max(len(e.name) for e in report.edits)
    k = max(len(e.kind) for e in report.edits)
    lines = []
    if edits:
        lines += [f"{'edit':<{w}}  {'kind':<{k}}  {'outcome':<24}  reason", "-" * (w + k + 60)]
        for e in edits:
            lines.append(f"{e.name:<{w}}  {e.kind:<{k}}  {LABELS[e.outcome]:<24}  {e.reason[:110]}")
        lines.append("")
    if probes:
        lines += [f"{'hostile input':<{w}}  {'must':<70}  {'outcome':<6}  reason", "-" * (w + 140)]
        for e in probes:
            lines.append(
                f"{e.name:<{w}}  {e.must[:70]:<70}  {'held' if e.outcome == 'refused' else 'MISSED':<6}  "
                f"[{e.stage}] {e.reason[:110]}"
            )
        lines.append("")
    counts = {o: sum(e.outcome == o for e in edits) for o in OUTCOMES}
    lines.append(f"{len(edits)} edits: " + ", ".join(f"{counts[o]} {LABELS[o]}" for o in OUTCOMES))
    if probes:
        held = sum(e.outcome == "refused" for e in probes)
        lines.append(f"{len(probes)} hostile inputs: {held} held, {len(probes) - held} MISSED")
    flagged = ", ".join(f"step {t} ({why[:80]})" for t, why in report.honest_flagged) or "none"
    lines.append(f"honest steps checked: {report.honest_checked}; flagged: {flagged}")
    return "\n".join(lines)


__all__ = [
    "CHALLENGED",
    "EDITS",
    "OUTCOMES",
    "PROBES",
    "SPEC",
    "Attempt",
    "Lab",
    "RedTeamError",
    "Report",
    "format_table",
    "run_redteam",
    "verify",
]
