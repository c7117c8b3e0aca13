"""The units distbench reports in, for the modules that convert without measuring anything
(the performance model, the hardware profile, the reports): importing them loads no torch."""

from __future__ import annotations

BYTES_PER_MB = 1_000_000  # distbench reports decimal megabytes everywhere (MB, MB/s)
BYTES_PER_GB = 1_000_000_000  # and decimal gigabytes (hardware.device_memory_gb)
