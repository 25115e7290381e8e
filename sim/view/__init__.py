"""The web view of a run: `npcsim view` and `npcsim run --view` (docs/operations.md).

    view = LiveView()
    async with open_view_server(build_app(view.source()), "127.0.0.1", 8080) as url:
        await view.follow("mqtt://127.0.0.1:1883", "village-7")   # until cancelled

`RunModel` is the sans-I/O state the page reads; `LiveFeed` fills it from MQTT,
`StoredRun` from a finished run's store; `StoreComparison` sets two stores' working
memories side by side. `sim.view.access` decides who may use the view:
Host, login, and the Origin, JSON and page token of whatever changes state.
"""

from sim.view.access import ENV_PASSWORD, TOKEN_HEADER
from sim.view.compare import StoreComparison
from sim.view.live import LiveFeed, LiveView
from sim.view.model import DialogueLine, RunModel
from sim.view.server import DEFAULT_PLAYER, ViewSource, build_app, open_view_server
from sim.view.stored import StoredRun
from sim.view.thread import ViewThread, open_view_thread

__all__ = [
    "DEFAULT_PLAYER",
    "ENV_PASSWORD",
    "TOKEN_HEADER",
    "DialogueLine",
    "LiveFeed",
    "LiveView",
    "RunModel",
    "StoreComparison",
    "StoredRun",
    "ViewSource",
    "ViewThread",
    "build_app",
    "open_view_server",
    "open_view_thread",
]
