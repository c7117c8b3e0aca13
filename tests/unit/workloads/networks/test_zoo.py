"""A user's own module, torchvision and timm models by name (`workloads.networks.zoo`), and the
layer lists derived from them by tracing (`workloads.networks.split`): the layers compute what
the model computes with the model's own parameters, on CPU and on the meta device, and every
bad setting is one line naming its key."""

from __future__ import annotations

import socket
import sys
import textwrap

import pytest
import torch
from torch import nn

from workloads.datasets.spec import DATASET_SPECS
from workloads.networks import build_network, layer_count, to_layer_list
from workloads.networks.ref import NetworkError, NetworkRef, canonical_json
from workloads.networks.split import LayerSequence, derive_layers

CIFAR = DATASET_SPECS["cifar10"]
MNIST = DATASET_SPECS["mnist"]
TOKENS = DATASET_SPECS["tokens"]

USER_MODELS = textwrap.dedent('''
    import torch
    from torch import nn


    class Block(nn.Module):
        def __init__(self, width):
            super().__init__()
            self.conv = nn.Conv2d(width, width, 3, padding=1, bias=False)
            self.norm = nn.BatchNorm2d(width)

        def forward(self, x):
            return torch.relu(x + self.norm(self.conv(x)))


    class TinyNet(nn.Module):
        """Not an nn.Sequential: a stem, residual blocks in a ModuleList, a flatten."""

        def __init__(self, width=8, classes=10, channels=3):
            super().__init__()
            self.stem = nn.Conv2d(channels, width, 3, padding=1)
            self.act = nn.ReLU()
            self.blocks = nn.ModuleList(Block(width) for _ in range(3))
            self.pool = nn.AdaptiveAvgPool2d(1)
            self.head = nn.Linear(width, classes)

        def forward(self, x, scale=None):
            x = self.act(self.stem(x))
            for block in self.blocks:
                x = block(x)
            x = torch.flatten(self.pool(x), 1)
            return self.head(x)


    def build(width=8):
        return TinyNet(width)


    class SizedNet(TinyNet):
        """Sized by the dataset it is given."""

        def __init__(self, dataset, width=4):
            super().__init__(width, dataset.num_classes, dataset.channels)


    class Untraceable(TinyNet):
        def forward(self, x):
            if x.sum() > 0:  # data-dependent control flow: torch.fx cannot trace it
                return super().forward(x)
            return super().forward(-x)


    class FunctionalDropout(TinyNet):
        """Reads self.training in its own forward, as timm's heads do."""

        def forward(self, x):
            x = self.act(self.stem(x))
            for block in self.blocks:
                x = block(x)
            x = nn.functional.dropout(x.mean((2, 3)), 0.5, training=self.training)
            return self.head(x)


    class TinyLM(nn.Module):
        """A language model: token ids (N, T) in, logits (N, T, vocab) out."""

        def __init__(self, dataset, width=16):
            super().__init__()
            self.embed = nn.Embedding(dataset.vocab_size, width)
            self.layers = nn.ModuleList(
                nn.TransformerEncoderLayer(width, 2, 32, dropout=0.1, batch_first=True)
                for _ in range(2))
            self.out = nn.Linear(width, dataset.vocab_size)

        def forward(self, ids):
            x = self.embed(ids)
            for layer in self.layers:
                x = layer(x)
            return self.out(x)


    def needs_depth(depth):
        return TinyNet()


    def broken():
        raise RuntimeError("boom\\non two lines")


    def not_a_module():
        return 42


    NOT_CALLABLE = 3


    def exits():
        import sys

        sys.exit(3)


    def sleeps():
        import time

        time.sleep(30)


    def floods():
        for line in range(5000):
            print("flood", line)
        return TinyNet()


    CALLS = []


    def counted(width=8):
        CALLS.append("counted")
        return nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, width), nn.Linear(width, 10))


    def counted_then_fails():
        CALLS.append("counted_then_fails")
        raise ValueError("no model today")


    def reads_a_tensor():
        CALLS.append("reads_a_tensor")
        rates = torch.linspace(0, 0.1, 4).tolist()
        return nn.Sequential(nn.Flatten(), nn.Dropout(rates[-1]), nn.Linear(3 * 32 * 32, 10))
''')


@pytest.fixture(autouse=True)
def no_network(monkeypatch):
    """Nothing may be downloaded: any connection attempt fails the test."""

    def refuse(*args, **kwargs):
        raise AssertionError(f"network access attempted: {args}")

    monkeypatch.setattr(socket.socket, "connect", refuse)


