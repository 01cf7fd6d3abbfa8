"""``python -m audiofast.sweep.worker SPEC --storage URL --study NAME --trials N``: one
worker process of ``audiofast sweep --workers K`` (study.py)."""

import sys

from audiofast.sweep.study import worker_main

if __name__ == "__main__":
    sys.exit(worker_main())
