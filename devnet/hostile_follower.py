"""Hostile-input probes, second round: a block or snapshot that would stop the chain follower. Registered in devnet.hostile."""

from __future__ import annotations
