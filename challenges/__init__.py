"""Challenges: derivation, openings, replay verification, witness values, verdicts, loss checks."""
