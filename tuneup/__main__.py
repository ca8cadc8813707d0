"""``python -m tuneup``: the same as the ``tuneup`` command."""

from tuneup.cli import main

if __name__ == "__main__":
    main()
