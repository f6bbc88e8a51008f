"""Entry point of the packaged app (PyInstaller). ``freeze_support`` first: the engine and embedding processes
are started with multiprocessing's "spawn", which re-runs this executable as the child."""

import multiprocessing
import sys

if __name__ == "__main__":
    multiprocessing.freeze_support()
    from app.cli import main

    sys.exit(main(sys.argv[1:]))
