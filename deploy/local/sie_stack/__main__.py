import sys

from sie_stack.cli import main

sys.exit(main())
