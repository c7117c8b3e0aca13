"""Typed configuration of one grid cell, registered in Hydra's ConfigStore.

The YAML files in `conf/` fill in values; these dataclasses fix the keys and their types, so a
misspelled key or a wrong type fails at composition. Value checks (positive counts, names that
exist, combinations that make sense) run in `__post_init__` when `validate()` turns the composed
DictConfig into these objects, before anything is built or launched. Every error names the full
key, the value given and what is allowed.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import re
import typing
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any, ClassVar

from omegaconf import MISSING, DictConfig, ListConfig, OmegaConf, ValueNode, open_dict
from omegaconf.errors import OmegaConfBaseException

from harness.config.accepts import (
    MAX_COUNT,
    MLFLOW_NAME_CHARS,
    allowed,
    component,
    declared,
    integer,
    number,
    path,
    shown,
    text,
)
from harness.config.batch_sizes import default_batch_size
from harness.config.stores import ALLOWED_STORES, known_scheme, store_scheme
from harness.config.weight_memory import (
    WorkerMemory,
    device_memory,
    gigabytes,
    least_state_bytes,
    parameter_count,
    shared_machine_memory,
)
from workloads.datasets.spec import BYTE_VOCAB, DATASET_SPECS, DatasetSpec
from workloads.networks import registry as network_registry
from workloads.networks.ref import BUILTIN, NetworkError, NetworkRef, canonical_json
from workloads.networks.source import SOURCE_SETTINGS, NetworkSourceSpec

if TYPE_CHECKING:
    from workloads.networks.check import NetworkSize

# torch.manual_seed's range (an unsigned 64-bit integer).
MAX_SEED = 2**64 - 1
# Longest run.progress_timeout_s: long enough for any step, short enough for a timedelta.
MAX_PROGRESS_TIMEOUT_S = 7 * 24 * 3600.0
# Longest dataset.seq_len / largest dataset.vocab_size (Llama 3's vocabulary is 128,256).
MAX_TOKEN_SETTING = 1_048_576
# A network's label names files, directories and MLflow runs.
_SAFE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")
# Physical bounds of the settings (docs/config.md, "What a setting accepts"): beyond any real
# machine or run, and small enough that the arithmetic on them stays finite and exact.
MAX_LR = 1e3
MAX_WEIGHT_DECAY = 1e3
MAX_DEVICE_MEMORY_GB = 1e5  # 100 TB per device; today's largest hold 0.2 TB (GPU), 32 TB (CPU)
MAX_THREADS = 65_536  # Linux's NR_CPUS tops out at 8,192; oversubscribing 8x is the limit
MAX_NODES = 1_000_000
MAX_BANDWIDTH_MBPS = 1e9  # 1 PB/s: 1,000x today's fastest link
MAX_TFLOPS = 1e6  # 1 EFLOP/s per device: 100x today's fastest
MAX_LATENCY_US = 1e9  # 1,000 s
MAX_PRICE_PER_HOUR = 1e6
MAX_EPOCHS = 1_000_000
MAX_REPEATS = 100_000
MAX_PROBE_ROUNDS = 100  # each round repeats the whole probe: 100 of them take hours
MAX_MESSAGE_BYTES = 2**34  # 16 GiB: more than one device holds
NAME_CHARS = 255
MAX_BUFFER_MB = 1e5  # a gradient bucket or fusion buffer: at most a device's memory


class ConfigError(ValueError):
    """An invalid configuration value; the message names the key and the allowed values."""


class DatasetName(str, Enum):
    mnist = "mnist"
    cifar10 = "cifar10"
    imagenet = "imagenet"
    highres = "highres"
    tokens = "tokens"  # synthetic token sequences (language models)
    text = "text"  # local text files, byte-level tokens (language models)


class DataSource(str, Enum):
    synthetic = "synthetic"  # generated from the seed, cached on local storage
    real = "real"  # read from `dataset.root` through torchvision


class Device(str, Enum):
    cpu = "cpu"
    cuda = "cuda"


class OptimizerName(str, Enum):
    sgd = "sgd"  # with momentum: what the thesis trained its CNNs with
    adamw = "adamw"  # two states per weight: how language models are trained


def _network_sources() -> dict[str, NetworkSourceSpec]:
    """Every network source, in their order (`workloads.networks.registry.sources`); a source
    registered by another package that cannot be loaded is bad input, refused in one line."""
    try:
        return network_registry.sources()
    except NetworkError as err:
        raise ConfigError(str(err)) from None


def _either(names: list[str]) -> str:
    """ "a, b or c": one of `names`, in a message."""
    return " or ".join(filter(None, (", ".join(names[:-1]), *names[-1:])))


def require(condition: bool, key: str, value: Any, allowed: str) -> None:
    """Raise ConfigError('key=value: allowed') unless `condition` holds."""
    if not condition:
        raise ConfigError(f"{key}={value!r} is invalid: {allowed}")


def _check_positive(
    section: str, name: str, value: float | None, *, nullable: bool = False, null_means: str = ""
) -> None:
    if value is None and nullable:
        return
    allowed = "must be a positive number" + (f", or null ({null_means})" if nullable else "")
    require(value is not None and value > 0, f"{section}.{name}", value, allowed)


@dataclass
class DatasetConfig:
    """What is trained on (Table 3.2, docs/thesis.md)."""

    _section: ClassVar[str] = "dataset"
    name: DatasetName = DatasetName.mnist
    # synthetic: generated once from run.seed into cache_dir (keeps storage out of the measurement);
    # real: torchvision formats under `root` (MNIST raw idx files, cifar-10-batches-py,
    # ImageFolder).
    source: DataSource = DataSource.synthetic
    root: str | None = field(default=None, metadata=path("read"))
    # Samples per epoch; null = the full dataset (Table 3.2 size, or what is on disk).
    num_samples: int | None = field(default=None, metadata=integer(1, MAX_COUNT, "samples"))
    # Distinct synthetic images stored on disk (index i reads image i % this); null = the
    # per-dataset default of workloads.datasets (all of MNIST/CIFAR, a subset of ImageNet/Highres).
    synthetic_unique_samples: int | None = field(
        default=None, metadata=integer(1, MAX_COUNT, "samples")
    )
    # Node-local directory for the synthetic cache.
    cache_dir: str = field(
        default="${oc.env:DISTBENCH_CACHE_DIR,${oc.env:HOME}/.cache/distbench}",
        metadata=path("create"),
    )
    # DataLoader worker processes (0 = load in the training process; right for synthetic data).
    num_workers: int = field(default=0, metadata=integer(0, 1024, "processes"))
    # Samples of the held-out evaluation split evaluated after every epoch (run.eval): the
    # real datasets' test split, or a synthetic split generated like the training data.
    # null = one tenth of the epoch's samples (at most the split), which
    # keeps evaluation under 5 % of a cell's wall time (BENCHMARKS.md, "Time to quality").
    eval_samples: int | None = field(default=None, metadata=integer(1, MAX_COUNT, "samples"))
    # Token datasets (tokens, text): tokens per sample and the vocabulary; null = the
    # dataset's default (128 and 256, the byte-level tokenizer's ids). Refused for images.
    seq_len: int | None = field(default=None, metadata=integer(1, MAX_TOKEN_SETTING, "tokens"))
    vocab_size: int | None = field(
        default=None, metadata=integer(1, MAX_TOKEN_SETTING, "token ids")
    )

    def __post_init__(self) -> None:
        _check_positive(
            self._section,
            "num_samples",
            self.num_samples,
            nullable=True,
            null_means=f"the full dataset: {DATASET_SPECS[self.name.value].num_images}",
        )
        _check_positive(
            self._section,
            "synthetic_unique_samples",
            self.synthetic_unique_samples,
            nullable=True,
            null_means="the dataset's default",
        )
        require(self.num_workers >= 0, "dataset.num_workers", self.num_workers, "must be 0 or more")
        _check_positive(
            self._section,
            "eval_samples",
            self.eval_samples,
            nullable=True,
            null_means="one tenth of the epoch's samples",
        )
        spec = DATASET_SPECS[self.name.value]
        if self.source is DataSource.real:
            require(
                not spec.synthetic_only,
                "dataset.source",
                self.source.value,
                f"dataset {spec.name} exists only as synthetic data; allowed: synthetic",
            )
            require(
                bool(self.root),
                "dataset.root",
                self.root,
                "source=real needs the directory that holds the dataset",
            )
        else:
            require(
                not spec.real_only,
                "dataset.source",
                self.source.value,
                f"dataset {spec.name} is read from local files; allowed: real (with "
                f"dataset.root), or dataset=tokens for synthetic tokens",
            )
        for key in ("seq_len", "vocab_size"):
            value = getattr(self, key)
            if not spec.tokens:
                require(
                    value is None,
                    f"dataset.{key}",
                    value,
                    f"is a setting of token datasets (tokens, text), not of {spec.name}",
                )
                continue
            _check_positive(
                self._section, key, value, nullable=True, null_means=f"{getattr(spec, key)}"
            )
            require(
                value is None or value <= MAX_TOKEN_SETTING,
                f"dataset.{key}",
                value,
                f"allowed: at most {MAX_TOKEN_SETTING:,}",
            )
        if spec.real_only and self.vocab_size is not None:
            require(
                self.vocab_size >= BYTE_VOCAB,
                "dataset.vocab_size",
                self.vocab_size,
                f"the byte-level tokenizer of dataset={spec.name} has {BYTE_VOCAB} token "
                f"ids; allowed: {BYTE_VOCAB} or more",
            )

    @property
    def spec(self) -> DatasetSpec:
        """The dataset's shape as the cell trains it (a token dataset's seq_len and
        vocab_size applied)."""
        return DATASET_SPECS[self.name.value].with_tokens(self.seq_len, self.vocab_size)

    @property
    def key(self) -> str:
        """The dataset's identity where facts are cached: its name, and for tokens the
        sequence length and vocabulary (they change every shape)."""
        spec = self.spec
        if not spec.tokens:
            return spec.name
        return f"{spec.name}-t{spec.seq_len}-v{spec.vocab_size}"


@dataclass
class NetworkConfig:
    """Which network is trained: a built-in CNN by name (its variant, small-image or ImageNet,
    follows the dataset), a user's own module, a torchvision or timm model by name, or a
    Hugging Face `transformers` model from its config class (random weights, nothing is
    downloaded). conf/network/ holds one file per built-in and preset, and `module`,
    `torchvision`, `timm`, `hf` to name any other."""

    _section: ClassVar[str] = "network"
    # The network's label (tables, run names, MLflow); a built-in's name. Empty for another
    # source = derived from network.arch or network.target.
    name: str = "resnet18"
    # Where the network comes from: a network source's name (`workloads.networks.registry`:
    # builtin, module, torchvision, timm, hf, and those other packages register).
    source: str = BUILTIN
    # source=module: "package.module:factory" (or a class), importable where the cell runs.
    target: str | None = None
    # source=torchvision/timm: the model's name in the zoo; source=hf: the transformers model
    # type (gpt2, llama, bert, ...).
    arch: str | None = None
    # source=module/torchvision/timm: keyword arguments of the factory (network.kwargs.depth=12;
    # add a key with +network.kwargs.<key>=...). torchvision/timm get num_classes (and timm
    # in_chans) from the dataset unless given here.
    kwargs: dict[str, Any] = field(default_factory=dict)
    # source=hf: fields of the config class (network.config.n_layer=6); vocab_size and the
    # positions follow dataset.vocab_size / dataset.seq_len unless given here.
    config: dict[str, Any] = field(default_factory=dict)
    # Dotted path of the repeated block container (e.g. "blocks" or "transformer.h") for a
    # module that is not an nn.Sequential and has no pipeline_layers(): pipelines split there.
    blocks: str | None = None

    def __post_init__(self) -> None:
        """What the source's spec asks of the config (`NetworkSourceSpec`): a name of its
        closed list, the key it needs, and no key of another source's."""
        source = self.source_spec
        if source.names is not None:
            others = [name for name, spec in _network_sources().items() if spec.names is None]
            require(
                self.name in source.names,
                "network.name",
                self.name,
                f"allowed {source.title} networks: {', '.join(source.names)}; any "
                f"other network: network={_either(others)}",
            )
        need = source.requires
        if need is not None:
            require(
                bool(getattr(self, need)),
                f"network.{need}",
                getattr(self, need),
                f"network.source={source.name} needs network.{need}",
            )
        for key in SOURCE_SETTINGS:
            used_by = [name for name, spec in _network_sources().items() if key in spec.settings]
            require(
                not getattr(self, key) or key in source.settings,
                f"network.{key}",
                getattr(self, key),
                f"is a setting of network.source={', '.join(used_by)}, not of {source.name}",
            )
        if not self.name:
            self.name = (self.arch or str(self.target)).replace(":", ".").split(".")[-1]
        require(
            _SAFE_NAME.fullmatch(self.name) is not None,
            "network.name",
            self.name,
            "allowed: 1-64 letters, digits, '_', '-', '.' (it names files and runs)",
        )

    @property
    def source_spec(self) -> NetworkSourceSpec:
        """The spec of the network's source; ConfigError names the sources there are."""
        try:
            return _network_sources()[self.source]
        except KeyError:
            raise ConfigError(
                f"network.source={self.source!r} is invalid: allowed: "
                f"{', '.join(_network_sources())}"
            ) from None

    @property
    def ref(self) -> NetworkRef:
        """The network as workloads.networks builds it (hashable)."""
        return NetworkRef(
            name=self.name,
            source=self.source,
            target=self.target,
            arch=self.arch,
            options_json=canonical_json(dict(self.config or self.kwargs)),
            blocks=self.blocks,
        )

    @property
    def label(self) -> str:
        """What tables and run names call the network."""
        return self.name

    def given(self, longest: int = 240) -> str:
        """The network and the settings that size it, as a refusal names them: "network
        gpt2_tiny (network.config.n_embd=128, ..., network.config.vocab_size=1000000000)",
        cut at about `longest` characters."""
        section = "config" if self.config else "kwargs"
        settings = [
            f"network.{key}={value}" for key in ("target", "arch") if (value := getattr(self, key))
        ]
        settings += [
            f"network.{section}.{key}={value}"
            for key, value in sorted(dict(self.config or self.kwargs).items())
        ]
        shown_settings = ""
        for setting in settings:
            if len(shown_settings) + len(setting) > longest:
                shown_settings += ", ..."
                break
            shown_settings += (", " if shown_settings else "") + setting
        return f"network {self.name}" + (f" ({shown_settings})" if shown_settings else "")

    @property
    def key(self) -> str:
        """The network's identity where facts are cached (NetworkRef.key)."""
        return self.ref.key


