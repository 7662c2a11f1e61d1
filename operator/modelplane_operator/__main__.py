import sys

from modelplane_operator.main import main

sys.exit(main())
