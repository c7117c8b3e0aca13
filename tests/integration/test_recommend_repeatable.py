"""The recommender as a person acts on it: the same command gives the same numbers (measured
facts are kept per device and used again), says how sure it is, says "unknown" for what the
hardware config does not tell, prices options in the config's currency, ranks by time or
cost, and every option carries the `python -m harness` overrides that train it.

One real measurement serves the module: `python -m harness.recommend` twice on the smallest
pipeline-capable hardware (2 CPU workers), then in-process calls that reuse its facts file.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import shlex
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from harness.commands.compose import compose_config
from harness.config.schema import DistbenchConfig, validate
from harness.distributions.registry import spec_of, specs
from harness.recommend import candidates
from tests.helpers import run_module

PRICE, CURRENCY = 0.5, "EUR"
WORKLOAD = [
    "dataset=mnist",
    "network=mobilenetv2",
    "hardware=local_2cpu",
    "distribution=gpipe",
    "distribution.batch_size=4",
    "distribution.micro_batches=2",
    "--probe-batches=2",
]
PRICED = [f"hardware.price_per_device_hour={PRICE}", f"hardware.currency={CURRENCY}"]
MNIST_IMAGES = 70_000


@dataclass(frozen=True)
class TwoRuns:
    root: Path
    first: Any  # CompletedProcess
    second: Any
    facts_after_first: bytes
    facts_after_second: bytes


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory: pytest.TempPathFactory) -> TwoRuns:
    root = tmp_path_factory.mktemp("recommend") / "outputs"
    root.mkdir()
    facts = root / "facts" / "local_2cpu.json"
    args = [*WORKLOAD, *PRICED, f"run.output_dir={root}"]
    first = run_module("harness.recommend", args, cwd=root.parent, timeout=300)
    after_first = facts.read_bytes() if facts.exists() else b""
    second = run_module("harness.recommend", args, cwd=root.parent, timeout=300)
    return TwoRuns(root, first, second, after_first, facts.read_bytes() if facts.exists() else b"")


def _asked() -> DistbenchConfig:
    """The cell the module's recommender commands ask about (its flags left out)."""
    return validate(compose_config([arg for arg in WORKLOAD if not arg.startswith("--")]))


def _recommend_here(root: Path, capsys: pytest.CaptureFixture[str], *args: str) -> dict:
    """The recommender in this process, as JSON, on the module's kept facts."""
    from harness.recommend import main

    capsys.readouterr()
    main([*WORKLOAD, *args, f"run.output_dir={root}", "--json"])
    return json.loads(capsys.readouterr().out)


@pytest.fixture(scope="module")
def priced(two_runs: TwoRuns) -> dict:
    """`_recommend_here(root, capsys, *PRICED)`, asked once for the module: the answer ranked
    by time, with the prices, that several tests read."""
    from harness.recommend import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        main([*WORKLOAD, *PRICED, f"run.output_dir={two_runs.root}", "--json"])
    return json.loads(out.getvalue())


ROW = re.compile(
    r"\s*\d+  (?P<label>.+?) +(?P<seconds>[\d.]+)\*? +(?P<low>[\d.]+)-"
    r"(?P<high>[\d.]+) +(?P<cal>yes|no) +(?P<mb>\d+) +(?P<fits>yes|NO|unknown) "
)


def _rows(stdout: str) -> list[str]:
    return [line for line in stdout.splitlines() if ROW.match(line)]


def test_the_same_command_gives_the_same_numbers_and_the_second_run_measures_nothing(
    two_runs: TwoRuns,
) -> None:
    first, second = two_runs.first, two_runs.second
    assert first.returncode == 0, first.stderr[-3000:]
    assert second.returncode == 0, second.stderr[-3000:]
    print(first.stdout)
    assert first.stdout == second.stdout
    (measured,) = [line for line in first.stderr.splitlines() if line.startswith("measured here: ")]
    assert "the step time at batch 4" in measured
    assert "measured here: nothing (all facts were kept from earlier runs)" in second.stderr
    assert two_runs.facts_after_second == two_runs.facts_after_first  # nothing rewritten
    # The step times say where they come from, when, and how spread they were.
    kept = json.loads(two_runs.facts_after_first)
    entries = {entry["batch"]: entry for entry in kept["step_times"]}
    assert set(entries) == {1, 2, 4}  # the batch, and GPipe's micro-batches of 4 / {2, 4}
    for batch, entry in entries.items():
        assert len(entry["batch_seconds"]) == entry["probe_batches"] == 2
        assert entry["q1_seconds"] <= entry["seconds"] <= entry["q3_seconds"]
        # a probe the suite's other process disturbed however often it was timed again is
        # kept marked with how much the machine's speed changed, and says so
        change = entry.get("speed_change")
        unsteady = (
            ""
            if change is None
            else f" (measured while the machine's speed changed by {change:+.0%}: time it "
            f"again on a quiet machine, --remeasure)"
        )
        line = (
            f"  batch {batch}: {entry['seconds']:.4g} s (IQR {entry['q1_seconds']:.4g}-"
            f"{entry['q3_seconds']:.4g} over 2 batches), facts file "
            f"{two_runs.root / 'facts' / 'local_2cpu.json'}{unsteady}, measured "
            f"{entry['measured_at']}"
        )
        assert any(row.startswith(line) for row in first.stdout.splitlines()), line
    assert [len(kept[kind]) for kind in ("runtimes", "saved_activations")] == [1, 1]
    # A layer profile per batch a pipeline's workers step at (GPipe's micro-batches, PipeDream's
    # batch): each layer's share of a step moves with the batch.
    assert sorted(entry["profile"]["batch_size"] for entry in kept["layer_profiles"]) == sorted(
        entries
    )