@pytest.fixture
def userpkg(tmp_path, monkeypatch):
    """An importable package `userpkg` written at test time, as a user's own would be."""
    package = tmp_path / "userpkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "models.py").write_text(USER_MODELS)
    (package / "needs_dep.py").write_text("import a_package_that_is_not_installed\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield package
    for name in [name for name in sys.modules if name.split(".")[0] == "userpkg"]:
        del sys.modules[name]


def module_ref(target: str, blocks: str | None = None, **kwargs) -> NetworkRef:
    return NetworkRef(
        name="mine",
        source="module",
        target=target,
        options_json=canonical_json(kwargs),
        blocks=blocks,
    )


def zoo_ref(source: str, arch: str, **kwargs) -> NetworkRef:
    return NetworkRef(name=arch, source=source, arch=arch, options_json=canonical_json(kwargs))


def assert_splits_exactly(model: nn.Module, layers: list[nn.Module] | None, spec, train=False):
    """The layers in order compute what the model computes, with the model's parameters."""
    assert layers is not None
    inputs, _ = spec.example_batch(2, torch.Generator().manual_seed(0))
    sequence = LayerSequence(layers, type(model).__name__)
    model.train(train)
    sequence.train(train)
    with torch.no_grad():
        torch.manual_seed(1)
        expected = model(inputs)
        torch.manual_seed(1)
        got = sequence(inputs)
    assert torch.equal(got, expected)
    mine = {id(p): p.data_ptr() for p in model.parameters()}
    theirs = {id(p): p.data_ptr() for layer in layers for p in layer.parameters()}
    assert theirs == mine  # the same Parameter objects: no copies


def one_line_error(call, key: str) -> str:
    with pytest.raises(NetworkError) as raised:
        call()
    message = str(raised.value)
    assert key in message and "\n" not in message, message
    return message


# --- a user's module ------------------------------------------------------------------------


def test_user_factory_builds_and_splits_at_its_units(userpkg):
    from userpkg.models import build

    model = build(width=8)
    layers = derive_layers(model, CIFAR)
    assert layers is not None and len(layers) == 7  # stem, act, 3 blocks, pool+flatten, head
    assert_splits_exactly(model, layers, CIFAR)
    assert_splits_exactly(model, layers, CIFAR, train=True)

    built = build_network(module_ref("userpkg.models:build", width=8), CIFAR)
    assert isinstance(built, LayerSequence) and len(built) == 7
    assert to_layer_list(module_ref("userpkg.models:build"), built) == list(built.children())
    assert build_network(module_ref("userpkg.models.build"), CIFAR)(
        CIFAR.example_batch(2)[0]
    ).shape == (2, 10)


def test_blocks_make_each_block_one_layer(userpkg):
    from userpkg.models import build

    model = build()
    layers = derive_layers(model, CIFAR, blocks="blocks")
    assert layers is not None and len(layers) == 5  # before, 3 blocks, after
    assert_splits_exactly(model, layers, CIFAR)
    built = build_network(module_ref("userpkg.models:build", blocks="blocks"), CIFAR)
    assert len(built) == 5


def test_a_class_taking_dataset_is_given_the_spec(userpkg):
    model = build_network(module_ref("userpkg.models:SizedNet"), MNIST)
    assert isinstance(model, LayerSequence)
    assert model(MNIST.example_batch(2)[0]).shape == (2, MNIST.num_classes)


def test_a_forward_reading_self_training_follows_the_layers_mode(userpkg):
    from userpkg.models import FunctionalDropout

    model = FunctionalDropout()
    layers = derive_layers(model, CIFAR)
    assert layers is not None and len(layers) == 6
    assert_splits_exactly(model, layers, CIFAR, train=True)
    assert_splits_exactly(model, layers, CIFAR, train=False)


def test_a_language_model_module_splits_on_token_data(userpkg):
    from userpkg.models import TinyLM

    model = TinyLM(TOKENS)
    layers = derive_layers(model, TOKENS)
    assert layers is not None and len(layers) == 4  # embed, 2 layers, out
    assert_splits_exactly(model, layers, TOKENS)
    assert_splits_exactly(model, layers, TOKENS, train=True)
    built = build_network(module_ref("userpkg.models:TinyLM"), TOKENS)
    assert built(TOKENS.example_batch(2)[0]).shape == (2, TOKENS.seq_len, TOKENS.vocab_size)


def test_an_untraceable_module_is_returned_as_built_without_a_layer_list(userpkg):
    ref = module_ref("userpkg.models:Untraceable")
    model = build_network(ref, CIFAR)
    assert type(model).__name__ == "Untraceable"
    assert derive_layers(model, CIFAR) is None
    one_line_error(lambda: to_layer_list(ref, model), "network.blocks")
    one_line_error(
        lambda: build_network(module_ref("userpkg.models:Untraceable", blocks="blocks"), CIFAR),
        "network.blocks=blocks",
    )


@pytest.mark.parametrize(
    ("target", "kwargs", "key", "says"),
    [
        ("userpkg.nowhere:build", {}, "network.target", "PYTHONPATH"),
        ("userpkg.needs_dep:build", {}, "network.target", "a_package_that_is_not_installed"),
        ("nodots", {}, "network.target", "package.module:factory"),
        ("userpkg.models:biuld", {}, "network.target", "no attribute 'biuld' (close: build)"),
        ("userpkg.models:NOT_CALLABLE", {}, "network.target", "not a factory"),
        ("userpkg.models:broken", {}, "network.target", "RuntimeError: boom on two lines"),
        ("userpkg.models:not_a_module", {}, "network.target", "not a torch.nn.Module"),
        ("userpkg.models:needs_depth", {}, "network.target", "+network.kwargs.depth="),
        ("userpkg.models:build", {"depth": 3}, "network.kwargs.depth", "takes no argument"),
    ],
)
def test_a_bad_module_setting_is_one_line_naming_its_key(userpkg, target, kwargs, key, says):
    message = one_line_error(lambda: build_network(module_ref(target, **kwargs), CIFAR), key)
    assert says in message


def test_a_users_code_checked_on_meta_runs_bounded_and_in_its_place(
    userpkg, monkeypatch, capsys, tmp_path
):
    """While a config is checked (on the meta device) a factory's exit is a refusal, a wait
    is cut short, its output kept aside, and the standard library is never called."""
    import workloads.networks.user_code as user_code

    monkeypatch.setattr(user_code, "CHECK_SECONDS", 0.5)
    with torch.device("meta"):
        said = one_line_error(
            lambda: build_network(module_ref("userpkg.models:exits"), CIFAR), "network.target"
        )
        assert "calling it called sys.exit(3) while distbench checked it" in said
        said = one_line_error(
            lambda: build_network(module_ref("userpkg.models:sleeps"), CIFAR), "network.target"
        )
        assert "calling it took over 0 s on the meta device" in said
        model = build_network(module_ref("userpkg.models:floods"), CIFAR)
        made = tmp_path / "made"
        said = one_line_error(
            lambda: build_network(module_ref("os:makedirs", name=str(made)), CIFAR),
            "network.target=os:makedirs",
        )
        assert "Python's standard library" in said and not made.exists()
    assert isinstance(model, nn.Module)
    printed = capsys.readouterr()
    assert "flood" not in printed.out + printed.err
    # built for real (a worker): the code runs as written, its output where it prints
    build_network(module_ref("userpkg.models:floods"), CIFAR)
    assert "flood 4999" in capsys.readouterr().out


def test_a_users_factory_is_called_once_per_check(userpkg):
    """Checking a pipeline cell's network runs it on the dataset's input and counts its layer
    list: its factory is called once for both. One that fails on the meta device is refused
    there and not called again (it may print, write or wait each time), but where it failed
    for reading a tensor the meta device holds no value of."""
    from userpkg.models import CALLS

    from workloads.networks.check import check_network

    check_network(module_ref("userpkg.models:counted"), CIFAR)
    assert layer_count(module_ref("userpkg.models:counted"), CIFAR) == 3
    assert CALLS == ["counted"]
    CALLS.clear()
    said = one_line_error(
        lambda: check_network(module_ref("userpkg.models:counted_then_fails"), CIFAR),
        "network.target=userpkg.models:counted_then_fails",
    )
    assert "calling it raised ValueError: no model today" in said
    assert "meta device" not in said  # the user's own error, said as it is
    # one that failed for the meta device itself (it read a tensor's value, which no meta
    # tensor holds) is built once more computing on the CPU: the one way to check it
    check_network(module_ref("userpkg.models:reads_a_tensor"), CIFAR)
    assert CALLS == ["counted_then_fails", "reads_a_tensor", "reads_a_tensor"]
    # built for real (a worker), the factory that reads a tensor builds
    assert isinstance(build_network(module_ref("userpkg.models:reads_a_tensor"), CIFAR), nn.Module)


def test_a_bad_blocks_path_names_network_blocks(userpkg):
    one_line_error(
        lambda: build_network(module_ref("userpkg.models:build", blocks="stages"), CIFAR),
        "network.blocks=stages",
    )
    one_line_error(
        lambda: build_network(module_ref("userpkg.models:build", blocks="head"), CIFAR),
        "network.blocks=head",
    )


# --- torchvision and timm ---------------------------------------------------------------------

SMALL_VIT = {
    "image_size": 32,
    "patch_size": 8,
    "num_layers": 3,
    "num_heads": 2,
    "hidden_dim": 32,
    "mlp_dim": 64,
    "num_classes": 10,
}
ZOO = [
    # (ref, layers expected), each small at 32x32
    (zoo_ref("torchvision", "efficientnet_b0"), 12),  # StochasticDepth branches on training
    (zoo_ref("torchvision", "resnet18"), 14),  # 4 stem modules, 8 blocks, pool, fc
    (module_ref("torchvision.models.vision_transformer:VisionTransformer", **SMALL_VIT), 7),
    (zoo_ref("timm", "resnet10t"), 16),
    (zoo_ref("timm", "vit_tiny_patch16_224", depth=4), 12),  # img_size follows the dataset
]


@pytest.mark.parametrize(
    ("ref", "count"),
    ZOO,
    ids=lambda value: getattr(value, "arch", None) or getattr(value, "target", None),
)
def test_zoo_models_split_exactly_on_cpu_and_meta(ref, count):
    torch.manual_seed(0)
    built = build_network(ref, CIFAR)
    assert isinstance(built, LayerSequence) and len(built) == count
    torch.manual_seed(0)
    model = _unsplit(ref)
    layers = derive_layers(model, CIFAR, ref.blocks)
    assert_splits_exactly(model, layers, CIFAR)
    assert_splits_exactly(model, layers, CIFAR, train=True)
    with torch.device("meta"):
        on_meta = build_network(ref, CIFAR)
    assert next(on_meta.parameters()).is_meta and len(on_meta) == count
    assert layer_count(ref, CIFAR) == count


def _unsplit(ref: NetworkRef) -> nn.Module:
    """The model as its zoo builds it, before splitting."""
    options = ref.options
    if ref.source == "torchvision":
        import torchvision

        return torchvision.models.get_model(ref.arch, weights=None, num_classes=10, **options)
    if ref.source == "timm":
        import timm

        size = {"img_size": 32} if ref.arch.startswith("vit") else {}
        return timm.create_model(ref.arch, pretrained=False, num_classes=10, **size, **options)
    from torchvision.models.vision_transformer import VisionTransformer

    return VisionTransformer(**options)


def test_vit_blocks_are_its_encoder_layers():
    ref = module_ref(
        "torchvision.models.vision_transformer:VisionTransformer",
        blocks="encoder.layers",
        **SMALL_VIT,
    )
    assert len(build_network(ref, CIFAR)) == 5  # patches and class token, 3 blocks, head


def test_torchvision_on_grayscale_adapts_its_stem():
    model = build_network(zoo_ref("torchvision", "resnet18"), MNIST)
    assert model(MNIST.example_batch(2)[0]).shape == (2, 10)


@pytest.mark.parametrize(
    ("ref", "spec", "key", "says"),
    [
        (zoo_ref("torchvision", "resnet19"), CIFAR, "network.arch=resnet19", "list_models"),
        (
            zoo_ref("torchvision", "fasterrcnn_resnet50_fpn"),
            CIFAR,
            "network.arch",
            "classification",
        ),
        (zoo_ref("torchvision", "resnet18"), TOKENS, "network.arch=resnet18", "token data"),
        (zoo_ref("torchvision", "resnet18", foo=1), CIFAR, "network.kwargs.foo", "foo"),
        (
            zoo_ref("torchvision", "resnet18", weights="DEFAULT"),
            CIFAR,
            "network.kwargs.weights",
            "random weights",
        ),
        (zoo_ref("timm", "resnet11t"), CIFAR, "network.arch=resnet11t", "timm.list_models"),
        (zoo_ref("timm", "hf-hub:timm/resnet18.a1_in1k"), CIFAR, "network.arch", "downloaded"),
        (zoo_ref("timm", "resnet10t"), TOKENS, "network.arch=resnet10t", "token data"),
        (
            zoo_ref("timm", "resnet10t", pretrained=True),
            CIFAR,
            "network.kwargs.pretrained",
            "random weights",
        ),
    ],
)
def test_a_bad_zoo_setting_is_one_line_naming_its_key(ref, spec, key, says):
    assert says in one_line_error(lambda: build_network(ref, spec), key)
