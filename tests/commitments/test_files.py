"""The one atomic-write policy: contents, permissions, no torn files, no overwrite when asked."""
import os
import stat

import pytest

from commitments.files import (
    PRIVATE,
    atomic_write_bytes,
    atomic_write_text,
    atomic_writer,
    create_private,
    make_private_dir,
    publish,
)


def _mode(p):
    return stat.S_IMODE(os.stat(p).st_mode)


def test_write_replace_and_mode(tmp_path):
    p = tmp_path / "sub" / "a.bin"
    atomic_write_bytes(p, b"one")
    assert p.read_bytes() == b"one" and _mode(p) == 0o644
    atomic_write_text(p, "two", mode=PRIVATE)
    assert p.read_text() == "two" and _mode(p) == 0o600
    assert [q.name for q in p.parent.iterdir()] == ["a.bin"]  # no temp file left


def test_failure_leaves_old_file(tmp_path):
    p = tmp_path / "a.bin"
    atomic_write_bytes(p, b"old")
    with pytest.raises(RuntimeError), atomic_writer(p) as f:
        f.write(b"half")
        raise RuntimeError("crash mid-write")
    assert p.read_bytes() == b"old"
    assert [q.name for q in tmp_path.iterdir()] == ["a.bin"]


def test_no_replace_refuses_existing(tmp_path):
    p = tmp_path / "a.bin"
    atomic_write_bytes(p, b"first", replace=False)
    with pytest.raises(FileExistsError):
        atomic_write_bytes(p, b"second", replace=False)
    assert p.read_bytes() == b"first"
    assert [q.name for q in tmp_path.iterdir()] == ["a.bin"]


def test_create_private_narrows(tmp_path):
    p = tmp_path / "db.sqlite"
    p.write_bytes(b"x")
    os.chmod(p, 0o644)
    create_private(p)
    assert _mode(p) == 0o600 and p.read_bytes() == b"x"
    q = tmp_path / "new" / "j.db"
    create_private(q)
    assert _mode(q) == 0o600 and q.read_bytes() == b""


def test_publish_moves_a_finished_file_over_the_target(tmp_path):
    part, dest = tmp_path / "o.part", tmp_path / "o"
    dest.write_bytes(b"old")
    part.write_bytes(b"downloaded")
    publish(part, dest)
    assert dest.read_bytes() == b"downloaded" and not part.exists()
    with pytest.raises(FileNotFoundError):
        publish(part, dest)  # nothing to publish: the target stays
    assert dest.read_bytes() == b"downloaded"


def test_make_private_dir_creates_0700_and_keeps_an_existing_mode(tmp_path):
    d = make_private_dir(tmp_path / "a" / "data")
    assert d.is_dir() and _mode(d) == 0o700
    os.chmod(d, 0o750)
    make_private_dir(d)
    assert _mode(d) == 0o750
