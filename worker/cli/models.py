"""`sentiment-worker models status|shadow|promote`: what the fleet should serve (the group's control topic)
and what each replica serves (its status topic); a shadow on; a new primary behind a gate. Exit codes: 0
done / promoted, 1 refused, 2 usage or connection errors."""

from __future__ import annotations

import argparse
import json
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from worker.cli.common import EXIT_FAILED, EXIT_OK, Subparsers, add_settings_flags, settings_from_args
from worker.errors import ConfigurationError
from worker.tools.models import (
    FleetView,
    agreement_figures,
    changed_by,
    fleet_agreement,
    follows,
    promote,
    read_fleet,
    set_shadow,
)


def register(subparsers: Subparsers) -> None:
    """Adds `models` and its sub-commands."""
    models = subparsers.add_parser(
        "models",
        help="the models the fleet serves: status, a shadow, promote (the control topic)",
        description="Steers every replica of the consumer group through its control topic "
        "(<group>.control): `status` shows the desired state and what each live replica serves, `shadow` "
        "runs a model beside the primary on live traffic, `promote` makes a model the primary everywhere. "
        "See docs/live-models.md.",
    )
    sub = models.add_subparsers(dest="models_command", required=True)
    status = sub.add_parser("status", help="the desired state, each live replica, the shadow's agreement")
    _common(status)
    status.set_defaults(func=cmd_models_status)

    shadow = sub.add_parser("shadow", help="label live traffic with DIR beside the primary (or --off)")
    _common(shadow)
    shadow.add_argument("directory", nargs="?", type=Path, metavar="DIR", help="a model directory")
    shadow.add_argument("--off", action="store_true", help="no shadow")
    shadow.set_defaults(func=cmd_models_shadow)

    promote_ = sub.add_parser(
        "promote",
        help="DIR becomes the primary on every replica, if it passes the gate",
        description="The gate: the held-out figures of DIR's metrics.json beside the current primary's; with "
        "--live also the shadow's figures on live traffic (DIR must be the shadow; agreement at least "
        "SENTIMENT_PROMOTE_MIN_AGREEMENT on at least SENTIMENT_PROMOTE_MIN_SHADOWED reviews, summed over the "
        "live replicas). Exit 0 promoted, 1 refused, 2 usage or connection error.",
    )
    _common(promote_)
    promote_.add_argument("directory", type=Path, metavar="DIR", help="a model directory every replica reads")
    promote_.add_argument("--live", action="store_true", help="gate on the shadow's live figures too")
    promote_.add_argument("--force", action="store_true", help="promote even when the gate refuses")
    promote_.set_defaults(func=cmd_models_promote)


def _common(parser: argparse.ArgumentParser) -> None:
    add_settings_flags(parser, "bootstrap_servers", "group_id")
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout, for scripts")
    parser.add_argument(
        "--max-age-s",
        type=float,
        default=None,
        help="leave out replicas whose last report is older (default: 6 x SENTIMENT_STATUS_INTERVAL_S)",
    )


def _max_age_s(args: argparse.Namespace, status_interval_s: float) -> float:
    return float(args.max_age_s) if args.max_age_s is not None else 6 * status_interval_s


def cmd_models_status(args: argparse.Namespace) -> int:
    sections = settings_from_args(args).sections
    max_age_s = _max_age_s(args, sections.live.status_interval_s)
    fleet = read_fleet(sections, max_age_s=max_age_s)
    if args.json:
        print(json.dumps(fleet.to_json(max_age_s), ensure_ascii=False))
    else:
        print(format_fleet(fleet, max_age_s))
    return EXIT_OK


def cmd_models_shadow(args: argparse.Namespace) -> int:
    if args.off == (args.directory is not None):
        raise ConfigurationError("models shadow: give a model directory DIR or --off (one of them)")
    sections = settings_from_args(args).sections
    desired = set_shadow(sections, None if args.off else args.directory, by=changed_by("models shadow"))
    if args.json:
        print(json.dumps({"desired": desired.model_dump(mode="json")}, ensure_ascii=False))
    elif desired.shadow is None:
        print(f"shadow off (written to {sections.live.control_topic_of(sections.kafka.group_id)})")
    else:
        print(
            f"shadow {desired.shadow.path} (hash {desired.shadow.content_hash[:12]}…) written to "
            f"{sections.live.control_topic_of(sections.kafka.group_id)}; `models status` shows the replicas "
            "take it"
        )
    return EXIT_OK


