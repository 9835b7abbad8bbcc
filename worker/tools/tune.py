"""The `tune` command's report: the probes, the fit and the chosen budget as a table for people."""

from __future__ import annotations

from worker.inference.tuning.result import MIB, TuningResult


def format_report(result: TuningResult) -> str:
    """A human-readable table of the probes, the fit and the chosen budget."""
    lines: list[str] = []
    k = result.key
    lines.append(
        f"model {k['model_name']} {k['model_version']} ({k['precision']}, {k['backend']}) "
        f"on {k['device_name']}, Paddle {k['paddle_version']}, max_seq_len {k['max_seq_len']}"
    )
    if result.mode == "gpu-memory":
        lines += ["", f"{'batch':>7} {'len':>5} {'tokens':>9} {'peak MiB':>10}"]
        for p in result.probes:
            peak = "OOM" if p["peak_bytes"] is None else f"{p['peak_bytes'] / MIB:.1f}"
            lines.append(f"{p['batch_size']:>7} {p['seq_len']:>5} {p['tokens']:>9} {peak:>10}")
        d, fit = result.details, result.details["fit"]
        budget = d["budget"]
        lines += [
            "",
            f"fit: peak ≈ {fit['base_bytes'] / MIB:.1f} MiB + {fit['per_token_bytes'] / 1024:.2f} "
            f"KiB·tokens + {fit['per_token_position_bytes']:.1f} B·tokens·len "
            f"(rms error {fit['rms_error_bytes'] / MIB:.2f} MiB, {fit['points']} points)",
            f"budget: {budget['budget_bytes'] / MIB:.0f} MiB of {budget['total_bytes'] / MIB:.0f} MiB "
            f"({budget['source']}), limit after the {d['margin']:.0%} margin "
            f"{d['limit_bytes'] / MIB:.0f} MiB",
            f"verified: {d['verified']['batch_size']} x {d['verified']['seq_len']} peaks at "
            f"{d['verified']['peak_bytes'] / MIB:.1f} MiB",
        ]
    else:
        lines += ["", f"{'budget':>8} {'tokens/s':>10} {'slowest batch ms':>17}"]
        for row in result.details["rows"]:
            mark = "" if row["within_latency_bound"] else "  over bound"
            lines.append(
                f"{row['max_batch_tokens']:>8} {row['tokens_per_second']:>10,.0f} "
                f"{row['worst_batch_seconds'] * 1000:>17.0f}{mark}"
            )
    lines += [f"note: {note}" for note in result.notes]
    what = "VRAM budget" if result.mode == "gpu-memory" else "CPU throughput (not memory)"
    source = "cached" if result.from_cache else f"measured in {result.seconds:.1f} s"
    lines.append(f"max_batch_tokens = {result.max_batch_tokens}  (tuned for {what}; {source})")
    return "\n".join(lines)
