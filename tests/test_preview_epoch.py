"""``preview`` reads one epoch: every sample at most once, ``--batches`` / ``--html`` stop early and say
so, and the summary counts the samples of the batches shown (issue 27, new user 4)."""

from __future__ import annotations

import json
import re
from collections import Counter

import pytest
import yaml

from energon_data import text_config, text_dataset
from energon_nemotron.inspection.preview import PreviewOptions, run_preview


class _Out:
    def __init__(self):
        self.lines = []

    def write(self, text):
        self.lines.append(text)

    def isatty(self):
        return False

    def flush(self):
        pass

    def records(self):
        return [json.loads(line) for line in "".join(self.lines).splitlines() if line.strip()]


def _config(tmp_path, workers, n=30):
    ds, keys = text_dataset(tmp_path / "ds", "openai_messages", n=n)
    cfg = text_config(ds, workers=workers, seq_length=512,
                      packing={"algorithm": "first_fit_decreasing", "buffer_size": 4})
    path = tmp_path / "loader.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return str(path), keys


def _preview(path, **kw):
    out = _Out()
    assert run_preview(path, as_json=True, out=out, **kw) == 0
    *batches, summary = out.records()
    return batches, summary["summary"]


@pytest.mark.parametrize("workers", [0, 2])
def test_default_preview_is_one_whole_epoch(tmp_path, workers):
    path, keys = _config(tmp_path, workers)
    batches, summary = _preview(path)
    shown = Counter(k for b in batches for row in b["sample_keys"] for k in row)
    assert sorted(shown) == sorted(keys) and set(shown.values()) == {1}
    assert summary["samples"] == len(keys) == 30
    assert summary["read"] == f"the epoch, whole: {len(batches)} batches"


@pytest.mark.parametrize("workers", [0, 2])
def test_batches_stop_early_without_repeating_a_sample(tmp_path, workers):
    path, keys = _config(tmp_path, workers)
    batches, summary = _preview(path, batches=3)
    shown = [k for b in batches for row in b["sample_keys"] for k in row]
    assert len(batches) == 3 and len(shown) == len(set(shown)) == summary["samples"] < len(keys)
    assert summary["read"].startswith("stopped early, after 3 batches; the epoch holds more")


def test_html_reads_the_epoch_not_a_repeating_stream(tmp_path, capsys):
    """The page's 8 batches come from the epoch: no sample twice; the stderr line says it stopped early."""
    path, keys = _config(tmp_path, 0, n=40)
    page = tmp_path / "p.html"
    out = _Out()
    assert run_preview(path, html=str(page), out=out, as_json=True) == 0
    summary = out.records()[-1]["summary"]
    assert summary["batches"] == 8 and summary["samples"] < len(keys)
    shown = re.findall(r"segment \d+: (\S+) — positions", page.read_text())
    assert len(shown) == len(set(shown)) == summary["samples"] and set(shown) <= set(keys)
    assert "stopped early, after 8 batches" in capsys.readouterr().err


def test_a_batch_count_equal_to_the_epoch_says_whole(tmp_path):
    path, keys = _config(tmp_path, 0)
    batches, _ = _preview(path)
    again, summary = _preview(path, batches=len(batches))
    assert len(again) == len(batches) and summary["read"] == f"the epoch, whole: {len(batches)} batches"


def test_a_training_state_restores_into_the_repeating_stream(tmp_path):
    """A state saved by a training loader (repeating) is previewed on the repeating stream: the
    next batches training would read; without --batches that stream has no end, and it says so."""
    from energon_nemotron.errors import ConfigError
    from energon_nemotron.loading import build_train_loader
    from energon_nemotron.resume import save_state_file

    path, _ = _config(tmp_path, 0)
    training = build_train_loader(path)                        # repeat=True: as training reads
    it = iter(training)
    next(it)
    save_state_file(tmp_path / "state.json", training.state_dict())
    expected = [next(it).sample_keys for _ in range(2)]
    restore = PreviewOptions(load_state=str(tmp_path / "state.json"))
    batches, summary = _preview(path, batches=2, options=restore)
    assert [b["sample_keys"] for b in batches] == expected
    assert summary["read"] == "2 batches of the repeating stream (the state was saved by a repeating loader)"
    with pytest.raises(ConfigError, match=r"state\.json was saved by a repeating loader .*give --batches N"):
        _preview(path, options=restore)