@dataclass
class OptimizerConfig:
    """The optimizer every distribution model uses, so that their timings compare: SGD with
    momentum (the thesis' CNNs) or AdamW (language models), optimizer=adamw."""

    _section: ClassVar[str] = "optimizer"
    name: OptimizerName = OptimizerName.sgd
    # Bounds: finite (inf trains to nan), at most 1e3 (no optimizer converges above it).
    lr: float = field(default=0.01, metadata=number(0, MAX_LR, low_open=True))
    # SGD's momentum; AdamW's first-moment decay (beta1).
    momentum: float = field(default=0.9, metadata=number(0, 1))
    # AdamW's second-moment decay (beta2); SGD has none.
    beta2: float = field(default=0.999, metadata=number(0, 1))
    weight_decay: float = field(default=5e-4, metadata=number(0, MAX_WEIGHT_DECAY))

    def __post_init__(self) -> None:
        _check_positive(self._section, "lr", self.lr)
        require(0 <= self.momentum < 1, "optimizer.momentum", self.momentum, "must be in [0, 1)")
        require(0 <= self.beta2 < 1, "optimizer.beta2", self.beta2, "must be in [0, 1)")
        require(
            self.weight_decay >= 0, "optimizer.weight_decay", self.weight_decay, "must be 0 or more"
        )

    @property
    def state_buffers(self) -> int:
        """Buffers the optimizer keeps per weight (what the memory model counts): AdamW two
        moments, SGD one momentum buffer, or none without momentum."""
        if self.name is OptimizerName.adamw:
            return 2
        return 1 if self.momentum > 0 else 0

    @property
    def state_named(self) -> str:
        """The buffers `state_buffers` counts, as a refusal names them ("" for none)."""
        if self.name is OptimizerName.adamw:
            return "AdamW's two moments"
        return "SGD's momentum" if self.state_buffers else ""


