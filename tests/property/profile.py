"""Hypothesis budgets for the property tests: bounded by default, longer on request.

`PROPERTY_PROFILE=long` (or `HYPOTHESIS_PROFILE=property-long`) runs 20x the examples for a soak;
`PROPERTY_PROFILE=generated` skips the explicit `@example`s, to show that generation alone finds a bug the
examples pin. No example database is written: CI and the other engineers' trees stay clean, and a failure
prints its reproduction blob.
"""

from __future__ import annotations

import os

from hypothesis import Phase, settings
from hypothesis.errors import InvalidArgument

settings.register_profile("property-default", max_examples=200, deadline=None, database=None, print_blob=True)
settings.register_profile("property-long", max_examples=4000, deadline=None, database=None, print_blob=True)
settings.register_profile(
    "property-generated",
    parent=settings.get_profile("property-default"),
    phases=[Phase.generate, Phase.target, Phase.shrink],
)

_NAME = os.environ.get("HYPOTHESIS_PROFILE") or "property-" + os.environ.get("PROPERTY_PROFILE", "default")
try:
    # Only our own profiles: another one (a project-wide "ci") need not bound time or skip the database.
    ACTIVE = settings.get_profile(_NAME if _NAME.startswith("property-") else "property-default")
except InvalidArgument:
    ACTIVE = settings.get_profile("property-default")


def budget(scale: float = 1.0) -> settings:
    """The active profile, with `scale` times its examples (cheap properties can afford more)."""
    return settings(ACTIVE, max_examples=max(1, int(ACTIVE.max_examples * scale)))
