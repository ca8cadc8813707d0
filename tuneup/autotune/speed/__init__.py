"""The speed stage: the throughput walk over this machine's speed features (precision, memory
format, compile, DataLoader workers, the batch size...), one dimension at a time, each
candidate measured in interleaved rounds against the recipe so far.

Its interface: ``Search(settings, lab, checks, budget).run()``, given the ``autotune``
settings, the Lab its trials run in, the candidates' checks and a :class:`Budget` of
seconds; what it decided is on the search after it ran (``recipe``, ``outcomes``,
``confirmation``). The modules: search (the walk), budget (the seconds it may spend and
what each trial is expected to cost), batch (the batch-size dimension), guard
(the loss-curve guard), outcome (each candidate's rounds and verdict), projection (the full
run's device-hours)."""

from tuneup.autotune.speed.budget import Budget
from tuneup.autotune.speed.search import Search

__all__ = ["Budget", "Search"]