@dataclass
class DistributionConfig:
    """How training is distributed: what every distribution model has. Each model subclasses
    it in its own module (`harness.distributions.<name>`) with its own settings and their
    checks; the subclass is the Hydra schema of `conf/distribution/<name>.yaml`, so a key of
    another model (`distribution=ddp distribution.micro_batches=8`) is refused. The methods
    are what the rest of distbench asks a model about a cell; the defaults describe a model
    that runs one whole replica per worker."""

    _section: ClassVar[str] = "distribution"
    # Every model's settings class by its name, as the classes are defined (the registry,
    # harness.distributions.registry, imports them all): what a wrong name is told.
    models: ClassVar[dict[str, type[DistributionConfig]]] = {}
    name: str = ""
    # Batch size: per worker for data-parallel models, whole batch for GPipe; null = Table 3.3.
    batch_size: int | None = field(default=None, metadata=integer(1, 2**31 - 1, "samples"))
    # torch.distributed backend: null = nccl on CUDA, gloo on CPU.
    backend: str | None = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.__dict__.get("name"):  # a model's own class, not a shared base (pipelines)
            DistributionConfig.models[cls.__dict__["name"]] = cls

    def __post_init__(self) -> None:
        own_name = type(self).__dataclass_fields__["name"].default
        require(
            self.name == own_name,
            "distribution.name",
            self.name,
            f"these are the settings of distribution={own_name}; a model is chosen by its "
            f"config file, distribution=<name>; allowed: "
            f"{', '.join(sorted(DistributionConfig.models))}",
        )
        _check_positive(
            self._section,
            "batch_size",
            self.batch_size,
            nullable=True,
            null_means="the thesis' Table 3.3 for the dataset and distribution model",
        )
        require(
            self.backend in (None, "gloo", "nccl"),
            "distribution.backend",
            self.backend,
            "allowed: gloo, nccl, or null (nccl on CUDA, gloo on CPU)",
        )

    def default_batch_size(self, dataset: str) -> int:
        """The batch size of Table 3.3 (docs/thesis.md; per worker)."""
        return default_batch_size(dataset)

    def workers(self, hardware: HardwareConfig) -> int:
        """The workers a cell of this model occupies on `hardware`: all of them."""
        return hardware.world_size

    def weight_shards(self, cell: DistbenchConfig) -> int:
        """The most workers among which this model divides one copy of the network's
        weights, gradients and optimizer state (1: each worker holds them whole), for the
        check that they can fit at all (`harness.config.weight_memory`). By default every
        worker of the cell, the least any model can hold: a model that does not say is never
        refused for a network it could split."""
        return cell.world_size

    @property
    def weight_bytes(self) -> int:
        """Bytes of one weight, gradient or optimizer value as the model keeps them: float32."""
        return 4

    def check_cell(self, cell: DistbenchConfig) -> None:
        """Checks of this model's settings against the rest of the cell (ConfigError): an
        epoch needs at least one full batch per worker."""
        needed = cell.batch_size * cell.world_size
        cell.check_epoch_holds(
            cell.world_size,
            f"an epoch needs at least one full batch per worker (batch size "
            f"{cell.batch_size} x {cell.world_size} workers = {needed})",
        )

    def data_shard_of(self, cell: DistbenchConfig, rank: int) -> int:
        """The shard of the epoch's data worker `rank` trains (0 .. data_shards - 1): its rank
        modulo the shards, unless the model groups its workers otherwise (a device mesh: the
        workers of one data-parallel position, across its tensor and pipeline axes, share
        one)."""
        return rank % self.data_shards(cell)

    def batch_from_global(self, cell: DistbenchConfig, global_batch: int) -> int:
        """The per-worker batch (what a worker's data loader yields per optimizer step) that
        makes `run.global_batch` samples per step: the global batch over the data shards. A
        model with settings of its own that set the batch refuses what does not divide."""
        shards = self.data_shards(cell)
        require(
            global_batch % shards == 0,
            "run.global_batch",
            global_batch,
            f"must divide among the cell's {shards} data-parallel shard(s) of "
            f"distribution={self.name}; allowed: a multiple of {shards}",
        )
        require(
            self.batch_size is None or self.batch_size == global_batch // shards,
            "distribution.batch_size",
            self.batch_size,
            f"run.global_batch={global_batch} sets the per-worker batch of "
            f"distribution={self.name} to {global_batch // shards}; allowed: null, or "
            f"{global_batch // shards}",
        )
        return global_batch // shards

    def tensor_parallelism(self, cell: DistbenchConfig) -> int:
        """Workers each layer's weights are split over (MLPerf's tensor_parallelism): 1 but
        for a model that shards within a layer."""
        return 1

    def run_name_head(self, cell: DistbenchConfig) -> list[str]:
        """What the cell's name leads with: the model's name, or the plan of a model whose
        settings are a plan (DistbenchConfig.run_name)."""
        return [self.name]

    def data_shards(self, cell: DistbenchConfig) -> int:
        """Equal shards the epoch's data is split into, one per worker that trains its own
        batches (worker `rank` takes shard `rank % shards`; an optimizer step covers
        batch_size x shards samples): every worker, each a whole replica. A model that feeds
        every batch through all its workers (a pipeline) has one."""
        return cell.world_size

    def step_batch(self, cell: DistbenchConfig) -> int:
        """The samples one forward pass of one worker takes (what the sequential step time is
        probed at, and MLPerf's micro_batch_size): the per-worker batch."""
        return cell.batch_size

    def run_name_parts(self, cell: DistbenchConfig) -> list[str]:
        """What the cell's name says of this model's own settings (DistbenchConfig.run_name)."""
        return []

    def own_settings(self, cell: DistbenchConfig) -> dict[str, Any]:
        """This model's own settings (the subclass's fields), resolved where null means a
        default, as plain values: the columns of a sweep's table."""
        base = {f.name for f in dataclasses.fields(DistributionConfig)}
        return {
            f.name: _plain(getattr(self, f.name))
            for f in dataclasses.fields(self)
            if f.name not in base
        }

    def own_settings_raw(self) -> dict[str, Any]:
        """This model's own settings as they are set (null stays null)."""
        base = {f.name for f in dataclasses.fields(DistributionConfig)}
        return {
            f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in base
        }

    def parallelism(
        self, cell: DistbenchConfig, resolved: dict[str, Any]
    ) -> tuple[int | list[int], int]:
        """MLPerf's data and pipeline parallelism of the cell (`resolved`: what the trainer
        resolved, e.g. a planned pipeline)."""
        return cell.world_size, 1


