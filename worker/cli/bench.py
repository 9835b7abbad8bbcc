"""`sentiment-worker bench`: end-to-end vs `predict` vs model-only vs naive throughput, latency at a fixed
rate, RSS; `bench --http`: `serve` vs the naive handler, which `bench --naive-server` serves;
`bench --host-ceiling`: the worker on the identity model (no inference) vs a minimal Kafka loop;
`bench --shadow DIR` / `bench --swaps N`: what a shadow costs the primary's drain, and the RSS of a worker
whose primary is swapped back and forth (docs/live-models.md)."""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from worker.cli.common import EXIT_FAILED, EXIT_OK, Subparsers, add_settings_flags, settings_from_args
from worker.errors import ConfigurationError, OperationError
from worker.labelling.loading import load_classifier_for, load_model
from worker.runtime.logs import configure_logging
from worker.runtime.process import install_stop_handlers, rest_idle_threads

if TYPE_CHECKING:
    from worker.bench.bench import BenchOptions
    from worker.bench.host_ceiling import HostCeilingOptions


def register(subparsers: Subparsers) -> None:
    """Adds `bench`."""
    bench = subparsers.add_parser(
        "bench",
        help="end-to-end vs predict vs model-only vs naive throughput, latency at a fixed rate, RSS "
        "(table + JSON)",
    )
    add_settings_flags(bench, "bootstrap_servers", "model", "device")
    _add_sizes(bench)
    _add_http(bench)
    _add_host_ceiling(bench)
    _add_live_models(bench)
    _add_naive_server(bench)
    bench.set_defaults(func=cmd_bench)


def _add_sizes(bench: argparse.ArgumentParser) -> None:
    """The end-to-end / predict / model-only / naive / latency run's sizes and topics."""
    bench.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    bench.add_argument("--messages", type=int, default=None, help="backlog drained end to end (200000)")
    bench.add_argument("--model-only-messages", type=int, default=None, help="reviews for model-only (20000)")
    bench.add_argument(
        "--predict-messages",
        type=int,
        default=None,
        help="`predict` runs on N and 2N reviews for its marginal rate (10000; 0 skips it)",
    )
    bench.add_argument(
        "--drains", type=int, default=None, help="backlog drains end to end, the median kept (3; --quick 1)"
    )
    bench.add_argument(
        "--predict-repeats",
        type=int,
        default=None,
        help="`predict` runs on N and on 2N, alternated; their median times give the rate (3; --quick 1)",
    )
    bench.add_argument("--naive-messages", type=int, default=None, help="reviews for the naive loop (2000)")
    bench.add_argument("--latency-messages", type=int, default=None, help="reviews at the fixed rate (3000)")
    bench.add_argument("--rate", type=float, default=None, help="offered msg/s (default: half of end-to-end)")
    bench.add_argument("--max-batch-tokens", type=int, default=None, help="default: the tuned budget")
    bench.add_argument("--max-batch-size", type=int, default=None, help="default: SENTIMENT_MAX_BATCH_SIZE")
    bench.add_argument("--partitions", type=int, default=None, help="input partitions (3)")
    bench.add_argument("--keep-topics", action="store_true", default=None, help="keep the bench's topics")
    bench.add_argument("--json", type=Path, default=None, help="where to write the JSON report")


def _add_http(bench: argparse.ArgumentParser) -> None:
    """`--http` and its sizes."""
    bench.add_argument(
        "--http",
        action="store_true",
        help="instead: `serve` (batched) vs the naive handler over HTTP at concurrency 1, 8, 64 (no Kafka)",
    )
    bench.add_argument("--requests", type=int, default=None, help="--http: requests per concurrency (3000)")
    bench.add_argument("--overload-s", type=float, default=None, help="--http: seconds of overload (30)")
    bench.add_argument(
        "--http-max-wait-ms", type=int, default=None, help="--http: the server's http_max_wait_ms (2)"
    )


def _add_host_ceiling(bench: argparse.ArgumentParser) -> None:
    """`--host-ceiling`."""
    bench.add_argument(
        "--host-ceiling",
        action="store_true",
        help="instead: the worker on the identity model (its model directory's tokenizer, no inference) "
        "draining --messages (40000; --quick 2000) through the broker, beside a minimal consume -> parse -> "
        "produce -> commit loop on the same reviews; msg/s of both and CPU µs per review of each worker "
        "thread, --drains rounds (3; --quick 1)",
    )


def _add_live_models(bench: argparse.ArgumentParser) -> None:
    """`--shadow DIR` and `--swaps N` with their options."""
    bench.add_argument(
        "--shadow",
        type=Path,
        default=None,
        metavar="DIR",
        help="instead: alternated drains of --messages reviews (3000; --quick 400) by the primary (--model) "
        "without and with DIR as its shadow (sent on the group's control topic, as `models shadow` does), "
        "--drains pairs (3; --quick 1): medians of reviews/s, CPU s per review, the primary's latency "
        "p50/p95, the shadow's groups shadowed/skipped",
    )
    bench.add_argument(
        "--swaps",
        type=int,
        nargs="?",
        const=3,
        default=None,
        metavar="N",
        help="instead: one worker draining while its primary is promoted to --swap-with and back N times (3) "
        "through the control topic, as `models promote` does; its RSS before, after each swap, at the end",
    )
    bench.add_argument(
        "--swap-with", default=None, metavar="DIR", help="--swaps: the other model (models/fast)"
    )
    bench.add_argument(
        "--dwell-s",
        type=float,
        default=None,
        help="--swaps: seconds of draining on each model (20; --quick 2)",
    )


