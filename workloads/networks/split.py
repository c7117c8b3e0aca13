"""Derive the layer list of a network that is not an `nn.Sequential` and defines no
`pipeline_layers()`: trace it with `torch.fx` and cut its graph where one tensor flows.

Pipelines (GPipe, PipeDream) partition a layer list into stages and FSDP shards each entry, so a
user's module or a zoo model needs one. Tracing records the forward as a graph; a point of that
graph where exactly one value (a tensor) produced so far is still needed later is a place the
model can be cut, since the part before it then hands the part after it that one tensor. The
graph is cut at such points where the forward moves from one unit of the model to the next: a
top-level submodule, or a child of the first `nn.Sequential`/`nn.ModuleList` on its path (a
ResNet's `conv1`, `bn1`, ..., `layer1.0`, `layer1.1`, ..., `avgpool`, `fc`; a ViT's
`encoder.layers.encoder_layer_0`, ...). With `blocks` (`network.blocks`, the path of the
repeated block container) each block is one layer, and what comes before the first block and
after the last is one layer each. Functional operations (`flatten`, a residual `add`, a
`getattr`) stay with the module call they follow.

Each layer is a `torch.fx.GraphModule` over the same submodules and parameters as the model (no
copies), taking one tensor and returning one tensor; the layers in order compute what the
model computes. Tracing runs no tensors, so models built on the meta device split the same way.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import operator
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import fx, nn

from workloads.datasets.spec import DatasetSpec
from workloads.networks.ref import NetworkError

_CONTAINERS = (nn.Sequential, nn.ModuleList, nn.ModuleDict)
_PRE = "<before the blocks>"
_POST = "<after the blocks>"
# Retraces with modules that branch on self.training kept whole, at most.
_MAX_RETRACES = 8
FAKE_TENSOR_LOG = "torch._subclasses.fake_tensor"


class LayerSequence(nn.Sequential):
    """A model as the `nn.Sequential` of its derived layers (`derive_layers`): the same
    submodules and parameters as the model it was derived from, computing the same; pipelines
    and FSDP take its children as the layer list. `source` names the model's class."""

    def __init__(self, layers: Sequence[nn.Module], source: str) -> None:
        super().__init__(*layers)
        self.source = source

    def extra_repr(self) -> str:
        return f"source={self.source}"


def with_layer_list(model: nn.Module, spec: DatasetSpec, blocks: str | None = None) -> nn.Module:
    """`model` itself when it already has a layer list (an `nn.Sequential`, or a model with
    `pipeline_layers()`) or none can be derived; else a `LayerSequence` of its derived
    layers."""
    if isinstance(model, nn.Sequential) or callable(getattr(model, "pipeline_layers", None)):
        return model
    layers = derive_layers(model, spec, blocks)
    return model if layers is None else LayerSequence(layers, type(model).__name__)


def derive_layers(
    model: nn.Module, spec: DatasetSpec, blocks: str | None = None
) -> list[nn.Module] | None:
    """The layers of `model` in forward order (GraphModules sharing its submodules), or None
    when it cannot be traced (data-dependent control flow, a forward that needs more than one
    input, a top-level forward that branches on `self.training`) or has fewer than two places
    where one tensor flows. `spec` gives the input's shape and dtype, which tell the tensors
    apart from other values (tuples, shapes) without running the model. Raises NetworkError
    for a `blocks` path that is not a container of the model, or whose blocks do not hand one
    tensor from one to the next."""
    if blocks:
        _check_block_container(model, blocks)
    traced = _trace(model)
    if traced is None:
        if blocks:
            raise NetworkError(
                f"network.blocks={blocks}: {type(model).__name__} cannot be "
                f"traced by torch.fx, so it cannot be split there; define "
                f"pipeline_layers() returning its layers in order"
            )
        return None
    flow = _Flow.of(traced, _tensor_values(traced, spec))
    if len(flow.cuts) < 2 and not blocks:
        return None
    keys = _block_keys(flow.paths, blocks) if blocks else _unit_keys(flow.paths, model)
    cuts = [i for i in flow.cuts if keys[i] != keys[i + 1]]
    if blocks:
        _check_blocks(cuts, keys, blocks)
    if not cuts:
        return None
    layers = flow.segments(traced, cuts)
    for layer in layers:  # a forward that reads self.training reads the layer's own mode
        layer.training = model.training
    return layers


