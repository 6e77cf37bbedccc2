"""Failed tests' pictures, drawn in a thread of their own.

matplotlib (its import in the first failing test, then a figure per failed split) was most
of the 1.7 s that the reports of 10 failing cases took in a 15-case session of 11.8 s
(docs/performance.md), on the items' path, with no launch running meanwhile. The failure text
names the picture's path at once; the drawing runs beside the next tests' launches (processes
of their own, waited for without the GIL), and the session waits for the last picture before
it ends, so every path a failure named exists once pytest has finished.
"""

from __future__ import annotations

import queue
import threading
from typing import Optional

from .plot import Picture, draw


class Drawer:
    """One thread, started at the first picture, drawing them in order."""

    def __init__(self) -> None:
        self._pictures: queue.Queue[Optional[Picture]] = queue.Queue()
        self._thread: Optional[threading.Thread] = None
        self.failed: list[str] = []
        """`path: error` of each picture that could not be drawn."""

    def later(self, picture: Picture) -> str:
        """Queue `picture`; its path, where it will be once `finish` has returned."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="resume-equiv-plots")
            self._thread.daemon = True  # Ctrl-C: pytest's exit does not wait for a picture
            self._thread.start()
        self._pictures.put(picture)
        return picture.path

    def finish(self) -> None:
        """Wait until every queued picture is drawn (the thread then ends)."""
        if self._thread is not None:
            self._pictures.put(None)
            self._thread.join()
            self._thread = None

    def _run(self) -> None:
        while True:
            picture = self._pictures.get()
            if picture is None:
                return
            try:
                draw(picture)
            except Exception as exc:  # noqa: BLE001 - a picture never fails a session
                self.failed.append(f"{picture.path}: {type(exc).__name__}: {exc}")
