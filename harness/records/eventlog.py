"""The cell's event log in MLPerf's format (`:::MLLOG {...}` lines), written with the
`mlperf-logging` package so that MLPerf's own tools read it.

Rank 0 alone writes it. MLPerf keeps one run per log, so a cell writes one file per repeat:
repeat 1 `<cell dir>/mllog.txt`, repeat k > 1 `<cell dir>/mllog-<k>.txt` (`log_file_name`).
Each file is a whole MLPerf run that MLPerf's tools read alone:

- the initialisation, shared by the repeats (the cell builds, plans and warms up once): an
  `init_start`, the run's facts, `init_stop`. A repeat's file repeats these lines verbatim,
  timestamps included: they say when that shared initialisation happened.
- the facts MLPerf's training rules (ruleset 6.1.0) require, each with the cell's true value
  (`RunFacts`, `Parallelism`): submission_org (`run.submission_org`), submission_division
  `open` (distbench's networks and data are not MLPerf's closed reference), submission_status
  `research` (not an available-system submission; distbench cannot tell on-premises from cloud
  hardware), submission_platform (`hardware.name`), submission_benchmark (`benchmark_name`),
  cache_clear `false` (distbench does not drop the page cache before a run), train_samples,
  eval_samples (0 with `run.eval=false`), lowest_numerical_precision_in_linear/attn/comm (the
  precision the layers compute in: the parameters' dtype, or bfloat16 under mixed precision
  (`Trainer.compute_dtype`); one precision for all three keys), tensor_parallelism (a device
  mesh's tp, else 1), context/expert_parallelism 1, pipeline_parallelism and micro_batch_size
  (`Parallelism`),
  config_filename (the cell's recorded config.yaml); besides MLPerf's: global_batch_size,
  epoch_count, opt_name, opt_base_learning_rate and distbench's distribution, world_size,
  data_parallelism.
- the run: `seed`, `run_start`; per epoch (numbered from 1 in the log) a `block_start`
  (first_epoch_num, epoch_count 1), `epoch_start`, `epoch_stop`, `block_stop`, then, outside the
  block's time, `eval_start`, `eval_accuracy` (0..1), `eval_loss`, `eval_stop`; `run_stop`
  (status `success`: the target was reached, or there is none; `aborted`: missed, or the cell
  failed). Every event carries `repeat` (from 0) and, where MLPerf uses it, `samples_count`:
  training samples seen so far in the run.

A cell with `run.eval=false` logs no evaluation, and MLPerf's checker then rejects its log:
`eval_accuracy` is required at least once, and distbench does not invent one.

The events are written outside the timed epochs, so the log costs the measurement nothing.
A disk that fills up or turns read-only mid-cell does not end the measurement: every file's
lines are also kept in memory (`text()`), and the cell's record carries them wherever it can
still go.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from mlperf_logging.mllog import constants
from mlperf_logging.mllog.mllog import MLLogger

from harness.runtime.environment import PROJECT_ROOT

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from harness.config.schema import DistbenchConfig

MLLOG_FILE = "mllog.txt"
DIVISION = constants.OPEN
# Not an available-system submission: distbench benchmarks whatever it runs on.
SUBMISSION_STATUS = constants.RESEARCH
# MLPerf's names of torch's floating-point types (lowest_numerical_precision_*).
PRECISIONS = {"float64": "fp64", "float32": "fp32", "float16": "fp16", "bfloat16": "bfloat16"}


def log_file_name(repeat: int) -> str:
    """The log of repeat `repeat` (from 0): mllog.txt, then mllog-2.txt, mllog-3.txt, ..."""
    return MLLOG_FILE if repeat == 0 else f"mllog-{repeat + 1}.txt"


def precision_name(dtype: Any) -> str:
    """MLPerf's name of a torch dtype (torch.float32 -> 'fp32'); ValueError if MLPerf has none."""
    name = str(dtype).removeprefix("torch.")
    if name not in PRECISIONS:
        raise ValueError(f"no MLPerf precision name for {dtype}; known: {', '.join(PRECISIONS)}")
    return PRECISIONS[name]


