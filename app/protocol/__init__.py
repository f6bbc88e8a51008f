"""The values every layer shares: requests, events, settings, tool and reasoning values, and the backend
contract (``backend.Backend``). Frozen, picklable, checked on construction; imports nothing of Hearth but
``app.errors``."""
