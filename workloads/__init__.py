"""Request sources (ShareGPT, Spec-Bench, BurstGPT, synthetic) and arrival processes. Not built yet."""
