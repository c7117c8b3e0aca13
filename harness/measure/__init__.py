"""How distbench measures: timers and the rules that say when a timing is steady.

`metrics` (device time, medians, throughput), `timing_rule` (warm-up and when a probe may stop
early), `spread` (a figure's spread over its repeats), `steadiness` (a reference kernel timed
before and after a cell: whether the machine held still), `allocator` (freed host memory kept
in every process that times training), `profiler` (each layer's forward, backward and update
timed), `network_facts` (a network's sizes traced on the meta device) and `saved_activations`
(what autograd saves per layer, measured).

Below the runtime, the distribution models and the worker, which time with it; above the
config, the profiles and the cost models, whose records it fills. torch is imported inside
the functions that measure, never at import.
"""
