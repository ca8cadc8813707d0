"""tuneup's Hydra sweeper (``hydra/sweeper=autotune``): Hydra instantiates sweepers only from
the ``hydra_plugins`` namespace package; the search itself is tuneup.autotune."""