def _add_naive_server(bench: argparse.ArgumentParser) -> None:
    """`--naive-server PORT`."""
    bench.add_argument(
        "--naive-server",
        type=int,
        default=None,
        metavar="PORT",
        help="instead: serve the naive handler `--http` measures against on PORT (0: a free one) until "
        "stopped: the design documents' baseline, POST /predict, one text padded to 128, a model call each",
    )


def cmd_bench(args: argparse.Namespace) -> int:
    from worker.bench.bench import run_bench
    from worker.bench.bench_table import format_table
    from worker.inference.token_budget import StartupError, choose_token_budget

    if args.naive_server is not None:
        return serve_naive(args)
    if args.host_ceiling:
        return bench_host_ceiling(args)
    if args.shadow is not None or args.swaps is not None:
        return bench_live_models(args)
    options = bench_options(args)  # before the model loads: a bad flag fails at once
    settings = settings_from_args(args)
    s = settings.sections
    configure_logging("WARNING")
    classifier = load_classifier_for(s.model, s.batching)

    try:  # the tuned budget unless --max-batch-tokens names one (whatever SENTIMENT_MAX_BATCH_TOKENS says)
        choice = choose_token_budget(
            s.batching,
            s.model,
            classifier,
            requested=args.max_batch_tokens if args.max_batch_tokens is not None else "auto",
            progress=_say,
        )
    except StartupError as exc:
        raise OperationError(f"{exc}; pass --max-batch-tokens") from None
    budget = choice.max_batch_tokens
    source = "--max-batch-tokens" if args.max_batch_tokens is not None else choice.source
    if args.http:
        return bench_http(args, s, classifier, budget, _say)
    report = run_bench(settings, classifier, options, max_batch_tokens=budget, tuned_from=source, say=_say)
    print(format_table(report), flush=True)
    _write_report(report, args.json, "bench")
    checked = [report["end_to_end"], report["latency"], report["predict"]]
    conserved = all(phase["conservation"]["ok"] for phase in checked if phase is not None)
    return EXIT_OK if conserved else EXIT_FAILED


def bench_options(args: argparse.Namespace) -> BenchOptions:
    """The phases' sizes: `--quick`'s or the full run's, overridden by the flags given."""
    from worker.bench.bench import BenchOptions  # noqa: F811 - at run time (the CLI loads lazily)

    if args.predict_messages is not None and args.predict_messages < 0:
        raise ConfigurationError("--predict-messages: 0 (skip the phase) or more")
    for flag, value in (("--predict-repeats", args.predict_repeats), ("--drains", args.drains)):
        if value is not None and value < 1:
            raise ConfigurationError(f"{flag}: 1 or more")
    return BenchOptions.sized(
        args.quick, messages=args.messages, naive_messages=args.naive_messages,
        latency_messages=args.latency_messages, model_only_messages=args.model_only_messages,
        predict_messages=args.predict_messages, predict_repeats=args.predict_repeats,
        drains=args.drains, rate_per_s=args.rate,
        max_batch_size=args.max_batch_size, partitions=args.partitions, keep_topics=args.keep_topics,
    )  # fmt: skip


def host_ceiling_options(args: argparse.Namespace) -> HostCeilingOptions:
    """`bench --host-ceiling`'s sizes: `--quick`'s or the full run's, overridden by the flags given."""
    from worker.bench.host_ceiling import HostCeilingOptions  # noqa: F811 - at run time (lazy CLI)

    for flag, value in (("--messages", args.messages), ("--drains", args.drains)):
        if value is not None and value < 1:
            raise ConfigurationError(f"{flag}: 1 or more")
    return HostCeilingOptions.sized(
        args.quick, messages=args.messages, rounds=args.drains, partitions=args.partitions,
        keep_topics=args.keep_topics,
    )  # fmt: skip


def bench_host_ceiling(args: argparse.Namespace) -> int:
    """`bench --host-ceiling`: no model loads here; the worker subprocess serves the identity backend with
    `run`'s settings (token budget and batch size as --max-batch-tokens / --max-batch-size say)."""
    from worker.bench.bench_table import format_host_ceiling_table
    from worker.bench.host_ceiling import conserved, run_host_ceiling

    options = host_ceiling_options(args)
    settings = _subprocess_settings(args)

    report = run_host_ceiling(settings, options, say=_say)
    print(format_host_ceiling_table(report), flush=True)
    _write_report(report, args.json, "bench-host-ceiling")
    return EXIT_OK if conserved(report) else EXIT_FAILED


