"""The protocol as a deterministic state machine, its transports, keys and randomness."""
