"""Networks that are not built in: a user's own module, and torchvision and timm models by name.

`network=module network.target=mypkg.models:build` calls the factory (or `nn.Module` class)
`build` of the importable module `mypkg.models` with `network.kwargs` as keyword arguments; a
factory with a parameter named `dataset` that `network.kwargs` does not set receives the
dataset's `DatasetSpec` (channels, resolution, classes, or for tokens the vocabulary and
sequence length), so it can size its input and output to the data. `network=torchvision` and
`network=timm` build `network.arch` from the zoo with random weights (nothing is downloaded),
for the dataset unless `network.kwargs` says otherwise: its classes (`num_classes`), its
channels (timm's `in_chans`; torchvision's first 3-channel convolution is replaced by one for
grayscale), and its resolution for models built for one image size (torchvision's ViTs'
`image_size`, timm's `img_size` where its config has a fixed input size).

Each of the three builders is its source's (`workloads.networks.sources`). A model that is
not an `nn.Sequential` and defines no `pipeline_layers()` is split by tracing
(`workloads.networks.split`): where that works the model is returned as a `LayerSequence` of
its layers (the same modules and parameters, computing the same), which pipelines and FSDP
use; where it does not, the model is returned unchanged and has no layer list.
"""

from __future__ import annotations

import contextlib
import difflib
import importlib
import inspect
import re
from collections.abc import Callable, Iterator, Sequence
from typing import Any
from unittest import mock

import torch
from torch import nn

from workloads.datasets.spec import DatasetSpec
from workloads.networks.ref import NetworkError, NetworkRef
from workloads.networks.split import with_layer_list
from workloads.networks.user_code import refuse_standard_library, run_as_checked

# Longest exception message quoted in an error (a user's exception may carry a whole dump).
_MAX_MESSAGE = 300
_UNEXPECTED_KEYWORD = re.compile(r"unexpected keyword argument '(\w+)'")
# torchvision models with auxiliary classifiers: a network returns one tensor of logits.
_AUXILIARY_HEADS = ("googlenet", "inception_v3")


def build_module(ref: NetworkRef, spec: DatasetSpec) -> nn.Module:
    """`network.source=module`: the user's factory or class `ref.target` called with its
    keyword arguments, for `spec`."""
    return with_layer_list(_build_module(ref, spec), spec, ref.blocks)


def build_torchvision(ref: NetworkRef, spec: DatasetSpec) -> nn.Module:
    """`network.source=torchvision`: the torchvision classification model `ref.arch`, random
    weights, for `spec`."""
    return with_layer_list(_build_torchvision(ref, spec), spec, ref.blocks)


def build_timm(ref: NetworkRef, spec: DatasetSpec) -> nn.Module:
    """`network.source=timm`: the timm model `ref.arch`, `pretrained=False`, for `spec`."""
    return with_layer_list(_build_timm(ref, spec), spec, ref.blocks)


# --- a user's module ------------------------------------------------------------------------


def _build_module(ref: NetworkRef, spec: DatasetSpec) -> nn.Module:
    target = ref.target or ""
    factory = _resolve(target)
    kwargs = _factory_kwargs(target, factory, ref.options, spec)
    try:
        # Called once: a failure of its own is the refusal (the user's code may print, write
        # or wait each time it runs). Only where it failed for the meta device itself, reading
        # a value no meta tensor holds (stochastic depth's rates off `torch.linspace(...)
        # .tolist()`, as many ViT factories compute them), is it built once more computing on
        # the CPU, its weights still on meta (`_build`'s second way): the one way to check it.
        with _as_checked(target, "calling it"):
            model = _build_once(lambda: factory(**kwargs), again_if=_failed_for_meta)
    except NetworkError:
        raise
    except Exception as exc:  # noqa: BLE001 - the user's code may raise anything: one line
        given = f" with network.kwargs {', '.join(sorted(ref.options))}" if ref.options else ""
        raise NetworkError(
            f"network.target={target}: calling it{given} raised {_one_line(exc)}"
        ) from exc
    if not isinstance(model, nn.Module):
        raise NetworkError(
            f"network.target={target}: returned a {type(model).__name__}, not "
            f"a torch.nn.Module; name a factory that returns the model, or the "
            f"model's nn.Module class"
        )
    return model


