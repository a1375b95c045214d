"""The stages of a challenge job, in one place: the daemon moves jobs through them, the database
stores their string values, and the API, queries, metrics and dashboard read and filter by them.

awaiting_opening -> fetch -> validate -> losschecks -> replay -> witness -> commit -> reveal ->
revealed -> done, or skipped (our own run, or a committee this node is not on) / missed (a window
closed first). The rules that move a job between them are node.lifecycle's (a pure state machine
the daemon follows).
"""

from __future__ import annotations

from enum import StrEnum


class Stage(StrEnum):
    """A job's stage. The values are what the database stores: renaming a member keeps records."""

    AWAITING_OPENING = "awaiting_opening"
    FETCH = "fetch"
    VALIDATE = "validate"
    LOSSCHECKS = "losschecks"
    REPLAY = "replay"
    WITNESS = "witness"
    COMMIT = "commit"
    REVEAL = "reveal"
    REVEALED = "revealed"
    DONE = "done"
    MISSED = "missed"
    SKIPPED = "skipped"  # our own run, or not on the challenge's committee


# Every stage, in pipeline order (filters, counts, the API's enum).
STAGES: tuple[str, ...] = tuple(s.value for s in Stage)
# Stages whose work the daemon runs itself (threads, replay processes, the journal); the ones an
# operator may re-queue.
WORK_STAGES: tuple[Stage, ...] = (Stage.FETCH, Stage.VALIDATE, Stage.LOSSCHECKS, Stage.REPLAY, Stage.WITNESS)
# Stages after which a job moves no further in this node.
STOPPED: tuple[Stage, ...] = (Stage.DONE, Stage.MISSED, Stage.SKIPPED)
# The stage after each thread stage that succeeded (node.lifecycle.next_stage: a refusal goes to the
# witness, and a fetch for a Ray cluster skips validate).
NEXT_STAGE: dict[Stage, Stage] = {Stage.FETCH: Stage.VALIDATE, Stage.VALIDATE: Stage.LOSSCHECKS,
                                  Stage.LOSSCHECKS: Stage.REPLAY}
# The stage log's last row of a resolved job: not a job stage, the chain's resolution.
RESOLUTION = "resolution"
# The database column's width (String(STAGE_WIDTH)); every value must fit (tests/node/test_stages.py).
STAGE_WIDTH = 32

__all__ = ["NEXT_STAGE", "RESOLUTION", "STAGES", "STAGE_WIDTH", "STOPPED", "WORK_STAGES", "Stage"]
