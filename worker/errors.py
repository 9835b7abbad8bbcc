"""The project's own errors: one base, `WorkerError`, and the two categories that say what the user does
next. Every error class of the project derives from exactly one category; the command line turns the
category into the exit code (`worker.cli.main`, the one place), and the message is the one line it prints.

- `ConfigurationError`: the work cannot start as asked: a setting, a flag, an input file, a model
  directory, a device or a topic is wrong or missing. Change it and run again. Exit 2.
- `OperationError`: the work started and failed while running: the broker refused a result, a subprocess
  died, a measurement or a check did not come out. Nothing past the failure was committed. Exit 1.

This module imports nothing of the project, so every package can raise its categories.
"""

from __future__ import annotations

__all__ = ["ConfigurationError", "OperationError", "WorkerError"]


class WorkerError(Exception):
    """Base of the project's own errors; its message says what is wrong and what to do. Not raised as
    such: raise a category, or a class derived from one."""


class ConfigurationError(WorkerError):
    """The work cannot start as configured (settings, flags, input files, model, device): exit 2."""


class OperationError(WorkerError):
    """The work failed while running (a refused delivery, a failed subprocess or check): exit 1."""