def test_the_table_says_what_its_numbers_are_for(two_runs: TwoRuns) -> None:
    lines = two_runs.first.stdout.splitlines()
    assert f"s/epoch: seconds per epoch of {MNIST_IMAGES} images (all of mnist)" in lines
    assert "fits: unknown for all (hardware.device_memory_gb is not set)" in lines
    assert (
        f"cost: {PRICE:g} {CURRENCY} per device-hour (hardware.price_per_device_hour), "
        f"for the devices in use" in lines
    )
    title = next(line for line in lines if line.lstrip().startswith("#"))
    assert "range" in title and f"{CURRENCY}/epoch" in title
    rows = _rows(two_runs.first.stdout)
    # one row per candidate of every model (here: sequential, ddp, horovod, 3 gpipe,
    # 2 pipedream, 2 fsdp), none skipped
    assert len(rows) == len(list(candidates(_asked())))
    for row in rows:
        found = ROW.match(row)
        assert float(found["low"]) <= float(found["seconds"]) <= float(found["high"]), row
        assert found["fits"] == "unknown"
        # No analysis in this output directory: every model is uncalibrated, and its range is
        # the raw equations' error (x/3 to x3), not the probe's narrow spread.
        seconds = float(found["seconds"])
        assert found["cal"] == "no", row
        assert float(found["high"]) >= 3 * seconds - 0.002, row
        assert float(found["low"]) <= seconds / 3 + 0.001, row
    assert (
        "range (cal no: ddp, fsdp, gpipe, horovod, pipedream, sequential): uncalibrated "
        "(no fit of this hardware): the raw equations' error, x/3 to x3 "
        "(docs/recommend.md)"
    ) in lines
    assert (
        "to calibrate hardware=local_2cpu: python -m harness +sweep=calibrate_local, "
        "python -m harness.probe hardware=local_2cpu, then python -m harness.analysis "
        "tracking.experiment=calibrate_local"
    ) in lines
    assert lines[0].endswith("parameters: raw equations (no analysis of hardware=local_2cpu found)")


def test_fits_is_yes_or_no_once_the_hardware_has_a_memory_size(
    two_runs: TwoRuns, capsys: pytest.CaptureFixture[str]
) -> None:
    unknown = _recommend_here(two_runs.root, capsys)
    assert {option["fits_memory"] for option in unknown["options"]} == {None}
    assert unknown["measured_here"] == []  # the module's facts, again
    # a limit between the smallest and the largest worker's predicted memory
    memory = sorted(option["memory_mb"] for option in unknown["options"])
    limit_gb = (memory[0] + memory[-1]) / 2 / 1000
    known = _recommend_here(two_runs.root, capsys, f"hardware.device_memory_gb={limit_gb}")
    verdicts = {option["label"]: option["fits_memory"] for option in known["options"]}
    assert set(verdicts.values()) == {True, False}
    assert verdicts[known["recommended"]] is True