def benchmark_name(config: DistbenchConfig) -> str:
    """The cell's submission_benchmark: network_dataset, e.g. resnet18_cifar10, with
    `_synthetic` when the images are generated (dataset.source=synthetic): a quality reached on
    synthetic data says nothing about the real dataset. None of MLPerf's benchmark names fits
    (MLPerf Training 6.1 has no image classification), so the name is distbench's own."""
    name = f"{config.network.label}_{config.dataset.name.value}"
    return name if config.dataset.source.value == "real" else f"{name}_synthetic"


def _task_keys(config: DistbenchConfig) -> dict[str, Any]:
    """The keys MLPerf's language-model benchmarks log (the sequence length; AdamW's betas and
    weight decay), and the optimizer's weight decay for SGD; `eval_accuracy` stays the share
    of correct top-1 predictions (per token for a language model), and the log perplexity is
    recorded beside it in result.json and MLflow (eval_loss)."""
    optimizer = config.optimizer
    keys: dict[str, Any] = {}
    if config.dataset.spec.tokens:
        keys[constants.MAX_SEQUENCE_LENGTH] = config.dataset.spec.seq_len
    if optimizer.name.value == constants.ADAMW:
        keys.update(
            {
                constants.OPT_ADAMW_BETA_1: optimizer.momentum,
                constants.OPT_ADAMW_BETA_2: optimizer.beta2,
                constants.OPT_ADAMW_WEIGHT_DECAY: optimizer.weight_decay,
            }
        )
    else:
        keys[constants.OPT_WEIGHT_DECAY] = optimizer.weight_decay
    return keys


@dataclass(frozen=True)
class RunFacts:
    """What the cell learnt while initialising, for the log's facts."""

    train_samples: int  # the training split's images (an epoch, all workers together)
    eval_samples: int  # the evaluation split's images; 0 with run.eval=false
    # The plan the trainer resolved (Trainer.resolved_config): GPipe's balance and
    # micro_batches, PipeDream's stages ("2-1"); empty for the data-parallel models.
    resolved: dict[str, Any] = field(default_factory=dict)
    precision: str = "fp32"  # MLPerf's name (precision_name) of the trained parameters' dtype
    config_file: str = "config.yaml"  # the config the cell records, in its directory


@dataclass(frozen=True)
class Parallelism:
    """How the cell splits the training, in MLPerf's terms.

    - data: workers that train the same weights on different samples (not an MLPerf key;
      logged as distbench's `data_parallelism`): the worker count for DDP and Horovod, 1 for
      sequential and GPipe, PipeDream's replicas per stage (a list when the stages differ,
      e.g. [2, 1] for the plan "2-1").
    - pipeline: stages: GPipe's and PipeDream's stage count, else 1.
    - micro_batch_size: the samples one forward pass of one worker takes: the per-worker batch
      (data-parallel, sequential), GPipe's batch / micro_batches, PipeDream's minibatch (its
      batch: each minibatch is one micro-batch of the pipeline).
    """

    data: int | list[int]
    pipeline: int
    micro_batch_size: int
    tensor: int = 1  # workers each layer's weights are split over (a device mesh's tp)

    @classmethod
    def of(cls, config: DistbenchConfig, resolved: dict[str, Any]) -> Parallelism:
        data, pipeline = config.distribution.parallelism(config, resolved)
        return cls(
            data=data,
            pipeline=pipeline,
            micro_batch_size=config.distribution.step_batch(config),
            tensor=config.distribution.tensor_parallelism(config),
        )


