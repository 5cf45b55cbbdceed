import sys

from sie_config.cli import main

sys.exit(main())
