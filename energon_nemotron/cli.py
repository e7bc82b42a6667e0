"""The ``energon-nemotron`` console script: prepare Energon datasets for a cooker, look at the
packed batches of a loader config and measure its datasets, pack and inspect Megatron-LM rows."""

from __future__ import annotations

import argparse
import itertools
import json
import re
import sys
import warnings
from pathlib import Path
from typing import Optional, Sequence

from energon_nemotron.errors import ConfigError, original_message
from energon_nemotron.version import __version__

#: example command lines per subcommand: its ``--help`` shows them, the top-level ``--help`` the first
EXAMPLES = {
    "prepare": ["energon-nemotron prepare my_data --cooker general_conversations",
                "energon-nemotron prepare my_data --cooker openai_messages    # prepared already: only the cooker",
                "energon-nemotron prepare data.jsonl --cooker openai_messages"],
    "preview": ["energon-nemotron preview loader.yaml --batches 2",
                "energon-nemotron preview loader.yaml --html preview.html"],
    "stats": ["energon-nemotron stats loader.yaml --limit 1000",
              "energon-nemotron stats loader.yaml --json --no-progress"],
    "cookers": ["energon-nemotron cookers", "energon-nemotron cookers --json"],
    "demo": ["energon-nemotron demo --out demo_out"],
    "pack-megatron": ["energon-nemotron pack-megatron --input 'raw/*.jsonl' --output train.jsonl.packed "
                      "--tokenizer TOKENIZER_DIR --seq-length 4096 --prompt-format nemotron-nano-v2"],
    "inspect-megatron": ["energon-nemotron inspect-megatron train.jsonl.packed --tokenizer TOKENIZER_DIR "
                         "--seq-length 4096 --prompt-format nemotron-nano-v2 --rows 2"],
}

_ROLE = re.compile(r":[\w.+-]+(?::[\w.+-]+)?:`(~?)([^`<]*?)\s*(?:<[^`>]*>)?`")


def plain_text(text: str) -> str:
    """``text`` without reStructuredText inline markup, as a terminal shows it: literals in double
    or single backticks as their text, a role (class, func, meth, ref, ...) as its target, the last
    dotted part of a ``~`` target, the title of a ``title <target>`` one."""
    text = _ROLE.sub(lambda m: m.group(2).rsplit(".", 1)[-1] if m.group(1) else m.group(2), text)
    return re.sub(r"`([^`]+)`", r"\1", re.sub(r"``(.+?)``", r"\1", text))


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions and epilogs as written (the examples keep their lines); an option's default is
    appended to its help, unless the help already says it or the option is a flag."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if action.nargs == 0 or action.default is None or action.default is False \
                or action.default == argparse.SUPPRESS or "default:" in text:
            return text
        return f"{text} (default: %(default)s)"


def _encoder_args(p: argparse.ArgumentParser) -> None:
    from energon_nemotron.registry import MEGATRON_PROMPT_FORMATS

    g = p.add_argument_group("encoder (must match how the rows will be read)")
    g.add_argument("--tokenizer", required=True, help="Hugging Face tokenizer directory")
    g.add_argument("--seq-length", type=int, required=True, help="row length L")
    g.add_argument("--prompt-format", default="identity", choices=MEGATRON_PROMPT_FORMATS.names(),
                   help="Megatron-LM's SFT prompt format")
    g.add_argument("--context-parallel-size", type=int, default=1, metavar="CP",
                   help="context-parallel size: each conversation is padded to a multiple of 2*CP when CP > 1")
    g.add_argument("--pad-token", default=None, help="override the format's pad token")
    g.add_argument("--chat-key", default="messages", help="the key of the message list in each JSON line")
    g.add_argument("--identity-unmasked", dest="identity_masks_prompt", action="store_false",
                   help="identity format of Megatron-LM v0.18-v0.19: every token trained")
    g.add_argument("--allow-eos-pad", action="store_true",
                   help="accept a pad id equal to EOS (every EOS label is then masked)")