class EventLog:
    """One cell's MLLOG files; every method is a no-op on a worker that does not write them.

    Used as a context manager: leaving it by an exception ends the open run (or the cell's
    initialisation) with `run_stop` status `aborted`, then closes the file.
    """

    def __init__(self, output_dir: Path | None) -> None:
        self.output_dir = output_dir
        self._repeat: int | None = None  # the repeat whose run is open
        self._stopped = False
        self._train_samples = 0
        self._texts: dict[str, list[str]] = {}  # every file's lines, by file name
        self._current = MLLOG_FILE  # the file being written
        self._init_lines: list[str] = []  # init_start .. init_stop, repeated in every file
        self._in_init = False
        self._file: logging.Handler | None = None
        self._sink: logging.Logger | None = None
        self._logger: MLLogger | None = None
        if output_dir is not None:
            # A private logger (not registered with `logging`), so that cells run one after
            # another in one process never write into each other's files.
            self._sink = logging.Logger(f"distbench.mllog.{output_dir}", level=logging.INFO)
            self._sink.addHandler(_LineKeeper(self._keep))
            self._logger = MLLogger(logger=self._sink, root_dir=str(PROJECT_ROOT))
            self._open(MLLOG_FILE)

    @classmethod
    def for_worker(cls, output_dir: Path, is_main: bool) -> EventLog:
        """The cell's log on rank 0, a silent stand-in on every other worker."""
        return cls(Path(output_dir) if is_main else None)

    @property
    def path(self) -> Path | None:
        """The first repeat's log (mllog.txt); None on a worker that writes none."""
        return None if self.output_dir is None else self.output_dir / MLLOG_FILE

    def __enter__(self) -> EventLog:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if error is not None and not self._stopped:
            self.run_stop(self._repeat, success=False)
        self.close()

    def init_start(self) -> None:
        self._in_init = True
        self._log("start", constants.INIT_START)

    def init_stop(self, config: DistbenchConfig, facts: RunFacts) -> None:
        """The run's facts (see the module docstring), then the end of initialisation
        (building, planning, warm-up)."""
        self._train_samples = facts.train_samples
        parallelism = Parallelism.of(config, facts.resolved)
        values: dict[str, Any] = {
            constants.SUBMISSION_ORG: config.run.submission_org,
            constants.SUBMISSION_DIVISION: DIVISION,
            constants.SUBMISSION_STATUS: SUBMISSION_STATUS,
            constants.SUBMISSION_PLATFORM: config.hardware.name,
            constants.SUBMISSION_BENCHMARK: benchmark_name(config),
            constants.CACHE_CLEAR: False,
            constants.TRAIN_SAMPLES: facts.train_samples,
            constants.EVAL_SAMPLES: facts.eval_samples,
            constants.LOWEST_NUMERICAL_PRECISION_IN_LINEAR: facts.precision,
            constants.LOWEST_NUMERICAL_PRECISION_IN_ATTN: facts.precision,
            constants.LOWEST_NUMERICAL_PRECISION_IN_COMM: facts.precision,
            constants.TENSOR_PARALLELISM: parallelism.tensor,
            constants.PIPELINE_PARALLELISM: parallelism.pipeline,
            constants.CONTEXT_PARALLELISM: 1,
            constants.EXPERT_PARALLELISM: 1,
            constants.MICRO_BATCH_SIZE: parallelism.micro_batch_size,
            constants.CONFIG_FILENAME: facts.config_file,
            constants.GLOBAL_BATCH_SIZE: config.global_batch_size,
            constants.EPOCH_COUNT: config.run.epochs,
            constants.OPT_NAME: config.optimizer.name.value,
            constants.OPT_BASE_LR: config.optimizer.lr,
            "distribution": config.distribution.name,
            "world_size": config.world_size,
            "data_parallelism": parallelism.data,
            **_task_keys(config),
        }
        for key, value in values.items():
            self._log("event", key, value)
        self._log("end", constants.INIT_STOP)
        self._in_init = False

    def run_start(self, repeat: int, seed: int) -> None:
        """Starts repeat `repeat`'s run; from the second repeat on, in its own file that
        begins with the initialisation's lines."""
        if repeat > 0 and self._sink is not None:  # a worker that writes no log opens none
            self._open(log_file_name(repeat))
            for line in self._init_lines:
                self._write(line)
        self._stopped = False
        self._repeat = repeat
        self._log("event", constants.SEED, seed, repeat=repeat)
        self._log("start", constants.RUN_START, repeat=repeat)

    def epoch_start(self, repeat: int, epoch: int) -> None:
        """Epoch `epoch` (from 0) of repeat `repeat` starts: its block, then the epoch."""
        seen = self._train_samples * epoch
        self._log(
            "start",
            constants.BLOCK_START,
            repeat=repeat,
            first_epoch_num=epoch + 1,
            epoch_count=1,
            samples_count=seen,
        )
        self._log(
            "start", constants.EPOCH_START, repeat=repeat, epoch_num=epoch + 1, samples_count=seen
        )

    def epoch_stop(self, repeat: int, epoch: int) -> None:
        seen = self._train_samples * (epoch + 1)
        self._log(
            "end", constants.EPOCH_STOP, repeat=repeat, epoch_num=epoch + 1, samples_count=seen
        )
        self._log(
            "end",
            constants.BLOCK_STOP,
            repeat=repeat,
            first_epoch_num=epoch + 1,
            samples_count=seen,
        )

    def eval_start(self, repeat: int, epoch: int) -> None:
        """The evaluation after epoch `epoch` (from 0) starts."""
        self._log(
            "start",
            constants.EVAL_START,
            repeat=repeat,
            epoch_num=epoch + 1,
            samples_count=self._train_samples * (epoch + 1),
        )

    def eval_stop(self, repeat: int, epoch: int, *, accuracy: float, loss: float) -> None:
        """The evaluation after epoch `epoch` ends: its accuracy (0..1) and mean loss."""
        seen = self._train_samples * (epoch + 1)
        self._log(
            "event",
            constants.EVAL_ACCURACY,
            accuracy,
            repeat=repeat,
            epoch_num=epoch + 1,
            samples_count=seen,
        )
        self._log(
            "event", "eval_loss", loss, repeat=repeat, epoch_num=epoch + 1, samples_count=seen
        )
        self._log(
            "end", constants.EVAL_STOP, repeat=repeat, epoch_num=epoch + 1, samples_count=seen
        )

    def run_stop(self, repeat: int | None, *, success: bool) -> None:
        """`success`: the run reached its target accuracy, or had none; else `aborted`."""
        status = constants.SUCCESS if success else constants.ABORTED
        self._log("end", constants.RUN_STOP, repeat=repeat, status=status)
        self._stopped = True

    def text(self) -> dict[str, str]:
        """Every file's lines logged so far, by file name (mllog.txt, mllog-2.txt, ...),
        whether or not the disk could take them."""
        return {name: "".join(f"{line}\n" for line in lines) for name, lines in self._texts.items()}

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        self._logger = None

    def _open(self, name: str) -> None:
        """Write the lines that follow to the file `name` in the cell's directory."""
        assert self._sink is not None and self.output_dir is not None
        if self._file is not None:
            self._sink.removeHandler(self._file)
            self._file.close()
        self._current = name
        self._texts[name] = []
        self._file = _open_file_handler(self.output_dir / name)
        if self._file is not None:
            self._sink.addHandler(self._file)

    def _keep(self, line: str) -> None:
        self._texts[self._current].append(line)
        if self._in_init:
            self._init_lines.append(line)

    def _write(self, line: str) -> None:
        """A line already formatted (the initialisation's, repeated), as it is."""
        assert self._sink is not None
        self._sink.info("%s", line)

    def _log(self, kind: str, key: str, value: Any = None, **metadata: Any) -> None:
        if self._logger is None:
            return
        # stack_offset 3: the call site in the metadata is the code that called this class
        # (e.g. harness/worker/run.py), not this wrapper.
        getattr(self._logger, kind)(key=key, value=value, metadata=metadata or None, stack_offset=3)


