"""Run-state mechanics: what makes a run survive kills, preemption and bad files.

- :mod:`.checkpoint_write`: a checkpoint file written atomically, with its checksum sealed in
- :mod:`.checkpoint_file`: a checkpoint file read safely (weights only), checksum verified
- :mod:`.checkpoint_read`: a checkpoint read, a file or a sharded directory (:mod:`.sharded`)
- :mod:`.checkpoints`: a directory of them: names; the newest (by training progress, never file
  time); pruning; damaged files set aside
- :mod:`.checkpoint_io`: the above behind Lightning's CheckpointIO
- :mod:`.async_save`: ``checkpoint.async=true``: the state copied, written in the background,
  one save at a time
- :mod:`.checkpoint_space`: a checkpoint's size; the warning when the next will not fit
- :mod:`.hf_export`: the model as a Hugging Face directory (``checkpoint.export=hf``,
  ``tuneup-consolidate --format hf``)
- :mod:`.progress`: how far a checkpoint had got; epoch-end checkpoints made resumable by
  Lightning; a resumed run that ends short of its limits says why
- :mod:`.resume`: what ``resume=`` (and ``resume_weights_only``) means
- :mod:`.saved_overrides`: a resumed run takes the overrides its run recorded (the command
  line's on top)
- :mod:`.changes`: settings changed since a checkpoint: listed, applied, or refused
- :mod:`.run_state`: the callback that puts all of the above into checkpoints and back
- :mod:`.data_order`: the seeded, sharded training order that resumes mid-epoch
- :mod:`.rng`: every rank's random states, captured and restored
- :mod:`.preemption`: SIGTERM/SIGUSR1 -> save -> exit code 75
- :mod:`.divergence`: a NaN/inf loss stops the run without a device sync per step
"""
