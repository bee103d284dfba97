"""Engines that run one sweep point: the embedded simulator and real vLLM. Imports nothing heavy."""
