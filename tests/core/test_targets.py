"""A writer of a kind of folder: what ``overwrite`` replaces, what it keeps, what it refuses,
and what a replacement killed between its renames leaves to the next writer."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from implicitlm.core.targets import FolderKind, TargetExistsError, exclusive_target, exclusive_targets, staged_folder

KIND = FolderKind("a test build", marks=("built.json",), entries=("built.json", "parts"), foreign=("other.json",))


def contents(path: Path) -> dict[str, bytes | None]:
    return {str(p.relative_to(path)): p.read_bytes() if p.is_file() else None for p in sorted(path.rglob("*"))}


def build(target: Path, overwrite: bool = True) -> None:
    with staged_folder(target, overwrite, KIND) as staging:
        (staging / "built.json").write_text("new")
        (staging / "parts").mkdir()


@pytest.fixture
def earlier(tmp_path) -> Path:
    """A finished build, with a user's notes beside what it wrote."""
    target = tmp_path / "out"
    (target / "parts").mkdir(parents=True)
    (target / "parts" / "old").write_text("old part")
    (target / "built.json").write_text("old")
    (target / "notes.txt").write_text("mine")
    return target


def test_overwrite_replaces_what_the_writer_writes_and_keeps_the_rest(earlier):
    build(earlier)
    assert contents(earlier) == {"built.json": b"new", "notes.txt": b"mine", "parts": None}
    assert os.listdir(earlier.parent) == ["out"]


@pytest.mark.parametrize("other", ["a user's folder", "a file", "a link", "another kind's folder"])
def test_a_target_of_another_kind_is_refused_with_overwrite(other, tmp_path):
    target = tmp_path / "out"
    if other == "a user's folder":
        target.mkdir()
        (target / "notes.txt").write_text("mine")
    elif other == "a file":
        target.write_text("mine")
    elif other == "a link":
        (tmp_path / "elsewhere").mkdir()
        (tmp_path / "elsewhere" / "built.json").write_text("old")
        target.symlink_to("elsewhere")
    else:
        target.mkdir()
        (target / "built.json").write_text("old")
        (target / "other.json").write_text("theirs")
    before = contents(tmp_path)
    with pytest.raises(TargetExistsError, match=f"^{re.escape(str(target))}: (not a folder|a symbolic link|holds other work than)"):
        build(target)
    assert contents(tmp_path) == before


def test_a_folder_of_this_kinds_files_and_another_kinds_is_refused_naming_the_others_only(tmp_path):
    """before: "holds files that are no part of a test build (built.json, other.json, ...)", the
    build's own file among them (solver train's refusal of a run's checkpoint named config.json)."""
    target = tmp_path / "out"
    target.mkdir()
    for name in ("built.json", "other.json", "notes.txt"):
        (target / name).write_text("theirs")
    with pytest.raises(TargetExistsError, match=f"^{re.escape(str(target))}: holds other work than a test build "
                                                r"\(other.json\); write it into a new or empty folder$"):
        build(target)


def test_a_failed_writer_removes_the_folders_it_made_and_what_another_wrote_there_stays(tmp_path):
    """before: a writer refused (or failed) after its lock made the folders on the way to its
    target left them; the command line then removed --out whole, with another command's files."""
    files = [tmp_path / "new" / "deeper" / name for name in ("record.json", "figure.png")]
    with pytest.raises(OSError, match="refused"):
        with exclusive_targets(files):
            raise OSError("refused")
    assert contents(tmp_path) == {}
    with pytest.raises(OSError, match="refused"):
        with exclusive_targets(files):
            (files[0].parent / "words.npy").write_bytes(b"another command's")
            raise OSError("refused")
    assert contents(tmp_path) == {"new": None, "new/deeper": None, "new/deeper/words.npy": b"another command's"}


@pytest.mark.parametrize("overwrite", [False, True])
@pytest.mark.parametrize("target", ["a pipe", "a link to a file", "a link to a folder"])
def test_a_pipe_or_a_link_is_no_target_even_with_overwrite(target, overwrite, tmp_path):
    """before: with overwrite, a pipe (or a device) at the target became a regular file, and a
    link was replaced or written through."""
    path = tmp_path / "out"
    (tmp_path / "folder").mkdir()
    (tmp_path / "file").write_text("theirs")
    if target == "a pipe":
        os.mkfifo(path)
    else:
        path.symlink_to("folder" if target.endswith("folder") else "file")
    before = contents(tmp_path)
    what = "not a file or a folder \\(a device, a pipe or a socket\\)" if target == "a pipe" else "a symbolic link"
    for kind in (None, KIND):
        with pytest.raises(TargetExistsError, match=f"^{re.escape(str(path))}: {what}; write into a file or folder of its own"):
            with exclusive_target(path, overwrite, kind):
                pytest.fail("held")
    assert contents(tmp_path) == before and path.is_fifo() == (target == "a pipe")


def test_an_empty_folder_and_no_folder_are_built_in(tmp_path):
    (tmp_path / "empty").mkdir()
    for target in (tmp_path / "empty", tmp_path / "new"):
        build(target, overwrite=False)
        assert contents(target) == {"built.json": b"new", "parts": None}


def test_a_failed_build_leaves_the_earlier_one_and_the_notes(earlier):
    before = contents(earlier.parent)
    with pytest.raises(OSError):
        with staged_folder(earlier, True, KIND) as staging:
            (staging / "built.json").write_text("new")
            raise OSError("disk full")
    assert contents(earlier.parent) == before


@pytest.mark.parametrize("killed", ["with the notes aside", "between its renames", "before removing the old build"])
def test_what_a_killed_replacement_kept_aside_is_put_back_by_the_next_writer(killed, earlier):
    """The notes wait in ``.out.kept`` while the folder is swapped; a writer killed then
    leaves them there, and the next holder of the target puts them back."""
    kept = earlier.with_name(".out.kept")
    kept.mkdir()
    os.replace(earlier / "notes.txt", kept / "notes.txt")
    if killed != "with the notes aside":
        os.replace(earlier, earlier.with_name(".out.old"))
    if killed == "before removing the old build":
        earlier.mkdir()
        (earlier / "built.json").write_text("new")
    with exclusive_target(earlier, overwrite=True, kind=KIND):
        pass
    assert contents(earlier.parent) == {
        "out": None, "out/built.json": b"new" if killed == "before removing the old build" else b"old",
        "out/notes.txt": b"mine", **({} if killed == "before removing the old build" else
                                    {"out/parts": None, "out/parts/old": b"old part"}),
    }
