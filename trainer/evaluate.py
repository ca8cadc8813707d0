"""``mode=validate|test|predict``: a checkpoint's weights on a split of the data, nothing trained.

Lightning's own loops run them (``trainer.validate``, ``trainer.test``, ``trainer.predict``),
as ``trainer.test(ckpt_path=...)`` would; the runner has loaded the weights already
(``resume=<checkpoint>``, weights only). What each leaves in summary.json:

- ``validate``: ``val`` (the measure plugin reads the logged ``val/*`` metrics);
- ``test``: ``test``, the metrics the test loop logged (``test/loss``, ``test/acc``: tuneup's
  step; a LightningModule's own ``test_step``, or its ``validation_step`` when it has none),
  by short name; the logger (metrics.csv) has them too;
- ``predict``: ``predictions.pt`` in the run directory, the model's outputs on the predict
  split in the data's order (the batches' tensors concatenated along the first dim; a list of
  the batches' outputs where they are not tensors of one shape), and ``predict`` in the
  summary: the split, the samples, the file and its shape.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from pytorch_lightning.utilities.model_helpers import is_overridden

log = logging.getLogger(__name__)

#: The file ``mode=predict`` writes into the run directory.
PREDICTIONS = "predictions.pt"


def evaluate(mode: str, trainer, module, data, run_dir: Path) -> dict:
    """Run ``mode``'s loop on ``module`` (weights loaded) and return its figures for the summary."""
    if mode == "validate":
        trainer.validate(module, datamodule=data, verbose=False)
        return {}
    if mode == "test":
        if not is_overridden("test_step", module):  # a LightningModule of the user's without one
            module.test_step = module.validation_step
        results = trainer.test(module, datamodule=data, verbose=False)
        return {"test": short_names(results[0] if results else {}, "test")}
    outputs = trainer.predict(module, datamodule=data, return_predictions=True)
    split = data.predict_split()[0]
    predictions = joined(outputs or [])
    path = Path(run_dir) / PREDICTIONS
    torch.save(predictions, path)
    shape = list(predictions.shape) if isinstance(predictions, torch.Tensor) else None
    samples = shape[0] if shape else sum(_length(o) for o in outputs or [])
    return {"predict": {"split": split, "samples": samples, "file": str(path), "shape": shape}}


def short_names(metrics: dict, split: str) -> dict[str, float]:
    """``test/acc`` (tuneup's) or ``test_acc`` -> ``acc``; any other name as it is."""
    found = {}
    for key, value in metrics.items():
        for prefix in (f"{split}/", f"{split}_"):
            if key.startswith(prefix):
                key = key[len(prefix) :]
                break
        found[key] = float(value)
    return found


def joined(outputs: list):
    """The predict loop's per-batch outputs as one tensor in the data's order (concatenated
    along the batch dim), or the list itself where they are not tensors of matching shapes."""
    tensors = [o for o in outputs if isinstance(o, torch.Tensor)]
    if outputs and len(tensors) == len(outputs) and len({t.shape[1:] for t in tensors}) == 1:
        return torch.cat([t.detach().cpu() for t in tensors])
    return outputs


def _length(output) -> int:
    return output.shape[0] if isinstance(output, torch.Tensor) and output.dim() else 1
