"""The base layer: errors, atomic file writes, the version, and the closed sets of names
(the vocabulary) every other layer uses."""
