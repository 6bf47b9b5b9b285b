"""posenc.lab.common.corpus: corpus loading and splitting, training windows, evaluation windows."""

from __future__ import annotations

import sysconfig
import time
from pathlib import Path

import pytest
import torch

from posenc.lab.common.corpus import SEPARATOR, Corpus, eval_windows, load_corpus, stdlib_files, train_batch

# ----------------------------------------------------------------------------------------------------------------
# stdlib


def test_stdlib_files_are_sorted_python_files_without_installed_packages():
    root = Path(sysconfig.get_paths()["stdlib"])
    files = stdlib_files()
    rel = [f.relative_to(root).as_posix() for f in files]
    assert len(files) > 500
    assert rel == sorted(rel)
    assert all(r.endswith(".py") for r in rel)
    assert not [r for r in rel if "site-packages" in r.split("/") or "dist-packages" in r.split("/")]
    assert "os.py" in rel and "json/__init__.py" in rel
    assert stdlib_files() == files


def test_stdlib_corpus_is_fast_capped_and_identical_across_loads():
    start = time.perf_counter()
    corpus = load_corpus(max_bytes=200_000)
    seconds = time.perf_counter() - start
    assert seconds < 2.0, f"loading 200 kB of stdlib took {seconds:.2f} s"
    assert corpus.name == "stdlib"
    assert corpus.train.dtype == corpus.val.dtype == torch.uint8
    assert (corpus.train.numel(), corpus.val.numel()) == (180_000, 20_000)
    assert corpus.n_train_files > 0 and corpus.n_val_files > 0
    # file 0 of the fixed order goes to validation
    first = next(f.read_bytes() for f in stdlib_files() if f.read_bytes())
    head = min(len(first), 20_000)
    assert bytes(corpus.val[:head].tolist()) == first[:head]
    again = load_corpus(max_bytes=200_000)
    assert torch.equal(again.train, corpus.train) and torch.equal(again.val, corpus.val)


# ----------------------------------------------------------------------------------------------------------------
# folders and files


def _write(root: Path, files: dict[str, bytes]) -> None:
    for name, content in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)


def test_folder_split_by_file_in_relative_path_order_skipping_binaries(tmp_path):
    _write(tmp_path, {
        "b.md": b"bee",
        "a.txt": b"ay",
        "sub/c.py": "c\u00e9".encode(),
        "d": b"dee",  # no extension: still text
        "e.bin": b"\xff\xfe\x00\x01",  # not UTF-8
        "f.txt": b"has\0nul",  # NUL is the separator: treated as binary
        "g.txt": b"",  # empty: skipped, does not take an index
        ".hidden/h.txt": b"hidden",
        "__pycache__/i.txt": b"cache",
        "z.txt": b"zed",
    })
    corpus = load_corpus(tmp_path, val_fraction=0.5)
    # text files in order: a.txt(0) b.md(1) d(2) sub/c.py(3) z.txt(4); even indices -> validation
    assert bytes(corpus.val.tolist()) == b"ay\0dee\0zed"
    assert bytes(corpus.train.tolist()) == b"bee\0" + "c\u00e9".encode()
    assert (corpus.n_train_files, corpus.n_val_files) == (2, 3)
    assert corpus.name == tmp_path.name
    assert isinstance(corpus, Corpus)


def test_val_fraction_picks_every_kth_file(tmp_path):
    _write(tmp_path, {f"{i:02d}.txt": bytes([65 + i]) for i in range(20)})
    corpus = load_corpus(tmp_path, val_fraction=0.1, min_bytes=1)
    assert bytes(corpus.val.tolist()) == b"A\0K"  # files 0 and 10
    assert corpus.n_val_files == 2 and corpus.n_train_files == 18
    assert bytes(corpus.train.tolist()) == SEPARATOR.join(bytes([65 + i]) for i in range(20) if i % 10)


def test_single_file_is_split_by_bytes(tmp_path):
    text = bytes(range(32, 127)) + b"12345"  # 100 ASCII bytes
    (tmp_path / "one.txt").write_bytes(text)
    corpus = load_corpus(tmp_path / "one.txt", val_fraction=0.1)
    assert bytes(corpus.train.tolist()) == text[:90]
    assert bytes(corpus.val.tolist()) == text[90:]
    assert (corpus.n_train_files, corpus.n_val_files) == (1, 1)
    assert corpus.name == "one.txt"
    # a folder with one text file is split the same way
    folder = load_corpus(tmp_path, val_fraction=0.1)
    assert torch.equal(folder.train, corpus.train) and torch.equal(folder.val, corpus.val)


