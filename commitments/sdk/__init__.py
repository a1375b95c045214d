"""The miner SDK: a trainer that commits every step, a checkpoint store, the opening prover server,
and run documents (recipes). Modules load on first use so `pot --help` never imports torch.
"""
