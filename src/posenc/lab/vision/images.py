"""Image data for ``posenc vision``: Fashion-MNIST IDX files, scikit-learn's digits, or a folder of class folders.

Sources, in the order ``load_images(None)`` tries them:
    1. Fashion-MNIST (Xiao et al. 2017, arXiv:1708.07747) from the four IDX files where Debian's
       ``dataset-fashion-mnist`` package installs them (``FASHION_MNIST_DIR``), gzipped or not.
    2. scikit-learn's bundled 8x8 digits (``sklearn.datasets.load_digits``; no download), split by index.
``load_images(path)`` reads a folder holding the four IDX files (any MNIST-format dataset), or a folder of
class-named subfolders of images (``train/`` and ``test/`` inside it are used as the split when present).

Images are kept as ``uint8`` at their stored size; ``prepare`` resizes them to a model's resolution (area-
averaging down, bilinear up: PyTorch's ``antialias=True``) and normalises them with the training set's mean and
standard deviation.

Shapes:
    images (N, C, H, W) uint8; labels (N,) int64; prepare -> (N, C, R, R) float32.
"""

from __future__ import annotations

import gzip
import math
import struct
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from posenc._checks import check_positive_int, fail

FASHION_MNIST_DIR = Path("/usr/share/datasets/fashion-mnist")
FASHION_MNIST_CLASSES = (
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot",
)
IDX_FILES = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp")
#: Folder datasets are read at this size (square), before ``prepare`` resizes them to a model's resolution.
FOLDER_SIZE = 32
_IDX_DTYPES = {0x08: torch.uint8}


@dataclass(frozen=True)
class ImageData:
    """A train/test split of labelled images and where it came from (said in reports)."""

    train_images: torch.Tensor  # (N, C, H, W) uint8
    train_labels: torch.Tensor  # (N,) int64
    test_images: torch.Tensor  # (M, C, H, W) uint8
    test_labels: torch.Tensor  # (M,) int64
    classes: tuple[str, ...]
    source: str

    @property
    def channels(self) -> int:
        return self.train_images.shape[1]

    @property
    def size(self) -> int:
        """Stored image side in pixels."""
        return self.train_images.shape[-1]


def read_idx(path: str | Path) -> torch.Tensor:
    """Read an IDX file (LeCun's MNIST format; ``.gz`` or plain) of unsigned bytes into a ``uint8`` tensor.

    Format: two zero bytes, a type byte (``0x08`` = unsigned byte), the number of dimensions, then each dimension
    as a big-endian int32, then the data row-major.
    """
    path = Path(path)
    try:
        raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    except (OSError, EOFError, gzip.BadGzipFile) as err:
        fail("--data", str(path), f"a readable IDX file ({type(err).__name__}: {err})")
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_DTYPES or raw[3] == 0:
        fail("--data", str(path), "an IDX file of unsigned bytes (header 00 00 08 <ndim>); this one is not")
    ndim = raw[3]
    header = 4 + 4 * ndim
    if len(raw) < header:
        fail("--data", str(path), f"an IDX file with {ndim} dimension sizes after its header; it is cut short")
    dims = struct.unpack(f">{ndim}i", raw[4:header])
    count = 1
    for d in dims:
        count *= d
    if len(raw) - header != count:
        fail("--data", str(path), f"{count} data bytes for dimensions {dims}; it has {len(raw) - header}")
    return torch.frombuffer(bytearray(raw[header:]), dtype=torch.uint8).reshape(dims)


def _find_idx(folder: Path, stem: str) -> Path | None:
    for name in (stem, stem + ".gz", stem.replace("-idx", ".idx"), stem.replace("-idx", ".idx") + ".gz"):
        if (folder / name).is_file():
            return folder / name
    return None


def has_idx(folder: Path) -> bool:
    return all(_find_idx(folder, stem) is not None for stem in IDX_FILES.values())


def load_idx_folder(folder: str | Path, *, classes: tuple[str, ...] | None = None) -> ImageData:
    """The four MNIST-format IDX files in ``folder`` as an ``ImageData`` (one channel)."""
    folder = Path(folder)
    parts = {}
    for key, stem in IDX_FILES.items():
        path = _find_idx(folder, stem)
        if path is None:
            fail("--data", str(folder), f"a folder with {stem}[.gz] (and the other MNIST-format IDX files)")
        parts[key] = read_idx(path)
    for split in ("train", "test"):
        images, labels = parts[f"{split}_images"], parts[f"{split}_labels"]
        if images.dim() != 3 or labels.dim() != 1 or images.shape[0] != labels.shape[0]:
            fail("--data", str(folder), f"{split} images (N, H, W) and labels (N,) of the same N")
    n_classes = int(max(parts["train_labels"].max(), parts["test_labels"].max())) + 1
    names = classes if classes is not None and len(classes) == n_classes else tuple(map(str, range(n_classes)))
    return ImageData(
        train_images=parts["train_images"].unsqueeze(1),  # (N, H, W) -> (N, 1, H, W)
        train_labels=parts["train_labels"].long(),
        test_images=parts["test_images"].unsqueeze(1),
        test_labels=parts["test_labels"].long(),
        classes=names,
        source=f"IDX files in {folder}",
    )


