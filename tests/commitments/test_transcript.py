"""The signed transcript: writing, resuming, and offline detection of every kind of tampering."""

from __future__ import annotations

import os
import platform
import stat

import cbor2
import pytest
from nacl.signing import SigningKey

from commitments import cbor
from commitments.transcript import (
    BAD_ROOT,
    BAD_SIGNATURE,
    BROKEN_LINK,
    EMPTY,
    NON_CANONICAL,
    OUT_OF_SEQUENCE,
    TRANSCRIPT_VERSION,
    TRUNCATED,
    TranscriptError,
    TranscriptWriter,
    iter_records,
    load_session_key,
    make_record,
    record_digest,
    save_session_key,
    signing_message,
    verify_transcript,
)

KEY = SigningKey(bytes(range(32)))
OTHER = SigningKey(bytes(range(1, 33)))


def _write(path, n=4, key=KEY):
    with TranscriptWriter.create(path, "run-a", key, time=1_700_000_000, nonce=b"n" * 16) as w:
        for i in range(1, n):
            w.append("step", {"t": i, "loss_bits": 1000 + i, "note": "x" * i})
    return path.read_bytes()


def _records(data):
    return [r for r in iter_records(data)]


def _spans(data):
    return [(r.offset, r.offset + len(r.raw)) for r in _records(data)]


def test_a_written_transcript_verifies_with_its_identity(tmp_path):
    data = _write(tmp_path / "t.cbor")
    report = verify_transcript(tmp_path / "t.cbor")
    assert report.ok and report.problem is None
    assert report.records == 4 and report.kinds == {"root": 1, "step": 3}
    assert report.run_name == "run-a" and report.protocol_version == TRANSCRIPT_VERSION
    assert report.session_key == bytes(KEY.verify_key)
    assert report.time == 1_700_000_000
    assert report.build["python"] == platform.python_version()
    assert {"package", "python", "torch"} <= set(report.build)
    assert report.head == record_digest(_records(data)[-1].raw)
    assert verify_transcript(data).as_json() == report.as_json()


def test_the_file_is_a_concatenation_of_canonical_linked_signed_records(tmp_path):
    data = _write(tmp_path / "t.cbor")
    recs = _records(data)
    assert b"".join(r.raw for r in recs) == data
    for i, r in enumerate(recs):
        assert cbor.encode(cbor.decode(r.raw)) == r.raw
        assert r.index == i == r.fields["index"]
        unsigned = {k: v for k, v in r.fields.items() if k != "sig"}
        KEY.verify_key.verify(signing_message(unsigned), r.fields["sig"])
        if i:
            assert r.fields["prev"] == record_digest(recs[i - 1].raw)
    assert recs[2].payload == {"t": 2, "loss_bits": 1002, "note": "xx"}
    assert len(recs[0].fields["nonce"]) == 16


def test_flipping_any_byte_is_detected_at_or_before_its_record(tmp_path):
    data = _write(tmp_path / "t.cbor", n=3)
    spans = _spans(data)
    for pos in range(len(data)):
        for mask in (0x01, 0x80):
            bad = bytearray(data)
            bad[pos] ^= mask
            report = verify_transcript(bytes(bad))
            assert not report.ok, (pos, mask)
            owner = next(i for i, (a, b) in enumerate(spans) if a <= pos < b)
            assert report.problem.index <= owner, (pos, mask, report.problem)


def test_dropping_a_record_is_reported_as_out_of_sequence(tmp_path):
    data = _write(tmp_path / "t.cbor", n=5)
    spans = _spans(data)
    dropped = data[: spans[2][0]] + data[spans[2][1]:]
    report = verify_transcript(dropped)
    assert not report.ok and report.records == 2
    assert report.problem.index == 2 and report.problem.reason == OUT_OF_SEQUENCE
    assert "index 3, expected 2" in report.problem.detail


def test_swapping_two_records_is_reported_as_out_of_sequence(tmp_path):
    data = _write(tmp_path / "t.cbor", n=5)
    (a0, a1), (b0, b1) = _spans(data)[1], _spans(data)[2]
    swapped = data[:a0] + data[b0:b1] + data[a0:a1] + data[b1:]
    report = verify_transcript(swapped)
    assert report.problem.index == 1 and report.problem.reason == OUT_OF_SEQUENCE


def test_an_appended_record_signed_by_another_key_is_refused(tmp_path):
    data = _write(tmp_path / "t.cbor")
    head = record_digest(_records(data)[-1].raw)
    forged = make_record(OTHER, 4, "step", {"t": 4}, head)
    report = verify_transcript(data + forged)
    assert not report.ok and report.records == 4
    assert report.problem.index == 4 and report.problem.reason == BAD_SIGNATURE
    # The same record signed by the session key is accepted: the signature was the only fault.
    assert verify_transcript(data + make_record(KEY, 4, "step", {"t": 4}, head)).ok


def test_a_record_with_a_wrong_prev_is_a_broken_link(tmp_path):
    data = _write(tmp_path / "t.cbor")
    recs = _records(data)
    relinked = make_record(KEY, 4, "step", {"t": 4}, record_digest(recs[2].raw))
    report = verify_transcript(data + relinked)
    assert report.problem.index == 4 and report.problem.reason == BROKEN_LINK


def test_truncation_inside_a_record_is_reported(tmp_path):
    data = _write(tmp_path / "t.cbor")
    start, end = _spans(data)[-1]
    for cut in range(start + 1, end):
        report = verify_transcript(data[:cut])
        assert report.problem.index == 3 and report.problem.reason == TRUNCATED, cut
        assert report.records == 3
    # A cut at a record boundary leaves a shorter valid transcript: only an anchor can tell.
    short = verify_transcript(data[:start])
    assert short.ok and short.records == 3 and short.head != verify_transcript(data).head


