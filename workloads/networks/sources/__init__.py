"""distbench's own network sources, one module each, whose `SPEC` the registry
(`workloads.networks.registry`) finds: a module added here is a source, and nothing else
changes. Each spec names its builder and layer list (`workloads.networks.source.function_in`)
in the modules that build networks (`workloads.networks.layers`, `zoo`, `lm`), so that these
modules, read by every config check, load no torch."""
