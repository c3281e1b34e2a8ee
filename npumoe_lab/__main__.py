import sys

from npumoe_lab.cli import main

sys.exit(main())