def _plain(value: Any) -> Any:
    """A setting as a table cell: an enum's value, a list joined by '-'."""
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, list):
        return "-".join(map(str, value))
    return value


# The bounds of an emulated link (launchers.emulated): tc's token bucket takes rates from
# 8 kbit/s; above 100 Gbit/s this machine could not fill the link anyway.
MIN_LINK_MBIT = 0.008
MAX_LINK_MBIT = 100_000.0
MAX_LINK_BURST_KB = 1_048_576.0
MAX_LINK_QUEUE_MS = 10_000.0


@dataclass
class LinkEmulation:
    """How every node's link is emulated when the nodes are network namespaces on one machine
    (`python -m launchers.emulated up hardware=H`): tc's token-bucket filter (`tbf`) where the
    traffic leaves each node, so every byte between two nodes crosses one link shaped to
    `rate_mbit`. A cell on such hardware (re)applies it on every node before it starts and
    records it (the link is a property of the cell, like its cores)."""

    # The link's rate in Mbit/s (1000 = 1 Gbit/s = 125 MB/s).
    rate_mbit: float = field(
        default=1000.0, metadata=number(MIN_LINK_MBIT, MAX_LINK_MBIT, "Mbit/s")
    )
    # Bytes that may leave at once above the rate (tbf's bucket), in KB: at least one large
    # (GSO) packet, 64 KB; more lets short bursts through faster.
    burst_kb: float = field(default=256.0, metadata=number(64, MAX_LINK_BURST_KB, "KB"))
    # The longest a packet may queue before tbf drops it (its `latency`): bounds the queue.
    queue_ms: float = field(
        default=50.0, metadata=number(0, MAX_LINK_QUEUE_MS, "ms", low_open=True)
    )

    @property
    def bytes_per_s(self) -> float:
        return self.rate_mbit * 1e6 / 8

    @property
    def burst_bytes(self) -> float:
        """tbf's bucket in bytes (tc's KB are 1024 bytes)."""
        return self.burst_kb * 1024

    def tbf_arguments(self) -> list[str]:
        """The arguments of `tc qdisc replace dev IF root` that shape a link to this."""
        return [
            "tbf",
            "rate",
            f"{self.rate_mbit:g}mbit",
            "burst",
            f"{self.burst_kb:g}kb",
            "latency",
            f"{self.queue_ms:g}ms",
        ]


@dataclass
class AcceleratorSheet:
    """One GPU's data-sheet figures (dense, no sparsity), what the planner prices a plan's
    compute with where no step was timed on the device (`python -m harness.recommend --plans`;
    docs/planner.md). Not measured here: replace them with measured figures where you have them.
    """

    # The GPU's name as its data sheet gives it (e.g. "H100 SXM5 80GB").
    name: str = field(default="", metadata=text(64))
    # Peak 16-bit (bfloat16) tensor-core FLOP/s, in TFLOP/s.
    bf16_tflops: float = field(
        default=0.0, metadata=number(0, MAX_TFLOPS, "TFLOP/s", low_open=True)
    )
    # Peak float32 FLOP/s (no TF32), in TFLOP/s: what `precision=fp32` computes at.
    fp32_tflops: float = field(
        default=0.0, metadata=number(0, MAX_TFLOPS, "TFLOP/s", low_open=True)
    )
    # Peak HBM bandwidth in GB/s (10^9 bytes/s).
    memory_bandwidth_gbs: float = field(
        default=0.0, metadata=number(0, MAX_BANDWIDTH_MBPS, "GB/s", low_open=True)
    )
    # The largest bfloat16 GEMMs' share of `bf16_tflops`, as the vendor's cuBLAS measurements
    # show it (smaller shapes lose more: harness.costs.accelerator.gemm_efficiency).
    matmul_efficiency: float = field(default=0.7, metadata=number(0, 1, low_open=True))
    # A fused (flash) attention kernel's share of `bf16_tflops`, forward and backward.
    attention_efficiency: float = field(default=0.4, metadata=number(0, 1, low_open=True))
    # Where the figures come from (data sheet, paper, measurement).
    source: str = field(default="", metadata=text())


