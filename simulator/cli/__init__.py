"""The ``parasim`` command line: one module per command."""