# --- tracing -------------------------------------------------------------------------------


def _trace(model: nn.Module) -> fx.GraphModule | None:
    """The forward as a graph with one placeholder, or None.

    Traced in training and in eval mode: code that reads `self.training` is frozen into the
    mode it was traced in. Where the two graphs differ only in a flag that is True in one and
    False in the other (`F.dropout(x, p, training=self.training)`), the flag is read from the
    layer's mode at run time; where they differ otherwise, the module whose forward branched
    is kept whole (a leaf, which decides at run time, as Dropout does; torchvision's
    StochasticDepth is one) and the model traced again. A model whose own forward branches
    is not split."""
    leaves: tuple[type[nn.Module], ...] = ()
    for _ in range(_MAX_RETRACES):
        in_training, in_eval = _trace_in_modes(model, leaves)
        if in_training is None or in_eval is None:
            return None
        if in_training.code == in_eval.code:
            return in_eval
        following = _follow_mode(in_training, in_eval)
        if following is not None:
            return following
        culprit = _branching_module(in_training.graph, in_eval.graph)
        if culprit is None or culprit in leaves or isinstance(model, culprit):
            return None
        leaves = (*leaves, culprit)
    return None


def _trace_in_modes(
    model: nn.Module, leaves: tuple[type[nn.Module], ...]
) -> tuple[fx.GraphModule | None, fx.GraphModule | None]:
    with _mode(model, training=True):
        in_training = _trace_once(model, leaves)
    with _mode(model, training=False):
        in_eval = _trace_once(model, leaves)
    return in_training, in_eval


@contextlib.contextmanager
def _mode(model: nn.Module, training: bool) -> Iterator[None]:
    """`model` in training or eval mode, every module's own mode restored after."""
    modes = {module: module.training for module in model.modules()}
    model.train(training)
    try:
        yield
    finally:
        for module, mode in modes.items():
            module.training = mode


def _follow_mode(in_training: fx.GraphModule, in_eval: fx.GraphModule) -> fx.GraphModule | None:
    """`in_eval` reading `self.training` for the arguments that are True in `in_training` and
    False in it, or None when the graphs differ in anything else."""
    flags: list[tuple[fx.Node, int | str]] = []
    pairs = list(zip(in_training.graph.nodes, in_eval.graph.nodes))
    if len(pairs) != len(in_eval.graph.nodes) or len(pairs) != len(in_training.graph.nodes):
        return None
    for mine, theirs in pairs:
        if (mine.op, mine.target, mine.name, len(mine.args), mine.kwargs.keys()) != (
            theirs.op,
            theirs.target,
            theirs.name,
            len(theirs.args),
            theirs.kwargs.keys(),
        ):
            return None
        places: list[tuple[int | str, object, object]] = [
            *zip(range(len(mine.args)), mine.args, theirs.args),
            *((key, mine.kwargs[key], theirs.kwargs[key]) for key in mine.kwargs),
        ]
        for place, trained, evaluated in places:
            if trained is True and evaluated is False:
                flags.append((theirs, place))
            elif str(trained) != str(evaluated):
                return None
    if not flags:
        return None
    graph = in_eval.graph
    for node, place in flags:
        with graph.inserting_before(node):  # the GraphModule's own mode (a bool, no tensor)
            training = graph.create_node("get_attr", "training")
        if isinstance(place, int):
            node.update_arg(place, training)
        else:
            node.update_kwarg(place, training)
    in_eval.recompile()
    return in_eval


def _branching_module(first: fx.Graph, second: fx.Graph) -> type[nn.Module] | None:
    """The class of the module whose forward made two traces differ (at their first differing
    node), or None when it is the model's own forward."""
    first_nodes, second_nodes = list(first.nodes), list(second.nodes)
    for index in range(max(len(first_nodes), len(second_nodes))):
        mine = first_nodes[index] if index < len(first_nodes) else None
        theirs = second_nodes[index] if index < len(second_nodes) else None
        if mine is None or theirs is None or mine.format_node() != theirs.format_node():
            node = mine if mine is not None and mine.op != "output" else theirs
            return _calling_module(node) if node is not None else None
    return None


