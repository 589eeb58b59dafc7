"""Immutable values that flow through one tick: snapshots in, derived values out. Pure: no I/O."""
