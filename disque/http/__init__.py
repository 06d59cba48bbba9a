"""The node's HTTP side: Prometheus /metrics, a JSON API and a web dashboard.

Off by default; `http-port` turns it on (`http-password`, else `requirepass`, protects it with
HTTP basic auth). It runs on the node's own event loop (aiohttp), bound to the node's `bind`
addresses, and reaches the node only through `NodeView` (disque.http.view): reads at request
time, actions through the node's own command code. Nothing here runs on the RESP hot path;
the limits in disque.http.app keep a slow or flooding HTTP client from holding the loop.

    metrics.py  the Prometheus collector (prometheus_client), names in docs/metrics.md
    app.py      routes, password, limits, the listener (started / moved / stopped)
    view.py     the one door to the node
    static/     the single-page dashboard (no CDN, no external fonts)
"""

from disque.http.app import HttpSide
from disque.http.view import NodeView

__all__ = ["HttpSide", "NodeView"]
