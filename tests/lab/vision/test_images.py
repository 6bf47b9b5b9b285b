"""Image data for ``posenc vision``: IDX files, image folders, the digits fallback, resizing and cropping."""

import gzip
import struct

import pytest
import torch
import torch.nn.functional as F

from posenc.lab.vision import images as im


def write_idx(path, array: torch.Tensor, *, compress: bool = False) -> None:
    """An IDX file written from the format's definition (independent of ``read_idx``)."""
    header = bytes([0, 0, 0x08, array.dim()]) + struct.pack(f">{array.dim()}i", *array.shape)
    raw = header + bytes(array.flatten().tolist())
    path.write_bytes(gzip.compress(raw) if compress else raw)


def idx_folder(root, n_train=12, n_test=6, size=6, classes=3):
    root.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(0)
    for split, n in (("train", n_train), ("t10k", n_test)):
        write_idx(
            root / f"{split}-images-idx3-ubyte.gz", torch.randint(0, 256, (n, size, size), generator=g), compress=True
        )
        write_idx(root / f"{split}-labels-idx1-ubyte", torch.arange(n) % classes)
    return root


def image_folder(root, classes=("cat", "dog"), per_class=5, size=10, mode="L"):
    from PIL import Image

    for c, name in enumerate(classes):
        (root / name).mkdir(parents=True)
        for i in range(per_class):
            value = 40 + 150 * c + i
            Image.new(mode, (size, size + 2), value if mode == "L" else (value, 0, 255 - value)).save(
                root / name / f"{i}.png"
            )
    return root


@pytest.mark.parametrize("compress", [False, True])
def test_read_idx_round_trip(tmp_path, compress):
    array = torch.randint(0, 256, (3, 4, 5), dtype=torch.uint8)
    path = tmp_path / ("x.gz" if compress else "x")
    write_idx(path, array, compress=compress)
    torch.testing.assert_close(im.read_idx(path), array)


@pytest.mark.parametrize(
    "raw, message",
    [
        (b"\x00\x00\x0d\x01\x00\x00\x00\x01\x00", "IDX file of unsigned bytes"),  # float type byte
        (b"PNG...", "IDX file of unsigned bytes"),
        (b"\x00\x00\x08\x02\x00\x00", "cut short"),
        (b"\x00\x00\x08\x01\x00\x00\x00\x05\x01\x02", "5 data bytes"),
    ],
)
def test_read_idx_rejects_bad_files(tmp_path, raw, message):
    path = tmp_path / "bad-idx3-ubyte"
    path.write_bytes(raw)
    with pytest.raises(ValueError, match=message) as err:
        im.read_idx(path)
    assert str(path) in str(err.value)


def test_read_idx_bad_gzip(tmp_path):
    path = tmp_path / "x.gz"
    path.write_bytes(b"not gzip at all")
    with pytest.raises(ValueError, match="readable IDX file"):
        im.read_idx(path)


def test_idx_folder(tmp_path):
    data = im.load_images(idx_folder(tmp_path / "mnistlike"))
    assert data.train_images.shape == (12, 1, 6, 6) and data.test_images.shape == (6, 1, 6, 6)
    assert data.train_images.dtype == torch.uint8
    torch.testing.assert_close(data.train_labels, torch.arange(12) % 3)
    assert data.classes == ("0", "1", "2") and "IDX files" in data.source


def test_image_folder_split_and_pixels(tmp_path):
    data = im.load_images(image_folder(tmp_path / "pets"))
    assert data.classes == ("cat", "dog")
    assert data.train_images.shape == (8, 1, 32, 32) and data.test_images.shape == (2, 1, 32, 32)  # every 5th
    torch.testing.assert_close(data.test_labels, torch.tensor([0, 1]))
    # a flat grey image stays flat at any size: the pixel values are the ones drawn
    assert data.test_images[0].unique().tolist() == [44] and data.test_images[1].unique().tolist() == [194]


def test_image_folder_rgb_and_explicit_split(tmp_path):
    image_folder(tmp_path / "set" / "train", mode="RGB", per_class=3)
    image_folder(tmp_path / "set" / "test", mode="RGB", per_class=2)
    data = im.load_images(tmp_path / "set")
    assert data.channels == 3 and len(data.train_labels) == 6 and len(data.test_labels) == 4


def test_digits_fallback(tmp_path, monkeypatch):
    pytest.importorskip("sklearn")
    monkeypatch.setattr(im, "FASHION_MNIST_DIR", tmp_path / "nowhere")
    data = im.load_images(None)
    assert "digits" in data.source
    assert data.train_images.shape == (1437, 1, 8, 8) and data.test_images.shape == (360, 1, 8, 8)
    assert data.train_images.max() == 255


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda p: p / "missing", "an existing folder"),
        (lambda p: (p / "file.txt").write_text("x") and p / "file.txt", "a folder, not a file"),
        (lambda p: (p / "empty").mkdir() or p / "empty", "at least 2 class-named subfolders"),
    ],
)
def test_bad_data_paths(tmp_path, make, message):
    path = make(tmp_path)
    with pytest.raises(ValueError, match=message) as err:
        im.load_images(path)
    assert "--data" in str(err.value)


def test_unreadable_image_names_the_file(tmp_path):
    root = image_folder(tmp_path / "pets")
    bad = root / "dog" / "broken.png"
    bad.write_bytes(b"\x89PNG but not really")
    with pytest.raises(ValueError, match="readable image file") as err:
        im.load_images(root)
    assert str(bad) in str(err.value)


def test_prepare_resizes_and_normalises():
    x = torch.randint(0, 256, (5, 1, 8, 8), dtype=torch.uint8)
    stats = im.normalisation(x)
    out = im.prepare(x, 8, stats)
    torch.testing.assert_close(out, (x.float() / 255 - stats[0]) / stats[1])
    assert out.mean().abs() < 1e-5 and (out.std() - 1).abs() < 1e-5  # unbiased, as normalisation computes it
    big = im.prepare(x, 12, stats)
    ref = F.interpolate(x.float() / 255, size=(12, 12), mode="bilinear", antialias=True, align_corners=False)
    torch.testing.assert_close(big, (ref - stats[0]) / stats[1])


def test_random_resized_crop_whole_image_is_a_bilinear_resize():
    x = torch.randint(0, 256, (4, 1, 12, 12), dtype=torch.uint8)
    stats = (torch.zeros(1, 1, 1), torch.ones(1, 1, 1))
    g = torch.Generator().manual_seed(0)
    out = im.random_resized_crop(x, 6, stats, generator=g, scale=(1.0, 1.0), ratio=(1.0, 1.0))
    ref = F.interpolate(x.float() / 255, size=(6, 6), mode="bilinear", align_corners=False)
    torch.testing.assert_close(out, ref)


def test_random_resized_crop_is_deterministic_and_varies():
    x = torch.randint(0, 256, (16, 1, 12, 12), dtype=torch.uint8)
    stats = im.normalisation(x)
    a = im.random_resized_crop(x, 8, stats, generator=torch.Generator().manual_seed(1))
    b = im.random_resized_crop(x, 8, stats, generator=torch.Generator().manual_seed(1))
    c = im.random_resized_crop(x, 8, stats, generator=torch.Generator().manual_seed(2))
    torch.testing.assert_close(a, b)
    assert not torch.equal(a, c)
