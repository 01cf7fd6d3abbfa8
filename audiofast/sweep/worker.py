"""``python -m audiofast.sweep.worker SPEC --storage URL --study NAME --trials N``: one
worker process of ``audiofast sweep --workers K`` (study.py)."""

import sys

from audiofast.cli import show_library_logs
from audiofast.sweep.study import worker_main

if __name__ == "__main__":
    show_library_logs()
    sys.exit(worker_main())
