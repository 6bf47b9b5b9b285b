"""The lab's progress bar and the messages a resumed run prints about what it skips."""

from posenc.lab.common.progress import progress_bar, skipped


def test_skipped_says_how_many_were_done():
    assert skipped("alibi", 10, 10) == "alibi: 10 of 10 evaluations done, skipped"
    assert skipped("rope", 3, 10) == "rope: 3 of 10 evaluations done, skipped; measuring the other 7"
    assert skipped("none", 2, 2, "measurements") == "none: 2 of 2 measurements done, skipped"
    assert skipped("rope", 0, 10) is None  # a fresh run says nothing


def test_progress_bar_counts_and_is_silent_when_off(capsys):
    with progress_bar(True, 3, "rope evaluation") as advance:
        for _ in range(3):
            advance()
    shown = capsys.readouterr().out
    assert "rope evaluation" in shown and "3/3" in shown
    for enabled, total in ((False, 3), (True, 0)):
        with progress_bar(enabled, total, "quiet") as advance:
            advance()
    assert capsys.readouterr().out == ""
