"""When ``on_error: skip`` gives up, and how skips are reported while it does not.

Every skip counter (``guards.policy.skip_counter``) is a :class:`SkipTally`: the shared table of skips by
reason (``telemetry.SharedCounter``) plus, in each process (every ``DataLoader`` worker has its
own copy), the outcome of the last :data:`SKIP_WINDOW` samples it read. A sample is *read* when it
was encoded (``passed``: the task encoder's phase 1, or a Megatron-LM row) and *skipped* when it
was dropped (``skip``/``add``). Two limits stop a run that only skips:

- ``max_consecutive_skips`` (default 100, Energon's own default tolerance): that many skips in a
  row in one worker, with no sample read in between;
- ``max_skip_fraction`` (default 0.5): more than that fraction of the last ``SKIP_WINDOW`` samples
  of one worker skipped, checked once it has read ``SKIP_MIN_SEEN`` samples.

``None`` disables a limit. Hitting one raises :class:`~energon_nemotron.errors.SkipLimitError`
(a ``ConfigError``: never skipped itself) naming the limit, the window and the skip counts by
reason. A sample that was read and then fails at decode time (after packing) turns its own *read*
into a *skip* (``after_read``), so a dataset whose every media item fails only when decoded stops
too. Skips are otherwise quiet: one warning line (logger ``energon_nemotron``) at the first skip of
a process, then at most one every ``WARN_EVERY_S`` seconds; Energon's own per-error prints are
dropped (``_energon.quiet_error_prints``).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import Any, Optional, Sequence

import torch.utils.data

from energon_nemotron.errors import SkipLimitError
from energon_nemotron.telemetry import SharedCounter

log = logging.getLogger("energon_nemotron")

#: the defaults of ``loader.max_skip_fraction`` / ``loader.max_consecutive_skips``
DEFAULT_MAX_SKIP_FRACTION = 0.5
DEFAULT_MAX_CONSECUTIVE_SKIPS = 100
#: samples per worker over which the skip fraction is taken, and how many before it is checked
SKIP_WINDOW = 1000
SKIP_MIN_SEEN = 200
WARN_EVERY_S = 60.0


def _worker() -> str:
    info = torch.utils.data.get_worker_info()
    return "" if info is None else f" in DataLoader worker {info.id}"


class SkipTally(SharedCounter):
    """Skips by reason shared across workers (``SharedCounter``), with this process's window of
    outcomes and the two limits (see the module docstring)."""

    def __init__(self, names: Sequence[str], num_workers: int = 0,
                 max_skip_fraction: Optional[float] = DEFAULT_MAX_SKIP_FRACTION,
                 max_consecutive_skips: Optional[int] = DEFAULT_MAX_CONSECUTIVE_SKIPS) -> None:
        super().__init__(names, num_workers)
        self.set_limits(max_skip_fraction, max_consecutive_skips)
        self.window: deque = deque(maxlen=SKIP_WINDOW)      # True: skipped, False: read
        self.skipped_in_window = 0
        self.consecutive = 0
        self._next_warning = float("-inf")

    def set_limits(self, max_skip_fraction: Optional[float], max_consecutive_skips: Optional[int]) -> None:
        self.max_skip_fraction = max_skip_fraction
        self.max_consecutive_skips = max_consecutive_skips

    def add(self, name: str, n: int = 1) -> None:
        """``SharedCounter.add``: ``n`` samples skipped for reason ``name``."""
        for _ in range(n):
            self.skip(name)

    def passed(self) -> None:
        """One sample read and encoded."""
        self._push(False)
        self.consecutive = 0

    def skip(self, name: str, example: Optional[str] = None, after_read: bool = False) -> None:
        """One sample skipped for reason ``name`` (``example``: where and why, for the messages);
        ``after_read``: it had been counted as read (it failed at decode time, after packing).
        Raises ``SkipLimitError`` when a limit is hit."""
        super().add(name)
        if after_read and not self._revoke_read():
            after_read = False
        if not after_read:
            self._push(True)
        self.consecutive += 1
        self._check(example)
        now = time.monotonic()
        if now >= self._next_warning:
            self._next_warning = now + WARN_EVERY_S
            last = f"; last: {example}" if example else ""
            log.warning("on_error: skip dropped samples%s; skipped so far: %s%s (counted in Loader.skipped(); "
                        "this line repeats at most every %.0f s)", _worker(), self.summary(), last, WARN_EVERY_S)

    def summary(self) -> str:
        """``reason count, ...`` over all workers, largest first."""
        totals = sorted(self.totals().items(), key=lambda kv: (-kv[1], kv[0]))
        return ", ".join(f"{k} {v}" for k, v in totals) or "none"

    def _push(self, skipped: bool) -> None:
        if len(self.window) == self.window.maxlen and self.window[0]:
            self.skipped_in_window -= 1
        self.window.append(skipped)
        self.skipped_in_window += skipped

    def _revoke_read(self) -> bool:
        """Turn the latest *read* in the window into a skip; False when there is none."""
        for i in range(len(self.window) - 1, -1, -1):
            if not self.window[i]:
                self.window[i] = True
                self.skipped_in_window += 1
                return True
        return False

    def _check(self, example: Optional[str]) -> None:
        last = f"; last skipped: {example}" if example else ""
        limit = self.max_consecutive_skips
        if limit is not None and self.consecutive >= limit:
            raise SkipLimitError(
                f"stopping: {self.consecutive} consecutive samples were skipped{_worker()} "
                f"(loader.max_consecutive_skips={limit}); skipped so far: {self.summary()}{last}; "
                "fix the data, or raise the limit (null disables it)")
        fraction, seen = self.max_skip_fraction, len(self.window)
        if fraction is not None and seen >= SKIP_MIN_SEEN and self.skipped_in_window > fraction * seen:
            raise SkipLimitError(
                f"stopping: {self.skipped_in_window} of the last {seen} samples read{_worker()} were skipped, "
                f"more than loader.max_skip_fraction={fraction} (a window of the last {SKIP_WINDOW} samples "
                f"of a worker, checked from {SKIP_MIN_SEEN} on); skipped so far: {self.summary()}{last}; "
                "fix the data, or raise the limit (null disables it)")


def apply_limits(counts: Any, settings: Any) -> None:
    """Set ``settings.max_skip_fraction`` / ``max_consecutive_skips`` (``LoaderSettings``) on a
    skip counter (nothing for a counter without limits)."""
    if isinstance(counts, SkipTally):
        counts.set_limits(settings.max_skip_fraction, settings.max_consecutive_skips)


def record_pass(counts: Any) -> None:
    """One sample read, on any skip counter (a plain ``SharedCounter`` keeps no window)."""
    if isinstance(counts, SkipTally):
        counts.passed()


def record_skip(counts: Any, code: str, example: Optional[str] = None, after_read: bool = False) -> None:
    """One skip of reason ``code`` on any skip counter (see :meth:`SkipTally.skip`)."""
    if isinstance(counts, SkipTally):
        counts.skip(code, example, after_read)
    else:
        counts.add(code)
