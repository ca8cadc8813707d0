"""Token data for language models: ``x`` is ``[B, T]`` int64 tokens, ``y`` the next token of each.

``synthetic_tokens``: sequences from a fixed random Markov chain. Every token
has ``BRANCHING`` possible successors with probabilities 8:4:2:1, so the best
possible next-token accuracy is 8/15 (53 %) and a model that learns the chain
gets far above chance (1 / vocab_size). Generated once from ``data.seed``.

``textfile``: byte-level language modelling on any file (UTF-8 text is bytes
like any other; the vocabulary is the 256 byte values). The first
``1 - val_fraction`` of the file is training data, the rest validation, each
cut into consecutive sequences of ``context`` bytes (the inputs, which do not
overlap) with the same bytes shifted by one as targets, as nanoGPT's
character-level Shakespeare does.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
from omegaconf import OmegaConf
from torch.utils.data import Dataset, TensorDataset

from tuneup.trainer.datamodule import DataModule
from tuneup.trainer.validation import Integer, Number, problems

#: Successors per token in the synthetic chain, and their relative probabilities.
BRANCHING = torch.tensor([8.0, 4.0, 2.0, 1.0])

#: Byte-level vocabulary of ``textfile``.
BYTE_VOCAB = 256


class Windows(Dataset):
    """``(tokens[i*T : i*T+T], tokens[i*T+1 : i*T+T+1])`` for window ``i``, as int64."""

    def __init__(self, tokens: torch.Tensor, context: int, count: int | None = None) -> None:
        self.tokens, self.context = tokens, context
        available = (len(tokens) - 1) // context
        self.count = available if count is None else min(count, available)

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int):
        start = index * self.context
        chunk = self.tokens[start : start + self.context + 1].long()
        return chunk[:-1], chunk[1:]


class SyntheticTokens(DataModule):
    inputs = "tokens"
    rules = {
        "data.batch_size": Integer(low=1),
        "data.vocab_size": Integer(low=len(BRANCHING)),
        "data.context": Integer(low=1),
        "data.train_samples": Integer(low=1),
        "data.val_samples": Integer(low=1),
        "data.test_samples": Integer(low=0),
        "data.seed": Integer(low=0),
    }

    def __init__(self, settings, configure_loader=None) -> None:
        super().__init__(settings, configure_loader)
        self.input_shape = (settings.context,)
        self.num_classes = settings.vocab_size
        self._held_out = None

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        s = self.settings
        generator = torch.Generator().manual_seed(s.seed)
        successors = successor_table(s.vocab_size, generator)
        self.train_set = _chain(successors, s.train_samples, s.context, generator)
        self.val_set = _chain(successors, s.val_samples, s.context, generator)
        self._held_out = (successors, generator.get_state())

    test_hint = "give data.test_samples=N (held-out samples drawn after train and val)"

    def test_split(self):
        """``data.test_samples`` more walks of the same chain, drawn after the training and
        validation ones from the same seeded stream: held out, the same for every run."""
        if self.test_set is None and self.settings.get("test_samples"):
            self.setup("test")
            successors, state = self._held_out
            generator = torch.Generator()
            generator.set_state(state)
            s = self.settings
            self.test_set = _chain(successors, s.test_samples, s.context, generator)
        return self.test_set


#: Up to this vocabulary the successors are the first of a permutation per token (the chain
#: every seed has always drawn); above it a permutation per token is O(vocab^2): GPT-2's 50,304
#: tokens would draw 2.5e9 numbers.
PERMUTATION_UP_TO = 4096


def successor_table(vocab_size: int, generator) -> torch.Tensor:
    """``[vocab_size, len(BRANCHING)]``: each token's distinct successors, uniformly drawn."""
    k = len(BRANCHING)
    if vocab_size <= PERMUTATION_UP_TO:
        return torch.stack(
            [torch.randperm(vocab_size, generator=generator)[:k] for _ in range(vocab_size)]
        )
    table = torch.randint(vocab_size, (vocab_size, k), generator=generator)
    while True:  # rows with a repeated successor drawn again (about k^2/2 / vocab of them)
        ordered = table.sort(dim=1).values
        repeated = (ordered[:, 1:] == ordered[:, :-1]).any(dim=1).nonzero().flatten()
        if not len(repeated):
            return table
        table[repeated] = torch.randint(vocab_size, (len(repeated), k), generator=generator)


def _chain(successors, count: int, context: int, generator) -> TensorDataset:
    """``count`` walks of ``context + 1`` tokens along the chain: (inputs, next tokens)."""
    sequences = torch.empty(count, context + 1, dtype=torch.long)
    sequences[:, 0] = torch.randint(len(successors), (count,), generator=generator)
    for t in range(context):
        choice = torch.multinomial(BRANCHING, count, replacement=True, generator=generator)
        sequences[:, t + 1] = successors[sequences[:, t], choice]
    return TensorDataset(sequences[:, :-1], sequences[:, 1:])


class TextFile(DataModule):
    inputs = "tokens"
    rules = {
        "data.batch_size": Integer(low=1),
        "data.context": Integer(low=1),
        "data.val_fraction": Number(gt=0, lt=1),
        "data.train_samples": Integer(low=1, also=(None,), note="None: every window"),
        "data.val_samples": Integer(low=1, also=(None,), note="None: every window"),
    }

    def __init__(self, settings, configure_loader=None) -> None:
        super().__init__(settings, configure_loader)
        self.input_shape = (settings.context,)
        self.num_classes = BYTE_VOCAB

    @classmethod
    def problems(cls, cfg) -> list[str]:
        found = problems(cfg, cls.rules)
        path = OmegaConf.select(cfg, "data.path", throw_on_missing=False)
        if not path:
            return [*found, "data.path is not set: give a text file, e.g. data.path=input.txt"]
        file = Path(str(path)).expanduser()
        if not file.is_file():
            what = "is a directory, not a file" if file.is_dir() else "does not exist"
            return [*found, f"data.path={str(path)!r} {what}: give a UTF-8 text file"]
        size = file.stat().st_size
        if size == 0:
            return [*found, f"data.path={str(path)!r} is empty: give a file with text in it"]
        if found:
            return found
        return _split_problems(cfg.data, size, str(path))

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        s = self.settings
        data = Path(s.path).expanduser().read_bytes()
        tokens = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        cut = split_point(len(tokens), s.val_fraction)
        self.train_set = Windows(tokens[:cut], s.context, s.train_samples)
        self.val_set = Windows(tokens[cut:], s.context, s.val_samples)


def split_point(size: int, val_fraction: float) -> int:
    """Bytes of the training part: the first ``1 - val_fraction`` of the file."""
    return size - math.ceil(size * val_fraction)


def _split_problems(settings, size: int, path: str) -> list[str]:
    context, batch = settings.context, settings.batch_size
    cut = split_point(size, settings.val_fraction)
    train_windows = (cut - 1) // context
    if settings.train_samples is not None:
        train_windows = min(train_windows, settings.train_samples)
    if size - cut < context + 1:
        return [
            f"data.path={path!r} has {size} bytes: its validation part "
            f"(data.val_fraction={settings.val_fraction}) has {size - cut}, fewer than one "
            f"sequence of data.context + 1 = {context + 1}; use a longer file, a larger "
            "val_fraction or a shorter context"
        ]
    if train_windows < batch:
        return [
            f"data.path={path!r} has {size} bytes: its training part gives {train_windows} "
            f"sequences of data.context={context}, fewer than data.batch_size={batch}; use a "
            "longer file, a shorter context or a smaller batch"
        ]
    return []
