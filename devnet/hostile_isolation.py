"""Hostile-input probes, second round: one miner starving a resource every miner shares (resolver, fetch slots, disk). Registered in devnet.hostile."""

from __future__ import annotations