@dataclass
class HardwareConfig:
    """Where a cell runs. Bandwidths and latencies feed the performance models (Table 4.1)."""

    _section: ClassVar[str] = "hardware"
    # It names the hardware's facts and fit files (harness.recommend).
    name: str = field(default="local_cpu", metadata=component())
    device: Device = Device.cpu
    nodes: int = field(default=1, metadata=integer(1, MAX_NODES, "nodes"))
    workers_per_node: int = field(default=1, metadata=integer(1, MAX_THREADS, "workers"))
    # Threads torch may use per worker (torch.set_num_threads); null = torch's default.
    cpu_threads: int | None = field(default=None, metadata=integer(1, MAX_THREADS, "threads"))
    # Memory of one device in GB (null = unknown; the recommender then cannot rule out OOM).
    # On a CPU it is also enforced on every worker (harness.worker.memory_limit): a cell that does
    # not fit ends `oom`, as on a GPU; null = no limit.
    device_memory_gb: float | None = field(
        default=None, metadata=number(0, MAX_DEVICE_MEMORY_GB, "GB", low_open=True)
    )
    intra_node_bandwidth_mbps: float | None = field(
        default=None, metadata=number(0, MAX_BANDWIDTH_MBPS, "MB/s", low_open=True)
    )
    intra_node_latency_us: float | None = field(
        default=None, metadata=number(0, MAX_LATENCY_US, "us", low_open=True)
    )
    inter_node_bandwidth_mbps: float | None = field(
        default=None, metadata=number(0, MAX_BANDWIDTH_MBPS, "MB/s", low_open=True)
    )
    inter_node_latency_us: float | None = field(
        default=None, metadata=number(0, MAX_LATENCY_US, "us", low_open=True)
    )
    # What one device costs per hour, in `currency` (e.g. USD, EUR, or "credits"); null =
    # unknown: the recommender shows no cost column and cannot rank by cost.
    price_per_device_hour: float | None = field(
        default=None, metadata=number(0, MAX_PRICE_PER_HOUR, low_open=True)
    )
    currency: str | None = field(default=None, metadata=text(32))
    description: str = field(default="", metadata=text())
    # null: real nodes (or one machine). Set: the nodes are emulated on one machine, each a
    # network namespace with its own address, cores and a link shaped as this says
    # (launchers.emulated; docs/launchers.md).
    link: LinkEmulation | None = None
    # true: the nodes are processes on one machine, sharing its cores and talking over its
    # loopback (scripts/slurm_local.sh's cluster): their collectives are priced as one
    # machine's, whatever `nodes` says. false: each node has cores and a link of its own (real
    # nodes, or emulated ones: `link`).
    one_host: bool = False
    # The GPU's data sheet (null: none): lets `harness.recommend --plans` price plans on it
    # without a step timed there.
    accelerator: AcceleratorSheet | None = None

    def __post_init__(self) -> None:
        for name in ("nodes", "workers_per_node"):
            require(
                getattr(self, name) >= 1,
                f"hardware.{name}",
                getattr(self, name),
                "must be 1 or more",
            )
        for name in (
            "cpu_threads",
            "device_memory_gb",
            "intra_node_bandwidth_mbps",
            "intra_node_latency_us",
            "inter_node_bandwidth_mbps",
            "inter_node_latency_us",
            "price_per_device_hour",
        ):
            _check_positive(
                self._section,
                name,
                getattr(self, name),
                nullable=True,
                null_means="unknown / default",
            )
        require(
            self.currency is None or bool(self.currency.strip()),
            "hardware.currency",
            self.currency,
            "the unit of hardware.price_per_device_hour, e.g. USD, or null",
        )

    @property
    def world_size(self) -> int:
        return self.nodes * self.workers_per_node

    @property
    def on_one_machine(self) -> bool:
        """Whether every worker runs on one machine: one node, nodes that share one machine
        (`one_host`), or nodes emulated on this one (`link`)."""
        return self.nodes == 1 or self.one_host or self.link is not None

    def group_spans_nodes(self, group_size: int) -> bool:
        """Whether a group of `group_size` consecutive ranks sits on more than one node (a
        node's workers take consecutive ranks): its collectives then cross the nodes' links."""
        return self.nodes > 1 and group_size > self.workers_per_node

    def group_crosses_links(self, group_size: int) -> bool:
        """Whether the collectives of such a group wait on links between machines, not on the
        cores of one (`one_host` nodes share the cores they compute on)."""
        return self.group_spans_nodes(group_size) and not self.one_host


@dataclass
class RunConfig:
    """How one cell is measured."""

    _section: ClassVar[str] = "run"
    # Timed epochs per repeat; seconds_per_epoch is their mean.
    epochs: int = field(default=3, metadata=integer(1, MAX_EPOCHS, "epochs"))
    # Untimed batches before the first timed epoch.
    warmup_batches: int = field(default=5, metadata=integer(0, MAX_COUNT, "batches"))
    # Samples per optimizer step over the whole cell; null = the distribution model's batch
    # (distribution.batch_size, or Table 3.3) times its data-parallel shards. Set, every model
    # derives its per-worker batch from it (a pipeline: its whole batch; a device mesh: each
    # data-parallel position's, which its micro-batches and accumulation steps then divide),
    # so that the cells of a sweep over plans train the same amount of work per step; what
    # does not divide is refused.
    global_batch: int | None = field(default=None, metadata=integer(1, 2**31 - 1, "samples"))
    # Seeds Python's random, NumPy, torch (CPU and CUDA), the synthetic data and the data
    # order; repeat k runs with seed + k (harness.runtime.seeding.repeat_seed).
    seed: int = 0
    # Measurements of the cell: each trains and times `epochs` epochs with its own seed, in
    # the same workers on the same built network (harness.worker.run.measure says why); the cell
    # reports their mean, spread and 95% confidence interval.
    repeats: int = field(default=1, metadata=integer(1, MAX_REPEATS, "repeats"))
    # torch.use_deterministic_algorithms, cuDNN's deterministic kernels without autotuning,
    # and CUBLAS_WORKSPACE_CONFIG: bit-reproducible training, possibly slower; an operation
    # without a deterministic kernel then fails the cell.
    deterministic: bool = False
    # Root of run dirs, sweep dirs and the default MLflow store.
    output_dir: str = field(default="outputs", metadata=path("create"))
    # Time data/forward/backward/optimizer separately. On CUDA this synchronises the device at
    # each phase boundary, which removes some overlap; turn off for the purest epoch time.
    phase_timing: bool = True
    progress: bool = True  # progress bar over batches
    # Bounds every collective, so a peer that died or hangs turns into a `timeout` record
    # instead of a wait forever; a worker that finishes no batch for 1.25x this (+5 s) is ended
    # by its watchdog.
    progress_timeout_s: float = field(
        default=600.0, metadata=number(0, MAX_PROGRESS_TIMEOUT_S, "s", low_open=True)
    )
    # Evaluate the trained network on the held-out split (dataset.eval_samples) after every
    # epoch, outside the timed epoch as MLPerf times it; eval loss and accuracy are recorded
    # per epoch. Every repeat then trains from the same initial weights.
    eval: bool = True
    # End a repeat at the first evaluation whose accuracy (0..1) reaches this, and record the
    # time to it (MLPerf's score, run_stop - run_start); null = train run.epochs epochs.
    target_accuracy: float | None = field(default=None, metadata=number(0, 1, low_open=True))
    # The organisation named in the MLPerf log (submission_org); not part of the cell's key.
    submission_org: str = field(default="distbench", metadata=text(NAME_CHARS))
    # A cell is recorded *unsteady* when the machine's speed changed while it ran by more than
    # this fraction: a reference kernel timed before and after it, or its epochs' coefficient
    # of variation (harness.measure.steadiness). Not part of the cell's key: it judges, never
    # changes, the measurement.
    steadiness_threshold: float = field(default=0.10, metadata=number(0, 10, low_open=True))

    def __post_init__(self) -> None:
        require(self.epochs >= 1, "run.epochs", self.epochs, "must be 1 or more")
        if self.target_accuracy is not None:
            require(
                0 < self.target_accuracy <= 1,
                "run.target_accuracy",
                self.target_accuracy,
                "allowed: a fraction in (0, 1], or null (no target)",
            )
            require(
                self.eval,
                "run.eval",
                self.eval,
                "run.target_accuracy needs run.eval=true (the target is checked at each "
                "evaluation)",
            )
        # It becomes a timedelta for every collective and the watchdog's deadline: nan, inf
        # and 1e308 overflow them, so a worker would fail or never time out.
        require(
            0 < self.progress_timeout_s <= MAX_PROGRESS_TIMEOUT_S,
            "run.progress_timeout_s",
            self.progress_timeout_s,
            f"allowed: seconds in (0, {MAX_PROGRESS_TIMEOUT_S:.0f}] (at most 7 days)",
        )
        require(
            self.warmup_batches >= 0, "run.warmup_batches", self.warmup_batches, "must be 0 or more"
        )
        require(self.repeats >= 1, "run.repeats", self.repeats, "must be 1 or more")
        require(
            self.global_batch is None or self.global_batch >= 1,
            "run.global_batch",
            self.global_batch,
            "must be 1 or more samples, or null (the model's batch times its data shards)",
        )
        # torch's generators take seeds below 2**64 (NumPy's legacy one gets seed % 2**32),
        # and repeat k runs with run.seed + k (harness.runtime.seeding.repeat_seed).
        highest = MAX_SEED - (self.repeats - 1)
        require(
            0 <= self.seed <= highest,
            "run.seed",
            self.seed,
            f"allowed: 0 to {highest} (torch seeds are below 2**64; repeat k uses run.seed + k)",
        )