def test_max_bytes_caps_each_split_proportionally(tmp_path):
    _write(tmp_path, {f"{i:02d}.txt": bytes([65 + i]) * 10 for i in range(20)})
    corpus = load_corpus(tmp_path, val_fraction=0.1, max_bytes=50)
    assert bytes(corpus.val.tolist()) == b"A" * 5
    assert bytes(corpus.train.tolist()) == (
        b"B" * 10 + b"\0" + b"C" * 10 + b"\0" + b"D" * 10 + b"\0" + b"E" * 10 + b"\0" + b"F" * 1
    )
    single = load_corpus(tmp_path / "00.txt", val_fraction=0.2, max_bytes=5, min_bytes=1)
    assert (single.train.numel(), single.val.numel()) == (4, 1)


def test_max_bytes_stops_reading_once_both_splits_are_full(tmp_path, monkeypatch):
    _write(tmp_path, {f"{i:03d}.txt": b"x" * 100 for i in range(200)})
    reads = []
    original = Path.read_bytes
    monkeypatch.setattr(Path, "read_bytes", lambda self: reads.append(self.name) or original(self))
    load_corpus(tmp_path, val_fraction=0.5, max_bytes=400)
    assert reads == [f"{i:03d}.txt" for i in range(4)]


@pytest.mark.parametrize(
    ("make", "kwargs", "match"),
    [
        (lambda p: p / "missing", {}, r"path='.*missing' is invalid: expected an existing file or folder.*--corpus"),
        (lambda p: p, {}, r"has no non-empty UTF-8 text file.*--corpus PATH"),
        (lambda p: _write(p, {"x.bin": b"\xff\xff"}) or p, {}, r"no non-empty UTF-8 text file"),
        (lambda p: _write(p, {"x.bin": b"\xff\xff"}) or p / "x.bin", {}, r"expected a UTF-8 text file"),
        (
            lambda p: _write(p, {"a.txt": b"a" * 100}) or p,
            {"min_bytes": 50},
            r"at least 50 bytes, but .* gave train=90, val=10 bytes.*raise max_bytes",
        ),
        (lambda p: _write(p, {"a.txt": b"a" * 100}) or p, {"max_bytes": 20, "min_bytes": 5}, r"train=18, val=2"),
        (lambda p: _write(p, {"a.txt": b"a" * 100}) or p, {"val_fraction": 0.0}, r"val_fraction=0.0 is invalid"),
        (lambda p: _write(p, {"a.txt": b"a" * 100}) or p, {"val_fraction": 0.7}, r"in \(0, 0.5\]"),
        (lambda p: _write(p, {"a.txt": b"a" * 100}) or p, {"max_bytes": 0}, r"max_bytes=0 is invalid"),
    ],
)
def test_load_corpus_errors_say_what_to_do(tmp_path, make, kwargs, match):
    with pytest.raises(ValueError, match=match):
        load_corpus(make(tmp_path), **kwargs)


# ----------------------------------------------------------------------------------------------------------------
# training windows


def test_train_batch_windows_are_contiguous_and_shifted():
    data = torch.arange(200, dtype=torch.uint8)
    x, y = train_batch(data, length=16, batch=64, generator=torch.Generator().manual_seed(1))
    assert x.shape == y.shape == (64, 16) and x.dtype == y.dtype == torch.int64
    starts = x[:, 0]
    assert torch.equal(x, starts[:, None] + torch.arange(16))
    assert torch.equal(y, x + 1)
    assert int(starts.min()) >= 0 and int(starts.max()) <= 200 - 17
    assert len(set(starts.tolist())) > 20  # random starts


def test_train_batch_is_deterministic_in_the_generator_and_reaches_the_last_byte():
    data = torch.randint(0, 256, (500,), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    a = train_batch(data, length=8, batch=4, generator=torch.Generator().manual_seed(3))
    b = train_batch(data, length=8, batch=4, generator=torch.Generator().manual_seed(3))
    c = train_batch(data, length=8, batch=4, generator=torch.Generator().manual_seed(4))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) and not torch.equal(a[0], c[0])
    tight = torch.arange(9, dtype=torch.uint8)  # exactly length + 1 bytes: the only window
    x, y = train_batch(tight, length=8, batch=2, generator=torch.Generator().manual_seed(0))
    assert torch.equal(x, torch.arange(8).expand(2, 8)) and torch.equal(y, torch.arange(1, 9).expand(2, 8))


