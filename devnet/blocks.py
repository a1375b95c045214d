"""Block production for a local network: a thread that seals dev-chain blocks or asks a chopsticks
chain for them, slowly while someone still has to act in a window and fast otherwise."""

from __future__ import annotations

import threading
from collections.abc import Callable

from commitments.retry import Backoff

# Blocks come every SLOW_S while someone still has to act in a window, every FAST_S otherwise:
# generous windows keep a loaded machine from missing one, and nobody waits for idle blocks.
SLOW_S = 1.0
FAST_S = 0.1
# After a failure (a busy chain file, a slow RPC) the pause grows, jittered, up to 32 slow blocks.
RETRY = Backoff(base_s=2 * SLOW_S, cap_s=32 * SLOW_S)


class BlockMaker:
    """Makes blocks in a thread: every SLOW_S, or every FAST_S while `fast` is set.

    On the dev chain it seals blocks; on a chopsticks chain it asks for them (`dev_newBlock`);
    on any other Substrate chain the chain makes its own and this does nothing (`make` is None).
    `make(fast)` makes one batch of blocks."""

    def __init__(self, make: Callable[[bool], object] | None, label: str) -> None:
        self._make = make
        self.label = label
        self.fast = threading.Event()
        self._stop = threading.Event()
        self.errors = 0
        self.thread = threading.Thread(target=self._run, name="pot-demo-blocks", daemon=True)

    def start(self) -> BlockMaker:
        if self._make is not None:
            self.thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._make(self.fast.is_set())
                self.errors = 0
            except Exception:  # a busy chain file or a slow RPC: try again after a pause
                self.errors += 1
            pause = FAST_S if self.fast.is_set() else SLOW_S
            if self.errors:
                pause = RETRY.delay(self.errors - 1)
            self._stop.wait(pause)

    def stop(self) -> None:
        self._stop.set()
        if self.thread.is_alive():
            self.thread.join(10)
