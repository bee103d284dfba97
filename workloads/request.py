"""The one request type every workload yields and both engines consume."""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Request:
    """One request, as ``vllm bench serve`` would send it.

    ``prompt_len`` and ``output_len`` are tokens; ``output_len`` is the request's max tokens and,
    with ``ignore_eos``, exactly what it generates (synthetic lengths and trace lengths rely on it).
    ``arrival_s``: offset in seconds from the start of the run when the workload has arrival times
    (open loop, trace replay); None under closed-loop concurrency.
    """

    prompt_len: int
    output_len: int
    prompt: str | None = None
    prompt_token_ids: tuple[int, ...] | None = None
    category: str = ""
    source_id: str = ""
    arrival_s: float | None = None
    ignore_eos: bool = True

    def __post_init__(self) -> None:
        if self.prompt_len < 1:
            raise ValueError(f"request {self.source_id or '?'}: prompt_len={self.prompt_len}: must be >= 1")
        if self.output_len < 1:
            raise ValueError(f"request {self.source_id or '?'}: output_len={self.output_len}: must be >= 1")

    def at(self, arrival_s: float | None) -> "Request":
        return replace(self, arrival_s=arrival_s)