def bench_live_models(args: argparse.Namespace) -> int:
    """`bench --shadow DIR` or `bench --swaps N`: no model loads here; the worker subprocess serves --model
    (and the token budget and batch size --max-batch-tokens / --max-batch-size say, else its defaults)."""
    from worker.bench.model_swaps import (
        SwapBenchOptions,  # noqa: F811 - at run time (the CLI loads lazily)
        format_swaps_table,
        run_swaps_bench,
        swaps_conserved,
    )
    from worker.bench.shadow_cost import (
        ShadowBenchOptions,  # noqa: F811 - at run time (the CLI loads lazily)
        format_shadow_table,
        run_shadow_bench,
        shadow_conserved,
    )

    if args.shadow is not None and args.swaps is not None:
        raise ConfigurationError("--shadow and --swaps: one of them per run")
    for flag, value in (("--messages", args.messages), ("--drains", args.drains), ("--swaps", args.swaps)):
        if value is not None and value < 1:
            raise ConfigurationError(f"{flag}: 1 or more")
    settings = _subprocess_settings(args)

    stamp = f"{datetime.now(timezone.utc):%Y%m%dT%H%M%S}"
    if args.shadow is not None:
        options = ShadowBenchOptions.sized(
            args.quick, messages=args.messages, pairs=args.drains, partitions=args.partitions,
            keep_topics=args.keep_topics,
        )  # fmt: skip
        report = run_shadow_bench(settings, args.shadow, options, say=_say)
        table, ok, name = format_shadow_table(report), shadow_conserved(report), "shadow"
    else:
        swap_options = SwapBenchOptions.sized(
            args.quick, swaps=args.swaps, swap_with=args.swap_with, dwell_s=args.dwell_s,
            partitions=args.partitions, keep_topics=args.keep_topics,
        )  # fmt: skip
        report = run_swaps_bench(settings, swap_options, say=_say)
        table, ok, name = format_swaps_table(report), swaps_conserved(report), "swaps"
    print(table, flush=True)
    _write_report(report, args.json, f"bench-{name}", stamp)
    return EXIT_OK if ok else EXIT_FAILED


def bench_http(args: argparse.Namespace, sections: Any, classifier: Any, budget: int, say: Any) -> int:
    from worker.bench.http_bench import HttpBenchOptions, format_http_table, run_http_bench

    options = HttpBenchOptions.sized(
        args.quick, requests=args.requests, overload_s=args.overload_s, max_wait_ms=args.http_max_wait_ms,
        model_only_messages=args.model_only_messages, naive_requests=args.naive_messages,
    )  # fmt: skip
    stamp = f"{datetime.now(timezone.utc):%Y%m%dT%H%M%S}"
    report = run_http_bench(
        sections.model,
        sections.batching,
        classifier,
        options,
        max_batch_tokens=budget,
        log_dir=Path("var") / f"bench-http-{stamp}",
        say=say,
    )
    print(format_http_table(report), flush=True)
    _write_report(report, args.json, "bench-http", stamp)
    overload = report["targets"].get("overload_all_answered")
    return EXIT_OK if overload is None or overload["met"] else EXIT_FAILED


def serve_naive(args: argparse.Namespace) -> int:
    """`bench --naive-server PORT`: the naive handler until SIGTERM/SIGINT, started like `serve` (idle
    threads, signals, model), so that `bench --http` compares the two servers and nothing else."""
    import threading

    from worker.bench.naive_http import build_naive_app
    from worker.http.server import HttpServer

    s = settings_from_args(args).sections
    rest_idle_threads()  # before Paddle loads (load_model), as `serve` does
    configure_logging(s.observability.log_level)
    stop = threading.Event()
    reinstall = install_stop_handlers(stop.set)
    loaded = load_model(s.model, s.batching)
    reinstall()  # loading Paddle replaced them
    server = HttpServer(build_naive_app(loaded.classifier, loaded.ref), s.http.http_host, args.naive_server)
    host, port = server.address
    print(json.dumps({"listening": f"http://{host}:{port}"}), flush=True)
    while not stop.wait(0.5):
        pass
    server.close()
    return EXIT_OK


def _say(line: str) -> None:
    """Progress, on stderr (the table goes to stdout)."""
    print(line, file=sys.stderr, flush=True)


def _write_report(report: dict[str, Any], given: Path | None, stem: str, stamp: str | None = None) -> None:
    """Writes the JSON report to `given` (--json), else to `<stem>-<stamp>.json` (stamp: now, UTC), and says
    where."""
    stamp = stamp or f"{datetime.now(timezone.utc):%Y%m%dT%H%M%S}"
    path = given or Path(f"{stem}-{stamp}.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2, ensure_ascii=False), encoding="utf-8")
    print(f"wrote {path}", flush=True)


def _subprocess_settings(args: argparse.Namespace) -> Any:
    """The settings a bench's worker subprocess runs with: the flags', the token budget and batch size
    --max-batch-tokens / --max-batch-size give (else the defaults); logging at WARNING here."""
    settings = settings_from_args(args)
    sizes = {"max_batch_tokens": args.max_batch_tokens, "max_batch_size": args.max_batch_size}
    configure_logging("WARNING")
    return settings.model_copy(update={k: v for k, v in sizes.items() if v is not None})
