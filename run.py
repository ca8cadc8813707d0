"""Train with tuneup from a checkout: ``python run.py [group=option ...] [key=value ...]``.

The same entry point as the installed ``tuneup`` command (tuneup/cli.py); see conf/config.yaml.
"""

from tuneup.cli import console

if __name__ == "__main__":
    console()
