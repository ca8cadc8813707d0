"""The answer on disk: autotune.json, autotune.md, autotune.png and the recipe preset, for
either objective."""