def _encoder(a: argparse.Namespace):
    from energon_nemotron.megatron_packed import encoder_from

    return encoder_from(a.tokenizer, a)


def cmd_pack_megatron(a: argparse.Namespace) -> int:
    from energon_nemotron._energon.storage import is_url
    from energon_nemotron.megatron_packed.offline_pack import LocalEngine, PackOptions, pack

    if a.engine == "ray":
        from energon_nemotron.megatron_packed.ray_engine import RayEngine

        engine = RayEngine(address=a.address, num_cpus=a.num_cpus, verbose=a.ray_verbose)
    elif a.address is not None or a.num_cpus is not None or a.ray_verbose:
        raise ConfigError("--address, --num-cpus and --ray-verbose apply to --engine ray only")
    else:
        engine = LocalEngine()
    options = PackOptions(algorithm=a.algorithm, seed=None if a.no_shuffle else a.seed,
                          rows_per_shard=a.rows_per_shard, on_error=a.on_error, block_size=a.block_size)
    if is_url(a.output) or any(is_url(i) for i in a.input):
        from energon_nemotron.megatron_packed.store_output import pack_with_store

        summary = pack_with_store(a.input, a.output, _encoder(a), options, engine=engine, progress=not a.no_progress,
                                  staging=a.staging)
    else:
        summary = pack(a.input, a.output, _encoder(a), options, engine=engine, progress=not a.no_progress)
    if a.json:
        print(json.dumps(summary.as_dict()))
    else:
        shown = summary.shards[0] if len(summary.shards) == 1 else f"{summary.shards[0]} ... {summary.shards[-1]}"
        print(f"wrote {shown} beside {summary.manifest}")
        print(summary.text())
    return 0


def cmd_inspect_megatron(a: argparse.Namespace) -> int:
    from energon_nemotron.megatron_packed import MegatronSFTPackedDataset
    from energon_nemotron.inspection.rows import row_json, row_text

    enc = _encoder(a)
    ds = MegatronSFTPackedDataset(a.file, enc)
    color = a.color == "always" or (a.color == "auto" and sys.stdout.isatty())
    rows = ds if a.rows is None else itertools.islice(ds, a.rows)
    for i, row in enumerate(rows):
        if a.json:
            print(json.dumps(row_json(i, row)))
        else:
            print(row_text(i, row, enc.tokenizer, color, pad_id=enc.pad_id))
            print()
    return 0


def _config(a: argparse.Namespace, dp_rank: int = 0, dp_size: int = 1):
    """The loader config a command reads: its YAML, or ``--nemo-rl``'s NeMo-RL master config
    (``registry.CONFIG_READERS``: the NeMo-RL adapter of ``integrations``, with ``--tokenizer``)."""
    if (a.config is None) == (a.nemo_rl is None):
        raise ConfigError("give a loader YAML or --nemo-rl CONFIG.yaml (one of them)")
    if a.config is not None:
        if a.tokenizer is not None:
            raise ConfigError("--tokenizer goes with --nemo-rl; a loader YAML names its tokenizer")
        return a.config
    from energon_nemotron.registry import CONFIG_READERS

    return CONFIG_READERS.get("nemo_rl")(a.nemo_rl, a.tokenizer, dp_rank, dp_size)


def cmd_preview(a: argparse.Namespace) -> int:
    from energon_nemotron.inspection.preview import PreviewOptions, run_preview

    options = PreviewOptions(split=a.split, dp_rank=a.dp_rank, dp_size=a.dp_size, load_state=a.load_state,
                             save_state=a.save_state)
    return run_preview(_config(a, a.dp_rank, a.dp_size), batches=a.batches, as_json=a.json, color=a.color,
                       html=a.html, options=options)


def cmd_stats(a: argparse.Namespace) -> int:
    from energon_nemotron.stats.run import StatsOptions, run_stats

    options = StatsOptions(split=a.split, engine=a.engine, limit=a.limit, address=a.address, num_cpus=a.num_cpus)
    return run_stats(_config(a), options, as_json=a.json, html=a.html, progress=not a.no_progress)


