"""Data for bench/race.py's tasks that no zoo data module gives, from what every install has.

- :func:`breast_cancer`: scikit-learn's bundled Wisconsin breast-cancer table (569 rows of 30
  measurements, 2 classes; nothing downloaded) as ``data=custom`` Datasets, each column
  standardised by the training rows' mean and spread;
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


def breast_cancer(val_fraction: float = 0.2, seed: int = 1234) -> tuple[Table, Table]:
    """Training and validation rows: a fixed random ``val_fraction`` (by ``seed``) validates."""
    from sklearn.datasets import load_breast_cancer

    table = load_breast_cancer()
    x = torch.as_tensor(table.data, dtype=torch.float32)
    y = torch.as_tensor(table.target, dtype=torch.long)
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
    val, train = order[: round(len(y) * val_fraction)], order[round(len(y) * val_fraction) :]
    mean, std = x[train].mean(0), x[train].std(0)
    x = (x - mean) / std
    return Table(x[train], y[train]), Table(x[val], y[val])


def reference_text() -> bytes:
    """The language reference's topics (``help('if')``...), in sorted order, as UTF-8."""
    from pydoc_data.topics import topics

    return "\n\n".join(topics[name] for name in sorted(topics)).encode()


def write_reference_text(folder: Path) -> Path:
    path = Path(folder) / "python_reference.txt"
    path.parent.mkdir(parents=True, exist_ok=True)
    data = reference_text()
    if not path.is_file() or path.read_bytes() != data:
        path.write_bytes(data)
    return path
