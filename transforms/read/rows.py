"""Rows checked before they are split: a text that cannot be (the Parquet reader's rule), and
rows that are dicts (the library's input) checked into (id, text) or a Rejected with the same
reason codes, so nothing is dropped."""
from __future__ import annotations

from typing import Any

from transforms.records import Rejected


def _id_string(value: Any) -> str | None:
    """Ids as the outputs write them: strings (an int id 7 is "7"), None when there is none."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, (bool, float, bytes)) or not isinstance(value, int):
        return None
    return str(value)


def text_rejection(doc_id: str | None, text: str | None) -> Rejected | None:
    """Why a row's text cannot be split (null, or nothing but whitespace), or None."""
    if text is None:
        return Rejected(doc_id, None, "null_text", "the text column is null")
    if not text.strip():
        return Rejected(doc_id, None, "empty_text", "the text is empty or whitespace only")
    return None


def check_row(element: Any, id_field: str, text_field: str) -> tuple[str, str] | Rejected:
    """(doc_id, text) of a row that can be split; otherwise why not."""
    if not isinstance(element, dict):
        return Rejected(None, None, "not_a_dict", f"the element is a {type(element).__name__}, not a dict")
    raw_id = element.get(id_field)
    if raw_id is None:
        reason = "null_id" if id_field in element else "missing_id"
        return Rejected(None, None, reason, f"the row has no {id_field!r} field" if reason == "missing_id"
                        else f"the {id_field!r} field is null")
    doc_id = _id_string(raw_id)
    if doc_id is None:
        return Rejected(None, None, "bad_id", f"the {id_field!r} field is a {type(raw_id).__name__}, "
                                              "not a string or an integer")
    if text_field not in element:
        return Rejected(doc_id, None, "missing_text", f"the row has no {text_field!r} field")
    text = element[text_field]
    if text is not None and not isinstance(text, str):
        return Rejected(doc_id, None, "not_text", f"the {text_field!r} field is a {type(text).__name__}, not a str")
    rejected = text_rejection(doc_id, text)
    if rejected is not None:
        return rejected
    assert text is not None   # text_rejection rejects a null text
    return doc_id, text
