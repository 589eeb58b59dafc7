"""A /status document from outside (the daemon's URL, a saved file) checked against its schema before the doctor
reads it. pydantic's TypeAdapter validates it as the TypedDicts of `sidecar.model.status`, the classes the daemon
writes it with: one schema, and the pure doctor never sees a document it was not promised.

A document saved by an older sidecar lacks the keys added since; the schema reads each of those as the contract
reads any value it cannot know: a missing key that may be null is null, a missing list or map is empty. A key
that may not be null and is missing (a GPU without its total) is an error, one line naming it.
"""

from __future__ import annotations

import types
import typing

from pydantic import TypeAdapter, ValidationError
from typing_extensions import is_typeddict

from sidecar.doctor.evidence import HistoryFacts
from sidecar.doctor.history import HistoryError, from_status
from sidecar.document_error import first_error
from sidecar.model.status import StatusDocument

_STATUS: TypeAdapter[StatusDocument] = TypeAdapter(StatusDocument)


def status_history(document: object, source: str) -> HistoryFacts:
    """The history in a /status document; `HistoryError` with one line naming the first key that does not fit
    (a document from another program, or one that is not /status)."""
    try:
        status = _STATUS.validate_python(_missing_as_unknown(document, StatusDocument))
    except ValidationError as error:
        where, _, message = first_error(error).partition(": ")
        raise HistoryError(f"{source} is not the sidecar's /status document: {where}: {message.lower()}") from None
    return from_status(status, source)


def _missing_as_unknown(value: object, kind: object) -> object:
    """`value` with the keys `kind` (a TypedDict, or a list or map of them) declares and `value` lacks filled in
    as unknown: None where the key may be null, an empty list or map; nested documents alike."""
    kind = _without_none(kind)
    if is_typeddict(kind) and isinstance(value, dict):
        hints = typing.get_type_hints(kind)
        filled = dict(value)
        for key, hint in hints.items():
            if key in filled:
                filled[key] = _missing_as_unknown(filled[key], hint)
            elif key in getattr(kind, "__required_keys__", ()):
                empty = _empty(hint)
                if empty is not _NO_DEFAULT:
                    filled[key] = empty
        return filled
    origin = typing.get_origin(kind)
    if origin is list and isinstance(value, list):
        (item,) = typing.get_args(kind)
        return [_missing_as_unknown(entry, item) for entry in value]
    if origin is dict and isinstance(value, dict):
        item = typing.get_args(kind)[1]
        return {key: _missing_as_unknown(entry, item) for key, entry in value.items()}
    return value


_NO_DEFAULT = object()


def _empty(hint: object) -> object:
    if _nullable(hint):
        return None
    origin = typing.get_origin(_without_none(hint))
    if origin is list:
        return []
    if origin is dict:
        return {}
    return _NO_DEFAULT


def _nullable(hint: object) -> bool:
    return type(None) in typing.get_args(hint)


def _without_none(hint: object) -> object:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        rest = [argument for argument in typing.get_args(hint) if argument is not type(None)]
        if len(rest) == 1:
            return rest[0]
    return hint
