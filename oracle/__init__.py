"""The exact-v1 oracle: exact arithmetic, models, optimizers, RNG, the step function."""
