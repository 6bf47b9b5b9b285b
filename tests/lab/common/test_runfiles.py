"""The keyed results CSV, and the output-folder and settings checks shared by every lab command."""

import json
import math

import pytest

from posenc.lab.common.runfiles import (
    SETTINGS_FILES,
    KeyedCSV,
    check_out,
    check_settings,
    holds_only_settings,
    write_marker,
)

TABLE = KeyedCSV(columns=("name", "size", "score", "note"), key=("name", "size"), ints=frozenset({"size"}),
                 floats=frozenset({"score"}), defaults={"note": "-"}, command="posenc test")


def test_round_trip_is_typed_and_exact(tmp_path):
    path = tmp_path / "r.csv"
    rows = TABLE.upsert(
        path, [{"name": "a", "size": 2, "score": 0.1 + 0.2}, {"name": "b", "size": 3, "score": math.nan}]
    )
    assert rows == [{"name": "a", "size": 2, "score": 0.1 + 0.2, "note": "-"}, {"name": "b", "size": 3, "score": None,
                                                                                "note": "-"}]
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
    check_settings(tmp_path, {"steps": 3}, False, command="extend", what="run")
    assert json.loads((tmp_path / "extend.json").read_text()) == {"command": "posenc extend", "steps": 3}
    (tmp_path / "results.csv").write_text("work\n")  # work done: the settings are now fixed
    check_settings(tmp_path, {"steps": 3}, True, command="extend", what="run")
    with pytest.raises(ValueError, match="--resume to continue the run already there"):
        check_settings(tmp_path, {"steps": 3}, False, command="extend", what="run")
    with pytest.raises(ValueError, match=r"these differ: \['steps'\]"):
        check_settings(tmp_path, {"steps": 4}, True, command="extend", what="run")
    assert json.loads((tmp_path / "extend.json").read_text())["steps"] == 3


def test_a_folder_with_only_its_settings_is_taken_over(tmp_path):
    """A run that stopped before any work left only its settings file: nothing to lose, so any settings may follow."""
    check_settings(tmp_path, {"steps": 3}, False, command="lab", what="study")
    check_settings(tmp_path, {"steps": 4}, False, command="lab", what="study")
    check_settings(tmp_path, {"steps": 5}, True, command="lab", what="study")
    assert json.loads((tmp_path / "study.json").read_text()) == {"command": "posenc lab", "steps": 5}
    assert holds_only_settings(tmp_path, "lab") and not holds_only_settings(tmp_path, "vision")


def test_settings_files_from_before_the_marker_are_their_commands(tmp_path):
    (tmp_path / "study.json").write_text(json.dumps({"steps": 3}))
    (tmp_path / "results.csv").write_text("work\n")
    assert check_out(tmp_path, "lab") == {"steps": 3}
    check_settings(tmp_path, {"steps": 3}, True, command="lab", what="study")
    assert json.loads((tmp_path / "study.json").read_text())["command"] == "posenc lab"


def _snapshot(folder):
    return {p.relative_to(folder): (p.read_bytes() if p.is_file() else None) for p in sorted(folder.rglob("*"))}


@pytest.mark.parametrize("command", ["lab", "vision", "extend", "figures", "bench"])
def test_a_user_folder_is_never_written_into(tmp_path, command):
    user = tmp_path / "mine"
    user.mkdir()
    (user / "report.md").write_text("my notes")
    (user / "results.csv").write_text("a,b\n1,2\n")
    before = _snapshot(user)
    expected = rf"--out='.*mine' is invalid: expected a new or empty folder, or a `posenc {command}` output folder"
    with pytest.raises(ValueError, match=expected + ".*other files: report.md, results.csv"):
        check_out(user, command)
    if command in ("lab", "vision", "extend"):
        with pytest.raises(ValueError, match="other files"):
            check_settings(user, {"steps": 3}, True, command=command, what="run")
    assert _snapshot(user) == before


@pytest.mark.parametrize(
    ("command", "other", "file"),
    [("lab", "vision", "vision.json"), ("vision", "lab", "study.json"), ("extend", "lab", "study.json"),
     ("figures", "bench", "bench.json")],
)
def test_another_commands_folder_is_refused_by_name(tmp_path, command, other, file):
    check_settings(tmp_path, {"steps": 3}, False, command=other, what="run")
    with pytest.raises(ValueError, match=rf"it holds a `posenc {other}` \({file}\) run"):
        check_out(tmp_path, command)
    (tmp_path / SETTINGS_FILES[command]).write_text(json.dumps({"command": f"posenc {other}"}))
    with pytest.raises(ValueError, match=rf"its {SETTINGS_FILES[command]} was written by posenc {other}"):
        check_out(tmp_path, command)


def test_new_empty_file_and_unreadable_folders(tmp_path):
    assert check_out(tmp_path / "new" / "deeper", "lab") is None  # nothing is created by a check
    assert not (tmp_path / "new").exists()
    assert check_out(tmp_path, "lab") is None  # empty
    (tmp_path / "f").write_text("x")
    with pytest.raises(ValueError, match=r"--out='.*f' is invalid: .*; this is a file"):
        check_out(tmp_path / "f", "figures")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "study.json").write_text("{not json")
    with pytest.raises(ValueError, match="a readable JSON file"):
        check_out(tmp_path / "bad", "lab")
    with pytest.raises(ValueError, match="command='train'"):
        check_out(tmp_path, "train")


def test_markers_are_written_with_the_command(tmp_path):
    path = write_marker(tmp_path / "figs", "figures", {})
    assert path == tmp_path / "figs" / "figures.json"
    assert json.loads(path.read_text()) == {"command": "posenc figures"}
    assert check_out(tmp_path / "figs", "figures") == {}


def test_a_pick_folder_names_the_command_a_user_types(tmp_path):
    """``posenc pick`` does not exist: a pick's settings file says ``posenc extend --pick``; older pick folders
    (``"posenc pick"``, as the committed studies until 2026-11-27) stay resumable, and an extend folder stays apart."""
    write_marker(tmp_path / "new", "pick", {"target": 64})
    assert json.loads((tmp_path / "new" / "pick.json").read_text())["command"] == "posenc extend --pick"
    assert check_out(tmp_path / "new", "pick") == {"target": 64}
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "pick.json").write_text(json.dumps({"command": "posenc pick", "target": 64}))
    assert check_out(tmp_path / "old", "pick") == {"target": 64}
    with pytest.raises(ValueError, match=r"a `posenc extend` output folder .*it holds a `posenc extend --pick` "):
        check_out(tmp_path / "new", "extend")
