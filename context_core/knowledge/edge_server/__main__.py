"""``python -m context_core.knowledge.edge_server``: see :func:`.process.main`."""

import sys

from context_core.knowledge.edge_server.process import main

if __name__ == "__main__":  # pragma: no cover - exercised through start_edge_server
    sys.exit(main())
