"""`network.source=hf` (`network=hf network.arch=gpt2`, and the language-model presets): a
Hugging Face `transformers` model built from its config class, `network.config` its fields,
as an `nn.Sequential` of its embedding, blocks and head (`workloads.networks.lm`)."""

from __future__ import annotations

from workloads.networks.source import NetworkSourceSpec, function_in

SPEC = NetworkSourceSpec(
    name="hf",
    build=function_in("workloads.networks.lm", "build_hf"),
    requires="arch",
    settings=("arch", "config"),
    libraries=("torch", "transformers"),
    tensor_parallel_plan=function_in("workloads.networks.tensor_parallel", "hf_plan"),
    order=4,
)
