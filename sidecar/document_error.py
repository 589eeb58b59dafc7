"""Where a JSON document read back from disk or a peer first fails its schema, in one line. Pure, no I/O.

The sidecar's own documents (the remediation record, an incident's manifest, a /status history) are checked
with pydantic on the way in; a file from another program, or an older one, is refused with the first key that
does not fit, never a multi-line validation dump.
"""

from __future__ import annotations

from pydantic import ValidationError


def first_error(error: ValidationError) -> str:
    """`key.sub.0: message` for the first error pydantic found; `the document: message` at the top level."""
    first = error.errors()[0]
    where = ".".join(str(part) for part in first["loc"]) or "the document"
    return f"{where}: {first['msg']}"
