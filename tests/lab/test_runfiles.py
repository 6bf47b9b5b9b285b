"""The keyed results CSV and the settings check shared by ``posenc vision`` and ``posenc extend``."""

import math

import pytest

from posenc.lab.runfiles import KeyedCSV, check_settings

TABLE = KeyedCSV(columns=("name", "size", "score", "note"), key=("name", "size"), ints=frozenset({"size"}),
                 floats=frozenset({"score"}), defaults={"note": "-"}, command="posenc test")  # fmt: skip


def test_round_trip_is_typed_and_exact(tmp_path):
    path = tmp_path / "r.csv"
    rows = TABLE.upsert(
        path, [{"name": "a", "size": 2, "score": 0.1 + 0.2}, {"name": "b", "size": 3, "score": math.nan}]
    )
    assert rows == [{"name": "a", "size": 2, "score": 0.1 + 0.2, "note": "-"}, {"name": "b", "size": 3, "score": None,
                                                                                "note": "-"}]  # fmt: skip
    rows = TABLE.upsert(path, [{"name": "a", "size": 2, "score": 1.0, "note": "again"}])  # same key: replaced in place
    assert [(r["name"], r["score"], r["note"]) for r in rows] == [("a", 1.0, "again"), ("b", None, "-")]
    assert TABLE.key_of({"name": "a", "size": 2, "score": 5.0}) == ("a", 2)  # the key columns only


def test_bad_files_are_clear_errors(tmp_path):
    with pytest.raises(ValueError, match="run `posenc test` first"):
        TABLE.read(tmp_path / "missing.csv")
    (tmp_path / "short.csv").write_text("name,score\na,1\n")
    with pytest.raises(ValueError, match="missing \\['size'\\]"):
        TABLE.read(tmp_path / "short.csv")
    (tmp_path / "bad.csv").write_text("name,size,score\na,two,1\n")
    with pytest.raises(ValueError, match="bad.csv line 2 size='two'"):
        TABLE.read(tmp_path / "bad.csv")


def test_settings_allow_only_a_matching_resume(tmp_path):
    check_settings(tmp_path, {"steps": 3}, False, filename="s.json", what="run")
    check_settings(tmp_path, {"steps": 3}, True, filename="s.json", what="run")
    with pytest.raises(ValueError, match="--resume to continue the run already there"):
        check_settings(tmp_path, {"steps": 3}, False, filename="s.json", what="run")
    with pytest.raises(ValueError, match="these differ: \\['steps'\\]"):
        check_settings(tmp_path, {"steps": 4}, True, filename="s.json", what="run")