def _config_arguments(s: argparse.ArgumentParser) -> None:
    s.add_argument("config", nargs="?", default=None, help="a loader YAML")
    s.add_argument("--nemo-rl", default=None, metavar="CONFIG.yaml",
                   help="read a NeMo-RL SFT v2 master config instead (docs: Coming from NeMo-RL)")
    s.add_argument("--tokenizer", default=None, metavar="DIR",
                   help="--nemo-rl: the tokenizer folder (default: policy.tokenizer.name when it is a folder)")


def cmd_prepare(a: argparse.Namespace) -> int:
    from energon_nemotron.loading import PrepareOptions, prepare_dataset

    options = PrepareOptions(split_ratio=a.split_ratio, split_parts=tuple(a.split_parts or ()), reindex=a.reindex,
                             workers=a.num_workers, progress=not a.no_progress)
    done = prepare_dataset(a.path, a.cooker, options)
    if a.verbose:
        print(done.energon_output, end="", file=sys.stderr)
    print(done.text())
    return 0


def cmd_demo(a: argparse.Namespace) -> int:
    from energon_nemotron.demo import run_demo

    return run_demo(a.out, progress=not a.no_progress)


def cmd_cookers(a: argparse.Namespace) -> int:
    """Every registered cooker (built-in and from ``energon_nemotron.cookers`` entry points)."""
    from energon_nemotron.cookers.base import describe_cooker
    from energon_nemotron.registry import COOKERS

    cookers = [{**c, "schema": plain_text(c["schema"])} for c in map(describe_cooker, COOKERS.names())]
    if a.json:
        print(json.dumps(cookers, indent=2))
        return 0
    for c in cookers:
        print(f"{c['name']}  ({c['origin']})")
        print(f"  schema: {c['schema'] or '(not described)'}")
        print("  subflavors: " + ", ".join(f"{k} ({t})" for k, t in c["subflavors"].items()))
        print(f"  modalities: {', '.join(c['modalities']) or 'none (text only)'}; "
              f"every sample has: {', '.join(c['requires']) or 'nothing required'}")
        print()
    return 0


def _command(sub, name: str, summary: str, func) -> argparse.ArgumentParser:
    """Subcommand ``name``: its one-line summary, the examples of :data:`EXAMPLES` as epilog."""
    s = sub.add_parser(name, help=summary, description=summary[0].upper() + summary[1:] + ".",
                       epilog="examples:\n" + "\n".join(f"  {e}" for e in EXAMPLES[name]),
                       formatter_class=_HelpFormatter)
    s.set_defaults(func=func)
    return s


def _progress_argument(s: argparse.ArgumentParser) -> None:
    s.add_argument("--no-progress", action="store_true", help="no progress bars (they go to stderr)")


def _add_prepare(sub) -> None:
    s = _command(sub, "prepare", "make WebDataset tar shards (or a .jsonl file) an Energon dataset for a cooker",
                 cmd_prepare)
    s.add_argument("path", help="a folder of WebDataset .tar shards (any depth), or a .jsonl file")
    s.add_argument("--cooker", required=True, metavar="NAME",
                   help="the registered cooker of its samples (energon-nemotron cookers lists them), written "
                        "as subflavors.cooker into .nv-meta/dataset.yaml; on a prepared folder only this changes")
    s.add_argument("--split-ratio", default=None, metavar="TRAIN,VAL,TEST",
                   help="weights of the splits, over whole shards in name order (default: 1,0,0, all in train)")
    s.add_argument("--split-parts", action="append", default=None, metavar="SPLIT:PATTERN",
                   help="the shards of a split by relative path, e.g. 'train:parts/data-{0..6}.tar' (a regular "
                        "expression after brace expansion; once per split; instead of --split-ratio)")
    s.add_argument("--reindex", action="store_true",
                   help="index and split a prepared folder again (its dataset.yaml is kept, the cooker set)")
    s.add_argument("--num-workers", type=int, default=4, metavar="N", help="processes indexing the shards")
    _progress_argument(s)


