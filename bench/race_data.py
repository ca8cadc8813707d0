"""Data for bench/race.py's tasks that no zoo data module gives, from what every install has.

- :func:`breast_cancer`: scikit-learn's bundled Wisconsin breast-cancer table (569 rows of 30
  measurements, 2 classes; nothing downloaded) as ``data=custom`` Datasets, each column
  standardised by the training rows' mean and spread;
- :func:`wine`: scikit-learn's bundled wine table (178 rows of 13 measurements, 3 classes),
  prepared as :func:`breast_cancer`;
- :func:`write_reference_text`: the Python language reference's own text, as the standard
  library bundles it for ``help()`` (``pydoc_data.topics``), written to a file for
  ``data=textfile``: English prose with code, where ``data=python_source`` is code.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch.utils.data import TensorDataset


class Table(TensorDataset):
    num_classes = 2  # tuneup checks the model's outputs against it


class Table3(TensorDataset):
    num_classes = 3


def breast_cancer(val_fraction: float = 0.2, seed: int = 1234) -> tuple[Table, Table]:
    """Training and validation rows: a fixed random ``val_fraction`` (by ``seed``) validates."""
    from sklearn.datasets import load_breast_cancer

    return _split(load_breast_cancer(), Table, val_fraction, seed)


def wine(val_fraction: float = 0.2, seed: int = 1234) -> tuple[Table3, Table3]:
    """As :func:`breast_cancer`, on the wine table (3 classes)."""
    from sklearn.datasets import load_wine

    return _split(load_wine(), Table3, val_fraction, seed)


def _split(table, kind, val_fraction: float, seed: int):
    """Standardised training and validation rows of a scikit-learn table."""
    x = torch.as_tensor(table.data, dtype=torch.float32)
    y = torch.as_tensor(table.target, dtype=torch.long)
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
    val, train = order[: round(len(y) * val_fraction)], order[round(len(y) * val_fraction) :]
    mean, std = x[train].mean(0), x[train].std(0)
    x = (x - mean) / std
    return kind(x[train], y[train]), kind(x[val], y[val])


def reference_text() -> bytes:
    """The language reference's topics (``help('if')``...), in sorted order, as UTF-8."""
    from pydoc_data.topics import topics

    return "\n\n".join(topics[name] for name in sorted(topics)).encode()


def write_reference_text(folder: Path) -> Path:
    return _write(Path(folder) / "python_reference.txt", reference_text())


def _write(path: Path, data: bytes) -> Path:
    """``data`` at ``path``, written only where the file differs (a race's runs share it);
    the absolute path, since the searches run from the checkout, not from the race's folder."""
    path = path.resolve()
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.is_file() or path.read_bytes() != data:
        path.write_bytes(data)
    return path


def unicode_names(limit: int = 400_000, seed: int = 1234) -> bytes:
    """The names ``unicodedata`` gives the code points, one per line, in an order shuffled by
    ``seed`` (so that the validation tail reads like the rest), the first ``limit`` bytes.
    Names made of a code point's number (``CJK UNIFIED IDEOGRAPH-4E00``...) and the Hangul
    syllables' (spelled from their letters) are left out: they are counted, not written. The
    Unicode version is the Python build's."""
    import random
    import re
    import unicodedata

    names = (unicodedata.name(chr(c), "") for c in range(0x110000))
    kept = [
        n
        for n in names
        if n and not re.search(r"-[0-9A-F]{4,5}$", n) and not n.startswith("HANGUL SYLLABLE")
    ]
    random.Random(seed).shuffle(kept)
    return "\n".join(kept).encode()[:limit]


def write_unicode_names(folder: Path) -> Path:
    return _write(Path(folder) / "unicode_names.txt", unicode_names())
