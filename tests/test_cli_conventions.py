"""The conventions of the ``energon-nemotron`` console script: ``--version``, plain-text help and
cooker schemas (no reStructuredText markup), help and default on every option, examples in every
``--help``, and ``prepare`` (tar shards or a ``.jsonl`` file to an Energon dataset whose cooker is
named on the command line), read back by a real Energon loader."""

from __future__ import annotations

import argparse
import json
import re
import shlex

import pytest
import webdataset as wds
import yaml

from energon_data import loader_yaml
from energon_nemotron.demo.datasets import shown_keys, to_schema, with_system
from energon_nemotron.cli import EXAMPLES, build_parser, main, plain_text
from energon_nemotron.demo.conversations import make_conversations
from energon_nemotron.loading import build_train_loader
from energon_nemotron.version import __version__

RST = re.compile(r"``|:[\w.+-]+:`")
PACKING = {"algorithm": "best_fit_decreasing", "buffer_size": 16}


def subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def every_parser() -> list[tuple[str, argparse.ArgumentParser]]:
    parser = build_parser()
    return [("energon-nemotron", parser), *subparsers(parser).items()]


def rendered(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    """One option as its parser's ``--help`` shows it, whitespace collapsed."""
    formatter = parser._get_formatter()
    formatter.add_arguments([action])
    return " ".join(formatter.format_help().split())


# -- --version, plain text --------------------------------------------------------------------------

def test_version_prints_the_library_version(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["--version"])
    assert stop.value.code == 0
    assert capsys.readouterr().out == f"energon-nemotron {__version__}\n"


@pytest.mark.parametrize("text, plain", [
    ("``x``", "x"), (":class:`X`", "X"), (":func:`~a.b.f`", "f"), (":py:meth:`a.B.c`", "a.B.c"),
    (":ref:`the title <target>`", "the title"), ("a `b` c", "a b c"),
    ('LLaVA style ``{"conversations": [{"from", "value"}]}``.', 'LLaVA style {"conversations": [{"from", "value"}]}.'),
    ('"conversations[*].loss" stays', '"conversations[*].loss" stays'),
])
def test_plain_text_drops_inline_markup(text, plain):
    assert plain_text(text) == plain


@pytest.mark.parametrize("name, parser", every_parser(), ids=lambda x: x if isinstance(x, str) else "")
def test_no_rst_markup_in_any_help(name, parser):
    text = parser.format_help()
    assert not RST.search(text), f"{name} --help: {RST.search(text).group(0)!r} in\n{text}"


def test_no_rst_markup_in_the_cooker_list(capsys):
    assert main(["cookers"]) == 0
    text = capsys.readouterr().out
    assert "schema:" in text and not RST.search(text), RST.search(text)
    assert main(["cookers", "--json"]) == 0
    cookers = json.loads(capsys.readouterr().out)
    assert cookers and all(not RST.search(json.dumps(c)) for c in cookers)
    schemas = {c["name"]: c["schema"] for c in cookers}
    assert schemas["general_conversations"].startswith('LLaVA style {"conversations"')


# -- help, defaults, examples -----------------------------------------------------------------------

@pytest.mark.parametrize("name, parser", every_parser(), ids=lambda x: x if isinstance(x, str) else "")
def test_every_option_has_help_and_shows_its_default(name, parser):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            continue
        shown = rendered(parser, action)
        what = f"{name} {'/'.join(action.option_strings) or action.dest}"
        assert action.help and action.help.strip(), f"{what} has no help"
        flag = action.nargs == 0                    # store_true/false, --help, --version: no value
        if not flag and action.default is not None and action.default is not False:
            assert str(action.default) in shown, f"{what}: default {action.default!r} not in {shown!r}"


def test_the_wanted_help_texts():
    preview = subparsers(build_parser())["preview"]
    options = {o: a for a in preview._actions for o in a.option_strings}
    assert options["--batches"].help == "stop after N batches (default: one epoch; with --html: 8 batches of the epoch)"
    assert options["--html"].help == "write the batches as an HTML page (default: the first 8 batches of the epoch)"
    assert "(default: 0)" in rendered(preview, options["--dp-rank"])
    assert "(default: train)" in rendered(preview, options["--split"])


def test_every_command_has_examples_that_parse():
    parser = build_parser()
    commands = subparsers(parser)
    assert set(EXAMPLES) == set(commands)
    top = " ".join(parser.format_help().split())
    for name, sub in commands.items():
        help_text = sub.format_help()
        assert "examples:" in help_text
        for example in EXAMPLES[name]:
            assert example in help_text
            words = shlex.split(example, comments=True)
            assert words[:2] == ["energon-nemotron", name]
            assert build_parser().parse_args(words[1:]).func is sub.get_default("func")
        assert " ".join(EXAMPLES[name][0].split()) in top, f"the top-level --help lacks the example of {name}"


# -- prepare ----------------------------------------------------------------------------------------

def write_tar_shards(folder, cooker: str, n: int, per_shard: int = 5) -> list[str]:
    """``n`` samples of ``cooker``'s schema in ``folder/parts/data-K.tar`` (webdataset's TarWriter);
    returns their keys as the library shows them."""
    (folder / "parts").mkdir(parents=True)
    convs, keys = make_conversations(n, seed=3), []
    for start in range(0, n, per_shard):
        with wds.TarWriter(str(folder / "parts" / f"data-{start // per_shard}.tar")) as tar:
            for i in range(start, min(n, start + per_shard)):
                keys.append(f"sample-{i:04d}")
                payload = to_schema(cooker, [with_system(convs[i])])
                tar.write({"__key__": keys[-1], "json": json.dumps(payload).encode()})
    return shown_keys(folder, keys, per_shard)


def read_epoch(cfg) -> list[str]:
    keys = []
    for batch in build_train_loader(cfg, repeat=False):
        batch.validate()
        keys += [k for row in batch.sample_keys for k in row]
    return keys


def meta_files(folder) -> dict[str, bytes]:
    """Every file Energon wrote in ``.nv-meta`` (all but dataset.yaml), by name."""
    return {p.name: p.read_bytes() for p in (folder / ".nv-meta").iterdir() if p.name != "dataset.yaml"}


@pytest.fixture
def prepared(tmp_path, capsys):
    keys = write_tar_shards(tmp_path / "my_data", "general_conversations", n=12)
    code = main(["prepare", str(tmp_path / "my_data"), "--cooker", "general_conversations", "--no-progress",
                 "--num-workers", "1"])
    out = capsys.readouterr()
    assert code == 0, out.err
    return tmp_path / "my_data", keys, out.out


def test_prepare_a_tar_folder_then_a_real_loader_cooks_it(prepared, tmp_path):
    folder, keys, out = prepared
    assert f"indexed {folder}: 3 shards, 12 samples" in out
    meta = yaml.safe_load((folder / ".nv-meta" / "dataset.yaml").read_text())
    assert meta == {"__module__": "megatron.energon", "__class__": "CrudeWebdataset",
                    "subflavors": {"cooker": "general_conversations"}}
    cfg = loader_yaml(tmp_path / "loader.yaml", {"path": "my_data"}, packing=PACKING)
    assert sorted(read_epoch(cfg)) == keys


def test_preview_reads_the_prepared_folder(prepared, tmp_path, capsys):
    folder, keys, _ = prepared
    cfg = loader_yaml(tmp_path / "loader.yaml", {"path": "my_data"}, packing=PACKING)
    assert main(["preview", str(cfg), "--json"]) == 0
    last = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert last["summary"]["samples"] == len(keys)


def test_prepare_again_changes_only_the_cooker(prepared, capsys):
    folder, _, _ = prepared
    path = folder / ".nv-meta" / "dataset.yaml"
    meta = yaml.safe_load(path.read_text())
    meta["subflavors"]["skip_chat_template"] = True
    meta["split_config"] = "split.yaml"
    path.write_text(yaml.safe_dump(meta, sort_keys=False))
    before = meta_files(folder)
    assert main(["prepare", str(folder), "--cooker", "openai_messages"]) == 0
    assert f"kept the index of {folder}" in capsys.readouterr().out
    meta["subflavors"]["cooker"] = "openai_messages"
    assert yaml.safe_load(path.read_text()) == meta
    assert meta_files(folder) == before                 # the index, the info and the split untouched


def test_a_split_of_a_prepared_folder_needs_reindex(prepared, capsys):
    folder, _, _ = prepared
    assert main(["prepare", str(folder), "--cooker", "general_conversations", "--split-ratio", "2,1,0"]) == 2
    assert capsys.readouterr().err == (f"error: {folder} is prepared already: add --reindex to index and split "
                                       "its shards again\n")
    assert main(["prepare", str(folder), "--cooker", "general_conversations", "--split-ratio", "2,1,0",
                 "--reindex", "--no-progress", "--num-workers", "1"]) == 0
    split = yaml.safe_load((folder / ".nv-meta" / "split.yaml").read_text())["split_parts"]
    assert split["train"] == ["parts/data-{0..1}.tar"] and split["val"] == ["parts/data-2.tar"]


def test_an_unknown_cooker_is_one_line_with_the_nearest_name(tmp_path, capsys):
    write_tar_shards(tmp_path / "my_data", "general_conversations", n=3)
    assert main(["prepare", str(tmp_path / "my_data"), "--cooker", "general_conversation"]) == 2
    assert capsys.readouterr().err == ("error: unknown cooker 'general_conversation'; "
                                       "did you mean 'general_conversations'?\n")
    assert not (tmp_path / "my_data" / ".nv-meta").exists()            # nothing prepared


@pytest.mark.parametrize("args, message", [
    (["--split-ratio", "8,1"], "--split-ratio '8,1': write three weights TRAIN,VAL,TEST, e.g. 8,1,1 or 1,0,0"),
    (["--split-parts", "parts/data-0.tar"], "--split-parts 'parts/data-0.tar': write SPLIT:PATTERN"),
    (["--split-ratio", "1,0,0", "--split-parts", "train:parts/.*"], "give --split-ratio or --split-parts, not both"),
    (["--num-workers", "0"], "--num-workers 0: Energon indexes with at least one process"),
])
def test_bad_split_options(tmp_path, capsys, args, message):
    write_tar_shards(tmp_path / "my_data", "general_conversations", n=3)
    assert main(["prepare", str(tmp_path / "my_data"), "--cooker", "general_conversations", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {message}") and err.count("\n") == 1


def test_what_cannot_be_prepared(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    (tmp_path / "loader.yaml").write_text("{}\n")
    for path, message in [(tmp_path / "empty", "no .tar shards in it or below it"),
                          (tmp_path / "nope", "does not exist"),
                          (tmp_path / "loader.yaml", "give a folder of WebDataset .tar shards or a .jsonl file")]:
        assert main(["prepare", str(path), "--cooker", "openai_messages"]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: {path}") and message in err and err.count("\n") == 1, err


def test_a_sample_type_dataset_is_not_given_a_cooker(prepared, capsys):
    folder, _, _ = prepared
    path = folder / ".nv-meta" / "dataset.yaml"
    path.write_text(yaml.safe_dump({"sample_type": {"__module__": "megatron.energon", "__class__": "TextSample"},
                                    "field_map": {"text": "txt"}}))
    assert main(["prepare", str(folder), "--cooker", "openai_messages"]) == 2
    assert "a cooker reads crude samples only" in capsys.readouterr().err
    assert "cooker" not in path.read_text()


def test_prepare_a_jsonl_file_and_name_its_cooker_as_told(tmp_path, capsys):
    path = tmp_path / "data.jsonl"
    convs = make_conversations(7, seed=5)
    path.write_text("".join(json.dumps(to_schema("openai_messages", [with_system(c)])) + "\n" for c in convs))
    assert main(["prepare", str(path), "--cooker", "openai_messages"]) == 0
    out = capsys.readouterr().out
    assert f"indexed {path}: 7 samples" in out and (tmp_path / "data.jsonl.idx").is_file()
    assert f"data: {{train: {{path: {path}}}, default_cooker: openai_messages}}" in out
    assert f"{{path: {path}, subflavors: {{cooker: openai_messages}}}}" in out
    cfg = loader_yaml(tmp_path / "loader.yaml", {"path": str(path)}, packing=PACKING, default_cooker="openai_messages")
    keys = read_epoch(cfg)
    assert len(keys) == len(set(keys)) == 7                                 # every line once
    assert main(["prepare", str(path), "--cooker", "openai_messages", "--reindex"]) == 2
    assert "a .jsonl file has no shards to split" in capsys.readouterr().err


def test_a_bad_jsonl_line_is_one_line(tmp_path, capsys):
    path = tmp_path / "data.jsonl"
    path.write_text('{"messages": []}\n[1, 2]\n')
    assert main(["prepare", str(path), "--cooker", "openai_messages"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {path}: Energon's prepare stopped:") and err.count("\n") == 1, err