class _LineKeeper(logging.Handler):
    """Hands every formatted line to `keep` (the copy that survives a full disk)."""

    def __init__(self, keep: Any) -> None:
        super().__init__()
        self.keep = keep

    def emit(self, record: logging.LogRecord) -> None:
        self.keep(record.getMessage())


class _TolerantFileHandler(logging.FileHandler):
    """A FileHandler that, when the disk refuses a write, warns once instead of printing a
    traceback per line (logging's default); the lines are kept by _LineKeeper."""

    _warned = False

    def handleError(self, record: logging.LogRecord) -> None:  # noqa: N802 - logging's name
        if not self._warned:
            self._warned = True
            log.warning(
                "could not write the event log %s; it is kept in memory and recorded with the cell",
                self.baseFilename,
            )

    def close(self) -> None:
        """Close the file; the lines still buffered when the disk refuses them are dropped
        (the file is then incomplete, its lines kept in memory: closing must not end a
        measured cell as failed)."""
        try:
            super().close()
        except OSError:
            self.handleError(logging.makeLogRecord({}))


def _open_file_handler(path: Path) -> logging.Handler | None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handler = _TolerantFileHandler(path, mode="w", encoding="utf-8")
    except OSError as err:
        log.warning(
            "could not open the event log %s (%s); it is kept in memory and recorded with the cell",
            path,
            err,
        )
        return None
    handler.setFormatter(logging.Formatter("%(message)s"))
    return handler
