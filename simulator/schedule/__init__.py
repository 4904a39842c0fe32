"""The Schedule IR and the builders that write one training step into it."""
