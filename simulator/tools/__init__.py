"""Tools built on runs, each a pure function returning a dataclass: sweep, scale,
explain, collbench and compare."""