def _calling_module(node: fx.Node) -> type[nn.Module] | None:
    """The class of the module whose forward created `node` (for a leaf module's call, the
    module that called it)."""
    stack = list((node.meta.get("nn_module_stack") or {}).values())
    if node.op == "call_module":
        stack = stack[:-1]
    if not stack:
        return None
    cls = stack[-1][1]
    return cls if isinstance(cls, type) and issubclass(cls, nn.Module) else None


def _trace_once(model: nn.Module, leaves: tuple[type[nn.Module], ...]) -> fx.GraphModule | None:
    concrete = _defaulted_arguments(model)
    if concrete is None:
        return None
    for tracer in _tracers(model, leaves):
        try:
            graph = tracer.trace(model, concrete_args=concrete or None)
        except Exception:  # noqa: BLE001, S112 - untraceable Python: try the next tracer
            continue
        traced = fx.GraphModule(tracer.root, graph, type(model).__name__)
        if _drop_extra_inputs(traced.graph):
            return traced
        return None
    return None


def _defaulted_arguments(model: nn.Module) -> dict[str, object] | None:
    """The forward's arguments after the input, fixed at their defaults (`mask=None`), or None
    when one has no default (the forward needs more than one input)."""
    try:
        parameters = list(inspect.signature(model.forward).parameters.values())
    except (TypeError, ValueError):
        return {}
    concrete: dict[str, object] = {}
    for parameter in parameters[1:]:
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            continue
        if parameter.default is parameter.empty:
            return None
        concrete[parameter.name] = parameter.default
    return concrete


def _drop_extra_inputs(graph: fx.Graph) -> bool:
    """Remove the placeholders of defaulted arguments and the guards fx adds for them (they
    check the argument still has its default); False when the computation uses one."""
    placeholders = [node for node in graph.nodes if node.op == "placeholder"]
    if not placeholders:
        return False
    extra = set(placeholders[1:])
    for node in graph.nodes:
        if any(arg in extra for arg in node.all_input_nodes) and node.op != "placeholder":
            extra.add(node)
    for node in extra:
        if any(user not in extra for user in node.users):
            return False
    for node in reversed(list(graph.nodes)):
        if node in extra:
            graph.erase_node(node)
    graph.lint()
    return True


class _Tracer(fx.Tracer):
    """torch.fx's tracer, keeping modules of the given classes whole (leaves)."""

    def __init__(
        self, leaves: tuple[type[nn.Module], ...], functions: tuple[Callable[..., object], ...] = ()
    ) -> None:
        super().__init__(autowrap_functions=functions)
        self.leaves = leaves

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        return isinstance(m, self.leaves) or super().is_leaf_module(m, module_qualified_name)


def _tracers(model: nn.Module, leaves: tuple[type[nn.Module], ...]) -> Iterable[fx.Tracer]:
    """torch.fx's tracer; for a timm model then one that also keeps timm's untraceable modules
    and functions whole (timm registers them for its own fx feature extraction)."""
    yield _Tracer(leaves)
    if type(model).__module__.split(".")[0] == "timm":
        from timm.layers import _fx as timm_fx  # only for timm models, which imported it

        yield _Tracer(
            (*leaves, *timm_fx.get_notrace_modules()), tuple(timm_fx.get_notrace_functions())
        )


