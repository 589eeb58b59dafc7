"""Parsing at the edge: text in, frozen model values out. Pure: no I/O."""
