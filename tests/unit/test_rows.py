"""transforms/read/rows.py: every element becomes (id, text) or a Rejected with a reason."""
import pytest

from transforms.read.rows import check_row
from transforms.records import Rejected


@pytest.mark.parametrize("element, reason, doc_id", [
    ("a string", "not_a_dict", None), (["id", "text"], "not_a_dict", None), (None, "not_a_dict", None),
    ({"text": "t"}, "missing_id", None), ({"id": None, "text": "t"}, "null_id", None),
    ({"id": True, "text": "t"}, "bad_id", None), ({"id": 1.5, "text": "t"}, "bad_id", None),
    ({"id": b"x", "text": "t"}, "bad_id", None),
    ({"id": "a"}, "missing_text", "a"), ({"id": "a", "text": None}, "null_text", "a"),
    ({"id": "a", "text": 3}, "not_text", "a"), ({"id": "a", "text": " \n"}, "empty_text", "a"),
    ({"id": "a", "text": ""}, "empty_text", "a"),
])
def test_rows_that_cannot_be_split_say_why(element, reason, doc_id):
    got = check_row(element, "id", "text")
    assert isinstance(got, Rejected) and got.reason == reason and got.doc_id == doc_id and got.detail


def test_ids_are_strings_as_the_outputs_write_them():
    assert check_row({"id": 7, "text": "seven"}, "id", "text") == ("7", "seven")
    assert check_row({"key": "k", "body": "b", "other": 1}, "key", "body") == ("k", "b")
