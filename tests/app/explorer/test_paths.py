"""Path traversal is refused: every path the explorer opens stays under a configured root."""

from __future__ import annotations

import os

import pytest

from app.explorer.paths import UnsafePathError, relative_to_root, safe_path


def test_relative_path_under_root(tmp_path):
    (tmp_path / "run" / "study").mkdir(parents=True)
    assert safe_path(tmp_path, "run/study") == (tmp_path / "run" / "study").resolve()
    assert safe_path(tmp_path, "") == tmp_path.resolve()
    assert safe_path(tmp_path, None) == tmp_path.resolve()


@pytest.mark.parametrize("value", ["..", "../etc", "run/../../etc", "run/..", "..\\..\\windows", "a/../b"])
def test_dotdot_refused(tmp_path, value):
    with pytest.raises(UnsafePathError, match=r"'\.\.'"):
        safe_path(tmp_path, value)


def test_absolute_outside_refused(tmp_path):
    with pytest.raises(UnsafePathError, match="outside"):
        safe_path(tmp_path / "root", "/etc/passwd")
    with pytest.raises(UnsafePathError, match="outside"):
        safe_path(tmp_path / "root", str(tmp_path / "rootx"))  # a sibling sharing the prefix


def test_absolute_inside_allowed(tmp_path):
    inside = tmp_path / "a" / "b"
    inside.mkdir(parents=True)
    assert safe_path(tmp_path, str(inside)) == inside.resolve()


def test_symlink_out_of_root_refused(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    (tmp_path / "secret").mkdir()
    os.symlink(tmp_path / "secret", root / "link")
    with pytest.raises(UnsafePathError, match="outside"):
        safe_path(root, "link")


def test_nul_and_missing_root(tmp_path):
    with pytest.raises(UnsafePathError, match="NUL"):
        safe_path(tmp_path, "a\x00b")
    with pytest.raises(UnsafePathError, match="no root"):
        safe_path("", "a")


def test_relative_to_root(tmp_path):
    (tmp_path / "x" / "y").mkdir(parents=True)
    assert relative_to_root(tmp_path, tmp_path / "x" / "y") == "x/y"
    assert relative_to_root(tmp_path, tmp_path) == "."


def test_data_loaders_refuse_traversal(tmp_path):
    from app.explorer import data

    with pytest.raises(UnsafePathError):
        data.load_arrays(str(tmp_path), "../outside")
    with pytest.raises(UnsafePathError):
        data.load_figures(str(tmp_path), "/etc")
    with pytest.raises(UnsafePathError):
        data.store_manifest(str(tmp_path), "../../x")