def cmd_models_promote(args: argparse.Namespace) -> int:
    sections = settings_from_args(args).sections
    outcome = promote(
        sections,
        args.directory,
        live=args.live,
        force=args.force,
        max_age_s=_max_age_s(args, sections.live.status_interval_s),
        by=changed_by(" ".join(["models promote", *(f for f in ("--live", "--force") if vars(args)[f[2:]])])),
    )
    decision = outcome.decision
    if args.json:
        written = outcome.written.model_dump(mode="json") if outcome.written is not None else None
        shown = {"decision": decision.model_dump(mode="json"), "desired": written}
        print(json.dumps(shown, ensure_ascii=False))
    else:
        verdict = "PROMOTED" + (" (forced)" if decision.forced else "") if decision.promoted else "REFUSED"
        print(f"{verdict}: {args.directory}")
        for reason in decision.reasons:
            print(f"  {reason}")
        for name, value in decision.figures.items():
            print(f"  {name}: {value}")
        if outcome.written is None:
            print("nothing was written; --force promotes anyway")
    return EXIT_OK if decision.promoted else EXIT_FAILED


def format_fleet(fleet: FleetView, max_age_s: float) -> str:
    """`models status` for people."""
    lines = [f"control topic {fleet.control_topic}:"]
    desired = fleet.desired
    if desired is None:
        lines.append("  no desired state: each replica serves the model it started with (SENTIMENT_MODEL)")
    else:
        when = datetime.fromtimestamp(desired.changed_at_ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        lines.append(f"  desired state of {when} by {desired.changed_by or '?'}")
        lines.append(f"  primary  {_choice(desired.primary, 'the model each replica was started with')}")
        lines.append(f"  shadow   {_choice(desired.shadow, 'none')}")
        if desired.decision is not None:
            d = desired.decision
            forced = " (forced)" if d.forced else ""
            lines.append(f"  decision {'promoted' if d.promoted else 'refused'}{forced}")
    if fleet.refused:
        lines.append(f"  ! {fleet.refused}")
    now_ms = int(time.time() * 1000)
    lines.append(
        f"status topic {fleet.status_topic}: {len(fleet.replicas)} live replicas"
        + (f" ({len(fleet.stale)} stale left out, older than {max_age_s:g} s)" if fleet.stale else "")
    )
    for replica in fleet.replicas:
        shadow = f"{replica.shadow.name} {replica.shadow.version}" if replica.shadow is not None else "-"
        state = "follows the desired state" if follows(replica, desired) else "DIFFERS"
        age = (now_ms - replica.reported_at_ms) / 1000
        lines.append(
            f"  {replica.worker_id}: primary {replica.primary.name} {replica.primary.version} "
            f"({(replica.primary.content_hash or '?')[:12]}), shadow {shadow}; {state}; "
            f"reported {age:.0f} s ago"
        )
        if replica.problem:
            lines.append(f"    problem: {replica.problem}")
    shadow_hash = desired.shadow.content_hash if desired is not None and desired.shadow is not None else None
    agreement = fleet_agreement(fleet.replicas, shadow_hash) if shadow_hash is not None else None
    if agreement is not None:
        lines.extend(_agreement_lines(agreement_figures(agreement), len(fleet.replicas)))
    return "\n".join(lines)


def _choice(choice: Any, none: str) -> str:
    return f"{choice.path} (hash {choice.content_hash[:12]}…)" if choice is not None else none


def _agreement_lines(figures: dict[str, Any], replicas: int) -> list[str]:
    share = figures["agreement"]
    confusion = ", ".join(f"{pair} {count}" for pair, count in figures["confusion"].items())

    def mix(side: str) -> str:
        return " ".join(f"{label} {value:.1%}" for label, value in figures[f"{side}_label_mix"].items())

    return [
        f"agreement of the shadow {figures['shadow_version']} with the primary (over {replicas} replicas):",
        f"  {figures['reviews']} reviews, {share:.1%} agree" if share is not None else "  no reviews yet",
        f"  confusion (primary->shadow): {confusion or '-'}",
        f"  label mix: primary {mix('primary') or '-'}; shadow {mix('shadow') or '-'} "
        f"(largest shift {figures['label_mix_shift']:.1%})",
        f"  mean confidence: primary {figures['primary_mean_confidence']}, shadow "
        f"{figures['shadow_mean_confidence']}; groups shadowed {figures['groups_shadowed']}, skipped "
        f"{figures['groups_skipped']}",
    ]
