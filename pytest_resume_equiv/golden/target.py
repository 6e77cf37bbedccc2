"""What one resume test asks of the golden store: its golden for this environment, whether
this run writes it (`--resume-equiv-update-golden`) or only resumes its checkpoints
(`--resume-equiv-golden-only`). The checks reach the store through it alone."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional

from ..errors import ResumeEquivError
from .environment import Environment
from .meta import GoldenError, GoldenMeta, git_commit, now
from .store import Golden, GoldenStore


@dataclass(frozen=True)
class GoldenTarget:
    store: GoldenStore
    test: str
    """The test's node id."""
    environment: Environment
    update: bool = False
    only: bool = False
    session: str = ""

    @property
    def key(self) -> str:
        return self.environment.key

    @property
    def path(self) -> str:
        return self.store.path(self.test, self.key)

    def load(self) -> Optional[Golden]:
        """This test's golden for this environment (None: there is none); an unusable one is
        a ResumeEquivError naming the file."""
        try:
            return self.store.load(self.test, self.key)
        except GoldenError as exc:
            raise ResumeEquivError(f"the golden store: {exc}") from None

    def missing(self) -> str:
        return self.store.missing_text(self.test, self.key)

    def write(
        self, run_dir: str, world_size: int, steps: int, checkpoints: dict[int, str]
    ) -> Optional[Golden]:
        """Store `run_dir`'s signatures (and `checkpoints`, split -> path) as the golden;
        None when another worker of this session already did."""
        os.makedirs(self.store.root, exist_ok=True)
        meta = GoldenMeta(
            self.test,
            self.environment,
            world_size,
            steps,
            written=now(),
            commit=git_commit(self.store.root),
            session=self.session,
        )
        try:
            return self.store.write(meta, run_dir, checkpoints)
        except (GoldenError, OSError) as exc:
            raise ResumeEquivError(f"the golden store: cannot write {self.path}: {exc}") from None
