"""Typer option declarations shared by every command that takes one parallel plan (predict, export)."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

Model = Annotated[Optional[str], typer.Option("--model", "-m", help="Preset name (see `planner models`) or path to a config.json.")]
Gpu = Annotated[Optional[str], typer.Option("--gpu", help="GPU key (see `planner gpus`).")]
Gpus = Annotated[Optional[int], typer.Option("--gpus", help="Total number of GPUs.")]
GpusPerNode = Annotated[Optional[int], typer.Option("--gpus-per-node", help="GPUs per node (default: node type's).")]
Cluster = Annotated[Optional[str], typer.Option("--cluster", help="Node type / cluster (see `planner gpus`).")]
Tp = Annotated[int, typer.Option("--tp", help="Tensor-parallel degree.")]
Pp = Annotated[int, typer.Option("--pp", help="Pipeline-parallel degree.")]
Cp = Annotated[int, typer.Option("--cp", help="Context-parallel degree.")]
Vpp = Annotated[int, typer.Option("--vpp", help="Virtual pipeline chunks per stage.")]
Mbs = Annotated[int, typer.Option("--mbs", help="Micro-batch size (sequences).")]
Gbs = Annotated[Optional[int], typer.Option("--gbs", help="Global batch size (sequences); default ~4M tokens.")]
SeqLen = Annotated[Optional[int], typer.Option("--seq-len", help="Sequence length (default: model's max).")]
Recompute = Annotated[str, typer.Option("--recompute", help="none | selective | full.")]
SequenceParallel = Annotated[bool, typer.Option("--sequence-parallel/--no-sequence-parallel")]
Zero = Annotated[int, typer.Option("--zero", help="ZeRO stage 0-3 (1 = distributed optimizer, 3 = FSDP).")]
Dtype = Annotated[str, typer.Option("--dtype", help="bf16 | fp16 | fp8 | fp32.")]
LayerSplit = Annotated[Optional[str], typer.Option("--layer-split", help="Uneven layers per stage, e.g. 9,8,8,7.")]
HardwareFile = Annotated[list[str], typer.Option("--hardware-file", help="TOML/YAML file adding GPUs/clusters.")]


def write_or_print(text: str, out) -> None:
    """A command's text output: to ``out`` (atomically, `costmodel.core.fileio`) with a note, else to stdout."""
    if out is not None:
        from costmodel.core.fileio import atomic_write_text

        atomic_write_text(out, text)
        typer.echo(f"wrote {out}")
    else:
        typer.echo(text, nl=False)