def _failed_for_meta(exc: BaseException) -> bool:
    """Whether a build failed for the meta device itself: it read a tensor's value, which a
    meta tensor does not hold (`.item()`, `.tolist()`: "Cannot copy out of meta tensor",
    "Tensor.item() cannot be called on meta tensors")."""
    return "meta tensor" in _text_of(exc)


def _as_checked(target: str, what: str) -> contextlib.AbstractContextManager[None]:
    """The user's code bounded while a config is checked, on the meta device (`user_code`);
    as written where a worker builds the network for real."""
    if torch.get_default_device().type == "meta":
        return run_as_checked(target, what)
    return contextlib.nullcontext()


def _resolve(target: str) -> Callable[..., Any]:
    """The callable "package.module:attribute" (or "package.module.attribute") names."""
    if ":" in target:
        module_name, _, attribute = target.partition(":")
    else:
        module_name, _, attribute = target.rpartition(".")
    if not module_name or not attribute:
        raise NetworkError(
            f'network.target={target!r}: expected "package.module:factory" '
            f"(or package.module.factory), an importable module and a factory "
            f"function or nn.Module class in it"
        )
    refuse_standard_library(target, module_name)
    try:
        with _as_checked(target, f"importing {module_name}"):
            found: Any = importlib.import_module(module_name)
    except NetworkError:
        raise
    except ImportError as exc:
        raise NetworkError(
            f"network.target={target}: module {module_name} does not import "
            f"({_one_line(exc)}); the package must be importable where the cell "
            f"runs (installed, or its directory on PYTHONPATH)"
        ) from exc
    except Exception as exc:  # noqa: BLE001 - the module's own code failed: one line
        raise NetworkError(
            f"network.target={target}: importing module {module_name} raised {_one_line(exc)}"
        ) from exc
    owner = module_name
    for name in attribute.split("."):
        if not hasattr(found, name):
            raise NetworkError(
                f"network.target={target}: {owner} has no attribute {name!r}"
                f"{_close_matches(name, dir(found))}"
            )
        found, owner = getattr(found, name), f"{owner}.{name}"
    if not callable(found):
        raise NetworkError(
            f"network.target={target}: {owner} is a {type(found).__name__}, "
            f"not a factory function or nn.Module class"
        )
    return found


def _factory_kwargs(
    target: str, factory: Callable[..., Any], options: dict[str, Any], spec: DatasetSpec
) -> dict[str, Any]:
    """`network.kwargs`, plus `dataset=spec` where the factory takes a `dataset` the kwargs do
    not set; a key the factory does not take, or a parameter it needs that is not set, is
    named before anything is called."""
    try:
        parameters = inspect.signature(factory).parameters
    except (TypeError, ValueError):  # a builtin or extension without a signature: just call it
        return options
    kwargs = dict(options)
    if "dataset" in parameters and "dataset" not in kwargs:
        kwargs["dataset"] = spec
    named = {
        name
        for name, parameter in parameters.items()
        if parameter.kind in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY)
    }
    takes_any = any(parameter.kind is parameter.VAR_KEYWORD for parameter in parameters.values())
    for key in kwargs:
        if key not in named and not takes_any:
            raise NetworkError(
                f"network.kwargs.{key}: {target} takes no argument {key!r}; "
                f"its arguments: {', '.join(sorted(named)) or 'none'}"
            )
    missing = [
        name
        for name in named
        if parameters[name].default is parameters[name].empty and name not in kwargs
    ]
    if missing:
        raise NetworkError(
            f"network.target={target}: needs argument(s) {', '.join(missing)}; "
            f"set them with +network.kwargs.{missing[0]}=..."
        )
    return kwargs


