"""`python -m desktop_app` (and `longlens gui`, which runs this module by name)."""

import sys

from desktop_app.app import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
