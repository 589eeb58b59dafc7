"""Adapter tests: the sources and actuators against strict fakes or the real thing where it is cheap."""
