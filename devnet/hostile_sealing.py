"""Hostile-input probes, second round: what a node's views tell before its reveal. Registered in devnet.hostile."""

from __future__ import annotations
