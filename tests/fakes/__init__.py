"""Strict fakes of the libraries the adapters talk to, so adapter tests run without the real thing. No I/O."""
