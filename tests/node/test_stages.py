"""The one list of job stages: its stored values never change, and every user reads it."""

from __future__ import annotations

from node import db
from node.stages import RESOLUTION, STAGE_WIDTH, STAGES, STOPPED, WORK_STAGES, Stage


def test_stage_values_are_the_stored_strings():
    # Records written before the enum existed hold these strings; they must keep reading back.
    assert STAGES == ("awaiting_opening", "fetch", "validate", "losschecks", "replay", "witness", "commit",
                      "reveal", "revealed", "done", "missed", "skipped")
    assert Stage("losschecks") is Stage.LOSSCHECKS and Stage.LOSSCHECKS == "losschecks"
    assert f"{Stage.MISSED}" == "missed"
    assert WORK_STAGES == ("fetch", "validate", "losschecks", "replay", "witness")
    assert set(STOPPED) == {"done", "missed", "skipped"}
    assert RESOLUTION not in STAGES


def test_database_columns_fit_every_stage():
    for table in (db.challenges, db.stage_log):
        assert table.c.stage.type.length == STAGE_WIDTH
    assert max(map(len, (*STAGES, RESOLUTION))) <= STAGE_WIDTH
