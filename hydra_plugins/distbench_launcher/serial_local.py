"""`hydra/launcher=serial_local`: a sweep's cells one at a time, each in a fresh process.

Hydra's submitit local launcher starts every cell of a sweep at once; on shared hardware their
timings then measure each other. This launcher reuses it but submits one cell at a time and
waits for it, so each cell has the machine to itself, gets a fresh process (its own peak memory,
no state left by the previous cell) and cannot take the sweep down when it dies.

Hydra only instantiates launchers defined in the `hydra_plugins` namespace, so the class lives
here; what it does around a cell is in `launchers.cells`. Keep imports light: Hydra imports this
module on every start-up while scanning for plugins, and executes it before registering it in
sys.modules, which is why it must not use `from __future__ import annotations` (dataclasses
then fail to resolve their string annotations).
"""


import time
from collections.abc import Sequence
from dataclasses import dataclass

from hydra.core.config_store import ConfigStore
from hydra.core.utils import JobReturn, JobStatus
from hydra_plugins.hydra_submitit_launcher.config import LocalQueueConf
from hydra_plugins.hydra_submitit_launcher.submitit_launcher import LocalLauncher


@dataclass
class SerialLocalConf(LocalQueueConf):
    _target_: str = "hydra_plugins.distbench_launcher.serial_local.SerialLocalLauncher"
    # Wall-clock limit of one cell in minutes; a cell that exceeds it is recorded as `timeout`.
    timeout_min: int = 120


ConfigStore.instance().store(group="hydra/launcher", name="serial_local",
                             node=SerialLocalConf, provider="distbench")


class SerialLocalLauncher(LocalLauncher):
    """Submitit's local launcher, one cell at a time, every cell recorded whatever happens."""

    def launch(self, job_overrides: Sequence[Sequence[str]],
               initial_job_idx: int) -> Sequence[JobReturn]:
        from tqdm import tqdm

        from launchers import cells

        assert self.config is not None and self.hydra_context is not None
        loader = self.hydra_context.config_loader
        cells.validate_sweep(loader, self.config, job_overrides)
        results: list[JobReturn] = []
        for offset, overrides in enumerate(tqdm(job_overrides, desc="sweep", unit="cell")):
            job_num = initial_job_idx + offset
            started, clock = cells.now(), time.monotonic()
            try:
                (result,) = super().launch([overrides], job_num)
                error = result._return_value if result.status is JobStatus.FAILED else None
            except Exception as err:  # noqa: BLE001 - the cell's process died without a result
                result, error = None, err
            if error is not None:
                timed_out = time.monotonic() - clock >= 60 * self.params["timeout_min"]
                result = cells.record_lost_cell(loader, self.config, overrides, job_num,
                                                error, timed_out=timed_out, started=started)
            results.append(result)
        print(cells.summary_table([r.return_value for r in results]), flush=True)
        return results
