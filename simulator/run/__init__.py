"""The run: scenario to schedule to engine to result, in one call."""
