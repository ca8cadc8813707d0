"""What resuming on another layout does to the data order: another number of processes or
data shards, batch size or gradient accumulation (trainer/state/changes.py asks it).

Each epoch's order is its seeded permutation whatever the layout; the layout only decides
who trains which part of it, in which steps (trainer/state/data_order.py). The samples of
an epoch trained before a checkpoint are a prefix of that permutation, so a checkpoint cut
mid-epoch goes on with the rest of it on any layout, and the warning says which of two
things happens:

- the global batch (``data.batch_size`` x data shards x ``grad_accum.steps``) is the same:
  step k of the resumed run trains the very samples that step k of the uninterrupted run
  trains ("same global batch: resumes the same sequence of steps"); the weights agree to
  float rounding (the same gradient, summed in another order);
- it changed: the remaining samples of the epoch are each seen once, in the same order,
  in steps of the new global batch, in whole micro-batches (a shorter one would change the
  batch's shapes) from the checkpoint's last sample on. With gradient accumulation the
  windows fall on the new layout's grid of the epoch (counted in its micro-batches as if it
  had trained the epoch from its start), so the first step has fewer micro-batches when the
  count falls inside a window (:func:`first_step`); the warning says so. Without it every
  step is a whole global batch, the first included.

Training loaders make full batches only (``drop_last``, trainer/datamodule.py), in every
epoch of every layout: a data shard's last samples that do not fill a batch are not
trained. At the end of a resumed epoch those are the last of the epoch's order, and the
warning counts them exactly (:func:`epoch_tail`): "of the remaining 156 samples, 144 are
each seen once ...; the last 12 of the epoch's order are left out". Where the new shards'
last batches are full but the rest did not divide among the shards, the padding (samples
from the epoch's start) is trained again, and the warning says how many.

A checkpoint is written only where an optimizer step has just finished, so no accumulated
gradient is lost. A different dataset size mid-epoch is refused (by the sampler).
"""

from __future__ import annotations

from dataclasses import dataclass

from tuneup.trainer.state.data_order import batches_left, epoch_samples, rest_trained


@dataclass
class Context:
    """What the judgement of a change depends on besides the key."""

    step: int  # the checkpoint's optimizer step
    position: int  # samples of this rank's share already trained in the checkpoint's epoch
    saved: dict  # the checkpoint's run facts (trainer/state/resume.py run_facts)
    current: dict  # this run's
    weights_problem: str | None  # why the checkpoint's weights do not fit the model now
    owns_optimizer: bool  # tuneup builds the optimizer from the config (not model=lightning)
    order: dict | None = None  # the checkpoint's data order (trainer/state/data_order.py)


#: A changed key of the layout, with what its change does: (key, old, new, note).
Row = tuple[str, object, object, str]
#: Keys whose change mid-epoch is described by the "global batch" line.
BATCH_KEYS = ("data.batch_size", "grad_accum")


def consumed(ctx: Context) -> int:
    """The samples of the checkpoint's epoch trained before it, over all its data shards."""
    if ctx.order:
        return epoch_samples(ctx.order)
    return ctx.position * _int(ctx.saved.get("data_shards", ctx.saved.get("world_size")), 1)


def shards(facts: dict) -> int:
    return _int(facts.get("data_shards", facts.get("world_size")), 1)


def batch_size(ctx: Context, saved: bool) -> int | None:
    """One data shard's micro-batch: the loader's as saved, else the config's."""
    recorded = (ctx.order or {}).get("batch_size")
    old = _int(recorded, 0) or _int(ctx.saved.get("data.batch_size"), 0) or None
    if saved:
        return old
    return _int(ctx.current.get("data.batch_size"), 0) or old  # null: the data module's own


def global_batch(ctx: Context, saved: bool) -> int | None:
    facts = ctx.saved if saved else ctx.current
    batch, accumulate = batch_size(ctx, saved), _int(facts.get("grad_accum"), 0)
    return batch * shards(facts) * accumulate if batch and accumulate else None


def mid_epoch_change(ctx: Context) -> bool:
    """Whether the checkpoint stopped mid-epoch and the rest of it is dealt in another layout."""
    layout = (shards(ctx.saved), batch_size(ctx, True), ctx.saved.get("grad_accum"))
    now = (shards(ctx.current), batch_size(ctx, False), ctx.current.get("grad_accum"))
    return consumed(ctx) > 0 and layout != now


def key_note(key: str, ctx: Context) -> str:
    """What a change of ``data.batch_size`` or ``grad_accum.*`` does."""
    if key.startswith("grad_accum"):
        k = ctx.current.get("grad_accum")
        note = f"takes effect from step {ctx.step}: {k} micro-batch(es) per optimizer step"
    else:
        note = f"takes effect from step {ctx.step}"
    return note + ("; the rest of the epoch: see 'global batch'" if mid_epoch_change(ctx) else "")


