"""The built-in models and data sets, by the names in ``conf/model`` and ``conf/data``.

They are for demos, tests and benchmarks; a user's own model or data comes in by
``model._target_`` / ``data._target_`` (tuneup.trainer.components) and gets every
optimization plugin the same way.
"""