# --- torchvision and timm ---------------------------------------------------------------------


def _build_torchvision(ref: NetworkRef, spec: DatasetSpec) -> nn.Module:
    import torchvision.models

    arch = _image_arch(ref, spec)
    names = torchvision.models.list_models(module=torchvision.models)
    if arch not in names:
        raise NetworkError(
            f"network.arch={arch}: not a torchvision classification model"
            f"{_close_matches(arch, names)}; torchvision.models.list_models("
            f"module=torchvision.models) lists them"
        )
    kwargs = _zoo_kwargs(ref, forbidden="weights")
    kwargs.setdefault("num_classes", spec.num_classes)
    if arch in _AUXILIARY_HEADS:  # in training they return a tuple with the side heads' logits
        kwargs.setdefault("aux_logits", False)
    if torchvision.models.get_model_builder(arch).__module__.endswith(".vision_transformer"):
        kwargs.setdefault("image_size", spec.resolution)  # a ViT is built for one image size
    model = _zoo_call(arch, lambda: torchvision.models.get_model(arch, weights=None, **kwargs))
    if spec.channels != 3:
        _adapt_input_channels(model, arch, spec)
    return model


def _build_timm(ref: NetworkRef, spec: DatasetSpec) -> nn.Module:
    import timm

    arch = _image_arch(ref, spec)
    if ":" in arch or "/" in arch:  # hf-hub:..., local-dir:...: a config read from elsewhere
        raise NetworkError(
            f"network.arch={arch}: only timm's own model names are built (from "
            f"their code, random weights, nothing downloaded); timm.list_models() "
            f"lists them"
        )
    if not timm.is_model(arch):
        raise NetworkError(
            f"network.arch={arch}: not a timm model"
            f"{_close_matches(arch, timm.list_models())}; timm.list_models() "
            f"lists them"
        )
    kwargs = _zoo_kwargs(ref, forbidden="pretrained")
    kwargs.setdefault("num_classes", spec.num_classes)
    kwargs.setdefault("in_chans", spec.channels)
    cfg = timm.models.get_pretrained_cfg(arch)  # the registry's entry: nothing is read
    if (
        cfg is not None
        and cfg.fixed_input_size
        and "img_size" not in kwargs
        and tuple(cfg.input_size[-2:]) != (spec.resolution, spec.resolution)
    ):
        # A ViT-like model is built for one image size: the dataset's, where it takes one.
        try:
            return _build(
                lambda: timm.create_model(
                    arch, pretrained=False, img_size=spec.resolution, **kwargs
                )
            )
        except TypeError as exc:
            if "img_size" not in str(exc):
                raise NetworkError(
                    f"network.arch={arch}: building it raised {_one_line(exc)}"
                ) from exc
    return _zoo_call(arch, lambda: timm.create_model(arch, pretrained=False, **kwargs))


def _image_arch(ref: NetworkRef, spec: DatasetSpec) -> str:
    arch = ref.arch or ""
    if spec.tokens:
        raise NetworkError(
            f"network.arch={arch}: network.source={ref.source} builds an image "
            f"network on token data (dataset={spec.name}); choose an image "
            f"dataset, or a language model (network=hf, or network=module)"
        )
    return arch


def _zoo_kwargs(ref: NetworkRef, forbidden: str) -> dict[str, Any]:
    kwargs = ref.options
    if forbidden in kwargs:
        raise NetworkError(
            f"network.kwargs.{forbidden}: zoo models are built with random "
            f"weights (nothing is downloaded); remove it"
        )
    return kwargs


def _zoo_call(arch: str, build: Callable[[], nn.Module]) -> nn.Module:
    try:
        return _build(build)
    except Exception as exc:  # noqa: BLE001 - the zoo's builders raise many kinds: one line
        unexpected = _UNEXPECTED_KEYWORD.search(str(exc))
        key = f"network.kwargs.{unexpected.group(1)}" if unexpected else f"network.arch={arch}"
        raise NetworkError(f"{key}: building {arch} raised {_one_line(exc)}") from exc


