"""A module that exists but is not an environment (no load_environment)."""

VALUE = 1
