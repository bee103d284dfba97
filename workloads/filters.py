"""``vllm bench serve``'s length filters, with a count of what each one dropped."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass


@dataclass(frozen=True)
class LengthFilter:
    """vLLM's ``is_valid_sequence``: drop prompts or outputs under ``min_len`` tokens, prompts over
    ``max_prompt_len`` and prompt + output over ``max_total_len``. ``None`` disables a bound."""

    min_len: int | None = 4
    max_prompt_len: int | None = 1024
    max_total_len: int | None = 2048

    def reason(self, prompt_len: int, output_len: int) -> str | None:
        """Why a request is dropped (the first rule it breaks, in vLLM's order), or None to keep it."""
        if self.min_len is not None and prompt_len < self.min_len:
            return f"prompt < {self.min_len} tokens"
        if self.min_len is not None and output_len < self.min_len:
            return f"output < {self.min_len} tokens"
        if self.max_prompt_len is not None and prompt_len > self.max_prompt_len:
            return f"prompt > {self.max_prompt_len} tokens"
        if self.max_total_len is not None and prompt_len + output_len > self.max_total_len:
            return f"prompt + output > {self.max_total_len} tokens"
        return None

    def apply(self, items: list, lengths) -> tuple[list, Counter]:
        """Keep the items whose (prompt_len, output_len) pass; count the dropped by reason."""
        kept, dropped = [], Counter()
        for item, (p, o) in zip(items, lengths, strict=True):
            why = self.reason(p, o)
            if why is None:
                kept.append(item)
            else:
                dropped[why] += 1
        return kept, dropped