def test_non_canonical_encodings_are_refused(tmp_path):
    data = _write(tmp_path / "t.cbor", n=2)
    head = record_digest(_records(data)[-1].raw)
    unsigned = {"prev": head, "payload": {}, "kind": "step", "index": 2}  # unsorted keys
    sig = KEY.sign(signing_message(unsigned)).signature
    unsorted = cbor2.dumps({**unsigned, "sig": sig})
    report = verify_transcript(data + unsorted)
    assert report.problem.index == 2 and report.problem.reason == NON_CANONICAL
    indefinite = b"\xbf" + cbor.encode({"index": 2})[1:] + b"\xff"
    assert verify_transcript(data + indefinite).problem.reason == NON_CANONICAL


def test_bad_roots_and_empty_files(tmp_path):
    assert verify_transcript(b"").problem.reason == EMPTY
    unsigned = {"v": "pot/transcript/v0", "index": 0, "kind": "root", "run": "r", "build": {},
                "session_key": bytes(KEY.verify_key), "time": 1, "nonce": b"n" * 16}
    old = cbor.encode({**unsigned, "sig": KEY.sign(signing_message(unsigned)).signature})
    report = verify_transcript(old)
    assert report.problem.index == 0 and report.problem.reason == BAD_ROOT
    assert "pot/transcript/v0" in report.problem.detail
    not_root = make_record(KEY, 0, "step", {}, bytes(32))
    assert verify_transcript(not_root).problem.reason == BAD_ROOT
    with pytest.raises(TranscriptError, match="cannot read transcript"):
        verify_transcript(tmp_path / "missing.cbor")


def test_resume_continues_the_chain(tmp_path):
    path = tmp_path / "t.cbor"
    _write(path, n=3)
    with TranscriptWriter.resume(path, KEY) as w:
        assert w.count == 3 and w.run_name == "run-a"
        rec = w.append("checkpoint", {"root": b"r" * 32})
        assert rec.index == 3
    report = verify_transcript(path)
    assert report.ok and report.records == 4 and report.kinds["checkpoint"] == 1


def test_resume_refuses_a_wrong_key_or_a_damaged_file(tmp_path):
    path = tmp_path / "t.cbor"
    data = _write(path)
    with pytest.raises(TranscriptError, match="not this transcript's session key"):
        TranscriptWriter.resume(path, OTHER)
    last = _records(data)[-1]
    bad = bytearray(data)
    bad[last.offset + last.raw.index(last.fields["sig"]) + 5] ^= 0xFF
    path.write_bytes(bytes(bad))
    with pytest.raises(TranscriptError, match="record 3.*bad-signature"):
        TranscriptWriter.resume(path, KEY, drop_partial_tail=True)
    with pytest.raises(TranscriptError, match="no such transcript"):
        TranscriptWriter.resume(tmp_path / "none.cbor", KEY)


def test_resume_can_cut_a_partial_tail_left_by_a_crash(tmp_path):
    path = tmp_path / "t.cbor"
    data = _write(path)
    path.write_bytes(data[:-7])
    with pytest.raises(TranscriptError, match="truncated"):
        TranscriptWriter.resume(path, KEY)
    with TranscriptWriter.resume(path, KEY, drop_partial_tail=True) as w:
        assert w.count == 3
        w.append("step", {"t": 3, "again": True})
    report = verify_transcript(path)
    assert report.ok and report.records == 4


def test_one_writer_at_a_time_and_no_overwrite(tmp_path):
    path = tmp_path / "t.cbor"
    w = TranscriptWriter.create(path, "run-b", KEY)
    try:
        with pytest.raises(TranscriptError, match="another writer"):
            TranscriptWriter.resume(path, KEY)
        with pytest.raises(TranscriptError, match="already exists"):
            TranscriptWriter.create(path, "run-b", KEY)
    finally:
        w.close()
    with pytest.raises(TranscriptError, match="closed"):
        w.append("step", {})
    TranscriptWriter.resume(path, KEY).close()
    assert [p.name for p in tmp_path.iterdir()] == ["t.cbor"]


def test_bad_appends_are_refused(tmp_path):
    with TranscriptWriter.create(tmp_path / "t.cbor", "run-c") as w:
        with pytest.raises(TranscriptError, match="payload must be a dict"):
            w.append("step", [1, 2])
        with pytest.raises(TranscriptError, match="other than 'root'"):
            w.append("root", {})
        with pytest.raises(TranscriptError, match="cannot be encoded"):
            w.append("step", {"x": {1, 2}})
        assert w.count == 1
    with pytest.raises(TranscriptError, match="run name"):
        TranscriptWriter.create(tmp_path / "u.cbor", "")
    assert verify_transcript(tmp_path / "t.cbor").ok


def test_session_keys_are_saved_private_and_reloaded(tmp_path):
    save_session_key(tmp_path / "session.key", KEY)
    mode = stat.S_IMODE(os.stat(tmp_path / "session.key").st_mode)
    assert mode == 0o600
    assert bytes(load_session_key(tmp_path / "session.key")) == bytes(KEY)
    (tmp_path / "short.key").write_bytes(b"abc")
    with pytest.raises(TranscriptError, match="32-byte seed"):
        load_session_key(tmp_path / "short.key")
    with pytest.raises(TranscriptError, match="already exists"):
        save_session_key(tmp_path / "session.key", OTHER)
