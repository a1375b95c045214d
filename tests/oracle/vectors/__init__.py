"""Conformance vectors and edge-case inputs of exact-v1."""