def test_train_batch_errors():
    g = torch.Generator().manual_seed(0)
    with pytest.raises(ValueError, match=r"length=8 is invalid: expected at most 7: the data holds 8 tokens"):
        train_batch(torch.zeros(8, dtype=torch.uint8), length=8, batch=1, generator=g)
    with pytest.raises(ValueError, match=r"data=\(2, 8\) is invalid: expected a 1-D tensor"):
        train_batch(torch.zeros(2, 8, dtype=torch.uint8), length=4, batch=1, generator=g)
    with pytest.raises(ValueError, match=r"generator=0 is invalid: expected a torch.Generator"):
        train_batch(torch.zeros(20, dtype=torch.uint8), length=4, batch=1, generator=0)
    with pytest.raises(ValueError, match=r"batch=0 is invalid"):
        train_batch(torch.zeros(20, dtype=torch.uint8), length=4, batch=0, generator=g)


# ----------------------------------------------------------------------------------------------------------------
# evaluation windows


def _scored(data, **kwargs):
    """Every scored target as (target index in data, context length), checking x/y against data on the way."""
    out = []
    for x, y, mask in eval_windows(data, **kwargs):
        assert x.dtype == y.dtype == torch.int64 and mask.dtype == torch.bool
        assert x.shape == y.shape == mask.shape and x.shape[1] == kwargs["length"]
        for row in range(x.shape[0]):
            start = int(x[row, 0])  # data is arange, so a value is its index
            assert torch.equal(x[row], torch.arange(start, start + kwargs["length"]))
            assert torch.equal(y[row], x[row] + 1)
            out += [(start + j + 1, j + 1) for j in mask[row].nonzero().flatten().tolist()]
    return out


def test_eval_windows_exact_plan_on_small_examples():
    data = torch.arange(11, dtype=torch.uint8)  # 10 targets
    got = list(eval_windows(data, length=4, batch=8))
    assert len(got) == 1
    x, _, mask = got[0]
    assert x[:, 0].tolist() == [0, 4, 6]  # the last window moves back to end at the last target
    assert mask.tolist() == [[True] * 4, [True] * 4, [False, False, True, True]]
    x, _, mask = next(iter(eval_windows(data, length=4, stride=2, max_tokens=7)))
    assert x[:, 0].tolist() == [0, 2, 3]
    assert mask.tolist() == [[True] * 4, [False, False, True, True], [False, False, False, True]]


@pytest.mark.parametrize("n", [9, 10, 17, 50, 101])
@pytest.mark.parametrize(("length", "stride"), [(1, None), (1, 1), (4, None), (4, 1), (4, 3), (4, 4), (8, None),
                                                (8, 1), (8, 3), (8, 8)])
@pytest.mark.parametrize("max_tokens", [None, 8, 23])
def test_eval_windows_score_every_target_once(n, length, stride, max_tokens):
    targets = n - 1 if max_tokens is None else min(n - 1, max_tokens)
    if targets < length:
        pytest.skip("max_tokens below length is an error")
    data = torch.arange(n, dtype=torch.uint8)
    scored = _scored(data, length=length, stride=stride, max_tokens=max_tokens, batch=3)
    assert sorted(t for t, _ in scored) == list(range(1, targets + 1))
    for t, context in scored:
        assert context <= min(t, length)
        if t <= length:
            assert context == t  # the first window scores everything with all the context there is
        elif stride is not None:
            assert context >= length - stride + 1
        if stride == 1:
            assert context == min(t, length)


def test_eval_windows_stride_length_equals_non_overlapping_and_batches_are_grouped():
    data = torch.randint(0, 256, (100,), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    a = list(eval_windows(data, length=8, batch=5))
    b = list(eval_windows(data, length=8, stride=8, batch=5))
    assert [t[0].shape[0] for t in a] == [5, 5, 3]  # 13 windows: 12 full + 1 moved back
    for ta, tb in zip(a, b, strict=True):
        assert all(torch.equal(u, v) for u, v in zip(ta, tb, strict=True))


def test_eval_windows_errors():
    data = torch.arange(20, dtype=torch.uint8)
    with pytest.raises(ValueError, match=r"stride=9 is invalid: expected an integer in \[1, length=8\]"):
        eval_windows(data, length=8, stride=9)
    with pytest.raises(ValueError, match=r"stride=0 is invalid"):
        eval_windows(data, length=8, stride=0)
    with pytest.raises(ValueError, match=r"max_tokens=5 is invalid: expected at least length=8"):
        eval_windows(data, length=8, max_tokens=5)
    with pytest.raises(ValueError, match=r"length=20 is invalid: expected at most 19"):
        eval_windows(data, length=20)
