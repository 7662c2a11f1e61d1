"""`python -m servlane_cli …` is the `servlane` command."""

import sys

from servlane_cli.main import main

sys.exit(main())