def _tensor_values(traced: fx.GraphModule, spec: DatasetSpec) -> Callable[[fx.Node], bool]:
    """Which nodes produce a tensor: shapes propagated with fake tensors (nothing is computed,
    and it works for meta parameters); where that fails, every value that is not unpacked
    like a tuple is taken for one."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    parameter = next(traced.parameters(), None)
    device = parameter.device if parameter is not None else torch.device("cpu")
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    example = torch.empty((2, *spec.input_shape), dtype=spec.input_dtype, device=device)
    try:
        # In eval mode: in training mode BatchNorm would count the fake batch in the real
        # num_batches_tracked.
        with _mode(traced, training=False), torch.no_grad(), quiet_logger(FAKE_TENSOR_LOG):
            FakeTensorProp(traced, mode).propagate(mode.from_tensor(example))
    except Exception:  # noqa: BLE001 - unknown to fake tensors: fall back on the graph's form
        return lambda node: (
            not all(
                user.op == "call_function" and user.target is operator.getitem
                for user in node.users
            )
        )
    return lambda node: isinstance(node.meta.get("val"), torch.Tensor)


@contextlib.contextmanager
def quiet_logger(name: str) -> Iterator[None]:
    """Logger `name` silent below CRITICAL: fake (and meta) tensors log a traceback for an op
    they cannot run, which the callers report, or fall back on, themselves."""
    logger = logging.getLogger(name)
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)


# --- where one tensor flows ------------------------------------------------------------------


@dataclass
class _Flow:
    """The traced graph as a line of computing nodes.

    Attributes:
        nodes: the nodes that depend on the input, in graph order (nodes that do not, such as
            a parameter's `get_attr`, are copied into each layer that uses them).
        paths: the module path each node runs in ("" for the top-level forward).
        cuts: indices i where the graph can be cut after nodes[i]: exactly one value produced
            up to there, a tensor and not the input itself, is used after it.
        handed: the value handed on at each cut.
        source: the input placeholder; result: the value the model returns.
    """

    nodes: list[fx.Node]
    paths: list[str]
    cuts: list[int]
    handed: dict[int, fx.Node]
    source: fx.Node
    result: fx.Node

    @classmethod
    def of(cls, traced: fx.GraphModule, is_tensor: Callable[[fx.Node], bool]) -> _Flow:
        graph_nodes = list(traced.graph.nodes)
        source = graph_nodes[0]
        output = graph_nodes[-1]
        dependent = {source}
        for node in graph_nodes[1:-1]:
            if any(arg in dependent for arg in node.all_input_nodes):
                dependent.add(node)
        nodes = [node for node in graph_nodes[1:-1] if node in dependent]
        position = {node: index for index, node in enumerate(nodes)}
        position[source] = -1
        position[output] = len(nodes)
        last_use = {
            node: max((position[user] for user in node.users), default=-2)
            for node in (source, *nodes)
        }
        expiring: dict[int, list[fx.Node]] = {}
        for node, last in last_use.items():
            expiring.setdefault(last, []).append(node)
        live = {source} if last_use[source] >= 0 else set()
        cuts: list[int] = []
        handed: dict[int, fx.Node] = {}
        for index, node in enumerate(nodes[:-1]):
            if last_use[node] > index:
                live.add(node)
            live.difference_update(expiring.get(index, ()))
            if len(live) == 1:
                (value,) = live
                if value is not source and is_tensor(value):
                    cuts.append(index)
                    handed[index] = value
        result = output.args[0]
        if not isinstance(result, fx.Node) or result not in dependent:
            return cls(nodes, [_path(node) for node in nodes], [], {}, source, source)
        return cls(nodes, [_path(node) for node in nodes], cuts, handed, source, result)

    def segments(self, traced: fx.GraphModule, cuts: list[int]) -> list[nn.Module]:
        """One GraphModule per stretch between the chosen cuts."""
        bounds = [-1, *cuts, len(self.nodes) - 1]
        layers: list[nn.Module] = []
        for start, end in zip(bounds, bounds[1:]):
            given = self.source if start < 0 else self.handed[start]
            returned = self.result if end == len(self.nodes) - 1 else self.handed[end]
            layers.append(_layer(traced, self.nodes[start + 1 : end + 1], given, returned))
        return layers


def _path(node: fx.Node) -> str:
    """The module a node runs in: a leaf module's own path, else the innermost module whose
    forward was being traced ("" for the model's own forward)."""
    if node.op == "call_module":
        return str(node.target)
    stack = node.meta.get("nn_module_stack")
    if not stack:
        return ""
    return str(list(stack.values())[-1][0])


def _layer(
    traced: fx.GraphModule, nodes: list[fx.Node], given: fx.Node, returned: fx.Node
) -> fx.GraphModule:
    """A GraphModule computing `nodes` from `given` to `returned`; it holds the same
    submodules and parameters as `traced` (GraphModule copies references, not tensors)."""
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {given: graph.placeholder(given.name)}

    def lookup(node: fx.Node) -> fx.Node:
        if node not in env:  # a value that does not depend on the input (a parameter)
            env[node] = graph.node_copy(node, lookup)
        return env[node]

    for node in nodes:
        env[node] = graph.node_copy(node, lookup)
    graph.output(lookup(returned))
    return fx.GraphModule(traced, graph, "Layer")


# --- which unit of the model each node belongs to ----------------------------------------------


def _unit_keys(paths: list[str], model: nn.Module) -> list[str]:
    """Per node, its unit: the path up to the child of the first container on it (`layer1.0`,
    `features.3`, `blocks.0`), else its top-level submodule (`conv1`, `stem`); nodes of the
    model's own forward join the unit before them."""
    units: dict[str, str] = {}
    keys = []
    for path in paths:
        if path and path not in units:
            units[path] = _unit(path, model)
        keys.append(units.get(path, ""))
    return _inherit(keys)


def _unit(path: str, model: nn.Module) -> str:
    parts = path.split(".")
    module: nn.Module | None = model
    for depth, part in enumerate(parts[:-1]):
        module = getattr(module, part, None) if module is not None else None
        if isinstance(module, _CONTAINERS):
            return ".".join(parts[: depth + 2])
    return parts[0]


def _inherit(keys: list[str]) -> list[str]:
    """Empty keys take the key before them (the first ones the first key that is set)."""
    first = next((key for key in keys if key), "")
    result = []
    previous = first
    for key in keys:
        previous = key or previous
        result.append(previous)
    return result


def _check_block_container(model: nn.Module, blocks: str) -> None:
    try:
        container = model.get_submodule(blocks)
    except AttributeError:
        raise NetworkError(
            f"network.blocks={blocks}: {type(model).__name__} has no submodule "
            f"{blocks!r}; name the dotted path of its repeated block container "
            f"(e.g. blocks, layers, transformer.h)"
        ) from None
    if not isinstance(container, _CONTAINERS) or not list(container.children()):
        raise NetworkError(
            f"network.blocks={blocks}: is a {type(container).__name__}, not an "
            f"nn.ModuleList or nn.{nn.Sequential.__name__} of blocks; name the "
            f"container of the repeated blocks"
        )


def _block_keys(paths: list[str], blocks: str) -> list[str]:
    """Per node: its block (`blocks.3`), or one key for everything before the first block and
    one for everything after the last; other nodes between blocks join the block before."""
    prefix = blocks + "."
    keys = [
        prefix + path[len(prefix) :].split(".")[0] if path.startswith(prefix) else ""
        for path in paths
    ]
    inside = [index for index, key in enumerate(keys) if key]
    if not inside:
        raise NetworkError(
            f"network.blocks={blocks}: the forward never calls a module in "
            f"{blocks}; name the container whose blocks the forward runs"
        )
    for index in range(len(keys)):
        if index < inside[0]:
            keys[index] = _PRE
        elif index > inside[-1]:
            keys[index] = _POST
    return _inherit(keys)


def _check_blocks(cuts: list[int], keys: list[str], blocks: str) -> None:
    """Each block must end up a layer of its own: a block that hands more than one value to
    the next (or a non-tensor) cannot be cut from it."""
    starts = [0, *(cut + 1 for cut in cuts)]
    for start, end in zip(starts, [*starts[1:], len(keys)]):
        block_keys = {key for key in keys[start:end] if key not in (_PRE, _POST)}
        if len(block_keys) > 1:
            names = sorted(block_keys)
            raise NetworkError(
                f"network.blocks={blocks}: {names[0]} and {names[1]} cannot be "
                f"cut apart (more than one value, or a value that is not a "
                f"tensor, passes between them); define pipeline_layers() "
                f"returning the model's layers in order"
            )
