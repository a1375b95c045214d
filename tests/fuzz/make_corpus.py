"""Write the fuzz seed corpora: `python -m tests.fuzz.make_corpus [TARGET ...]`.

Each target's `seeds()` builds small valid inputs with the project's own encoders; they are
written to tests/fuzz/corpus/<target>/<name> (the folder is replaced) and committed.
"""

from __future__ import annotations

import shutil
import sys

from tests.fuzz.engine import CORPUS
from tests.fuzz.targets import TARGETS, load

MAX_TOTAL_BYTES = 1024 * 1024


def main(argv: list[str]) -> int:
    for name in argv or TARGETS:
        seeds = load(name).seeds()
        folder = CORPUS / name
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        for key, data in sorted(seeds.items()):
            (folder / key).write_bytes(data)
        print(f"{name}: {len(seeds)} seeds, {sum(map(len, seeds.values()))} bytes")
    total = sum(p.stat().st_size for p in CORPUS.rglob("*") if p.is_file())
    print(f"corpus total: {total} bytes")
    if total > MAX_TOTAL_BYTES:
        print(f"the corpus is over {MAX_TOTAL_BYTES} bytes: keep the seeds small", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
