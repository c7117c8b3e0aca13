"""The cost models: seconds per epoch and memory per worker as plain arithmetic over a cell's
facts (the thesis' chapters 4-6, symbols as in its Table 5.1: docs/thesis.md).

`terms` (the epoch split by cause and the free parameters every model shares), `memory`
(weights, gradients, optimizer state, activations per worker), `allreduce` (Eq. 5.1's ring),
`overlap` (a step's compute and collectives on a timeline: what hides behind what), `onefoneb`
(PipeDream's 1F1B schedule as data: each worker's operations, the batches it divides),
`activations` (what autograd saves per layer, as records, and a stage's share of it) and
`partition` (stage plans that balance a pipeline's layers by their cost).

A plan on GPUs priced from data sheets (docs/planner.md; units there are seconds, bytes and
bytes/s): `transformer` (a decoder's parameters, FLOPs and saved activations), `accelerator` (a
GPU as a roofline), `collectives` (rings on the link an axis sits on), `schedules` (each
pipeline schedule's bubble and activations in flight) and `plan_step` (a step by cause and the
memory per rank).

Pure: no trainer, no worker, no torch, no torch.distributed. Imports `harness.config` and
`harness.profiles` only. The distribution models (`harness.distributions.<name>`) put these
terms together for a cell; units are seconds, MB (10^6 bytes) and MB/s.
"""
