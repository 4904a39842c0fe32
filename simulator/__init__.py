"""parasim's simulator: scenarios, model math, layouts, the Schedule IR, the SimPy
engine, metrics, reports and the command line. Imports no torch."""

__version__ = "0.1.0"
__all__ = ["__version__"]
