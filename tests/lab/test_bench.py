"""``posenc bench`` runs end to end on tiny shapes and writes its tables; bad options are clear errors.

Only that the harness works is tested here: timings are never asserted (BENCHMARKS.md records them)."""

import csv
import types

import pytest

from posenc.cli import main
from posenc.lab import bench as b


def test_cases_cover_llama_geometry_and_other_head_dims():
    cases = b.rotary_cases((1024, 4096, 8192), (64, 128), ("float32",), ("half",))
    assert [(c.seq, c.head_dim) for c in cases] == [(1024, 128), (4096, 128), (8192, 128), (4096, 64)]
    assert all((c.q_heads, c.kv_heads) == (32, 8) for c in cases)
    assert cases[0].bytes_moved == 2 * (32 + 8) * 1024 * 128 * 4


@pytest.mark.parametrize(
    "kwargs, name",
    [({"lengths": (0,)}, "lengths"), ({"head_dims": (7,)}, "head_dims"), ({"dtypes": ("int8",)}, "dtypes"),
     ({"layouts": ("spiral",)}, "layouts"), ({"lengths": ()}, "lengths"), ({"head_dims": ()}, "head_dims"),
     ({"dtypes": ()}, "dtypes"), ({"layouts": []}, "layouts")],
)
def test_bad_cases(kwargs, name):
    with pytest.raises(ValueError, match=name):
        b.rotary_cases(**kwargs)


def test_rotary_row_has_every_ratio():
    case = b.RotaryCase(seq=32, head_dim=16, dtype="float32", layout="interleaved", q_heads=4, kv_heads=2)
    row = b.run_rotary_case(case, device="cpu", min_run_time=0.01, compile_hf=False)
    assert row["ms"] > 0 and row["copy_ms"] > 0 and 0 < row["x_copy"] < float("inf")
    assert row["vs_hf_eager"] == row["hf_eager_ms"] / row["ms"]  # transformers is a test dependency
    assert row["liger_ms"] is None and row["flash_attn_ms"] is None  # CUDA only


def test_paired_ms_times_alternately_and_takes_the_median_ratio(monkeypatch):
    """Rounds alternate fn and reference; times are the best round's, the ratio the median of the rounds' ratios
    (not best / best): a round where both got slower (page faults) still compares like with like."""
    medians = iter([2.0, 1.0, 9.0, 3.0, 4.0, 1.0])  # rounds: (fn, ref) = (2, 1), (9, 3), (4, 1) -> ratios 2, 3, 4
    order = []

    class FakeTimer:
        def __init__(self, stmt, globals, num_threads):  # noqa: A002 - torch.utils.benchmark.Timer's signature
            self.name = globals["fn"].__name__

        def blocked_autorange(self, min_run_time):
            order.append(self.name)
            return types.SimpleNamespace(median=next(medians) / 1e3)

    def fn():
        pass

    def reference():
        pass

    monkeypatch.setattr(b.tb, "Timer", FakeTimer)
    assert b.paired_ms(fn, reference, 0.3, rounds=3) == (2.0, 1.0, 3.0)
    assert order == ["fn", "reference"] * 3


def test_cli_writes_tables(tmp_path, capsys):
    argv = ["bench", "--lengths", "32", "--head-dims", "16", "--dtypes", "float32", "--attention-lengths", "64",
            "--attention-encodings", "alibi",
            "--min-run-time", "0.01", "--out", str(tmp_path)]
    assert main(argv) == 0
    with open(tmp_path / "rotary.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [(r["layout"], r["seq"], r["head_dim"]) for r in rows] == [("half", "32", "16"), ("interleaved", "32", "16")]
    with open(tmp_path / "attention.csv", newline="") as f:
        attention = list(csv.DictReader(f))
    assert [r["encoding"] for r in attention] == ["alibi"]
    assert all(float(r["flex_ms"]) > 0 and float(r["sdpa_bias_ms"]) > 0 for r in attention)
    text = (tmp_path / "bench.md").read_text()
    assert "## RoPE on q and k" in text and "| flex ms |" in text
    assert main(["bench", "--dtypes", "int8"]) == 2
    assert "dtypes='int8' is invalid" in capsys.readouterr().err
    assert main(["bench", "--attention-encodings", "rope"]) == 2
    assert "attention_encodings='rope' is invalid" in capsys.readouterr().err


def test_header_names_the_cpu_path_the_rows_ran(monkeypatch):
    from posenc import kernels
    from posenc.kernels import native

    expected = native.describe() if native.available() else f"the blocked torch path (C kernel {native.error()})"
    assert f"CPU RoPE: {expected}" in b.header("cpu")
    monkeypatch.setattr(kernels, "use_native", False)
    assert "blocked torch path (C kernel turned off)" in b.header("cpu")
    monkeypatch.setattr(kernels, "use_cpu", False)
    assert "plain eager ops" in b.header("cpu")


def test_cpu_peak_memory_is_what_torch_allocated():
    """A call that allocates exactly 1 MiB and one that peaks at 2 MiB (two live tensors), measured on CPU where the
    process's resident size would show nothing (glibc reuses freed heap)."""
    import torch

    assert b.peak_mib(lambda: torch.empty(262144), "cpu") == 1.0  # 262144 float32

    def two_live():
        a = torch.ones(262144)
        c = a + a  # a and c both alive: 2 MiB (a * 2 would also allocate the scalar 2 as a tensor)
        del a
        return c

    assert b.peak_mib(two_live, "cpu") == 2.0
    assert b.peak_mib(lambda: None, "mps") is None  # no counter there: n/a, not 0


def test_unmeasured_memory_prints_na_not_zero(monkeypatch):
    rows = [{"encoding": "alibi", "seq": 512, "flex_ms": 1.5, "flex_mib": None, "sdpa_no_bias_ms": 1.0,
             "sdpa_no_bias_mib": 0.004, "sdpa_bias_ms": 2.0, "sdpa_bias_mib": 17.41}]
    table = b.markdown(rows, b.ATTENTION_COLUMNS)
    header, _, line = table.splitlines()
    cells = dict(zip(header.strip("| ").split(" | "), line.strip("| ").split(" | "), strict=True))
    assert cells["flex MiB"] == "n/a" and cells["SDPA no bias MiB"] == "0.004" and cells["SDPA+bias MiB"] == "17.41"
    # A memory column stays even when nothing in it was measured, and says so.
    rows[0].update(sdpa_no_bias_mib=None, sdpa_bias_mib=None)
    assert b.markdown(rows, b.ATTENTION_COLUMNS).splitlines()[2].count("n/a") == 3
    monkeypatch.setattr(b, "cpu_peak_bytes", lambda fn: None)
    assert b.peak_mib(lambda: None, "cpu") is None


def test_attention_rows_measure_memory_on_cpu():
    row = b.run_attention_case("alibi", 64, device="cpu", dtype="float32", min_run_time=0.01, heads=2, head_dim=8)
    assert all(row[f"{k}_mib"] > 0 for k in ("flex", "sdpa_no_bias", "sdpa_bias"))  # measured, not 0.00
    assert row["sdpa_bias_mib"] >= 2 * 64 * 64 * 4 / 2**20  # at least the (1, 2, 64, 64) float32 bias
    assert "Attention memory: peak MiB above the inputs: torch's CPU allocations" in b.header("cpu")
