"""``posenc extend``'s options and ``ExtendConfig``'s fields are one list (``posenc.lab.extend.settings.options``)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from posenc.cli import build_parser
from posenc.lab.extend.settings.config import STOP_WIDTH, ExtendConfig
from posenc.lab.extend.settings.options import BY_FIELD, OPTIONS, config_settings


def test_each_option_is_the_metadata_of_its_field():
    fields = {f.name: f for f in dataclasses.fields(ExtendConfig)}
    assert len(BY_FIELD) == len(OPTIONS) and set(BY_FIELD) <= set(fields)
    assert {name for name, f in fields.items() if "option" not in f.metadata} == {"corpus_bytes", "out"}
    for name, option in BY_FIELD.items():
        assert fields[name].metadata["option"] is option
    assert fields["model"].default is dataclasses.MISSING and fields["stop_width"].default == STOP_WIDTH


def test_the_config_is_built_back_from_every_option(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "model").mkdir()
    argv = ["extend", "model", "--methods", "yarn", "--factors", "2", "--lengths", "64,2x", "--depths", "0.5",
            "--trials", "3", "--finetune-steps", "4", "--finetune-lr", "1e-3", "--finetune-window", "1x",
            "--finetune-positions", "plain,pose", "--finetune-corpus", "ft.txt", "--task", "ruler",
            "--ruler-tasks", "niah_single_1", "--ruler-samples", "2", "--stop-width", "0", "--corpus", "c.txt",
            "--eval-tokens", "4x", "--original-len", "32", "--layer-type", "all", "--train-len", "16",
            "--train-steps", "5", "--device", "cpu", "--dtype", "float32", "--seed", "7", "--no-baseline"]
    settings = config_settings(build_parser().parse_args(argv))
    assert settings == {
        "model": str(tmp_path / "model"), "methods": ("yarn",), "factors": (2.0,), "lengths": (64, "2x"),
        "depths": (0.5,), "trials": 3, "finetune_steps": 4, "finetune_lr": 1e-3, "finetune_window": "1x",
        "finetune_positions": ("plain", "pose"), "finetune_corpus": str(tmp_path / "ft.txt"), "task": "ruler",
        "ruler_tasks": ("niah_single_1",), "ruler_samples": 2, "stop_width": 0.0, "corpus": str(tmp_path / "c.txt"),
        "eval_tokens": "4x", "original_len": 32, "layer_type": "all", "train_len": 16, "train_steps": 5,
        "device": "cpu", "dtype": "float32", "seed": 7, "baseline": False,
    }
    assert set(settings) == set(BY_FIELD)


def test_left_out_options_leave_the_config_defaults():
    settings = config_settings(build_parser().parse_args(["extend", "smollm2"]))
    assert settings == {"model": "smollm2", "finetune_steps": 0, "finetune_positions": ("plain",), "task": "lm",
                        "train_len": 128, "train_steps": 1000, "device": "auto", "seed": 0, "baseline": True}
    assert ExtendConfig(**settings) == ExtendConfig(model="smollm2")
    assert Path(settings["model"]).name == "smollm2"
