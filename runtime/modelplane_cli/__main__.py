"""`python -m modelplane_cli …` is the `modelplane` command."""

import sys

from modelplane_cli.main import main

sys.exit(main())
