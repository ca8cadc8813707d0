"""Run-state mechanics: what makes a run survive kills, preemption and bad files.

- :mod:`.checkpoint_io`: checkpoint files: atomic writes, safe loading, names, pruning
- :mod:`.resume`: what ``resume=`` means and whether a run can continue exactly
- :mod:`.data_order`: the seeded, sharded training order that resumes mid-epoch
- :mod:`.rng`: every rank's random states, captured and restored
- :mod:`.preemption`: SIGTERM/SIGUSR1 -> save -> exit code 75
- :mod:`.divergence`: a NaN/inf loss stops the run without a device sync per step
"""
