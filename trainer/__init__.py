"""The core of tuneup: the plugin contract and the training loop.

=====================  =================================================================
module                 what it holds
=====================  =================================================================
hookspecs              every hook a plugin can implement, drawn on the training loop
plugin_selection       which plugins a run has (by config name, through entry points)
plugin_manager         how they are loaded and called, and how their failures are named
runner                 one run from a composed config: check -> build -> fit -> report
build                  what a run trains with: the model, its LightningModule, the Trainer
run_report             what a run says: its line at the start, its report and summary.json
components             what is trained: the zoo's models and data by name, or the user's
                       by ``_target_``; the run's :class:`~components.Plan`
component_checks       whether the plan's model, data and task are sound, and pair
targets                the user's own model and data by ``_target_``: located, imported
batches                what a batch looks like: first tensor, kind, meta copy
pairing                whether the model reads the data and the task scores its output
task                   how a model's output becomes a loss and a metric
module                 the LightningModule that trains an ``nn.Module`` (a user's own
                       ``LightningModule`` trains as it is)
datamodule             how every data set gets its DataLoaders (plugins, resumable order)
bridge                 the one Lightning callback that forwards loop events to the hooks
checks, validation     the core's config checks, and the rules plugins check with
unread_keys            keys nothing reads (a typo added with ``+``), refused with the key meant
environment            the machine the run will use
optim                  the optimizers and LR schedules the core builds
flops, summary         model FLOPs and MFU; the run summary (table, summary.json)
state/                 run-state mechanics: checkpoint files, resume, data order, RNG,
                       preemption, divergence
=====================  =================================================================

Nothing here imports ``tuneup.plugins``: the plugin manager finds built-in and installed
plugins alike through the ``tuneup`` entry-point group.
"""
