"""Performance models: seconds per epoch and memory per worker, predicted without running the
distributed job (SPEC chapters 4-6, symbols as in Table 5.1).

One module per distribution model, each a plain function of the workload facts
(`harness.describe`, the profiler), the hardware profile (`harness.hardware_profile`) and the
distribution settings. The sequential statistical model (`sequential`) supplies T_seq, which
the others divide and extend. Units: seconds, MB (10^6 bytes), MB/s.
"""
