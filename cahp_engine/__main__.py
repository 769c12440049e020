import sys

from cahp_engine.cli import main

sys.exit(main())
