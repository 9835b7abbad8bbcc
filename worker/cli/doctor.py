"""`sentiment-worker doctor`: Paddle build, device, model, broker, topics — each with a verdict."""

from __future__ import annotations

import argparse
import os

from worker.cli.common import (
    EXIT_FAILED,
    EXIT_OK,
    SETTING_FLAGS,
    Subparsers,
    add_settings_flags,
    env_config_file,
    settings_from_args,
)
from worker.config import setting_origin
from worker.runtime.logs import configure_logging


def register(subparsers: Subparsers) -> None:
    """Adds `doctor`."""
    doctor = subparsers.add_parser(
        "doctor", help="check Paddle, device, model and broker, each with a verdict"
    )
    add_settings_flags(doctor, *SETTING_FLAGS)
    doctor.set_defaults(func=cmd_doctor)


def cmd_doctor(args: argparse.Namespace) -> int:
    from worker.tools.doctor import run_checks

    configure_logging("WARNING")  # the verdicts are the report; a log line only when something is off
    settings = settings_from_args(args)
    origin = setting_origin(
        "bootstrap_servers",
        flag_given=getattr(args, "bootstrap_servers", None) is not None,
        environ=os.environ,
        config_file=getattr(args, "config", None) or env_config_file(),
    )
    checks = run_checks(settings, bootstrap_origin=origin)
    for check in checks:
        print(check.line())
    failed = [c for c in checks if c.verdict == "FAIL"]
    print(f"{len(checks) - len(failed)}/{len(checks)} checks passed")
    return EXIT_FAILED if failed else EXIT_OK
