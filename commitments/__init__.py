"""Commitments: hashing, deterministic CBOR, Merkle trees, tensor/state digests, dataset,
schedule, spec, step leaves, the signed transcript, and the small shared helpers (atomic files,
retries). The bottom room: it imports nothing of this project's other packages."""
