"""``python -m attnlab.train_draft [overrides]`` — see attnlab/train_draft/__init__.py and docs/eagle.md."""

import sys

from attnlab.train_draft.cli import main

if __name__ == "__main__":
    sys.exit(main())
