import sys

from sie_gateway.cli import main

sys.exit(main())
