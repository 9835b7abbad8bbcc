"""What C++ libraries print straight to the process's stdout and stderr (paddle2onnx's `[Paddle2ONNX] ...`
lines, Paddle's glog and PIR notices), moved to the log at DEBUG: a command's own output stays its own.

Python's `contextlib.redirect_stdout` cannot catch them (they write to file descriptors 1 and 2, not to
`sys.stdout`); `native_output_to_log` points the descriptors at a temporary file for the duration and logs
what was written, line by line: at DEBUG, or at WARNING when the block raised (then it is what says why).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import tempfile
from collections.abc import Iterator


@contextlib.contextmanager
def native_output_to_log(logger: logging.Logger, what: str) -> Iterator[None]:
    """Within the block, fds 1 and 2 write to a temporary file; afterwards each of its lines goes to `logger`
    (`what: line`) at DEBUG, or WARNING if the block raised. Not thread-safe: process-wide descriptors."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    failed = False
    with tempfile.TemporaryFile() as sink:
        try:
            os.dup2(sink.fileno(), 1)
            os.dup2(sink.fileno(), 2)
            yield
        except BaseException:
            failed = True
            raise
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)
            sink.seek(0)
            level = logging.WARNING if failed else logging.DEBUG
            for line in sink.read().decode("utf-8", "replace").splitlines():
                if line.strip():
                    logger.log(level, "%s: %s", what, line.rstrip())
