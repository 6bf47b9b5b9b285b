"""posenc.lab.figures: the explanatory pictures are drawn, and the numbers behind them are right."""

import math

import pytest
import torch

import posenc
from posenc.lab import figures

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_draw_figures_writes_valid_pngs(tmp_path):
    paths = figures.draw_figures(tmp_path / "figs", dpi=40)
    assert [p.name for p in paths] == ["sinusoidal.png", "alibi.png", "rope_decay.png", "rope_scalings.png"]
    for path in paths:
        data = path.read_bytes()
        assert data[:8] == PNG_MAGIC and data[12:16] == b"IHDR"
        width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
        assert width > 200 and height > 100
    assert sorted(p.name for p in (tmp_path / "figs").iterdir()) == sorted(p.name for p in paths)  # no temp files


def test_rope_decay_matches_the_definition():
    inv_freq = torch.tensor([1.0, 0.1, 0.01], dtype=torch.float64)
    bound, ones = figures.rope_decay(torch.tensor([0, 5]), inv_freq)
    assert bound[0].item() == pytest.approx((1 + 2 + 3) / 3)  # |S_i| = i at distance 0
    partial = [abs(sum(complex(math.cos(5 * t), math.sin(5 * t)) for t in inv_freq[:i].tolist())) for i in (1, 2, 3)]
    assert bound[1].item() == pytest.approx(sum(partial) / 3)
    assert ones[0].item() == pytest.approx(1.0)
    assert ones[1].item() == pytest.approx(sum(math.cos(5 * t) for t in inv_freq.tolist()) / 3)


def test_rope_decay_decays():
    inv_freq, _ = posenc.rope_frequencies(128)
    bound, _ = figures.rope_decay(torch.arange(0, 1025), inv_freq)
    assert bound[0] > 2 * bound[100:].max()


def test_scaling_configs_are_valid_and_stretch_the_lowest_frequency():
    default, _ = posenc.rope_frequencies(figures.ROPE_HEAD_DIM)
    for label, scaling in figures.scaling_configs().items():
        inv_freq, _ = posenc.rope_frequencies(figures.ROPE_HEAD_DIM, scaling=scaling)
        expected = 1.0 if scaling is None else 1 / figures.FACTOR
        assert (inv_freq[-1] / default[-1]).item() == pytest.approx(expected, rel=1e-4), label


def test_alibi_figure_has_one_panel_per_head():
    fig = figures.alibi_figure(num_heads=6, positions=8)
    images = [ax.images[0] for ax in fig.axes if ax.images]
    assert len(images) == 6
    first = images[0].get_array()
    assert first[7, 0] == pytest.approx(-7 * posenc.alibi_slopes(6)[0].item())
    assert first.mask[0, 1]  # the masked future key is blank


@pytest.mark.parametrize("make", [figures.rope_decay_figure, figures.rope_scalings_figure])
def test_line_figures_keep_lines_apart_and_label_log_axes(make):
    """Each line its own (colour, marker, line style), so lines stay apart in grey print; log axes carry >= 3 labels."""
    fig = make()
    fig.canvas.draw()
    for ax in fig.axes:
        lines = [line for line in ax.get_lines() if not line.get_label().startswith("_")]
        looks = [(line.get_color(), line.get_marker(), str(line.get_linestyle())) for line in lines]
        assert len(set(looks)) == len(looks) and all(marker not in ("None", "") for _, marker, _ in looks)
        for axis in (ax.xaxis, ax.yaxis):
            if axis.get_scale() == "log":
                assert len([t for t in axis.get_ticklabels() if t.get_text()]) >= 3
