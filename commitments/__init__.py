"""Commitments: hashing, deterministic CBOR, Merkle trees, tensor/state digests, dataset,
schedule, spec, step leaves, the signed transcript, and the miner SDK."""
