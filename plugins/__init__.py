"""tuneup's built-in plugins, one module each, named by the config node that switches it on.

``conf/<group>/<choice>.yaml`` holds ``plugin: <name>``; ``plugins/<name>.py``
defines ``class Plugin`` with its ``@hookimpl`` methods. See docs/plugins.md.
"""