def load_digits_data() -> ImageData:
    """scikit-learn's bundled 8x8 digits (1797 images, no download): every 5th image (by index) is a test image."""
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        fail(
            "--data",
            None,
            f"Fashion-MNIST IDX files (none in {FASHION_MNIST_DIR}: `apt install dataset-fashion-mnist`, or pass "
            "--data DIR), or scikit-learn for its bundled digits (`pip install scikit-learn`)",
        )
    digits = load_digits()
    images = torch.as_tensor(digits.images * (255.0 / 16.0)).round().to(torch.uint8).unsqueeze(1)  # (N, 1, 8, 8)
    labels = torch.as_tensor(digits.target, dtype=torch.long)
    test = torch.arange(len(labels)) % 5 == 0
    return ImageData(
        train_images=images[~test],
        train_labels=labels[~test],
        test_images=images[test],
        test_labels=labels[test],
        classes=tuple(map(str, range(10))),
        source="scikit-learn's digits (8x8, 1437 train / 360 test images)",
    )


def _image_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)


def _read_class_folders(root: Path, classes: tuple[str, ...], size: int) -> tuple[torch.Tensor, torch.Tensor]:
    from PIL import Image, UnidentifiedImageError

    images, labels, mode = [], [], None
    for label, name in enumerate(classes):
        for path in _image_files(root / name):
            try:
                with Image.open(path) as img:
                    mode = mode or ("L" if img.mode in ("1", "L", "I", "I;16", "F") else "RGB")
                    img = img.convert(mode).resize((size, size), Image.Resampling.BILINEAR)
                    pixels = torch.frombuffer(bytearray(img.tobytes()), dtype=torch.uint8)
            except (OSError, UnidentifiedImageError, ValueError) as err:
                fail("--data", str(path), f"a readable image file ({type(err).__name__}: {err}); remove or fix it")
            channels = 1 if mode == "L" else 3
            images.append(pixels.reshape(size, size, channels).permute(2, 0, 1))  # (H, W, C) -> (C, H, W)
            labels.append(label)
    if not images:
        fail("--data", str(root), f"image files ({', '.join(IMAGE_SUFFIXES)}) in class subfolders {list(classes)}")
    return torch.stack(images), torch.tensor(labels, dtype=torch.long)


def load_image_folder(folder: str | Path, *, size: int = FOLDER_SIZE) -> ImageData:
    """A folder of class-named subfolders of images (``root/<class>/*.png``), read at ``size`` x ``size``.

    With ``root/train/<class>/`` and ``root/test/<class>/`` those are the split; otherwise every 5th image of each
    class (sorted by path) is a test image. Images are grey (one channel) when the first one is, else RGB.
    """
    root = Path(folder)
    check_positive_int("size", size)
    split = (root / "train").is_dir() and (root / "test").is_dir()
    top = root / "train" if split else root
    classes = tuple(sorted(p.name for p in top.iterdir() if p.is_dir() and not p.name.startswith(".")))
    if len(classes) < 2:
        fail("--data", str(root), "a folder of at least 2 class-named subfolders of images (or IDX files)")
    if split:
        train_x, train_y = _read_class_folders(root / "train", classes, size)
        test_x, test_y = _read_class_folders(root / "test", classes, size)
    else:
        x, y = _read_class_folders(root, classes, size)
        rank = torch.zeros_like(y)
        for c in range(len(classes)):  # index of each image within its class, in path order
            members = (y == c).nonzero().flatten()
            rank[members] = torch.arange(len(members))
        test = rank % 5 == 4
        train_x, train_y, test_x, test_y = x[~test], y[~test], x[test], y[test]
    if len(test_y) == 0 or len(train_y) == 0:
        fail("--data", str(root), "enough images for a train and a test split (at least 5 per class)")
    return ImageData(
        train_images=train_x,
        train_labels=train_y,
        test_images=test_x,
        test_labels=test_y,
        classes=classes,
        source=f"image folders in {root} ({len(train_y)} train / {len(test_y)} test images, read at {size} px)",
    )