def _add_pack_megatron(sub) -> None:
    from energon_nemotron.registry import PACKERS

    s = _command(sub, "pack-megatron", "pack raw conversations into Megatron-LM offline-packed rows",
                 cmd_pack_megatron)
    s.add_argument("--input", required=True, nargs="+", metavar="JSONL",
                   help="raw JSONL files or globs (quoted; matches sorted by name), one {\"messages\": [...]} per "
                        "line; conversations are taken in the order given")
    s.add_argument("--output", required=True,
                   help="the .jsonl.packed file to write (its manifest: OUTPUT.manifest.json); local or "
                        "msc://PROFILE/PATH (packed in --staging, then published, the manifest last)")
    s.add_argument("--staging", type=Path, default=None, metavar="DIR",
                   help="with inputs or --output on msc://: the local folder to pack in (a killed run resumes "
                        "from it; default: one per output under ~/.cache/energon-nemotron/pack-megatron)")
    s.add_argument("--rows-per-shard", type=int, default=None, metavar="N",
                   help="write shards of N rows beside OUTPUT (NAME-00000-of-000NN.jsonl.packed) instead of one file")
    s.add_argument("--algorithm", default="best_fit_decreasing", choices=PACKERS.names(),
                   help="how conversations are packed into rows")
    s.add_argument("--seed", type=int, default=0, help="seed of the row order shuffle")
    s.add_argument("--no-shuffle", action="store_true", help="write rows in packer order")
    s.add_argument("--on-error", choices=["raise", "skip"], default="raise",
                   help="a line or conversation that cannot be encoded: raise stops, skip skips and counts it")
    s.add_argument("--engine", choices=["local", "ray"], default="local",
                   help="local: this process; ray: Ray Data actors count, Ray tasks write (same output)")
    s.add_argument("--address", default=None, help="--engine ray: join this cluster (auto, HOST:PORT) "
                                                   "instead of starting a local one")
    s.add_argument("--num-cpus", type=int, default=None,
                   help="--engine ray: counting actors and writing tasks at once (default: all CPUs)")
    s.add_argument("--ray-verbose", action="store_true", help="--engine ray: show Ray's logs and progress bars")
    s.add_argument("--block-size", type=int, default=None, metavar="BYTES",
                   help="bytes of whole lines per counting block (default: one per file locally; ray: ~8 per actor)")
    s.add_argument("--json", action="store_true", help="print the summary as JSON")
    _progress_argument(s)
    _encoder_args(s)


def _color_argument(s: argparse.ArgumentParser) -> None:
    s.add_argument("--color", choices=["auto", "always", "never"], default="auto",
                   help="colour the output: auto (when it is a terminal), always or never")


def _add_inspect_megatron(sub) -> None:
    s = _command(sub, "inspect-megatron", "show the segments and trained tokens of packed rows", cmd_inspect_megatron)
    s.add_argument("file", help="a .jsonl.packed file")
    s.add_argument("--rows", type=int, default=None, help="show only the first K rows")
    s.add_argument("--json", action="store_true", help="one JSON object per row, tensors as lists")
    _color_argument(s)
    _encoder_args(s)


def _split_argument(s: argparse.ArgumentParser) -> None:
    s.add_argument("--split", choices=["train", "validation"], default="train",
                   help="the loader config's data.train or data.validation")


def _add_preview(sub) -> None:
    s = _command(sub, "preview", "show the packed batches a loader config produces", cmd_preview)
    _config_arguments(s)
    s.add_argument("--batches", type=int, default=None, metavar="N",
                   help="stop after N batches (default: one epoch; with --html: 8 batches of the epoch)")
    s.add_argument("--json", action="store_true", help="one JSON object per batch, then a summary line")
    _color_argument(s)
    _split_argument(s)
    s.add_argument("--dp-rank", type=int, default=0, help="data-parallel rank to show")
    s.add_argument("--dp-size", type=int, default=1, help="data-parallel world size")
    s.add_argument("--html", default=None, metavar="OUT.html",
                   help="write the batches as an HTML page (default: the first 8 batches of the epoch)")
    s.add_argument("--load-state", default=None, metavar="FILE", help="resume from a saved loader state")
    s.add_argument("--save-state", default=None, metavar="FILE",
                   help="write the loader state after the last printed batch (atomically)")


