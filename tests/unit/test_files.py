"""transforms/files.delete_each, the one rule of every clean-up: each path on its own, a path gone
already no failure, a link removed itself, a local path never read as a pattern; and
remove_empty_dirs, which leaves a folder a writer beside it has just used."""
from __future__ import annotations

import os

from transforms.files import delete_each, remove_empty_dirs


def test_each_path_goes_on_its_own_and_what_is_left_comes_back_with_why(tmp_path):
    (tmp_path / "a").write_text("a")
    (tmp_path / "b").write_text("b")
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "inner").write_text("x")
    blocked = str(tmp_path / "a" / "under-a-file")   # its parent is a file: cannot be deleted, nor is it gone
    left = delete_each([blocked, str(tmp_path / "a"), str(tmp_path / "never-made"), str(tmp_path / "b"),
                        str(tmp_path / "d")])
    assert [path for path, _ in left] == [blocked] and isinstance(left[0][1], NotADirectoryError)
    assert os.listdir(tmp_path) == []


def test_a_link_goes_never_what_it_points_to(tmp_path):
    (tmp_path / "view").mkdir()
    (tmp_path / "view" / "file").write_text("x")
    (tmp_path / "current").symlink_to(tmp_path / "view", target_is_directory=True)
    (tmp_path / "to-file").symlink_to(tmp_path / "view" / "file")
    assert delete_each([str(tmp_path / "current"), str(tmp_path / "to-file")]) == []
    assert sorted(os.listdir(tmp_path)) == ["view"] and (tmp_path / "view" / "file").exists()


def test_a_local_path_is_never_read_as_a_pattern(tmp_path):
    for name in ("day[1]", "day1", "dayX"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "f").write_text(name)
    assert delete_each([str(tmp_path / "day[1]" / "f"), str(tmp_path / "day?" / "f")]) == []
    assert sorted(p.parent.name for p in tmp_path.glob("*/f")) == ["day1", "dayX"]


def test_only_empty_folders_go_and_one_a_writer_just_used_is_no_failure(tmp_path):
    for name in ("empty", "written", "inner"):
        (tmp_path / name).mkdir()
    (tmp_path / "written" / "entry.intent").write_text("x")   # a writer's file, made after a check found it empty
    (tmp_path / "inner" / "run").mkdir()
    remove_empty_dirs([str(tmp_path / n) for n in ("empty", "written", "inner", "gone")] + ["gs://bucket/_journal/r"])
    assert sorted(os.listdir(tmp_path)) == ["inner", "written"]
    assert os.listdir(tmp_path / "written") == ["entry.intent"] and os.listdir(tmp_path / "inner") == ["run"]