def load_images(data: str | Path | None = None) -> ImageData:
    """``data`` None: Fashion-MNIST from ``FASHION_MNIST_DIR`` if present, else scikit-learn's digits. A path: a
    folder of MNIST-format IDX files, or of class-named image subfolders."""
    if data is None:
        if has_idx(FASHION_MNIST_DIR):
            found = load_idx_folder(FASHION_MNIST_DIR, classes=FASHION_MNIST_CLASSES)
            return ImageData(**{**found.__dict__, "source": f"Fashion-MNIST ({FASHION_MNIST_DIR})"})
        return load_digits_data()
    folder = Path(data)
    if not folder.exists():
        fail("--data", str(data), "an existing folder (MNIST-format IDX files, or class-named image subfolders)")
    if not folder.is_dir():
        fail("--data", str(data), "a folder, not a file (MNIST-format IDX files, or class-named image subfolders)")
    if has_idx(folder):
        classes = FASHION_MNIST_CLASSES if "fashion" in folder.name.lower() else None
        return load_idx_folder(folder, classes=classes)
    return load_image_folder(folder)


def normalisation(images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-channel mean and standard deviation of ``uint8`` images in [0, 1] units, each ``(C, 1, 1)``."""
    x = images.float().div_(255.0)
    mean = x.mean(dim=(0, 2, 3))
    std = x.std(dim=(0, 2, 3)).clamp(min=1e-3)
    return mean[:, None, None], std[:, None, None]


def prepare(
    images: torch.Tensor, resolution: int, stats: tuple[torch.Tensor, torch.Tensor], *, chunk: int = 4096
) -> torch.Tensor:
    """``uint8`` images resized to ``resolution`` x ``resolution`` and normalised: float32 ``(N, C, R, R)``.

    Bilinear with ``antialias=True``: a box-like average when shrinking (no aliasing), plain bilinear when
    enlarging. Done in chunks of ``chunk`` images to bound the float32 temporaries.
    """
    check_positive_int("resolution", resolution)
    mean, std = stats
    out = []
    for part in images.split(chunk):
        x = part.float().div_(255.0)
        if x.shape[-2:] != (resolution, resolution):
            x = F.interpolate(x, size=(resolution, resolution), mode="bilinear", antialias=True, align_corners=False)
        out.append((x - mean) / std)
    return torch.cat(out) if out else images.new_empty(0, images.shape[1], resolution, resolution, dtype=torch.float32)


def random_resized_crop(
    images: torch.Tensor,
    resolution: int,
    stats: tuple[torch.Tensor, torch.Tensor],
    *,
    generator: torch.Generator,
    scale: tuple[float, float] = (0.35, 1.0),
    ratio: tuple[float, float] = (3 / 4, 4 / 3),
) -> torch.Tensor:
    """Inception-style random-resized-crop of each image to ``resolution`` px, normalised: the scale augmentation
    ViTs are trained with (DeiT, RoPE-ViT), which makes objects of every size familiar to the model.

    Each image draws a crop of ``scale`` of its area and aspect ``ratio`` (log-uniform), placed uniformly inside it,
    sampled bilinearly (``F.grid_sample``, ``align_corners=False``). Deterministic given ``generator``.

    Shapes:
        images (B, C, H, W) uint8 -> (B, C, resolution, resolution) float32.
    """
    check_positive_int("resolution", resolution)
    b = images.shape[0]
    area = torch.empty(b).uniform_(scale[0], scale[1], generator=generator)  # (B,)
    log_ratio = torch.empty(b).uniform_(math.log(ratio[0]), math.log(ratio[1]), generator=generator)
    width = (area * log_ratio.exp()).sqrt().clamp(max=1.0)  # crop size as a fraction of the image, (B,)
    height = (area / log_ratio.exp()).sqrt().clamp(max=1.0)
    cx = (torch.rand(b, generator=generator) * 2 - 1) * (1 - width)  # crop centre in [-1, 1] coordinates
    cy = (torch.rand(b, generator=generator) * 2 - 1) * (1 - height)
    zero = torch.zeros(b)
    theta = torch.stack([torch.stack([width, zero, cx], 1), torch.stack([zero, height, cy], 1)], 1)  # (B, 2, 3)
    grid = F.affine_grid(theta, [b, images.shape[1], resolution, resolution], align_corners=False)  # (B, R, R, 2)
    x = F.grid_sample(images.float().div_(255.0), grid, mode="bilinear", align_corners=False)
    mean, std = stats
    return (x - mean) / std
