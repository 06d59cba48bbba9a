"""`python -m disque.worker ...`: the same as the `disque-worker` console script."""

import sys

from disque.worker.cli import main

sys.exit(main())
