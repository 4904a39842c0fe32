"""The user's request: the scenario file, the rank layout, the model's shape and the
training recipe, validated."""
