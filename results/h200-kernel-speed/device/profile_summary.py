"""Where an engine step's device time goes, from vLLM's profiler table (``step_profile.sh``'s ``*-table.txt``).

  python results/h200-kernel-speed/device/profile_summary.py profile-store_all-b40-table.txt [...]

The table is torch's ``key_averages().table()`` as vLLM writes it (``profiler_out*.txt``): one row per op or
kernel, self time on the device ("Self CUDA"; on a CPU run "Self CPU"), and call counts. On a GPU table an op
(a row with host time: ``aten::mm``, ``vllm::moe_forward_shared``) lists as its "Self CUDA" the kernels it
launched, which have rows of their own (no host time), so only those device rows are summed; vLLM's per-step
ranges (``execute_context_*``) are GPU-timeline spans, not kernels: they are printed apart as the span per step
(kernels plus the gaps between them). This groups the device rows by what they are (MoE, attention, the GDN
commit, the rest of GDN, GEMMs, sampling, other) with the regular expressions below, first match wins, and prints
per group the device time per engine step and its share of the table's total, with each group's largest rows so
a misfiled kernel shows. Steps: ``profile.steps`` of the run's result JSON beside the table
(``profile-S-bB.json``), else the calls of the step ranges. The table lists only its top rows: the rest of the
total is "not listed". Milliseconds.
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

GROUPS = [  # (group, pattern on the row's name); the first that matches files the row
    ("step ranges", r"^execute_context|^execute_model|^ProfilerStep"),
    ("moe", r"fused_moe|moe_align|moe_sum|topk_softmax|grouped_topk|_moe_|experts"),
    ("attention", r"flash|fmha|FlashAttn|unified_attention|paged_attention|reshape_and_cache|kv_cache"),
    ("gdn commit", r"delta_rule|fused_sigmoid_gating|paged_|treewy|replay|commitbench|_commit"),
    ("gdn other", r"causal_conv1d|convolution|chunk_|gdn|l2norm|gated_delta|fused_recurrent|solve_tril"),
    ("gemm", r"gemm|nvjet|cutlass|xmma|cublas|matmul|addmm|aten::mm$|onednn_mm|aten::linear"),
    ("sampling", r"sampl|argmax|rejection|eagle|aten::topk|softmax|multinomial|gumbel"),
    ("norm, activation, copies", r"norm|rms|silu|act_and_mul|gelu|rotary|triton_|elementwise|vectorized|copy|cat"
                                 r"|index|fill|slice|reduce|aten::"),
]
UNIT = {"us": 1e-3, "ms": 1.0, "s": 1e3}


def _ms(cell: str) -> float | None:
    m = re.fullmatch(r"([0-9.]+)(us|ms|s)", cell.strip())
    return float(m[1]) * UNIT[m[2]] if m else None


def parse(text: str) -> tuple[list[dict], float | None, str]:
    """(rows of name, self device ms, calls, host ms), the table's self device total (ms), and the device
    ("CUDA"/"CPU")."""
    lines = text.splitlines()
    sep = next(i for i, ln in enumerate(lines) if ln.startswith("---"))
    spans = [(m.start(), m.end()) for m in re.finditer(r"-+", lines[sep])]
    cells = lambda ln: [ln[a:b + 2].strip() for a, b in spans]
    head = cells(lines[sep + 1])
    device = "CUDA" if "Self CUDA" in head else "CPU"
    col, calls = head.index(f"Self {device}"), head.index("# of Calls")
    host = head.index("CPU total")
    rows = []
    for ln in lines[sep + 3:]:
        if ln.startswith("---"):
            break
        c = cells(ln)
        t = _ms(c[col])
        if t is not None:
            rows.append({"name": c[0], "ms": t, "calls": int(c[calls]), "host_ms": _ms(c[host]) or 0.0})
    total = next((_ms(m[1]) for ln in lines if (m := re.match(rf"Self {device} time total: (\S+)", ln))), None)
    return rows, total, device


def _steps(path: Path, ranges: list[dict]) -> tuple[int, str]:
    """Engine steps the table covers, and where that number came from."""
    js = path.with_name(path.name.replace("-table.txt", ".json"))
    if js.is_file():
        n = (json.loads(js.read_text()).get("profile") or {}).get("steps")
        if n:
            return int(n), js.name
    return sum(r["calls"] for r in ranges), "step ranges"


def summarize(path: Path) -> str:
    rows, total, device = parse(path.read_text())
    ranges = [r for r in rows if re.match(GROUPS[0][1], r["name"])]
    steps, source = _steps(path, ranges)
    if device == "CUDA":    # ops' self device time repeats their kernels' rows; ranges are spans, not kernels
        rows = [r for r in rows if r["host_ms"] == 0.0 and r not in ranges]
    by: dict[str, list[dict]] = {g: [] for g, _ in GROUPS}
    by["other"] = []
    for r in rows:
        g = next((g for g, pat in GROUPS if re.search(pat, r["name"])), "other")
        by[g].append(r)
    listed = sum(r["ms"] for rs in by.values() for r in rs)
    out = [f"{path.name}: {device} self time {f'{total:.1f}' if total else '?'} ms over {steps or '?'} steps"
           + (f" ({source})" if steps else "") + (f" = {total / steps:.2f} ms per step" if steps and total else "")]
    per = lambda ms: f"{ms / steps:8.2f}" if steps else f"{ms:8.1f}"
    if device == "CUDA" and ranges:
        span = sum(r["ms"] for r in ranges)
        out.append(f"  {'GPU span of a step':26s} {per(span)} ms/step (kernels and the gaps between them)")
    for g, rs in by.items():
        if not rs:
            continue
        ms = sum(r["ms"] for r in rs)
        top = ", ".join(f"{r['name'][:48]} {r['ms']:.1f}" for r in sorted(rs, key=lambda r: -r["ms"])[:3])
        out.append(f"  {g:26s} {per(ms)} ms/step {ms / total:6.1%}   [{top}]" if total else f"  {g} {ms:.1f}")
    if total:
        out.append(f"  {'not listed':26s} {per(total - listed)} ms/step {(total - listed) / total:6.1%}")
    return "\n".join(out)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    print("\n\n".join(summarize(Path(p)) for p in sys.argv[1:]))
