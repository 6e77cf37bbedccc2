"""Failed tests' pictures, drawn by a process of their own.

matplotlib (its import in the first failing test, then a figure per failed split) was most
of the 1.46 s that the reports of 10 failing cases took in a 15-case session of 10.3 s
(docs/performance.md), on the items' path, with no launch running meanwhile. Drawn in a
thread of pytest's process instead, it took the GIL from the waits on launches: 0.4 s more
between items. So the failure text names the picture's path at once; once the test is over
and its run directories stay (a test that expected the failure passes, and its directories
go), a drawing process (`picture.py`, started at the first picture, dying with pytest) draws
it beside the next tests' launches, and the session waits for it before it ends: every path
a failed test named exists once pytest has finished.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
from typing import IO, Optional

from ..launch.forked import die_with_pytest
from ..launch.waiting import wait_exits
from .picture import END, Picture, draw

DRAWER = "pytest_resume_equiv.report.picture"
FINISH_WAIT = 300.0
"""Seconds the end of the session waits for the pictures still to draw."""


class Drawer:
    """The session's drawing process, started at the first picture."""

    def __init__(self) -> None:
        self._proc: Optional[subprocess.Popen] = None
        self._said: Optional[IO[bytes]] = None
        self.failed: list[str] = []
        """`path: error` of each picture that could not be drawn."""

    def later(self, picture: Picture) -> Optional[str]:
        """Hand `picture` to the drawing process; its path, where it will be once `finish`
        has returned. Without a process (it could not start, or it died) it is drawn now."""
        picture = Picture(
            os.path.abspath(picture.path), picture.panels, picture.xlabel, picture.panel_height
        )
        try:
            proc = self._process()
            assert proc.stdin is not None
            proc.stdin.write(picture.to_json().encode() + b"\n")
            proc.stdin.flush()
        except OSError:
            return draw(picture)
        return picture.path

    def _process(self) -> subprocess.Popen:
        """The drawing process: a session of its own (Ctrl-C is pytest's, which then still
        waits for the pictures it named), what it cannot draw said in a file (a pipe nobody
        reads until the end could fill and stop it)."""
        if self._proc is None:
            self._said = tempfile.TemporaryFile()
            self._proc = subprocess.Popen(
                [sys.executable, "-m", DRAWER],
                stdin=subprocess.PIPE,
                stdout=self._said,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
                preexec_fn=die_with_pytest,
            )
        return self._proc

    def finish(self) -> None:
        """Wait until every picture handed over is drawn; the process then leaves."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        with contextlib.suppress(OSError):
            if proc.stdin is not None:
                proc.stdin.write(END.encode())
                proc.stdin.close()
        if not wait_exits([proc], FINISH_WAIT):
            proc.kill()
            self.failed.append(f"the drawing process did not finish in {FINISH_WAIT:.0f}s")
        proc.wait()
        if self._said is not None:
            self._said.seek(0)
            said = self._said.read().decode(errors="replace").splitlines()
            self._said.close()
            self._said = None
            self.failed.extend(line for line in said if line.strip())
        if proc.returncode not in (0, None) and not self.failed:
            self.failed.append(f"the drawing process ended with exit status {proc.returncode}")
