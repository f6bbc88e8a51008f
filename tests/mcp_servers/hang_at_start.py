"""An MCP server that never answers ``initialize`` (it never reads stdin), as a stuck one does. With
``--ignore-sigterm`` it also ignores SIGTERM, so only the client's SIGKILL ends it."""

import signal
import sys
import time

if "--ignore-sigterm" in sys.argv:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
while True:
    time.sleep(60)