def test_ranking_by_cost_names_the_fastest_and_the_cheapest(
    two_runs: TwoRuns, priced: dict, capsys: pytest.CaptureFixture[str]
) -> None:
    by_cost = _recommend_here(two_runs.root, capsys, *PRICED, "--objective=cost")
    by_time = priced  # the same ask, answered once for the module
    assert (by_cost["currency"], by_cost["price_per_device_hour"]) == (CURRENCY, PRICE)
    for option in by_cost["options"]:  # devices in use x hours x price per device-hour
        assert option["cost_per_epoch"] == pytest.approx(
            option["workers"] * option["seconds_per_epoch"] / 3600 * PRICE
        )
    costs = [option["cost_per_epoch"] for option in by_cost["options"]]
    seconds = [option["seconds_per_epoch"] for option in by_time["options"]]
    assert costs == sorted(costs) and seconds == sorted(seconds)
    cheapest, fastest = by_cost["options"][0]["label"], by_time["options"][0]["label"]
    assert by_cost["recommended"] == by_cost["cheapest"] == by_time["cheapest"] == cheapest
    assert by_time["recommended"] == by_time["fastest"] == by_cost["fastest"] == fastest

    # The same options either way: only the order differs.
    def same(options: list[dict]) -> list[str]:
        return sorted(json.dumps(option, sort_keys=True) for option in options)

    assert same(by_cost["options"]) == same(by_time["options"])
    verdict = (
        f"fastest and cheapest: {fastest}"
        if fastest == cheapest
        else f"fastest: {fastest}; cheapest: {cheapest}"
    )
    assert verdict in two_runs.first.stdout.splitlines()


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (
            ["--objective=cost"],
            "--objective=cost is invalid: hardware=local_2cpu has no "
            "hardware.price_per_device_hour",
        ),
        (["--remeasure", "--no-probe"], "--remeasure is invalid with --no-probe"),
    ],
)
def test_flags_that_cannot_be_followed_are_one_line(
    two_runs: TwoRuns, capsys: pytest.CaptureFixture[str], flags: list[str], says: str
) -> None:
    with pytest.raises(SystemExit) as exit_:
        _recommend_here(two_runs.root, capsys, *flags)
    assert exit_.value.code == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"distbench: invalid config: {says}")


def assert_overrides_train(options: Sequence[dict]) -> None:
    """Every option's overrides compose and validate as `python -m harness` takes them, into
    the configuration the option predicts (model, workers, batch, micro-batches, plan)."""
    from harness.commands.compose import compose_config
    from harness.config.schema import validate

    for option in options:
        config = validate(compose_config(option["overrides"]))
        distribution = config.distribution
        assert distribution.name == option["distribution"], option["label"]
        assert config.world_size == option["workers"], option["label"]
        assert config.batch_size == option["batch_size"], option["label"]
        # the model's own settings as the option predicted them (GPipe's micro-batches, ...),
        # and a pipeline's plan, pinned
        own, predicted = distribution.own_settings_raw(), dict(option["settings"])
        if spec_of(config).stage_planner is not None:  # a pipeline
            assert own.pop("balance") == option["balance"], option["label"]
            predicted.pop("balance")
        if "stages" in own:  # PipeDream: the planner's choice, pinned
            assert own.pop("stages") == option["stages"], option["label"]
            predicted.pop("stages")
        assert distribution.own_settings(config) == {
            **distribution.own_settings(config),
            **predicted,
        }, option["label"]
        assert option["overrides"][-len(option["own_overrides"]) :] == option["own_overrides"]


def test_every_option_carries_the_overrides_that_train_it(
    two_runs: TwoRuns, priced: dict, capsys: pytest.CaptureFixture[str]
) -> None:
    answer = priced  # the same ask, answered once for the module
    # every model that offers candidates (a plan is offered once it is predicted)
    offering = {name for name in specs() if name != "mesh"}
    assert {option["distribution"] for option in answer["options"]} == offering
    assert_overrides_train(answer["options"])
    # Worker counts the user set are restated by the options that keep them: 2 nodes of 2
    two_nodes = _recommend_here(
        two_runs.root,
        capsys,
        "hardware.nodes=2",
        "hardware.inter_node_bandwidth_mbps=1000",
        "hardware.inter_node_latency_us=50",
    )
    assert two_nodes["measured_here"] == []  # the same batches and network: kept facts
    assert {option["workers"] for option in two_nodes["options"]} == {1, 2, 4}
    assert_overrides_train(two_nodes["options"])
    # The printed command of the recommendation is the same, shell-quoted.
    (line,) = [
        line for line in two_runs.first.stdout.splitlines() if line.startswith("recommended: ")
    ]
    command = shlex.split(line.split(": python -m harness ", 1)[1])
    best = next(o for o in answer["options"] if o["label"] == answer["recommended"])
    assert command == best["overrides"]
    # The table's overrides column is each option's own part, shell-quoted.
    for row, option in zip(_rows(two_runs.first.stdout), answer["options"]):
        assert row.endswith("  " + shlex.join(option["own_overrides"])), row


