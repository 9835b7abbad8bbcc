"""The searches: the largest token budget that fits the VRAM budget (GPU) and the smallest one within a few
percent of the best throughput under a latency bound (CPU)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from worker.inference.model_calls import is_out_of_memory
from worker.inference.tuning.memory_model import MemoryProbeResult, fit_memory, resolve_budget
from worker.inference.tuning.probes import MemoryProbe, ThroughputProbe
from worker.inference.tuning.result import MIB, TuningError

log = logging.getLogger(__name__)

MEMORY_SEQ_LENS = (32, 64, 128, 256)
THROUGHPUT_SEQ_LENS = (32, 64, 128)
THROUGHPUT_BUDGETS = (256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536)


def search_memory_budget(
    probe: MemoryProbe,
    *,
    max_seq_len: int,
    budget_mb: int | None = None,
    fraction: float | None = None,
    margin: float = 0.1,
    seq_lens: Sequence[int] = MEMORY_SEQ_LENS,
    start_tokens: int = 256,
    max_tokens: int = 1 << 20,
    refine_steps: int = 3,
    verify_attempts: int = 6,
    progress: Callable[[str], None] | None = None,
) -> tuple[int, dict[str, Any], list[MemoryProbeResult], list[str]]:
    """The largest padded-token budget that fits the VRAM budget: (tokens, details, probes, notes).

    At each sequence length (those of `seq_lens` up to `max_seq_len`, plus `max_seq_len`) the padded token
    count doubles from `start_tokens` until a probe exceeds the limit, runs out of memory (then
    `refine_steps` bisection probes narrow down where) or passes `max_tokens`. If the device ran out of
    memory at all, the limit becomes `margin` below the largest peak that fitted (the device has less free
    memory than its size). The fit gives the budget for the worst case (all sequences at `max_seq_len`),
    capped at `max_tokens`; real probes verify it, bisecting towards the largest size known to fit.
    """
    say = progress or (lambda _line: None)
    budget = resolve_budget(probe.device_total_bytes(), budget_mb=budget_mb, fraction=fraction, margin=margin)
    lens = sorted({n for n in seq_lens if n <= max_seq_len} | {max_seq_len})
    probes: list[MemoryProbeResult] = []
    for seq_len in lens:
        probes += _probe_length(
            probe, seq_len, start_tokens, max_tokens, budget.limit_bytes, refine_steps, say
        )
    worst = lens[-1]
    first_worst = next(p for p in probes if p.seq_len == worst)
    if first_worst.batch_size == 1 and not _fits(first_worst, budget.limit_bytes):
        raise TuningError(
            f"one sequence of {worst} tokens does not fit in {budget.limit_bytes // MIB} MiB "
            f"({budget.source}, margin {margin:.0%}): raise the budget or lower max_seq_len"
        )
    fit = fit_memory(probes)
    notes: list[str] = []
    limit = budget.limit_bytes
    if any(p.out_of_memory for p in probes):
        usable = max(p.peak_bytes for p in probes if p.peak_bytes is not None)
        if int(usable * (1 - margin)) < limit:
            limit = int(usable * (1 - margin))
            notes.append(
                "the device ran out of memory below the budget (other processes on it?): "
                f"{usable / MIB:.0f} MiB was the largest peak that fitted; the limit is {margin:.0%} "
                f"below it, {limit / MIB:.0f} MiB"
            )
    tokens = fit.max_tokens(worst, limit)
    if tokens > max_tokens:
        notes.append(f"the fit allows {tokens} tokens; capped at {max_tokens} (the largest probed size)")
        tokens = max_tokens
    tokens, verified = _verify(probe, tokens, worst, limit, probes, verify_attempts, notes, say)
    details = {
        "budget": asdict(budget),
        "margin": margin,
        "limit_bytes": limit,
        "worst_case_seq_len": worst,
        "fit": asdict(fit),
        "verified": {"batch_size": verified.batch_size, "seq_len": worst, "peak_bytes": verified.peak_bytes},
    }
    return tokens, details, probes, notes


def _probe_length(
    probe: MemoryProbe,
    seq_len: int,
    start_tokens: int,
    max_tokens: int,
    limit_bytes: int,
    refine_steps: int,
    say: Callable[[str], None],
) -> list[MemoryProbeResult]:
    """Doubling probes at one length; after an out-of-memory, bisection probes between it and the last fit."""
    out: list[MemoryProbeResult] = []

    def measure(batch: int) -> MemoryProbeResult:
        result = _measure(probe, batch, seq_len)
        out.append(result)
        say(_describe_probe(result, limit_bytes))
        return result

    batch, last_ok = max(1, start_tokens // seq_len), 0
    while True:
        result = measure(batch)
        if result.out_of_memory:
            low, high = last_ok, batch
            for _ in range(refine_steps if low else 0):
                middle = (low + high) // 2
                if middle <= low:
                    break
                low, high = (low, middle) if measure(middle).out_of_memory else (middle, high)
            return out
        if not _fits(result, limit_bytes) or 2 * batch * seq_len > max_tokens:
            return out
        last_ok, batch = batch, batch * 2


def _verify(
    probe: MemoryProbe,
    tokens: int,
    worst: int,
    limit_bytes: int,
    probes: list[MemoryProbeResult],
    attempts: int,
    notes: list[str],
    say: Callable[[str], None],
) -> tuple[int, MemoryProbeResult]:
    """A budget confirmed by a real probe at the worst-case length: `tokens`, or bisected below it."""
    at_worst = [p for p in probes if p.seq_len == worst]
    good = max((p for p in at_worst if _fits(p, limit_bytes)), key=lambda p: p.tokens, default=None)
    bad_tokens = min((p.tokens for p in at_worst if not _fits(p, limit_bytes)), default=None)
    if bad_tokens is not None and tokens >= bad_tokens:
        tokens = ((good.tokens if good else 0) + bad_tokens) // 2
    for _ in range(attempts):
        if tokens < worst:
            break
        if good is not None and (tokens // worst) * worst <= good.tokens:
            return tokens, good  # already measured: a batch this size fits
        check = _measure(probe, tokens // worst, worst)
        probes.append(check)
        say("verify " + _describe_probe(check, limit_bytes))
        if _fits(check, limit_bytes):
            return tokens, check
        notes.append(f"verification at {check.tokens} tokens did not fit; bisecting below it")
        tokens = ((good.tokens if good else 0) + check.tokens) // 2
    if good is not None:
        notes.append(f"using {good.tokens} tokens, the largest worst-case size measured to fit")
        return good.tokens, good
    raise TuningError(
        f"no padded-token budget of at least one sequence of max_seq_len={worst} was verified to fit in "
        f"{limit_bytes // MIB} MiB: raise the VRAM budget or lower max_seq_len"
    )


def _fits(result: MemoryProbeResult, limit_bytes: int) -> bool:
    return result.peak_bytes is not None and result.peak_bytes <= limit_bytes


def _measure(probe: MemoryProbe, batch_size: int, seq_len: int) -> MemoryProbeResult:
    try:
        return MemoryProbeResult(batch_size, seq_len, int(probe.peak_bytes(batch_size, seq_len)))
    except Exception as exc:
        if is_out_of_memory(exc):
            return MemoryProbeResult(batch_size, seq_len, None)
        raise


def _describe_probe(result: MemoryProbeResult, limit_bytes: int) -> str:
    peak = "out of memory" if result.peak_bytes is None else f"{result.peak_bytes / MIB:.1f} MiB"
    return (
        f"probe batch {result.batch_size} x {result.seq_len} = {result.tokens} tokens: {peak} "
        f"(limit {limit_bytes / MIB:.1f} MiB)"
    )


@dataclass(frozen=True)
class ThroughputRow:
    """Throughput at one token budget, over the probed sequence lengths."""

    max_batch_tokens: int
    tokens_per_second: float
    worst_batch_seconds: float
    within_latency_bound: bool


def search_throughput_budget(
    probe: ThroughputProbe,
    *,
    max_seq_len: int,
    latency_bound_s: float = 1.0,
    tolerance: float = 0.03,
    seq_lens: Sequence[int] = THROUGHPUT_SEQ_LENS,
    budgets: Sequence[int] = THROUGHPUT_BUDGETS,
    patience: int = 2,
    progress: Callable[[str], None] | None = None,
) -> tuple[int, dict[str, Any], list[dict[str, Any]], list[str]]:
    """The CPU token budget: the smallest one within `tolerance` of the best tokens/s among budgets whose
    batches (worst: every sequence at `max_seq_len`) take at most `latency_bound_s`.

    Budgets are tried in ascending order; the search stops at the first budget over the latency bound or
    after `patience` budgets without a gain of more than `tolerance`. Returns (tokens, details, rows, notes).
    """
    say = progress or (lambda _line: None)
    lens = sorted({n for n in seq_lens if n <= max_seq_len} | {max_seq_len})
    candidates = sorted({b for b in budgets if b >= max_seq_len}) or [max_seq_len]
    rows: list[ThroughputRow] = []
    probes: list[dict[str, Any]] = []
    best, stale = 0.0, 0
    for budget in candidates:
        total_tokens, total_seconds, worst = 0, 0.0, 0.0
        for seq_len in lens:
            batch = max(1, budget // seq_len)
            seconds = float(probe.batch_seconds(batch, seq_len))
            probes.append(
                {"max_batch_tokens": budget, "batch_size": batch, "seq_len": seq_len, "seconds": seconds}
            )
            total_tokens += batch * seq_len
            total_seconds += seconds
            worst = max(worst, seconds)
        rate = total_tokens * probe.parallel_calls / total_seconds  # that many batches in those seconds
        row = ThroughputRow(budget, rate, worst, worst <= latency_bound_s)
        rows.append(row)
        say(
            f"budget {budget:>6} tokens: {row.tokens_per_second:,.0f} tokens/s, slowest batch "
            f"{worst * 1000:.0f} ms{'' if row.within_latency_bound else ' (over the latency bound)'}"
        )
        if not row.within_latency_bound:
            break
        if row.tokens_per_second > best * (1 + tolerance):
            best, stale = row.tokens_per_second, 0
        else:
            stale += 1
            if stale >= patience:
                break
    notes: list[str] = []
    feasible = [r for r in rows if r.within_latency_bound]
    if not feasible:
        chosen = rows[0]
        notes.append(
            f"even {chosen.max_batch_tokens} tokens take {chosen.worst_batch_seconds * 1000:.0f} ms "
            "per batch, "
            f"over the {latency_bound_s * 1000:.0f} ms bound; using the smallest budget"
        )
    else:
        top = max(r.tokens_per_second for r in feasible)
        chosen = next(r for r in feasible if r.tokens_per_second >= (1 - tolerance) * top)
    details = {
        "latency_bound_s": latency_bound_s,
        "tolerance": tolerance,
        "seq_lens": lens,
        "rows": [asdict(r) for r in rows],
        "chosen_tokens_per_second": chosen.tokens_per_second,
    }
    return chosen.max_batch_tokens, details, probes, notes
