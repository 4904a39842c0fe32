"""Analysis of a simulated or measured step: the trace, the time accounting, memory,
link utilisation and the step's result."""
