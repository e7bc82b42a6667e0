"""Cookers from other packages: a real installed distribution (a ``.dist-info`` with
``entry_points.txt`` in group ``energon_nemotron.cookers``) built here, found by
``importlib.metadata`` through ``PYTHONPATH``. Everything that loads it runs in a subprocess, so the
global registry of this process never holds the plugin's cookers."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from conftest import DEMO_TOKENIZER, REPO
from energon_data import tar_keys
from energon_nemotron.cookers.base import COMMON_SUBFLAVORS
from energon_nemotron.demo.datasets import prepare, write_shards
from energon_nemotron.errors import ConfigError
from energon_nemotron.registry import COOKERS, Registry

PLUGIN = '''
"""An example plugin: question/answer rows."""
import os

from megatron.energon import basic_sample_keys, stateless

from energon_nemotron.cookers import payload, register, sample_where, text_of
from energon_nemotron.types import Conversation, Message


@register("qa_pairs", {"qa_prefix": str}, modalities=())
@stateless
def cook_qa_pairs(sample: dict, **aux) -> Conversation:
    """``{"q": QUESTION, "a": ANSWER}``: one user turn, one assistant turn.

    The prefix (subflavor ``qa_prefix``) starts the question."""
    where = sample_where(sample)
    obj = payload(sample, where)
    prefix = (sample.get("__subflavors__") or {}).get("qa_prefix", "")
    log = os.environ.get("MYPLUGIN_LOG")
    if log:
        with open(log, "a") as f:
            f.write(json.dumps([os.getpid(), sample["__key__"], prefix]) + "\\n")
    messages = [Message("user", [prefix + text_of(obj.get("q"), where, "'q'")]),
                Message("assistant", [text_of(obj.get("a"), where, "'a'")])]
    return Conversation(**basic_sample_keys(sample), messages=messages)


import json  # noqa: E402
'''

EXTRA = '''
from megatron.energon import stateless

from energon_nemotron.cookers import register


def register_cookers():
    """Registers ``qa_upper`` (an entry point naming a callable)."""

    @register("qa_upper", schema="{\\"q\\": ..., \\"a\\": ...}, upper-cased", modalities=("image",))
    @stateless
    def cook_upper(sample, **aux):
        raise NotImplementedError
'''


def make_distribution(site: Path, name: str, files: dict[str, str], entry_points: dict[str, str]) -> Path:
    """An installed distribution ``name`` 0.1 in ``site``: its files and a ``.dist-info`` whose
    ``entry_points.txt`` holds ``entry_points`` in group ``energon_nemotron.cookers``."""
    for rel, text in files.items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_text(textwrap.dedent(text))
    info = site / f"{name}-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        "[energon_nemotron.cookers]\n" + "".join(f"{k} = {v}\n" for k, v in entry_points.items()))
    return site


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    return make_distribution(tmp_path_factory.mktemp("site"), "myplugin",
                             {"myplugin/__init__.py": PLUGIN, "myplugin/extra.py": EXTRA},
                             {"qa": "myplugin", "more": "myplugin.extra:register_cookers"})


def run(args: list[str], site: Path | None, **env) -> subprocess.CompletedProcess:
    """This interpreter in a subprocess, with ``site`` (when given) on ``PYTHONPATH``."""
    paths = [str(site)] if site else []
    paths += [str(REPO), str(REPO / "tests")]
    environ = {**os.environ, "PYTHONPATH": os.pathsep.join(paths), **env}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=environ, timeout=600)


def cookers_json(site: Path | None) -> dict:
    res = run(["-m", "energon_nemotron.cli", "cookers", "--json"], site)
    assert res.returncode == 0, res.stderr[-3000:]
    return {c["name"]: c for c in json.loads(res.stdout)}


def test_the_cli_lists_built_in_and_plugin_cookers(site):
    listed = cookers_json(site)
    assert listed["qa_pairs"] == {
        "name": "qa_pairs", "origin": "myplugin",
        "schema": '{"q": QUESTION, "a": ANSWER}: one user turn, one assistant turn.',
        "subflavors": {**{k: t.__name__ for k, t in COMMON_SUBFLAVORS.items()}, "qa_prefix": "str"},
        "modalities": [], "requires": []}
    assert listed["qa_upper"]["origin"] == "myplugin" and listed["qa_upper"]["modalities"] == ["image"]
    assert listed["qa_upper"]["schema"] == '{"q": ..., "a": ...}, upper-cased'
    asr = listed["granary_asr"]
    assert asr["origin"] == "built-in" and asr["modalities"] == ["audio"] and asr["requires"] == ["audio"]
    assert asr["subflavors"]["asr_prompt"] == "str" and "audio_filepath" in asr["schema"]
    assert set(COOKERS.names()) <= set(listed)
    assert all(listed[n]["origin"] == "built-in" for n in COOKERS.names())
    # the same interpreter without the distribution on its path: no plugin cookers
    assert set(cookers_json(None)) == set(COOKERS.names())


def test_the_cli_text_listing(site):
    res = run(["-m", "energon_nemotron.cli", "cookers"], site)
    assert res.returncode == 0, res.stderr[-3000:]
    blocks = {b.splitlines()[0]: b for b in res.stdout.strip().split("\n\n")}
    qa = blocks["qa_pairs  (myplugin)"]
    assert "schema: {\"q\": QUESTION" in qa and "qa_prefix (str)" in qa and "cooker (str)" in qa
    assert "modalities: none (text only); every sample has: nothing required" in qa
    assert "modalities: audio; every sample has: audio" in blocks["granary_asr  (built-in)"]


LOADER_SCRIPT = '''
import json, os, sys
from energon_nemotron.loading import build_train_loader

loader = build_train_loader(sys.argv[1], repeat=False)
keys = sorted(k for batch in loader for row in batch.sample_keys for k in row)
print(json.dumps({"pid": os.getpid(), "keys": keys, "skipped": loader.skipped()}))
'''


def test_a_plugin_cooker_is_selected_by_subflavors_in_a_loader_with_two_workers(site, tmp_path):
    samples = [(f"qa-{i}", {"json": json.dumps({"q": f"What is {i} plus {i}?", "a": f"{2 * i}."}).encode()})
               for i in range(8)]
    prepare(write_shards(tmp_path / "qa", samples, 2), {"cooker": "qa_pairs", "qa_prefix": "Q: "})
    cfg = {"tokenizer": str(DEMO_TOKENIZER),
           "task_encoder": {"name": "nemotron_multimodal", "options": {"prompt_format": "nemotron6",
                                                                          "seq_length": 512}},
           "data": {"train": {"path": str(tmp_path / "qa")}},
           "loader": {"batch_size": 1, "num_workers": 2, "shuffle_buffer_size": None, "seed": 1}}
    (tmp_path / "loader.yaml").write_text(yaml.safe_dump(cfg))
    (tmp_path / "run.py").write_text(LOADER_SCRIPT)
    log = tmp_path / "cooked.jsonl"
    res = run([str(tmp_path / "run.py"), str(tmp_path / "loader.yaml")], site, MYPLUGIN_LOG=str(log))
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert tar_keys(out["keys"]) == [f"qa-{i}" for i in range(8)] and out["skipped"] == {}
    cooked = [json.loads(line) for line in log.read_text().splitlines()]
    assert sorted(key for _, key, _ in cooked) == tar_keys(out["keys"])       # a cooker sees the tar's key
    assert {prefix for _, _, prefix in cooked} == {"Q: "}                 # the plugin's subflavor reached it
    pids = {pid for pid, _, _ in cooked}
    assert len(pids) == 2 and out["pid"] not in pids                      # cooked in the two (forked) workers

    # without the distribution the dataset names no registered cooker, at start
    res = run([str(tmp_path / "run.py"), str(tmp_path / "loader.yaml")], None)
    assert res.returncode != 0 and "subflavor cooker: 'qa_pairs'" in res.stderr and "ConfigError" in res.stderr


BROKEN = {
    "raises": ({"brokenplugin/__init__.py": 'raise RuntimeError("boom at import")\n'}, "brokenplugin",
               r"RuntimeError: boom at import"),
    "duplicate": ({"brokenplugin/__init__.py": '''
                   from megatron.energon import stateless
                   from energon_nemotron.cookers import register

                   @register("granary_asr")
                   @stateless
                   def cook(sample, **aux):
                       raise NotImplementedError
                   '''}, "brokenplugin", r"KeyError: cooker 'granary_asr' is already registered \(by built-in\)"),
    "needs_arguments": ({"brokenplugin/__init__.py": "def setup(registry):\n    pass\n"}, "brokenplugin:setup",
                        r"TypeError: brokenplugin:setup is neither a module nor a callable without arguments"),
    "missing": ({}, "no_such_module", r"ModuleNotFoundError: No module named 'no_such_module'"),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_a_broken_entry_point_is_a_config_error_naming_the_distribution(tmp_path, case):
    files, target, reason = BROKEN[case]
    broken = make_distribution(tmp_path, "brokenplugin", files, {"broken": target})
    res = run(["-m", "energon_nemotron.cli", "cookers"], broken)
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr[-3000:]
    expected = (rf"^error: cooker entry point 'broken' = '{target}' \(group energon_nemotron\.cookers\) of the "
                rf"distribution brokenplugin failed to load: {reason}.*; fix or uninstall brokenplugin$")
    assert re.match(expected, res.stderr.strip()), res.stderr


def test_a_broken_entry_point_fails_every_lookup_of_a_fresh_registry(tmp_path, monkeypatch):
    """In this process, with a registry of its own (the global one is loaded first, so it does not
    read the broken distribution)."""
    COOKERS.names()
    monkeypatch.syspath_prepend(str(make_distribution(
        tmp_path, "brokenplugin", {"brokenplugin_x/__init__.py": 'raise RuntimeError("boom")\n'},
        {"broken": "brokenplugin_x"})))
    registry = Registry("cooker", entry_points="energon_nemotron.cookers")
    for _ in range(2):
        with pytest.raises(ConfigError, match=r"^cooker entry point 'broken' = 'brokenplugin_x' .* distribution "
                                              r"brokenplugin failed to load: RuntimeError: boom"):
            registry.names()
    assert "brokenplugin_x" not in sys.modules


def test_a_registry_attributes_entry_point_registrations_to_the_distribution(tmp_path, monkeypatch):
    """A fresh registry whose entry point is a callable registering into it: loaded once, lazily."""
    registry = Registry("widget", entry_points="energon_nemotron.test_widgets")
    (tmp_path / "widgets_x.py").write_text(textwrap.dedent('''
        CALLS = []

        def setup(registry=None):
            import widgets_registry
            CALLS.append(1)
            widgets_registry.REGISTRY.register("w1", object())
        '''))
    info = tmp_path / "widgets-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: widgets\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[energon_nemotron.test_widgets]\nw = widgets_x:setup\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(sys.modules, "widgets_registry", type(sys)("widgets_registry"))
    sys.modules["widgets_registry"].REGISTRY = registry
    def local():
        pass

    registry.register("local", local)
    assert registry.origin("local") == f"module {__name__}"
    assert registry.names() == ["local", "w1"] and registry.origin("w1") == "widgets"
    assert registry.names() == ["local", "w1"]
    assert sys.modules.pop("widgets_x").CALLS == [1]                        # loaded once
