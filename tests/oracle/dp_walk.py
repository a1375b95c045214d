"""One rank of a data-parallel walk (run by tests/oracle/test_parallel.py as a real process per rank).

    RANK=r WORLD_SIZE=n MASTER_ADDR=127.0.0.1 MASTER_PORT=p \\
        python -m tests.oracle.dp_walk SPEC_JSON STEPS MB OUT

Walks STEPS steps of the spec from its seed on test batches, each step split over the ranks
(MB micro-batches per shard), and writes this rank's [state digest hex, loss bits] per step to
OUT.<rank>.json.
"""

from __future__ import annotations

import json
import sys

import torch

from commitments.spec import Spec
from oracle.parallel import Ranks
from oracle.step import init_state, step


def batch(spec: Spec, t: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(t)  # test data only
    return torch.randint(0, spec.model.vocab_size, (spec.batch.batch_size, spec.sample_len), generator=g)


def main() -> None:
    spec_json, steps, mb, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    torch.set_num_threads(1)
    spec = Spec.from_dict(json.loads(spec_json))
    ranks = Ranks.from_env(backend="gloo", timeout_s=120)
    assert ranks is not None
    st = init_state(spec)
    rows = []
    for t in range(1, steps + 1):
        st, loss = step(st, batch(spec, t), spec, t, micro_batches=mb, ranks=ranks)
        rows.append([st.digest().hex(), int(loss.view(torch.int32).item())])
    with open(f"{out}.{ranks.rank}.json", "w") as f:
        json.dump(rows, f)
    ranks.close()


if __name__ == "__main__":
    main()
