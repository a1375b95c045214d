"""Fields added to the spec after the first runs were committed leave old specs' bytes alone."""

from __future__ import annotations

from pathlib import Path

import pytest

from commitments import cbor
from commitments.spec import Spec, SpecError

ROOT = Path(__file__).resolve().parents[2]

# Digests of specs committed before the schedule, micro-batch and bf16 fields existed.
PINNED = {
    None: "5429195e80d2dd7449b19ce427c289f091c68a9125abd53b19349e128ba73f40",
    "gpt-tiny.toml": "22046a143b387a6d2adc3521554c06cfd2ac0a8033706609737d2426ad122120",
    "gpt2-small.toml": "fe26a5e349a466b0b5eef1854736247384f6595b8f270145080ad4182d6c64fa",
}


@pytest.mark.parametrize("name", list(PINNED))
def test_old_specs_keep_their_digests(name):
    spec = Spec() if name is None else Spec.from_toml(ROOT / "examples" / "specs" / name)
    assert spec.digest().hex() == PINNED[name]


@pytest.mark.parametrize(("section", "field", "value"), [
    ("optimizer", "schedule", "cosine"),
    ("optimizer", "warmup_steps", 0),
    ("optimizer", "decay_steps", 0),
    ("optimizer", "min_lr", 0.0),
    ("batch", "micro_batches", 1),
])
def test_new_fields_are_absent_at_their_default(section, field, value):
    spec = Spec()
    assert field not in spec.canonical()[section]
    explicit = Spec.from_dict({section: {field: value}} if field != "schedule" else
                              {section: {"schedule": "cosine", "decay_steps": 10}})
    if field == "schedule":
        assert explicit.canonical()[section][field] == value
    else:  # written out at its default, the field still encodes as before
        assert explicit.to_cbor() == spec.to_cbor()


def test_new_fields_round_trip_through_cbor():
    spec = Spec.from_dict({"dtype": "bf16-mixed", "batch": {"batch_size": 8, "micro_batches": 4},
                           "optimizer": {"schedule": "linear", "warmup_steps": 5, "decay_steps": 50,
                                         "min_lr": 1e-5}})
    back = Spec.from_cbor(spec.to_cbor())
    assert back == spec and back.to_cbor() == spec.to_cbor()
    assert cbor.decode(spec.to_cbor())["batch"]["micro_batches"] == 4
    assert spec.digest() != Spec.from_dict({"dtype": "bf16-mixed"}).digest()


def test_micro_batches_beyond_the_batch_are_refused():
    with pytest.raises(SpecError, match="micro_batches"):
        Spec.from_dict({"batch": {"batch_size": 4, "micro_batches": 5}})
    with pytest.raises(SpecError, match="micro_batches"):
        Spec.from_dict({"batch": {"micro_batches": 0}})
    with pytest.raises(SpecError, match="dtype"):
        Spec.from_dict({"dtype": "float16"})


def test_the_new_fields_encoding_is_pinned():
    """gpt-tiny-bf16 sets every field added with the schedules, bf16-mixed and micro-batches."""
    spec = Spec.from_toml(ROOT / "examples" / "specs" / "gpt-tiny-bf16.toml")
    assert (
        spec.dtype == "bf16-mixed" and spec.batch.micro_batches == 2 and spec.optimizer.schedule == "cosine"
    )
    assert spec.digest().hex() == "a83750b4b598c3e64b4e2f686eff8223875723ab6cfa76e389defdcd7ec962e8"
