"""``[web] listen``: the live page (``ops/livepage.py``) plugged into the daemon. Built by the
wiring only when configured. The page reads what the control socket's ``status`` answers (the
status cache, from the listener's threads: the main loop is never asked) and the ledger,
read-only; it never acts. A page that cannot start (a taken port) or fails later is said and the
run goes on without it: a monitor failing never stops the supervision."""

from __future__ import annotations

from typing import TYPE_CHECKING

import structlog

from ..eventnames import EventName
from ..levels import Level
from .effects import Note
from .plugin import Closes, DaemonStarted, Effects, OnStart, RunView

if TYPE_CHECKING:
    from ..ops.livedata import LiveData
    from ..ops.livepage import LivePage

log = structlog.get_logger("supervisor.daemon")


class LivePagePlugin(OnStart, Closes):
    name = "web"

    def __init__(self) -> None:
        self.page: LivePage | None = None
        self.data: LiveData | None = None

    def started(self, n: DaemonStarted, run: RunView) -> Effects:
        listen = run.cfg.web.listen
        if not listen:
            return ()
        try:
            from ..ops.config import is_loopback_listen
            from ..ops.livedata import LiveData
            from ..ops.livepage import LivePage

            self.data = LiveData(n.status, run.state_dir)
            self.page = LivePage(listen, self.data.payload, loopback=is_loopback_listen(listen))
            host, port = self.page.start()
        except Exception as e:  # a taken port, a missing page file: the run is supervised without the page
            self.page = None
            return [Note(EventName.WEB_UNAVAILABLE, Level.ERROR, f"cannot serve the live page on {listen}: {e}; "
                         "supervising without it", {"listen": listen, "error": repr(e)})]
        shown = f"[{host}]" if ":" in host else host
        return [Note(EventName.WEB_LISTENING, Level.INFO, f"the live page is at http://{shown}:{port}/ (read-only)",
                     {"listen": listen, "port": port})]

    def close(self) -> None:
        for part in (self.page, self.data):
            if part is not None:
                try:
                    part.close()
                except Exception as e:  # the exit goes on
                    log.warning("part_close_failed", part=type(part).__name__, error=repr(e))
