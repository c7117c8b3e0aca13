"""The cell's event log in MLPerf's format (`:::MLLOG {...}` lines), written with the
`mlperf-logging` package so that MLPerf's own tools read it.

Rank 0 alone writes it, to `<cell dir>/mllog.txt`: `init_start`, the run's facts (benchmark,
platform, global batch size, epochs, optimizer), `init_stop`; then per repeat `seed`,
`run_start`, `epoch_start`/`epoch_stop` (metadata `epoch_num`, counted from 1, and `repeat`)
and `run_stop` (metadata `status`: `success`, or `aborted` when the cell failed). MLPerf keeps
one run per log; a cell with `run.repeats > 1` writes its repeats one after another in the same
file, each between its own `run_start` and `run_stop`.

The events are written outside the timed epochs, so the log costs the measurement nothing.
A disk that fills up or turns read-only mid-cell does not end the measurement: the lines are
also kept in memory (`text()`), and the cell's record carries them wherever it can still go.
"""

from __future__ import annotations

import logging
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from mlperf_logging.mllog import constants
from mlperf_logging.mllog.mllog import MLLogger

from harness.environment import PROJECT_ROOT

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from harness.config import DistbenchConfig

MLLOG_FILE = "mllog.txt"


class EventLog:
    """One cell's MLLOG file; every method is a no-op on a worker that does not write it.

    Used as a context manager: leaving it by an exception ends the open run (or the cell's
    initialisation) with `run_stop` status `aborted`, then closes the file.
    """

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._repeat: int | None = None  # the repeat whose run is open
        self._stopped = False
        self._handler: logging.Handler | None = None
        self._logger: MLLogger | None = None
        self._lines: list[str] = []
        if path is not None:
            # A private logger (not registered with `logging`), so that cells run one after
            # another in one process never write into each other's files.
            sink = logging.Logger(f"distbench.mllog.{path}", level=logging.INFO)
            sink.addHandler(_LineKeeper(self._lines))
            self._handler = _open_file_handler(path)
            if self._handler is not None:
                sink.addHandler(self._handler)
            self._logger = MLLogger(logger=sink, root_dir=str(PROJECT_ROOT))

    @classmethod
    def for_worker(cls, output_dir: Path, is_main: bool) -> EventLog:
        """The cell's log on rank 0, a silent stand-in on every other worker."""
        return cls(Path(output_dir) / MLLOG_FILE if is_main else None)

    def __enter__(self) -> EventLog:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        if error is not None and not self._stopped:
            self.run_stop(self._repeat, success=False)
        self.close()

    def init_start(self) -> None:
        self._log("start", constants.INIT_START)

    def init_stop(self, config: DistbenchConfig) -> None:
        """The run's facts, then the end of initialisation (building, planning, warm-up)."""
        facts: dict[str, Any] = {
            constants.SUBMISSION_BENCHMARK: f"{config.network.name.value}_"
                                            f"{config.dataset.name.value}",
            constants.SUBMISSION_PLATFORM: config.hardware.name,
            "distribution": config.distribution.name.value,
            "world_size": config.world_size,
            constants.GLOBAL_BATCH_SIZE: config.global_batch_size,
            constants.EPOCH_COUNT: config.run.epochs,
            constants.OPT_NAME: config.optimizer.name.value,
            constants.OPT_BASE_LR: config.optimizer.lr,
        }
        for key, value in facts.items():
            self._log("event", key, value)
        self._log("end", constants.INIT_STOP)

    def run_start(self, repeat: int, seed: int) -> None:
        self._stopped = False
        self._repeat = repeat
        self._log("event", constants.SEED, seed, repeat=repeat)
        self._log("start", constants.RUN_START, repeat=repeat)

    def epoch_start(self, repeat: int, epoch: int) -> None:
        self._log("start", constants.EPOCH_START, repeat=repeat, epoch_num=epoch + 1)

    def epoch_stop(self, repeat: int, epoch: int) -> None:
        self._log("end", constants.EPOCH_STOP, repeat=repeat, epoch_num=epoch + 1)

    def run_stop(self, repeat: int | None, *, success: bool) -> None:
        status = constants.SUCCESS if success else constants.ABORTED
        self._log("end", constants.RUN_STOP, repeat=repeat, status=status)
        self._stopped = True

    def text(self) -> str:
        """Every line logged so far, whether or not the file could take it."""
        return "".join(f"{line}\n" for line in self._lines)

    def close(self) -> None:
        if self._handler is not None:
            self._handler.close()
            self._handler = None
            self._logger = None

    def _log(self, kind: str, key: str, value: Any = None, **metadata: Any) -> None:
        if self._logger is None:
            return
        # stack_offset 3: the call site in the metadata is the code that called this class
        # (e.g. harness/run.py), not this wrapper.
        getattr(self._logger, kind)(key=key, value=value, metadata=metadata or None,
                                    stack_offset=3)


class _LineKeeper(logging.Handler):
    """Keeps every formatted line in a list (the copy that survives a full disk)."""

    def __init__(self, lines: list[str]) -> None:
        super().__init__()
        self.lines = lines

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


class _TolerantFileHandler(logging.FileHandler):
    """A FileHandler that, when the disk refuses a write, warns once instead of printing a
    traceback per line (logging's default); the lines are kept by _LineKeeper."""

    _warned = False

    def handleError(self, record: logging.LogRecord) -> None:  # noqa: N802 - logging's name
        if not self._warned:
            self._warned = True
            log.warning("could not write the event log %s; it is kept in memory and recorded "
                        "with the cell", self.baseFilename)


def _open_file_handler(path: Path) -> logging.Handler | None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handler = _TolerantFileHandler(path, mode="w", encoding="utf-8")
    except OSError as err:
        log.warning("could not open the event log %s (%s); it is kept in memory and recorded "
                    "with the cell", path, err)
        return None
    handler.setFormatter(logging.Formatter("%(message)s"))
    return handler