@dataclass
class ProbeConfig:
    """The hardware probe (`python -m harness.probe`): what it sends between the workers."""

    _section: ClassVar[str] = "probe"
    # Message sizes in bytes, for point-to-point transfers between every pair of workers and
    # for allreduces: latency is read at the smallest, bandwidth fitted over all of them
    # (t = latency + bytes / bandwidth).
    message_bytes: list[int] = field(
        default_factory=lambda: [8, 65_536, 1_048_576, 8_388_608, 33_554_432],
        metadata=integer(1, MAX_MESSAGE_BYTES, "bytes"),
    )
    # Timed repetitions per size; the median is kept.
    repeats: int = field(default=10, metadata=integer(1, MAX_REPEATS, "repetitions"))
    # Untimed repetitions first (connection set-up, allocator).
    warmup: int = field(default=2, metadata=integer(0, MAX_REPEATS, "repetitions"))
    # Every figure is measured this many times, one round after the other, and kept at its
    # median across them; their spread is the probe's own noise, kept in the profile
    # (harness.profiles.rounds). 1 round: its noise is not known.
    rounds: int = field(default=3, metadata=integer(1, MAX_PROBE_ROUNDS, "rounds"))

    def __post_init__(self) -> None:
        require(
            len(self.message_bytes) >= 2 and all(size > 0 for size in self.message_bytes),
            "probe.message_bytes",
            self.message_bytes,
            "needs two or more positive sizes (a bandwidth fit needs two points)",
        )


@dataclass
class TrackingConfig:
    """Where results are recorded (besides result.json, which is always written)."""

    enabled: bool = True
    # null = $MLFLOW_TRACKING_URI if set, else sqlite:///<run.output_dir>/mlflow.db
    uri: str | None = field(default=None, metadata=text())
    # Sweeps set this to their own name. It names a directory of artifacts, and MLflow keeps
    # at most 500 characters: a name that could leave its root is refused before training.
    experiment: str = field(default="distbench", metadata=component(MLFLOW_NAME_CHARS))
    # null = built from the cell (DistbenchConfig.run_name).
    run_name: str | None = field(default=None, metadata=text(MLFLOW_NAME_CHARS))

    def __post_init__(self) -> None:
        if self.uri is not None:  # else resolved when the store is opened (check_store)
            scheme = store_scheme(self.uri)
            require(
                known_scheme(scheme),
                "tracking.uri",
                self.uri,
                f"no MLflow store has the scheme {scheme!r}; allowed: {ALLOWED_STORES}",
            )
        # MLflow refuses an empty experiment name, but only when the cell is synced, after
        # it trained.
        require(
            bool(self.experiment.strip()),
            "tracking.experiment",
            self.experiment,
            "allowed: a non-empty MLflow experiment name",
        )


