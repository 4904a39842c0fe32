"""Write ``docs/teaching.md`` and ``docs/teaching/charts.html`` from the teaching pairs
(:mod:`simulator.report.teaching_page`). Usage, from the repository root::

    python -m benchmarks.make_teaching            # rewrite the page and build its charts
    python -m benchmarks.make_teaching --check    # exit 1 when the checked-in page is stale
"""

from __future__ import annotations

import sys

from simulator.report.teaching_page import main

if __name__ == "__main__":
    sys.exit(main())
