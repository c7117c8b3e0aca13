"""Published multi-GPU measurements (docs/published/*.csv) predicted from data sheets alone:
each row's plan, shape and cluster, its predicted step and memory, and the errors.

A table's first line says where its figures come from (paper and table, or repository, file
and commit); every row gives a plan as `distribution=mesh` names it, the network's shape, the
hardware config whose data sheet it ran on, and what was measured: seconds per step, tokens per
second per GPU, or peak memory per GPU (GiB). Rows of one `compare` group are plans of one
model on one cluster: the plan predicted fastest is checked against the measured fastest.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

from harness.costs.plan_step import GIB, Cluster, PlanShape, predict_memory, predict_step
from harness.costs.transformer import Recompute, TransformerShape

PUBLISHED = Path(__file__).resolve().parents[3] / "docs" / "published"


@dataclass(frozen=True)
class PublishedRow:
    table: str
    row: str
    model: str
    shape: TransformerShape
    plan: PlanShape
    hardware: str
    nodes: int
    compare: str
    measured_step_s: float | None
    measured_tokens_per_s_per_gpu: float | None
    measured_memory_gib: float | None

    @property
    def measured_step(self) -> float | None:
        """Seconds per step, as measured or from the tokens per second per GPU."""
        if self.measured_step_s is not None:
            return self.measured_step_s
        if self.measured_tokens_per_s_per_gpu is None:
            return None
        tokens = self.plan.global_batch * self.shape.seq_len
        return tokens / (self.measured_tokens_per_s_per_gpu * self.plan.world)


@dataclass(frozen=True)
class Predicted:
    row: PublishedRow
    step_s: float
    tokens_per_s_per_gpu: float
    mfu: float
    bound: str
    memory_gib: float
    korthikanti_block_gib: float
    counted_block_gib: float

    @property
    def step_error(self) -> float | None:
        """Signed relative error of the step time (prediction over measurement, less one)."""
        measured = self.row.measured_step
        return None if measured is None else self.step_s / measured - 1

    @property
    def memory_error(self) -> float | None:
        measured = self.row.measured_memory_gib
        return None if measured is None else self.memory_gib / measured - 1


def _flag(text: str) -> bool:
    if text not in ("true", "false"):
        raise ValueError(f"expected true or false, got {text!r}")
    return text == "true"


def _number(text: str) -> float | None:
    return float(text) if text.strip() else None


def read_table(path: Path) -> tuple[str, list[PublishedRow]]:
    """A table's source line and its rows."""
    lines = path.read_text().splitlines()
    source = lines[0].lstrip("# ").strip()
    rows = []
    for record in csv.DictReader(line for line in lines[1:] if not line.startswith("#")):
        shape = TransformerShape(
            layers=int(record["layers"]),
            hidden=int(record["hidden"]),
            heads=int(record["heads"]),
            kv_heads=int(record["kv_heads"]),
            ffn=int(record["ffn"]),
            vocab=int(record["vocab"]),
            seq_len=int(record["seq_len"]),
            gated_mlp=_flag(record["gated_mlp"]),
            tied_embeddings=_flag(record["tied_embeddings"]),
            dropout=_flag(record["dropout"]),
            flash_attention=_flag(record["flash_attention"]),
        )
        plan = PlanShape(
            dp_replicate=int(record["dp_replicate"]),
            dp_shard=int(record["dp_shard"]),
            tp=int(record["tp"]),
            pp=int(record["pp"]),
            global_batch=int(record["global_batch"]),
            micro_batch=int(record["micro_batch"]),
            schedule=record["schedule"],
            virtual=int(record["virtual"]),
            sequence_parallel=_flag(record["sequence_parallel"]),
            recompute=Recompute(record["recompute"]),
            recompute_every=int(record["recompute_every"]),
            precision=record["precision"],
            fused_elementwise=_flag(record["fused_elementwise"]),
        )
        rows.append(
            PublishedRow(
                table=path.stem,
                row=record["row"],
                model=record["model"],
                shape=shape,
                plan=plan,
                hardware=record["hardware"],
                nodes=int(record["nodes"]),
                compare=record["compare"],
                measured_step_s=_number(record["measured_step_s"]),
                measured_tokens_per_s_per_gpu=_number(record["measured_tokens_per_s_per_gpu"]),
                measured_memory_gib=_number(record["measured_memory_gib"]),
            )
        )
    return source, rows


def tables(root: Path = PUBLISHED) -> dict[str, tuple[str, list[PublishedRow]]]:
    return {path.stem: read_table(path) for path in sorted(root.glob("*.csv"))}


def predict_row(row: PublishedRow, cluster: Cluster) -> Predicted:
    step = predict_step(row.shape, row.plan, cluster)
    memory = predict_memory(row.shape, row.plan)
    return Predicted(
        row=row,
        step_s=step.seconds,
        tokens_per_s_per_gpu=step.tokens_per_s_per_gpu,
        mfu=step.mfu,
        bound=step.bound,
        memory_gib=memory.total / GIB,
        korthikanti_block_gib=memory.korthikanti_block / GIB,
        counted_block_gib=memory.block_activations / GIB,
    )


@dataclass(frozen=True)
class Comparison:
    """A group of plans of one model on one cluster: the measured fastest, the predicted
    fastest, and how much slower (measured) the predicted choice is."""

    group: str
    measured_fastest: str
    predicted_fastest: str
    lost: float  # share of throughput lost by taking the predicted choice


def compare(predicted: list[Predicted]) -> list[Comparison]:
    groups: dict[str, list[Predicted]] = {}
    for one in predicted:
        if one.row.compare:
            groups.setdefault(one.row.compare, []).append(one)
    out = []
    for group, members in groups.items():

        def measured_rate(one: Predicted) -> float:
            step = one.row.measured_step or 0.0
            return one.row.plan.global_batch / step if step else 0.0

        best = max(members, key=measured_rate)
        chosen = max(members, key=lambda one: one.row.plan.global_batch / one.step_s)
        out.append(
            Comparison(
                group=group,
                measured_fastest=best.row.row,
                predicted_fastest=chosen.row.row,
                lost=1 - measured_rate(chosen) / measured_rate(best),
            )
        )
    return out
