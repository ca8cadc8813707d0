"""``python -m tuneup``: the same as the ``tuneup`` command."""

from tuneup.cli import console

if __name__ == "__main__":
    console()
