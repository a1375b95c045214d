"""The miner SDK: a trainer that commits every step, a checkpoint store, the opening prover server,
run documents (recipes) and the miner CLI. This package file imports nothing, so mounting the CLI
under `pot` never imports torch.
"""
