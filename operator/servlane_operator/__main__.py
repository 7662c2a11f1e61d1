import sys

from servlane_operator.main import main

sys.exit(main())