def _adapt_input_channels(model: nn.Module, arch: str, spec: DatasetSpec) -> None:
    """torchvision's models take RGB: the first 3-channel convolution (the stem, first in
    every torchvision model's module order) is replaced by one taking the dataset's
    channels, as timm does with `in_chans`."""
    for name, module in model.named_modules():
        if isinstance(module, nn.Conv2d) and module.in_channels == 3:
            parent_name, _, child = name.rpartition(".")
            geometry: dict[str, Any] = {
                "kernel_size": module.kernel_size,
                "stride": module.stride,
                "padding": module.padding,
                "dilation": module.dilation,
                "groups": module.groups,
                "bias": module.bias is not None,
                "padding_mode": module.padding_mode,
            }
            stem = nn.Conv2d(
                spec.channels, module.out_channels, **geometry, device=module.weight.device
            )
            setattr(model.get_submodule(parent_name), child, stem)
            return
    raise NetworkError(
        f"network.arch={arch}: has no 3-channel input convolution to adapt to "
        f"dataset={spec.name}'s {spec.channels} channel(s); choose an RGB dataset"
    )


# --- building on the meta device -------------------------------------------------------------


def _build(build: Callable[[], Any]) -> Any:
    """`build()` of a zoo's builder; on the meta device (where a config is checked) a builder
    that computes its configuration with tensors (torchvision's RegNets call `.tolist()`)
    fails, so it is built again computing on the CPU, each parameter and buffer moved to the
    meta device as the modules register it (no memory for weights is kept). A user's factory
    is built again only where it failed for the meta device itself (`_build_module`)."""
    return _build_once(build, again_if=lambda exc: True)


def _build_once(build: Callable[[], Any], *, again_if: Callable[[Exception], bool]) -> Any:
    """`build()`; on the meta device, where it failed so that `again_if(error)`, built once more
    computing on the CPU with its weights on meta (`_weights_on_meta`); the first error is the
    one raised if that fails too."""
    try:
        return build()
    except Exception as exc:
        if torch.get_default_device().type != "meta" or not again_if(exc):
            raise
        first = exc
    try:
        with _weights_on_meta():
            return build()
    except Exception:  # noqa: BLE001 - the first error is the one that explains
        raise first from None


@contextlib.contextmanager
def _weights_on_meta() -> Iterator[None]:
    """Compute on the CPU, but register every parameter and buffer on the meta device (what
    `accelerate.init_empty_weights` does)."""
    register_parameter = nn.Module.register_parameter
    register_buffer = nn.Module.register_buffer

    def parameter_on_meta(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
        if param is not None and not param.is_meta:
            param = nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)
        register_parameter(module, name, param)

    def buffer_on_meta(
        module: nn.Module, name: str, tensor: torch.Tensor | None, persistent: bool = True
    ) -> None:
        register_buffer(module, name, None if tensor is None else tensor.to("meta"), persistent)

    with (
        torch.device("cpu"),
        mock.patch.object(nn.Module, "register_parameter", parameter_on_meta),
        mock.patch.object(nn.Module, "register_buffer", buffer_on_meta),
    ):
        yield


# --- messages -------------------------------------------------------------------------------


def _text_of(exc: BaseException) -> str:
    """`str(exc)`, or what can be said of it where its own `__str__` fails (a user's
    exception class may raise there too)."""
    try:
        return str(exc)
    except Exception as err:  # noqa: BLE001 - whatever its __str__ raised
        return f"(its message could not be read: {type(err).__name__})"


def _one_line(exc: BaseException) -> str:
    """`Type: message` on one line, shortened."""
    message = " ".join(_text_of(exc).split())
    if len(message) > _MAX_MESSAGE:
        message = message[: _MAX_MESSAGE - 3] + "..."
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


def _close_matches(name: str, names: Sequence[str]) -> str:
    close = difflib.get_close_matches(name, names, n=5, cutoff=0.6)
    return f" (close: {', '.join(close)})" if close else ""
