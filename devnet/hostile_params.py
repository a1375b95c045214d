"""Hostile-input probes, second round: an out-of-range or unpinned configure_network record. Registered in devnet.hostile."""

from __future__ import annotations