def rows(ctx: Context) -> list[Row]:
    """The layout's changes: the number of processes, and a mid-epoch checkpoint's rest."""
    found = []
    old_world, world = ctx.saved.get("world_size"), ctx.current["world_size"]
    old_shards, new_shards = shards(ctx.saved), shards(ctx.current)
    if old_world is not None and (old_world, old_shards) != (world, new_shards):
        if old_shards == new_shards:
            note = (
                f"takes effect from step {ctx.step}: the model is laid out over {world} "
                f"process(es); the data order is unchanged ({new_shards} data shard(s) as "
                "before)"
            )
        else:
            note = (
                f"takes effect from step {ctx.step}: each epoch keeps its order (the seeded "
                f"permutation), now split into {new_shards} data shard(s) instead of "
                f"{old_shards}; "
            )
            note += (
                "the rest of the epoch: see 'global batch'"
                if mid_epoch_change(ctx)
                else "the samples of a step are the same if the global batch (data.batch_size x "
                "shards x grad_accum.steps) is"
            )
        found.append(("world size", old_world, world, note))
    if old_world is not None and mid_epoch_change(ctx):
        old, new = global_batch(ctx, True), global_batch(ctx, False)
        found.append(("global batch", old, new, rest_of_epoch(ctx, old, new)))
    return found


def rest_of_epoch(ctx: Context, old: int | None, new: int | None) -> str:
    """What the rest of the checkpoint's epoch is trained as, in this run's layout."""
    order = ctx.order or {}
    done, epoch, size = consumed(ctx), order.get("epoch", "?"), order.get("size")
    where = f"epoch {epoch} goes on from its sample {done} over {shards(ctx.current)} data shard(s)"
    tail = epoch_tail(ctx)
    if old is not None and old == new:
        same = f"same global batch: resumes the same sequence of steps ({where})"
        if tail is not None and tail != epoch_tail(ctx, saved=True):
            same += f"; at the epoch's end: {tail_note(ctx, tail)}"
        return same
    if not isinstance(size, int):
        return f"the remaining samples of epoch {epoch} are each seen once, in the same order"
    if tail is None or tail[1:] == (0, 0):
        text = f"the remaining {size - done} samples of epoch {epoch} are each seen once, in the "
        text += "same order"
    else:
        text = f"of the remaining {size - done} samples of epoch {epoch}, {tail[0]} are each "
        text += "seen once, in the same order"
    if old is None or new is None:
        return f"{text} ({where})"
    text = f"global batch changed from {old} to {new}: {text}, in steps of {new}"
    first = first_step(ctx, new)
    if first is not None:
        text += (
            f"; the first step takes {first}, to where a step of {new} ends in this "
            "layout's grid of the epoch"
        )
    if tail is not None and tail[1:] != (0, 0):
        text += f"; {tail_note(ctx, tail)}"
    return text


def epoch_tail(ctx: Context, saved: bool = False) -> tuple[int, int, int] | None:
    """(samples of the rest of the checkpoint's epoch trained once, the last ones left out,
    padding trained again) in this run's layout (``saved``: in the checkpoint's), or None
    when the sizes are not known. The training loaders make full batches only
    (trainer/datamodule.py ``drop_last``): :func:`data_order.rest_trained`."""
    size, batch = (ctx.order or {}).get("size"), batch_size(ctx, saved)
    if not (isinstance(size, int) and batch):
        return None
    return rest_trained(size, consumed(ctx), shards(ctx.saved if saved else ctx.current), batch)


def tail_note(ctx: Context, tail: tuple[int, int, int]) -> str:
    """What happens at the end of the epoch's rest: samples left out, padding trained again."""
    n, batch = shards(ctx.current), batch_size(ctx, False)
    _, left_out, again = tail
    if not left_out and not again:
        return "every remaining sample is seen once"
    notes = []
    if left_out:
        notes.append(
            f"the last {left_out} of the epoch's order are left out (each of the {n} "
            f"data shard(s) trains whole batches of {batch} only, as every epoch in "
            "this layout does)"
        )
    if again:
        notes.append(
            f"{again} sample(s) from the epoch's start are trained again, to fill the "
            f"last batches of the {n} data shard(s)"
        )
    return "; ".join(notes)


def first_step(ctx: Context, new: int) -> int | None:
    """The samples of the resumed run's first step when fewer than a whole step's (the
    windows fall on the new layout's grid of the epoch: trainer/state/progress.py
    ``continue_epoch``), else None."""
    size, batch = (ctx.order or {}).get("size"), batch_size(ctx, False)
    k = ctx.current.get("grad_accum")
    if not (isinstance(size, int) and batch and isinstance(k, int) and k > 0):
        return None
    n, done = shards(ctx.current), consumed(ctx)
    whole, left = batches_left(size, done, n, batch)
    into_window = (whole - left) % k
    samples = min(left, k - into_window) * batch * n
    return samples if into_window and 0 < samples < new else None


def _int(value, default: int) -> int:
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    return int(value) if number and int(value) == value else default