@dataclass
class DistbenchConfig:
    """One grid cell: dataset x network x distribution x hardware, plus how to run and record it."""

    dataset: DatasetConfig = field(default_factory=DatasetConfig)
    network: NetworkConfig = field(default_factory=NetworkConfig)
    # A model's settings (its subclass); no default here: `conf/config.yaml` chooses
    # `distribution: sequential`, and code builds one with `registry.settings(name)`.
    distribution: DistributionConfig = MISSING
    hardware: HardwareConfig = field(default_factory=HardwareConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    run: RunConfig = field(default_factory=RunConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    probe: ProbeConfig = field(default_factory=ProbeConfig)
    # One model's settings in a sweep over models: `+per_model.gpipe.micro_batches=4` sets
    # distribution.micro_batches in the cells whose model is gpipe only (it wins over
    # distribution.<key> there). Every entry is checked against its model's settings in every
    # cell; validate() merges the cell's own entry into `distribution` and empties this, so the
    # typed cell, its record and its key hold the effective settings only.
    per_model: dict[str, dict[str, Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.check_network()
        self.distribution.check_cell(self)
        require(
            not (self.distribution.backend == "nccl" and self.hardware.device is Device.cpu),
            "distribution.backend",
            self.distribution.backend,
            "NCCL needs hardware.device=cuda; allowed on CPU: gloo, or null",
        )

    def check_network(self) -> NetworkSize | None:
        """The network takes the dataset's input: asked of its source without building it
        where the source can answer so (a built-in network on token data is refused by name),
        else the network is built and run on the meta device (workloads.networks.check), once
        per (network, dataset shape), or read where the same code checked it before and a
        command that answered kept it (the planner); checking keeps nothing, since bad input
        writes nothing. Returns the network's size where it was built (asked again, it is
        answered from that check); None where its source answered without building it."""
        spec, ref = self.dataset.spec, self.network.ref
        try:
            input_check = self.network.source_spec.input_check
            if input_check is not None:  # answered without building the network (nor torch)
                input_check(ref, spec)
                return None
            from workloads.networks.check import check_network_remembered

            return check_network_remembered(ref, spec, self.dataset.cache_dir, keep=False)
        except NetworkError as err:
            raise ConfigError(str(err)) from None

    def weights_shortfall(self) -> tuple[NetworkSize, float, WorkerMemory] | None:
        """The network's size, the bytes a worker of the cell needs at least for its weights,
        gradients and optimizer state, and the memory a worker has, where the need is more
        (`check_weights_fit`); None where it is not, or either is unknown."""
        memory = self.worker_memory()
        size = self.check_network() if memory is not None else None  # answered from its check
        if size is None or memory is None:
            return None
        need = least_state_bytes(
            size.parameters,
            size.trainable,
            state_buffers=self.optimizer.state_buffers,
            value_bytes=self.distribution.weight_bytes,
            shards=self.distribution.weight_shards(self),
        )
        return (size, need, memory) if need > memory.bytes else None

    def check_weights_fit(self) -> None:
        """ConfigError where the network's weights, gradients and optimizer state alone, at
        the least a worker of the cell's distribution model holds of them, exceed the memory a
        worker has (`harness.config.weight_memory`): such a cell could only end `oom`, after
        its workers started. Nothing is ruled out where the network's size is not known
        without building it (a built-in network) or the memory is unknown."""
        shortfall = self.weights_shortfall()
        if shortfall is None:
            return
        size, need, memory = shortfall
        distribution, shards = self.distribution, self.distribution.weight_shards(self)
        state = self.optimizer.state_named
        held = (
            f"distribution={distribution.name}: each worker holds them whole"
            if shards == 1
            else f"distribution={distribution.name} divides them among {shards} workers at most"
        )
        remedy = "a smaller network, or hardware with more memory per worker"
        if shards < self.hardware.world_size:
            remedy += (
                ", or a distribution model that divides the weights among the workers "
                "(sharded or pipelined)"
            )
        raise ConfigError(
            f"{self.network.given()} cannot fit in memory: its {parameter_count(size.parameters)} "
            f"parameters need {gigabytes(need)} per worker for their "
            f"{'bfloat16' if distribution.weight_bytes == 2 else 'float32'} weights, gradients"
            f"{f' and {state}' if state else ''} alone ({held}), more than "
            f"{memory.named}; allowed: {remedy}"
        )

    def worker_memory(self) -> WorkerMemory | None:
        """The memory a worker of this cell has (`harness.config.weight_memory`): its device's,
        or on CPU workers without a limit that all run on one machine, their share of this
        machine's; None: unknown."""
        hardware = self.hardware
        if hardware.device_memory_gb is not None:
            return device_memory(hardware.device_memory_gb)
        if hardware.device is Device.cpu and hardware.on_one_machine:
            return shared_machine_memory(self.world_size)
        return None

    @property
    def samples_per_epoch(self) -> int:
        """dataset.num_samples, or the full dataset's size (Table 3.2) when it is null."""
        if self.dataset.num_samples is not None:
            return self.dataset.num_samples
        return self.dataset.spec.num_images

    def check_epoch_holds(self, batches: int, why: str, multiple: int = 1) -> None:
        """An epoch of samples_per_epoch must hold `batches` batches of the cell's batch size
        (one per data-parallel worker, or one pipeline batch). The refusal says the fix: the
        largest distribution.batch_size that fits (a multiple of `multiple`, e.g. GPipe's
        micro-batches) and the smallest dataset.num_samples; a batch larger than the whole
        dataset (num_samples null) names the batch size, which is what is wrong."""
        samples, needed = self.samples_per_epoch, self.batch_size * batches
        if samples >= needed:
            return
        largest = samples // batches // multiple * multiple
        batch_fix = (
            f"largest distribution.batch_size that works: {largest}"
            if largest
            else "no batch size fits"
        )
        if self.dataset.num_samples is None:
            raise ConfigError(
                f"distribution.batch_size={self.batch_size} is invalid: {why}, but "
                f"dataset={self.dataset.name.value} has {samples} samples "
                f"(dataset.num_samples=null); {batch_fix}"
            )
        require(
            False,
            "dataset.num_samples",
            samples,
            f"{why}; allowed: dataset.num_samples={needed} or more"
            + (f", or the {batch_fix}" if largest else ""),
        )

    @property
    def world_size(self) -> int:
        """Workers of this cell: all of the hardware's, except for a one-device model."""
        return self.distribution.workers(self.hardware)

    @property
    def batch_size(self) -> int:
        """The batch size this cell trains with (per worker, or a pipeline's whole batch):
        derived from run.global_batch where that is set, else the override, else Table 3.3 of
        docs/thesis.md."""
        if self.run.global_batch is not None:
            return self.distribution.batch_from_global(self, self.run.global_batch)
        if self.distribution.batch_size is not None:
            return self.distribution.batch_size
        return self.distribution.default_batch_size(self.dataset.name.value)

    @property
    def global_batch_size(self) -> int:
        """Samples per optimizer step over the whole cell: the batch of every worker that
        trains its own shard of the data (`DistributionConfig.data_shards`); a pipeline's batch
        (it enters the pipeline whole)."""
        return self.batch_size * self.distribution.data_shards(self)

    @property
    def run_name(self) -> str:
        """The cell's name (`tracking.run_name`, else built), led by what tells the cells of a
        sweep apart, since MLflow's runs table cuts long names: distribution model, workers
        (nodes x workers per node), GPipe's micro-batches or PipeDream's stage plan, batch
        size, then network-dataset; e.g. "gpipe 1x2 mb4 b32 resnet18-mnist"."""
        if self.tracking.run_name:
            return self.tracking.run_name
        distribution = self.distribution
        nodes, per_node = (
            (1, 1)
            if self.world_size == 1
            else (self.hardware.nodes, self.hardware.workers_per_node)
        )
        parts = [
            *distribution.run_name_head(self),
            f"{nodes}x{per_node}",
            *distribution.run_name_parts(self),
            f"b{self.batch_size}",
            f"{self.network.label}-{self.dataset.key}",
        ]
        return " ".join(parts)


def validate(
    cfg: DictConfig, *, owned: bool = False, weights_must_fit: bool = True
) -> DistbenchConfig:
    """Check a composed config and return it as typed objects; raise ConfigError if invalid.
    `cfg` is left as it was, unless the caller gives it away (`owned`: composed for this call
    alone; the dry run's cells), which saves a copy of it. A cell whose network's weights
    cannot fit its workers' memory is refused (`DistbenchConfig.check_weights_fit`), unless
    not `weights_must_fit`: a command whose answer is what fits (the recommender, the planner)
    or that reads cells measured elsewhere describes such configs without running them."""
    job = without_hydra(cfg)
    _check_known_keys(job, DistbenchConfig, "")
    if job.get("per_model"):  # else nothing to apply, and nothing to copy: to_object reads
        # an empty per_model as the field's default. `job` is a copy where Hydra's node went.
        job = with_per_model_settings(job, copy_first=job is cfg and not owned)
    try:
        config = OmegaConf.to_object(job)
    except OmegaConfBaseException as err:
        # OmegaConf wraps errors raised in __post_init__; surface ours unchanged.
        if isinstance(err.__cause__, ConfigError):
            raise err.__cause__ from None
        raise ConfigError(one_line(err)) from None
    except ConfigError:
        raise
    if not isinstance(config, DistbenchConfig):
        raise ConfigError(
            "the config is not built on distbench_schema "
            "(conf/config.yaml must list it first in its defaults)"
        )
    check_declared(config)
    if weights_must_fit:
        config.check_weights_fit()
    return config


def check_declared(node: Any, prefix: str = "") -> None:
    """Every field of every config group against what it declares it accepts
    (harness.config.accepts: range and finiteness of numbers, paths, names that become file names),
    the first one that is refused as "key=value is invalid: allowed: ...". The groups'
    `__post_init__` ran first: their own messages (and cross-field checks) win where they
    cover a value; this catches what they do not (inf, 1e15 GB, '../..' in a name)."""
    for item in dataclasses.fields(node):
        value = getattr(node, item.name)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            check_declared(value, f"{prefix}{item.name}.")
            continue
        accepts = declared(item.metadata)
        refused = allowed(accepts, value) if accepts is not None else None
        if refused is not None:
            raise ConfigError(f"{prefix}{item.name}={shown(value)} is invalid: {refused}")


def _check_known_keys(node: Any, schema: type, prefix: str) -> None:
    """Reject keys the schema does not have. `+dataset.bogus=1` (an appending override) gets
    past Hydra's own check and would be ignored silently, so a misspelled key looks applied."""
    if not isinstance(node, DictConfig) or not dataclasses.is_dataclass(schema):
        return
    # The node's own type where it has one: a model's settings subclass, not the base class
    # DistbenchConfig names.
    own_type = OmegaConf.get_type(node)
    if own_type is not None and dataclasses.is_dataclass(own_type):
        schema = own_type
    types = _type_hints(schema)
    fields = [f.name for f in dataclasses.fields(schema) if not f.name.startswith("_")]
    for key in node.keys():
        if key not in fields:
            raise ConfigError(
                unknown_key(f"{prefix}{key!s}", schema, override_value(node._get_node(str(key))))
            )
        _check_known_keys(node._get_node(str(key)), types[str(key)], f"{prefix}{key}.")


@functools.cache
def _type_hints(schema: type) -> dict[str, Any]:
    """The schema's fields' types, its string annotations resolved (once per schema: resolving
    them was a sixth of checking a cell)."""
    return typing.get_type_hints(schema)


def unknown_key(full_key: str, schema: type, value: str | None = None) -> str:
    """The one line for a key that the typed section `schema` does not have: the keys it has,
    and for a distribution setting that other models have, which models and the per-model
    form that sets it in a sweep over models (`value`: as given, where known)."""
    allowed = [f.name for f in dataclasses.fields(schema) if not f.name.startswith("_")]
    message = f"{full_key}: unknown key; allowed: {', '.join(allowed)}"
    key = full_key.rpartition(".")[2]
    if not (issubclass(schema, DistributionConfig) and full_key == f"distribution.{key}"):
        return message
    owners = [
        name
        for name, settings in sorted(DistributionConfig.models.items())
        if key in per_model_keys(settings)
    ]
    if not owners:
        return message
    model = schema.__dataclass_fields__["name"].default
    return (
        f"{message}; {key} is a setting of distribution={', '.join(owners)}"
        f"{f', not {model}' if model else ''}: in a sweep over models use "
        f"+per_model.{owners[0]}.{key}={value if value is not None else '...'}"
    )


def override_value(node: Any) -> str:
    """A config value as a command-line override writes it (`[10,5]`, `4`)."""
    value = node
    if isinstance(node, (ListConfig, DictConfig)):
        value = OmegaConf.to_container(node)
    elif isinstance(node, ValueNode):
        value = node._value()
    if isinstance(value, list):
        return f"[{','.join(map(str, value))}]"
    return str(value)


def per_model_keys(settings: type[DistributionConfig]) -> list[str]:
    """What `per_model.<model>` may set: every setting of the model but its name."""
    return [
        f.name
        for f in dataclasses.fields(settings)
        if not f.name.startswith("_") and f.name != "name"
    ]


def with_per_model_settings(cfg: DictConfig, *, copy_first: bool = True) -> DictConfig:
    """`cfg` with `per_model` applied (DistbenchConfig.per_model): every entry checked against
    its model's settings, whether or not the cell runs that model (an unknown model or key, a
    wrong type or value is refused in every cell of a sweep), the cell's own model's entry
    merged into `distribution`, and `per_model` removed. `cfg` itself is changed only where
    the caller says it owns it (`copy_first=False`)."""
    if "per_model" not in cfg:
        return cfg
    entries = cfg.per_model  # removed even when empty: a cell's key is as it was before
    for model, values in entries.items():
        _check_per_model_entry(str(model), values)
    if copy_first:
        cfg = copy.deepcopy(cfg)
    own = entries.get(OmegaConf.select(cfg, "distribution.name"))
    with open_dict(cfg):
        if own:
            cfg.distribution.merge_with(own)
        del cfg["per_model"]
    return cfg


def _check_per_model_entry(model: str, values: Any) -> None:
    """`per_model.<model>` names a model, and its keys and values are that model's settings
    (typed and checked by the model's own settings class)."""
    models = DistributionConfig.models
    if model not in models:
        raise ConfigError(
            f"per_model.{model}: unknown distribution model; allowed: {', '.join(sorted(models))}"
        )
    allowed = per_model_keys(models[model])
    if not isinstance(values, DictConfig):
        raise ConfigError(
            f"per_model.{model}={values!r} is invalid: allowed: settings of "
            f"distribution={model} by name, e.g. "
            f"+per_model.{model}.{allowed[-1]}=..."
        )
    for key in values.keys():
        if key not in allowed:
            raise ConfigError(
                f"per_model.{model}.{key!s}: unknown key; allowed: {', '.join(allowed)}"
            )
    settings = OmegaConf.structured(models[model])
    try:
        settings.merge_with(values)
        # The model's own value checks (__post_init__), then what its fields declare.
        check_declared(OmegaConf.to_object(settings), "distribution.")
    except (ConfigError, OmegaConfBaseException) as err:
        cause = err if isinstance(err, ConfigError) else err.__cause__
        if isinstance(cause, ConfigError):  # "distribution.<key>=... is invalid: ..."
            raise ConfigError(
                str(cause).replace("distribution.", f"per_model.{model}.", 1)
            ) from None
        assert isinstance(err, OmegaConfBaseException)
        key = str(err.key)
        given = override_value(values._get_node(key)) if key in values else "?"
        raise ConfigError(
            f"per_model.{model}.{key}={given} is invalid: {str(err).splitlines()[0]}"
        ) from None


def resolved_container(cfg: DictConfig) -> dict[str, Any]:
    """The config as plain data with interpolations resolved and enums as strings: the
    effective settings (`per_model` applied, with_per_model_settings)."""
    container = OmegaConf.to_container(
        with_per_model_settings(without_hydra(cfg)), resolve=True, enum_to_str=True
    )
    assert isinstance(container, dict)
    return {str(key): value for key, value in container.items()}


def without_hydra(cfg: DictConfig) -> DictConfig:
    """The config minus Hydra's own `hydra` node, which a job's config carries: a copy, the
    node left out of it (half of a cell's config: copying it cost half of `validate`)."""
    if "hydra" not in cfg:
        return cfg
    # deepcopy puts what its memo holds for a node in the node's place: an empty placeholder
    # for Hydra's, dropped from the copy below; the original keeps its node untouched.
    placeholder = DictConfig({})
    copied = copy.deepcopy(cfg, memo={id(cfg._get_node("hydra")): placeholder})
    with open_dict(copied):
        del copied["hydra"]
    return copied


def one_line(err: Exception) -> str:
    """An OmegaConf/Hydra error as one line: the message, then the cause that names the key."""
    message = str(err).split("Config search path:")[0]
    parts = [message] + ([str(err.__cause__)] if err.__cause__ is not None else [])
    lines = [line.strip() for part in parts for line in part.splitlines()]
    keep = [
        line for line in lines if line and not line.startswith(("object_type", "reference_type"))
    ]
    return " ".join("; ".join(keep).split())
