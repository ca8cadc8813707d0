"""Data, by the name in ``conf/data/<name>.yaml``; each data module checks its own keys.

==================  =======  ===============================================
name                gives    module
==================  =======  ===============================================
synthetic_images    images   :mod:`tuneup.zoo.data.synthetic_images` (default, built in)
imagefolder         images   :mod:`tuneup.zoo.data.image_folder` (``root/train``, ``root/val``)
synthetic_tokens    tokens   :mod:`tuneup.zoo.data.tokens` (a learnable Markov chain)
textfile            tokens   :mod:`tuneup.zoo.data.tokens` (bytes of any text file)
digits              images   :mod:`tuneup.zoo.data.digits` (scikit-learn's handwritten digits)
python_source       tokens   :mod:`tuneup.zoo.data.python_source` (the standard library's .py files)
shards              either   :mod:`tuneup.zoo.data.shards` (what ``tuneup-shards`` wrote)
==================  =======  ===============================================

Every data module exposes ``input_shape`` and ``num_classes`` before it loads
anything (see :mod:`tuneup.trainer.datamodule`). The image data sets leave the
loader as uint8 and finish each batch on the training device
(:meth:`~tuneup.zoo.data.images.ImageData.device_batch`).
"""

from __future__ import annotations

from tuneup.trainer.datamodule import DataModule
from tuneup.zoo.data.digits import Digits
from tuneup.zoo.data.image_folder import ImageFolder
from tuneup.zoo.data.python_source import PythonSource
from tuneup.zoo.data.shards import Shards
from tuneup.zoo.data.synthetic_images import SyntheticImages
from tuneup.zoo.data.tokens import SyntheticTokens, TextFile

DATA: dict[str, type[DataModule]] = {
    "synthetic_images": SyntheticImages,
    "imagefolder": ImageFolder,
    "synthetic_tokens": SyntheticTokens,
    "textfile": TextFile,
    "digits": Digits,
    "python_source": PythonSource,
    "shards": Shards,
}


def check_data(cfg) -> list[str]:
    name = cfg.data.name
    if name not in DATA:
        return [f"data.name={name!r} is not allowed: expected one of {', '.join(DATA)}"]
    return DATA[name].problems(cfg)


def build_data(cfg, plugins=None) -> DataModule:
    """The data module ``cfg.data`` names.

    With ``plugins`` (the run's plugin manager) every DataLoader's keyword arguments
    pass through the ``configure_dataloader`` hook; without (plugins that only need
    ``input_shape`` and ``num_classes``) DataLoaders get torch's defaults.
    """
    configure = None
    if plugins is not None:

        def configure(kwargs: dict) -> None:
            plugins.call("configure_dataloader", cfg=cfg, kwargs=kwargs)

    data = DATA[cfg.data.name](cfg.data, configure)
    data.order_seed = cfg.seed
    return data


__all__ = [
    "DATA",
    "DataModule",
    "Digits",
    "ImageFolder",
    "PythonSource",
    "Shards",
    "SyntheticImages",
    "SyntheticTokens",
    "TextFile",
    "build_data",
    "check_data",
]
