"""Hostile-input probes, second round: decoder memory amplification (leaf lists, manifests). Registered in devnet.hostile."""

from __future__ import annotations
