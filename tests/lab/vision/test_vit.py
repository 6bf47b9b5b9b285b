"""The lab's ViT: every 2-D encoding trains and runs at other resolutions; learned tables resize as transformers'
ViT does; 2-D RoPE scores depend only on the 2-D offset; the class token is RoPE-ViT's unrotated one."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import posenc
from posenc.functional.axial_rope import grid_positions
from posenc.lab.common.train import TrainConfig, step_generator, train
from posenc.lab.vision.vit import ViT, ViTConfig, registry_name, vision_encodings
from tolerances import bicubic_atol

ENCODINGS = ["learned", "sinusoidal", "nope", "rope_axial", "rope_mixed", "alibi_2d"]
TINY = {"image_size": 8, "patch_size": 2, "dim": 16, "n_layers": 2, "n_heads": 2, "num_classes": 4}


def where_batches(batch=32, size=8):
    """Class = the quadrant holding a bright square: a task that needs positions (NoPE with mean pooling can't)."""

    def batch_fn(step, rank, world):
        g = step_generator(0, step)
        labels = torch.randint(0, 4, (batch,), generator=g)
        images = torch.randn(batch, 1, size, size, generator=g) * 0.1
        for i, c in enumerate(labels.tolist()):
            y, x = divmod(c, 2)
            images[i, 0, y * size // 2 : y * size // 2 + 2, x * size // 2 : x * size // 2 + 2] += 2.0
        return images, labels, None

    return batch_fn


def test_vision_encodings_are_the_grid_ones():
    names = vision_encodings()
    assert {registry_name(e) for e in ENCODINGS} <= set(names)
    assert "rope" not in names and "alibi" not in names


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_smoke_train_and_other_resolutions(encoding, tmp_path):
    model = ViT(ViTConfig(encoding=encoding, **TINY), seed=0)
    cfg = TrainConfig(steps=30, batch_size=32, length=16, lr=3e-3, warmup=3, log_every=5)
    summary = train(model, where_batches(), cfg, tmp_path, progress=False)
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    first, last = (float(line.split('"loss": ')[1].split(",")[0]) for line in (lines[0], lines[-1]))
    assert last < first, (first, last)
    assert summary["steps"] == 30
    model.eval()
    with torch.no_grad():
        for size in (4, 8, 12, 16, 20):
            out = model(torch.randn(3, 1, size, size))
            assert out.shape == (3, 4) and torch.isfinite(out).all()
        assert model(torch.randn(2, 1, 8, 12)).shape == (2, 4)  # non-square


def test_seed_gives_the_same_model():
    a = ViT(ViTConfig(encoding="rope_mixed", **TINY), seed=3)
    b = ViT(ViTConfig(encoding="rope_mixed", **TINY), seed=3)
    c = ViT(ViTConfig(encoding="rope_mixed", **TINY), seed=4)
    for (name, p), q in zip(a.state_dict().items(), b.state_dict().values(), strict=True):
        torch.testing.assert_close(p, q, rtol=0, atol=0, msg=name)
    assert not torch.equal(a.patch.weight, c.patch.weight)


def test_rope_mixed_has_its_own_frequencies_per_block():
    model = ViT(ViTConfig(encoding="rope_mixed", **TINY), seed=0)
    assert len(model.encodings) == TINY["n_layers"]
    assert not torch.equal(model.encodings[0].freqs, model.encodings[1].freqs)
    assert len(ViT(ViTConfig(encoding="rope_axial", **TINY)).encodings) == 1


def test_any_per_layer_encoding_gets_one_module_per_block():
    """The ViT reads ``Encoding.per_layer`` (not a list of names): a registered 2-D encoding that sets it gets a module
    per block, each with its own parameters; without it one module serves every block."""
    from posenc.encodings.axial_rope import AxialRoPE
    from posenc.registry import _ENCODINGS

    class PerBlockScale(AxialRoPE):
        per_layer = True

        def __init__(self, head_dim: int) -> None:
            super().__init__(head_dim=head_dim)
            self.gain = torch.nn.Parameter(torch.randn(()))

    try:
        posenc.register("per_block_test", PerBlockScale)
        model = ViT(ViTConfig(encoding="per_block_test", **TINY), seed=0)
        assert len(model.encodings) == TINY["n_layers"]
        assert len({id(e) for e in model.encodings}) == TINY["n_layers"]
        assert model.encodings[0].gain.item() != model.encodings[1].gain.item()
        seen = []
        for i, encoding in enumerate(model.encodings):
            rotate = encoding.rotate
            encoding.rotate = lambda *a, i=i, rotate=rotate, **k: (seen.append(i), rotate(*a, **k))[1]
        model(torch.randn(2, 1, 8, 8))
        assert seen == list(range(TINY["n_layers"]))  # block i runs its own module
    finally:
        _ENCODINGS.pop("per_block_test", None)


@pytest.mark.parametrize("new_hw", [(24, 24), (12, 12), (24, 32)])
def test_learned_table_resizes_like_transformers_vit(new_hw):
    transformers = pytest.importorskip("transformers")
    from transformers.models.vit.modeling_vit import ViTEmbeddings

    dim, patch = 16, 4
    model = ViT(ViTConfig(image_size=16, patch_size=patch, dim=dim, n_heads=2, encoding="learned"))
    table = model.encodings[0].table.detach()  # (H, W, D) = (4, 4, 16)
    with torch.no_grad():
        table.copy_(torch.randn_like(table))
    hf = ViTEmbeddings(transformers.ViTConfig(image_size=16, patch_size=patch, hidden_size=dim, num_channels=1))
    with torch.no_grad():
        hf.position_embeddings.copy_(torch.cat([torch.zeros(1, 1, dim), table.reshape(1, 16, dim)], dim=1))
    h, w = new_hw
    n = (h // patch) * (w // patch)
    expected = hf.interpolate_pos_encoding(torch.zeros(1, 1 + n, dim), h, w)[0, 1:]  # (N', D), row-major patches
    ours = model.input_encoding((w // patch, h // patch))
    positions = grid_positions(w // patch, h // patch)
    got = ours.embed(torch.zeros(1, n, dim), positions)[0]
    atol = bicubic_atol(table.abs().max(), sides=2)  # both bicubic in float32
    torch.testing.assert_close(got, expected, rtol=0, atol=atol)


def test_learned_at_the_training_grid_is_the_table_itself():
    model = ViT(ViTConfig(encoding="learned", **TINY))
    assert model.input_encoding((4, 4)) is model.encodings[0]


@pytest.mark.parametrize("name", ["rope_axial", "rope_mixed"])
@given(
    shift=st.tuples(st.integers(-20, 20), st.integers(-20, 20)),
    n=st.integers(2, 9),
    seed=st.integers(0, 2**16),
)
def test_2d_rope_scores_depend_only_on_the_2d_offset(name, shift, n, seed):
    g = torch.Generator().manual_seed(seed)
    enc = posenc.build(name, dim=32, num_heads=2, head_dim=16, grid_size=(4, 4))
    q = torch.randn(1, 2, n, 16, generator=g, dtype=torch.float64)
    k = torch.randn(1, 2, n, 16, generator=g, dtype=torch.float64)
    pos = torch.randint(0, 12, (n, 2), generator=g).double()
    moved = pos + torch.tensor(shift, dtype=torch.float64)
    enc = enc.double()
    a = torch.einsum("bhsd,bhtd->bhst", *enc.rotate(q, k, pos, pos))
    b = torch.einsum("bhsd,bhtd->bhst", *enc.rotate(q, k, moved, moved))
    torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)
    # and they do depend on the offset: swapping the axes of the key positions changes them
    if not torch.equal(pos[:, 0], pos[:, 1]):
        c = torch.einsum("bhsd,bhtd->bhst", *enc.rotate(q, k, pos, pos.flip(-1)))
        assert not torch.allclose(a, c)


@pytest.mark.parametrize("name", ["rope_axial", "rope_mixed"])
def test_class_token_at_origin_is_the_unrotated_class_token(name):
    """RoPE-ViT rotates patch tokens only; the ViT puts its class token at (0, 0): the same attention scores."""
    enc = posenc.build(name, dim=32, num_heads=2, head_dim=16, grid_size=(3, 3))
    q, k = torch.randn(2, 2, 10, 16), torch.randn(2, 2, 10, 16)
    patches = grid_positions(3, 3)  # (9, 2)
    with_cls = torch.cat([torch.zeros(1, 2), patches])  # (10, 2)
    rq, rk = enc.rotate(q, k, with_cls, with_cls)
    pq, pk = enc.rotate(q[:, :, 1:], k[:, :, 1:], patches, patches)
    ref_q, ref_k = torch.cat([q[:, :, :1], pq], dim=2), torch.cat([k[:, :, :1], pk], dim=2)  # class token unrotated
    torch.testing.assert_close(rq, ref_q)
    torch.testing.assert_close(rk, ref_k)


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_cls_pooling_runs(encoding):
    model = ViT(ViTConfig(encoding=encoding, pool="cls", **TINY))
    assert model(torch.randn(2, 1, 12, 12)).shape == (2, 4)


@pytest.mark.parametrize(
    "overrides, name",
    [
        ({"image_size": 10, "patch_size": 4}, "image_size"),
        ({"dim": 24, "n_heads": 4}, "dim"),
        ({"encoding": "rope"}, "encoding"),
        ({"encoding": "alibi"}, "encoding"),
        ({"encoding": "nonesuch"}, "encoding"),
        ({"pool": "max"}, "pool"),
        ({"num_classes": 1}, "num_classes"),
        ({"backend": "fast"}, "backend"),
        ({"encoding_config": {"base": object()}}, "encoding_config"),
    ],
)
def test_bad_config(overrides, name):
    with pytest.raises(ValueError, match=name):
        ViT(ViTConfig(**{**TINY, **overrides}))


@pytest.mark.parametrize(
    "images, name",
    [
        (torch.randn(2, 3, 8, 8), "images.shape"),
        (torch.randn(2, 1, 9, 8), "images.shape"),
        (torch.randn(1, 8, 8), "images.shape"),
        (torch.zeros(2, 1, 8, 8, dtype=torch.uint8), "images.dtype"),
    ],
)
def test_bad_images(images, name):
    with pytest.raises(ValueError, match=name):
        ViT(ViTConfig(**TINY))(images)


def test_config_round_trip():
    cfg = ViTConfig(encoding="alibi_2d", pool="cls", **TINY)
    assert ViTConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ValueError, match="only the keys"):
        ViTConfig.from_dict({**cfg.to_dict(), "extra": 1})


@pytest.mark.parametrize("encoding, moves", [("rope_axial", True), ("alibi_2d", True), ("sinusoidal", True),
                                             ("learned", False), ("nope", False)])
def test_coordinate_scale_reaches_coordinate_encodings_only(encoding, moves):
    model = ViT(ViTConfig(encoding=encoding, **TINY)).eval()
    x = torch.randn(2, 1, 16, 16)
    with torch.no_grad():
        plain, squeezed = model(x), model(x, coordinate_scale=0.5)
        torch.testing.assert_close(model(x, coordinate_scale=1.0), plain, rtol=0, atol=0)
    assert (not torch.equal(plain, squeezed)) == moves