def _add_stats(sub) -> None:
    s = _command(sub, "stats", "the shape of a loader config's datasets: lengths, skips, media, packing fill",
                 cmd_stats)
    _config_arguments(s)
    _split_argument(s)
    s.add_argument("--limit", type=int, default=None, metavar="N", help="read at most N samples (rows) per dataset")
    s.add_argument("--json", action="store_true", help="print one JSON object")
    s.add_argument("--html", default=None, metavar="OUT.html", help="also write a page with the histograms")
    s.add_argument("--engine", choices=["single", "ray"], default="single",
                   help="single: this process; ray: N Ray actors, one part of every dataset each")
    s.add_argument("--address", default=None, help="--engine ray: join this Ray cluster instead of starting one")
    s.add_argument("--num-cpus", type=int, default=None, metavar="N",
                   help="--engine ray: CPUs of the local cluster and number of actors (default: all CPUs)")
    _progress_argument(s)


def _add_cookers_and_demo(sub) -> None:
    s = _command(sub, "cookers", "list the registered cookers: origin, schema, subflavors, modalities", cmd_cookers)
    s.add_argument("--json", action="store_true", help="one JSON list of the cookers")
    s = _command(sub, "demo", "run the library end to end on the embedded demo data", cmd_demo)
    s.add_argument("--out", default="demo_out", help="folder for the demo's files")
    _progress_argument(s)


def build_parser() -> argparse.ArgumentParser:
    examples = "examples (one per command; COMMAND --help shows more):\n" + \
        "\n".join(f"  {lines[0]}" for lines in EXAMPLES.values())
    p = argparse.ArgumentParser(prog="energon-nemotron", description=plain_text(__doc__), epilog=examples,
                                formatter_class=_HelpFormatter)
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}",
                   help="print the library version and exit")
    p.add_argument("--debug", action="store_true",
                   help="on an error, print its full traceback (a loader worker's too) before the message")
    p.add_argument("--verbose", action="store_true",
                   help="also show Energon's own lines: each worker's shard ranges and its buffer-filling bar, "
                        "what its prepare prints")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in (_add_prepare, _add_preview, _add_stats, _add_cookers_and_demo, _add_pack_megatron,
                _add_inspect_megatron):
        add(sub)
    return p


_PYTHON_FORMAT = warnings.formatwarning


def _one_line_warning(message, category, filename, lineno, line=None) -> str:
    """The library's own warnings as one line (``warning: ...``), without the source location;
    every other warning as Python shows it."""
    if category.__module__.startswith("energon_nemotron"):
        return f"warning: {message}\n"
    return _PYTHON_FORMAT(message, category, filename, lineno, line)


def main(argv: Optional[Sequence[str]] = None) -> int:
    warnings.formatwarning = _one_line_warning

    # Energon's loaders always request pinned memory; without an accelerator torch warns about it
    warnings.filterwarnings("ignore", message="'pin_memory' argument is set as true")
    args = build_parser().parse_args(argv)
    if args.verbose:
        import os

        from energon_nemotron.loading.loader import VERBOSE_ENV

        os.environ[VERBOSE_ENV] = "1"
    try:
        code = args.func(args)
        sys.stdout.flush()              # inside the try: a reader that went away is handled below
        return code
    except BrokenPipeError:             # the reader went away (`... | head`): stop quietly
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception as e:              # a data or config error, also one a loader worker raised: one message
        message = original_message(e)
        if message is None:
            raise
        if args.debug:
            import traceback

            traceback.print_exc()
        print(f"error: {message}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