def test_hardware_currency_is_checked_and_leaves_cell_keys_as_they_were() -> None:
    from harness.commands.compose import compose_config
    from harness.config.schema import ConfigError, resolved_container, validate
    from harness.records.resume import cell_key

    with pytest.raises(ConfigError, match="hardware.currency='' is invalid"):
        validate(compose_config(["hardware.currency=''"]))
    resolved = resolved_container(compose_config([]))
    assert resolved["hardware"]["currency"] is None
    before = json.loads(json.dumps(resolved))
    del before["hardware"]["currency"]  # a cell keyed before the key existed
    assert cell_key(before) == cell_key(resolved)


def test_probe_rounds_leaves_cell_keys_as_they_were() -> None:
    """`probe.rounds` joined after cells were recorded, and no cell reads it: a cell keyed
    before it existed, or with any number of rounds, keeps its key (an interrupted sweep
    resumes, its runs merge with later ones)."""
    from harness.commands.compose import compose_config
    from harness.config.schema import resolved_container
    from harness.records.resume import cell_key

    resolved = resolved_container(compose_config([]))
    before = json.loads(json.dumps(resolved))
    del before["probe"]["rounds"]  # a cell keyed before the key existed
    assert (
        cell_key(before)
        == cell_key(resolved)
        == cell_key(resolved_container(compose_config(["probe.rounds=1"])))
    )


def test_hardware_one_host_leaves_cell_keys_as_they_were_and_set_is_another_cell() -> None:
    """`hardware.one_host` joined after cells were recorded: false (each node a machine of
    its own) is what its absence meant, so those cells keep their keys; true is another
    hardware, another cell."""
    from harness.commands.compose import compose_config
    from harness.config.schema import resolved_container
    from harness.records.resume import cell_key

    resolved = resolved_container(compose_config(["hardware=slurm_local_2nodes"]))
    assert resolved["hardware"]["one_host"] is True
    apart = json.loads(json.dumps(resolved))
    apart["hardware"]["one_host"] = False
    before = json.loads(json.dumps(apart))
    del before["hardware"]["one_host"]  # a cell keyed before the key existed
    assert cell_key(before) == cell_key(apart) != cell_key(resolved)


def test_step_times_that_contradict_each_other_are_timed_again_then_said(
    two_runs: TwoRuns, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A kept step time at batch 4 faster than batch 2's beyond their spread (as a probe
    disturbed by other work leaves it) is not predicted from: both batches are timed again and
    every option predicted again. Where they still contradict each other, each says so beside
    its source, kept so in the facts file, and a later ask says it without timing them again."""
    from harness.recommend import main

    root = tmp_path / "outputs"
    shutil.copytree(two_runs.root / "facts", root / "facts")
    facts = root / "facts" / "local_2cpu.json"
    kept = json.loads(facts.read_text())
    by_batch = {entry["batch"]: entry for entry in kept["step_times"]}
    planted = by_batch[2]["q1_seconds"] / 10  # batch 4 ten times faster than batch 2
    by_batch[4].update(seconds=planted, q1_seconds=planted, q3_seconds=planted)
    by_batch[4]["batch_seconds"] = [planted, planted]
    facts.write_text(json.dumps(kept))

    capsys.readouterr()
    main([*WORKLOAD, f"run.output_dir={root}", "--json"])
    out, err = capsys.readouterr()
    assert "the step at batch 4 (" in err and "timing both again" in err, err
    after = {entry["batch"]: entry for entry in json.loads(facts.read_text())["step_times"]}
    assert after[4]["seconds"] != planted  # timed again, and that is what is kept now
    assert after[2]["measured_at"] != by_batch[2]["measured_at"]
    used = {step["batch"]: step for step in json.loads(out)["step_times"]}
    assert used[4]["seconds"] == after[4]["seconds"]
    # still contradicting (a disturbed machine) or not, the answer and the file agree
    assert (used[4]["contradicts"] == 2) == (after[4].get("contradicts") == 2)

    # Kept contradicting after being timed again: said on every later ask, not timed again.
    for batch, other in ((1, 4), (2, 4), (4, 2)):  # batch 4 planted faster than 1's too
        after[batch]["contradicts"] = other
    after[4].update(seconds=planted, q1_seconds=planted, q3_seconds=planted)
    facts.write_text(json.dumps({**kept, "step_times": list(after.values())}))
    main([*WORKLOAD, f"run.output_dir={root}"])
    out, err = capsys.readouterr()
    assert "timing both again" not in err
    assert "measured here: nothing" in err, err
    assert "contradicts batch 2: the step at batch 4 took less time than at batch 2" in out
