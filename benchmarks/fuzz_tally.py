"""The tally of a mutation fuzz (:mod:`benchmarks.fuzz_text`, :mod:`benchmarks.fuzz_compare`):
each case's outcome counted, by outcome and by mutation, with the first examples of each
failure, printed the same way by both."""

from __future__ import annotations

import traceback
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Tally", "traceback_detail"]


def traceback_detail(exc: BaseException) -> str:
    """``Type at file:line: message`` of an exception no case should raise."""
    frames = traceback.extract_tb(exc.__traceback__)
    where = f"{Path(frames[-1].filename).name}:{frames[-1].lineno}" if frames else "?"
    return f"{type(exc).__name__} at {where}: {str(exc)[:200]}"


@dataclass
class Tally:
    """Outcomes of the cases run; ``failures`` are the outcomes that count against."""

    outcomes: Sequence[str]
    failures: Sequence[str]
    mutations: Sequence[str]
    examples: int = 3
    counts: Counter[str] = field(default_factory=Counter)
    by_mutation: Counter[tuple[str, str]] = field(default_factory=Counter)
    shown: dict[str, list[str]] = field(default_factory=dict)

    def add(self, described: str, mutation: str, outcome: str, detail: str) -> None:
        self.counts[outcome] += 1
        self.by_mutation[(mutation, outcome)] += 1
        if outcome in self.failures:
            listing = self.shown.setdefault(f"{outcome}/{mutation}", [])
            if len(listing) < self.examples:
                listing.append(f"{described}\n      -> {detail[:300]!r}")

    @property
    def failed(self) -> bool:
        return any(self.counts[outcome] for outcome in self.failures)

    def print_counts(self, title: str, extra: Sequence[str] = ()) -> None:
        """The title, each outcome's count, then ``extra`` lines, then each mutation's
        cases and failures."""
        print(title)
        for outcome in self.outcomes:
            print(f"  {outcome:<15} {self.counts[outcome]}")
        for line in extra:
            print(line)
        print("by mutation (cases, failures):")
        for name in self.mutations:
            total = sum(n for (m, _), n in self.by_mutation.items() if m == name)
            failed = sum(
                n for (m, o), n in self.by_mutation.items() if m == name and o in self.failures
            )
            print(f"  {name:<15} {total:>5} {failed:>5}")

    def print_examples(self) -> None:
        for key, listing in sorted(self.shown.items()):
            print(f"examples of {key}:")
            for line in listing:
                print(f"  {line}")
