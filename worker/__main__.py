"""`python -m worker` is `sentiment-worker`."""

import sys

from worker.cli import main

sys.exit(main())
