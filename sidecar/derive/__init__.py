"""Pure functions from a bounded window of snapshots to derived values. No I/O, no clock reads."""
