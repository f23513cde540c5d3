"""``python -m attnlab [overrides]`` — see attnlab/cli.py and docs/usage.md."""

import sys

from attnlab.cli import main

if __name__ == "__main__":
    sys.exit(main())
